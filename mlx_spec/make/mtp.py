"""A target's own multi-token-prediction (MTP) layers, as Qwen3-Next ships them beside its weights (keys `mtp.*`:
`fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `layers.N`, `norm`; Qwen3.5 uses the same layout), which mlx-lm
drops at load.

The module reads the next token's embedding beside the target's last state (after its final norm), both normed, joins
them through `fc`, runs its full-attention decoder layers (the target's own layer class from mlx-lm) and a norm; the
result is read by the target's output layer and fed back as the next step's state."""

import json
import re
from pathlib import Path
from typing import Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ..errors import SourceError
from .layers import holder_of

FILE = "mtp.safetensors"  # beside a converted model: the module's weights as it names them (mlx_lm.load skips it)
FAMILIES = ("qwen3_next",)  # model types whose `mtp.*` layers run here (Qwen3.5's wrapper model is not a target yet)
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight",
         "norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


class MTP(nn.Module):
    """The MTP module over a target: `__call__` gives the states to read and feed back; `logits` reads them with the
    target's output layer (the target's embedding and output layer are shared, not copied)."""

    def __init__(self, target, layers: int = 1):
        super().__init__()
        from mlx_lm.models.qwen3_next import Qwen3NextDecoderLayer

        args = target.args
        d = args.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(d, eps=args.rms_norm_eps)
        full = args.full_attention_interval - 1  # the index of a layer that attends (MTP layers all do)
        self.layers = [Qwen3NextDecoderLayer(args, full) for _ in range(layers)]
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        inner = getattr(target, holder_of(target))
        object.__setattr__(self, "embed", inner.embed_tokens)  # the target's: outside the module's parameters
        object.__setattr__(self, "target_norm", inner.norm)
        object.__setattr__(self, "head", target.lm_head if "lm_head" in target else inner.embed_tokens.as_linear)

    def __call__(self, tokens: mx.array, hidden: mx.array, cache: Optional[list] = None) -> mx.array:
        h = self.fc(mx.concatenate([self.pre_fc_norm_embedding(self.embed(tokens)),
                                    self.pre_fc_norm_hidden(hidden)], axis=-1))
        cache = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)

    def logits(self, h: mx.array) -> mx.array:
        return self.head(h)

    def make_cache(self) -> List[KVCache]:
        return [KVCache() for _ in self.layers]


def has_mtp(folder) -> bool:
    """Whether a model folder holds MTP layers (a checkpoint's `mtp.*` weights or a converted folder's FILE)."""
    return (Path(folder) / FILE).is_file() or bool(_files(Path(folder), probe=True))


def _files(folder: Path, probe: bool = False) -> List[Path]:
    """The safetensors files of `folder` that hold `mtp.` keys (by the index where there is one)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = {f for k, f in json.loads(index.read_text())["weight_map"].items() if _is_mtp(k)}
        return [folder / n for n in sorted(names)]
    from safetensors import safe_open  # reads a file's header only

    out = []
    for f in sorted(folder.glob("model*.safetensors")):
        with safe_open(str(f), "numpy") as st:
            if any(_is_mtp(k) for k in st.keys()):
                out.append(f)
                if probe:
                    break
    return out


def _is_mtp(key: str) -> bool:
    return key.startswith("mtp.") or ".mtp." in key


def weights(folder: Path) -> Dict[str, mx.array]:
    """The MTP weights of a checkpoint as the module names them: prefix dropped, HF's zero-centred norms made whole
    (the checkpoint's norms multiply by 1 + w), experts stacked as mlx-lm's `switch_mlp`."""
    if (folder / FILE).is_file():
        return dict(mx.load(str(folder / FILE)))
    out = {}
    for f in _files(folder):
        for k, v in mx.load(str(f)).items():
            if _is_mtp(k):
                k = k[k.index("mtp.") + 4 :]
                out[k] = v + 1.0 if k.endswith(NORMS) and v.ndim == 1 else v
    experts: Dict[tuple, Dict[int, mx.array]] = {}
    for k in [k for k in out if re.fullmatch(r".*\.experts\.\d+\.\w+_proj\.\w+", k)]:
        m = re.fullmatch(r"(.*)\.experts\.(\d+)\.(\w+_proj)\.(\w+)", k)
        experts.setdefault((m[1], m[3], m[4]), {})[int(m[2])] = out.pop(k)
    for (base, proj, what), got in experts.items():
        out[f"{base}.switch_mlp.{proj}.{what}"] = mx.stack([got[i] for i in sorted(got)])
    return out


def save(folder: Path, src: Path, dtype) -> int:
    """Write the MTP layers of checkpoint `src` into `folder`/FILE, cast to `dtype`; their parameter count (0 and
    nothing written where it has none)."""
    got = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights(Path(src)).items()}
    if got:
        mx.save_safetensors(str(Path(folder) / FILE), got, metadata={"format": "mlx"})
    return sum(v.size for v in got.values())


def load(folder, target) -> MTP:
    """The MTP module of the checkpoint in `folder` over `target` (loaded from the same checkpoint); one line of
    refusal where the folder holds none or the target is of another family."""
    folder = Path(folder).expanduser()
    kind = getattr(getattr(target, "args", None), "model_type", type(target).__name__)
    if kind not in FAMILIES:
        raise SourceError(f"an MTP drafter runs the MTP layers of {', '.join(FAMILIES)} checkpoints; the target is "
                          f"{kind}")
    got = weights(folder)
    if not got:
        raise SourceError(f"{folder}: no MTP layers (the checkpoints that ship them here: Qwen3-Next's, mtp.*; a copy "
                          "converted by mlx-lm has them dropped, one converted by mlx-spec keeps them)")
    n = 1 + max(int(k.split(".")[1]) for k in got if k.startswith("layers."))
    module = MTP(target, n)
    try:
        module.load_weights(list(got.items()), strict=True)
    except ValueError as e:
        raise SourceError(f"{folder}: its MTP weights do not fit the target ({str(e).splitlines()[0]})") from None
    mx.eval(module.parameters())
    return module
