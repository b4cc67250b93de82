"""A target's own multi-token-prediction (MTP) layers, which mlx-lm drops at load: Qwen3-Next's and Qwen3.5's (keys
`mtp.*`: `fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `layers.N`, `norm`) and DeepSeek's
"nextn" layer (DeepSeek-V3, GLM-4.5+, GLM-4.7-Flash: `model.layers.<num_hidden_layers>.*`, its `enorm`, `hnorm`,
`eh_proj`, one decoder layer and `shared_head`, sometimes its own `embed_tokens`).

Both are one computation: the next token's embedding beside the target's last state (after its final norm), both
normed, joined through a linear layer, the MTP decoder layers (the target's own layer class from mlx-lm) and a norm;
the result is read by the output layer and fed back as the next step's state (as mlx-vlm's and SGLang's drafters
do). The module names its weights as Qwen3-Next does; `NEXTN` says which DeepSeek names they are."""

import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ..errors import SourceError, UnsupportedError
from . import drafter_weights, layer_config
from .base import text_of

FILE = "mtp.safetensors"  # beside a converted model: the module's weights as it names them (mlx_lm.load skips it)
NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)  # zero-centred in `mtp.*`
KEEP_DTYPE = ("e_score_correction_bias",)  # a router's bias stays float32 (cast, it changes which experts run)
NEXTN = {
    "eh_proj": "fc",
    "enorm": "pre_fc_norm_embedding",
    "hnorm": "pre_fc_norm_hidden",
    "shared_head.norm": "norm",
    "shared_head.head": "head",
    "embed_tokens": "embed_tokens",
}  # a nextn layer's own weights: the module's names


@dataclass(frozen=True)
class Family:
    """How a model type ships its MTP layers and which of mlx-lm's classes runs one."""

    layer: str  # the decoder-layer class in `mlx_lm.models.<model_type>`
    nextn: bool  # DeepSeek's layout, `model.layers.<num_hidden_layers>.*` (else `mtp.*`)
    array_mask: bool  # its attention reads the mask as an array (MLA's), not as "causal"


FAMILIES = {  # model types whose MTP layers run here (Qwen3.5's text model inside mlx-lm's wrapper)
    "qwen3_next": Family("Qwen3NextDecoderLayer", nextn=False, array_mask=False),
    "qwen3_5": Family("DecoderLayer", nextn=False, array_mask=False),
    "qwen3_5_moe": Family("DecoderLayer", nextn=False, array_mask=False),
    "deepseek_v3": Family("DeepseekV3DecoderLayer", nextn=True, array_mask=True),
    "glm4_moe": Family("DecoderLayer", nextn=True, array_mask=False),
    "glm4_moe_lite": Family("Glm4MoeLiteDecoderLayer", nextn=True, array_mask=True),
}


class MTP(nn.Module):
    """The MTP module over a target: `__call__` gives the states to read and feed back; `logits` reads them with the
    checkpoint's own output layer where it ships one, else the target's (an embedding likewise; the target's are
    shared, not copied)."""

    def __init__(self, target, layers: int = 1, head: bool = False, embed: bool = False):
        super().__init__()
        text = text_of(target)  # through a vision-language wrapper (Qwen3.5)
        args, kind = text.args, text.model_type
        family = FAMILIES[kind]
        d = args.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(d, eps=args.rms_norm_eps)
        module = "qwen3_5" if kind.startswith("qwen3_5") else kind  # Qwen3.5 MoE's layer is qwen3_5's with experts
        layer = getattr(importlib.import_module(f"mlx_lm.models.{module}"), family.layer)
        # DeepSeek's layer sits after the target's (its MoE rule reads the index); Qwen3-Next's attends, as all do
        at = args.num_hidden_layers if family.nextn else args.full_attention_interval - 1
        self.layers = [layer(args, at) for _ in range(layers)]
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.array_mask = family.array_mask
        inner = text.body
        if embed:
            self.embed_tokens = nn.Embedding(args.vocab_size, d)
        if head:
            self.head = nn.Linear(d, args.vocab_size, bias=False)
        else:  # the target's: outside the module's parameters
            object.__setattr__(self, "head", text.logits)
        object.__setattr__(self, "embed", self.embed_tokens if embed else inner.embed_tokens)
        object.__setattr__(self, "target_norm", inner.norm)

    def __call__(self, tokens: mx.array, hidden: mx.array, cache: list | None = None) -> mx.array:
        h = self.fc(
            mx.concatenate([self.pre_fc_norm_embedding(self.embed(tokens)), self.pre_fc_norm_hidden(hidden)], axis=-1)
        )
        cache = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0], return_array=self.array_mask)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)

    def logits(self, h: mx.array) -> mx.array:
        return self.head(h)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]


def has_mtp(folder) -> bool:
    """Whether a model folder holds MTP layers (a checkpoint's MTP weights or a converted folder's FILE)."""
    folder = Path(folder)
    return (folder / FILE).is_file() or bool(_files(folder, _matcher(_config(folder)), probe=True))


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}


def _nextn_prefix(config: dict) -> str | None:
    """Where a DeepSeek-layout checkpoint of a family here keeps its (first) nextn layer, or None."""
    family = FAMILIES.get(config.get("model_type", ""))
    if family is None or not family.nextn or not config.get("num_nextn_predict_layers"):
        return None
    return f"model.layers.{config['num_hidden_layers']}."


def _matcher(config: dict) -> Callable[[str], bool]:
    prefix = _nextn_prefix(config)
    return (lambda k: k.startswith(prefix)) if prefix else _is_mtp


def _files(folder: Path, wanted: Callable[[str], bool], probe: bool = False) -> list[Path]:
    """The safetensors files of `folder` that hold `wanted` keys (by the index where there is one)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = {f for k, f in json.loads(index.read_text())["weight_map"].items() if wanted(k)}
        return [folder / n for n in sorted(names)]
    from safetensors import safe_open  # reads a file's header only

    out = []
    for f in sorted(folder.glob("model*.safetensors")):
        with safe_open(str(f), "numpy") as st:
            if any(wanted(k) for k in st.keys()):
                out.append(f)
                if probe:
                    break
    return out


def _is_mtp(key: str) -> bool:
    return key.startswith("mtp.") or ".mtp." in key


def weights(folder: Path) -> dict[str, mx.array]:
    """The MTP weights of a checkpoint as the module names them: `mtp.*` with its prefix dropped, HF's zero-centred
    norms made whole (the checkpoint's norms multiply by 1 + w), experts stacked as mlx-lm's `switch_mlp`; a nextn
    layer as `_nextn` reads it."""
    if (folder / FILE).is_file():
        return drafter_weights.safetensors(folder / FILE)
    config = _config(folder)
    prefix = _nextn_prefix(config)
    if prefix:
        return _nextn(folder, config, prefix)
    out = {}
    for f in _files(folder, _is_mtp):
        for k, v in drafter_weights.safetensors(f).items():
            if _is_mtp(k):
                k = k[k.index("mtp.") + 4 :]
                out[k] = v + 1.0 if k.endswith(NORMS) and v.ndim == 1 else v
    for k in [k for k in out if k.endswith(".experts.gate_up_proj")]:  # Qwen3.5-MoE: the experts fused, stacked
        base, gate_up = k[: -len(".experts.gate_up_proj")], out.pop(k)
        mid = gate_up.shape[-2] // 2
        out[f"{base}.switch_mlp.gate_proj.weight"], out[f"{base}.switch_mlp.up_proj.weight"] = (
            gate_up[..., :mid, :],
            gate_up[..., mid:, :],
        )
        out[f"{base}.switch_mlp.down_proj.weight"] = out.pop(f"{base}.experts.down_proj")
    experts: dict[tuple, dict[int, mx.array]] = {}
    for k in list(out):
        if m := re.fullmatch(r"(.*)\.experts\.(\d+)\.(\w+_proj)\.(\w+)", k):
            experts.setdefault((m[1], m[3], m[4]), {})[int(m[2])] = out.pop(k)
    for (base, proj, what), got in experts.items():
        out[f"{base}.switch_mlp.{proj}.{what}"] = mx.stack([got[i] for i in sorted(got)])
    return out


def _nextn(folder: Path, config: dict, prefix: str) -> dict[str, mx.array]:
    """A nextn layer's weights: sanitized by mlx-lm as the target's own layer 0 would be (experts stacked, MLA's
    `kv_b_proj` split, DeepSeek-V3's FP8 dequantized), its own weights renamed by NEXTN, its decoder layer as
    `layers.0`."""
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    args = arch.ModelArgs.from_dict(config)
    raw = {}
    for f in _files(folder, _matcher(config)):
        weights = drafter_weights.safetensors(f)
        raw.update({"model.layers.0." + k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)})
    if not raw:
        return {}
    out = {}
    for k, v in arch.Model(replace(args, num_hidden_layers=1)).sanitize(raw).items():  # a one-layer model: lazy
        rest = k[len("model.layers.0.") :]
        own = next((n for n in NEXTN if rest.startswith(n + ".")), None)
        out[NEXTN[own] + rest[len(own) :] if own else "layers.0." + rest] = v
    return out


def save(folder: Path, src: Path, dtype) -> int:
    """Write the MTP layers of checkpoint `src` into `folder`/FILE, cast to `dtype`; their parameter count (0 and
    nothing written where it has none)."""
    got = {
        k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and not k.endswith(KEEP_DTYPE) else v
        for k, v in weights(Path(src)).items()
    }
    if got:
        mx.save_safetensors(str(Path(folder) / FILE), got, metadata={"format": "mlx"})
    return sum(v.size for v in got.values())


def load(folder, target) -> MTP:
    """The MTP module of the checkpoint in `folder` over `target` (loaded from the same checkpoint); one line of
    refusal where the folder holds none or the target is of another family."""
    folder = Path(folder).expanduser()
    kind = getattr(getattr(target, "args", None), "model_type", type(target).__name__)
    if kind not in FAMILIES:
        raise SourceError(
            f"an MTP drafter runs the MTP layers of {', '.join(FAMILIES)} checkpoints; the target is {kind}"
        )
    config = _config(folder)
    act = (config.get("text_config") or config).get("hidden_act") or "silu"
    if layer_config.ACTS.get(act) is not nn.silu:  # mlx-lm's layers of these families run SiLU whatever it says
        raise UnsupportedError(f"{folder}: an MTP drafter with hidden_act={act!r} does not run here ({kind}: silu)")
    got = weights(folder)
    if not got:
        raise SourceError(
            f"{folder}: no MTP layers (the checkpoints that ship them here: Qwen3-Next's, mtp.*; "
            "DeepSeek-V3's and GLM-4.5+'s, model.layers.<num_hidden_layers>.*; a copy converted by "
            "mlx-lm has them dropped, one converted by mlx-spec keeps them)"
        )
    n = 1 + max(int(k.split(".")[1]) for k in got if k.startswith("layers."))
    return drafter_weights.fill(
        MTP(target, n, head="head.weight" in got, embed="embed_tokens.weight" in got),
        got,
        f"{folder}: its MTP weights do not fit the target",
    )
