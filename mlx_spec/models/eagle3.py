"""EAGLE-3 heads: the network (one decoder layer over the target's token embedding and three of its hidden states),
read from the formats people publish (`make.heads` writes them in the speculators layout).

Formats read: vLLM's `speculators` (config `speculators_model_type: eagle3`, the layer config under
`transformer_layer_config`, a Llama or Qwen3 decoder layer, weights `layers.0.*`) and the SafeAILab/EAGLE and
SpecForge/AngelSlim checkpoints (a Llama config with `draft_vocab_size`, weights `midlayer.*`). Both: `fc` (3 target
states -> hidden), `norm`, `lm_head` over a draft vocabulary, `d2t` (draft id -> target id - draft id), `embed_tokens`
when the head ships its own; speculators adds `t2d` (which target ids the draft vocabulary holds).
"""

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen3
from mlx_lm.models.base import create_attention_mask

from ..errors import SourceError, UnsupportedError
from . import drafter_weights, layer_config, rope

FILE = "model.safetensors"
ARCHS = {"llama": llama, "qwen3": qwen3}  # the decoder layers a head runs (speculators' --draft-arch)
SPECULATIVE_TOKENS = 3  # the drafts a round that the saved config proposes to vLLM (speculators' converter's value)
UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")  # speculators' options that add norms this head lacks
WHAT = "an EAGLE-3 head"  # the refusals' subject


@dataclass
class Eagle3Config:
    """What a head is: its layer shape (a Llama or Qwen3 config), its vocabularies, the target layers it reads and the
    target it was made for."""

    layer: dict  # the decoder layer's config (model_type, hidden_size, heads, rope ...)
    vocab_size: int  # the target's vocabulary, which the head embeds
    draft_vocab_size: int
    target_hidden_size: int
    reads: list[int] = field(default_factory=list)  # target layers whose outputs it reads; [] until bound
    norm_before_residual: bool = False
    layers: int = 1
    verifier: dict = field(default_factory=dict)  # speculators': the target's name_or_path and architectures
    speculative_tokens: int = SPECULATIVE_TOKENS  # speculators': the drafts a round its proposal makes

    @classmethod
    def from_dict(cls, c: dict) -> "Eagle3Config":
        """A config.json of either published layout."""
        layer = dict(c.get("transformer_layer_config") or c)
        if "hidden_size" not in layer or "num_attention_heads" not in layer:
            raise SourceError("not an EAGLE-3 config: no hidden_size / num_attention_heads")
        kind = layer.get("model_type") or "llama"
        if "transformer_layer_config" in c and kind not in ARCHS:
            raise UnsupportedError(
                f"transformer_layer_config.model_type={kind!r}: EAGLE-3 heads run {' or '.join(ARCHS)} layers here"
            )
        layer["model_type"] = kind if kind in ARCHS else "llama"  # SafeAILab's layout: a Llama layer
        for key in UNSUPPORTED:
            if c.get(key):
                raise UnsupportedError(f"{WHAT} with {key}={c[key]!r} does not run here")
        layer_config.check(layer, WHAT)
        layer = _filled(rope.normalize(layer))
        aux = c.get("eagle_aux_hidden_state_layer_ids") or (c.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids"
        )
        if aux and min(aux) < 1:
            raise UnsupportedError(f"EAGLE-3 head reads the input of layer {min(aux)}: only layers from 1 are tapped")
        spec = c.get("speculators_config") or {}
        proposals = spec.get("proposal_methods") or [{}]
        return cls(
            layer,
            int(layer.get("vocab_size", c.get("vocab_size", 0))),
            int(c.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer["vocab_size"]),
            int(c.get("target_hidden_size") or layer["hidden_size"]),
            [i - 1 for i in aux] if aux else [],
            bool(c.get("norm_before_residual", False)),
            int(layer.get("num_hidden_layers", 1)),
            dict(spec.get("verifier") or {}),
            int(proposals[0].get("speculative_tokens") or SPECULATIVE_TOKENS),
        )

    def to_dict(self) -> dict:
        """The speculators layout (what `load` reads back, and speculators, vLLM and mlx-vlm's EAGLE-3 loader read)."""
        return {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": dict(
                self.layer,
                num_hidden_layers=self.layers,
                vocab_size=self.vocab_size,
                hidden_act=self.layer.get("hidden_act") or "silu",  # what the head computes, said whatever the default
            ),
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "norm_before_residual": self.norm_before_residual,
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in self.reads],
            "speculators_config": {  # vLLM requires the proposal's speculative_tokens and the verifier's name_or_path
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": self.speculative_tokens}],
                "default_proposal_method": "greedy",
                "verifier": {
                    "name_or_path": self.verifier.get("name_or_path"),
                    "architectures": list(self.verifier.get("architectures") or []),
                },
            },
        }


def _filled(layer: dict) -> dict:
    """A layer config with the fields mlx-lm's arguments need that it leaves out, from transformers' config class of
    its model type (speculators writes only the values that differ from that class's)."""
    arch = ARCHS[layer["model_type"]]
    required = [f.name for f in fields(arch.ModelArgs) if f.default is MISSING and f.default_factory is MISSING]
    need = [k for k in required if k not in layer]
    if not {"rope_theta", "rope_parameters", "rope_scaling"} & set(layer):
        need.append("rope_parameters")  # transformers' default theta, not mlx-lm's
    if not need:
        return layer
    from transformers import AutoConfig

    full = AutoConfig.for_model(layer["model_type"], **{k: v for k, v in layer.items() if k != "model_type"}).to_dict()
    return rope.normalize(dict(layer, **{k: full[k] for k in need if full.get(k) is not None}))


def default_reads(n_layers: int) -> list[int]:
    """The layers EAGLE-3 reads when a head does not say: the outputs of blocks 1, n/2 - 1 and n - 4 (the inputs of
    blocks 2, n/2 and n - 3, as SafeAILab/EAGLE, SpecForge and vLLM tap them)."""
    return [1, n_layers // 2 - 1, n_layers - 4]


class FirstLayer(nn.Module):
    """The head's first decoder layer: attention over [norm(embedding), norm(hidden)], the residual the hidden."""

    def __init__(self, args, norm_before_residual: bool, arch=llama):
        """arch: the mlx-lm module in ARCHS whose attention (Qwen3's with its q/k norms) and MLP it runs."""
        super().__init__()
        d = args.hidden_size
        self.self_attn = arch.Attention(args)
        a = self.self_attn  # q/k/v read both halves: mlx-lm's attention with wider input projections
        for name in ("q_proj", "k_proj", "v_proj"):
            p = getattr(a, name)
            setattr(a, name, nn.Linear(2 * d, p.weight.shape[0], bias="bias" in p))
        self.mlp = arch.MLP(args) if arch is llama else arch.MLP(d, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def __call__(self, embeds: mx.array, hidden: mx.array, mask, cache) -> mx.array:
        normed = self.hidden_norm(hidden)
        h = (normed if self.norm_before_residual else hidden) + self.self_attn(
            mx.concatenate([self.input_layernorm(embeds), normed], axis=-1), mask, cache
        )
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """The head: states (B, L, d) from tokens (B, L) and, at each position, the target's three states (3 T) there or
    the head's own state (d) of the position before; `logits` reads the draft vocabulary, `ids` maps it to the
    target's."""

    def __init__(self, config: Eagle3Config, embed: nn.Module | None = None):
        super().__init__()
        self.config = config
        arch = ARCHS[config.layer.get("model_type", "llama")]
        args = arch.ModelArgs.from_dict(
            dict(config.layer, vocab_size=config.vocab_size, num_hidden_layers=config.layers)
        )
        d = args.hidden_size
        if embed is None:
            self.embed_tokens = nn.Embedding(config.vocab_size, d)
        else:  # the target's embedding, outside the head's parameters: read, never trained or saved with it
            object.__setattr__(self, "shared", embed)
        self.fc = nn.Linear(3 * config.target_hidden_size, d, bias=False)
        self.layers = [FirstLayer(args, config.norm_before_residual, arch)] + [
            arch.TransformerBlock(args) for _ in range(1, config.layers)
        ]
        layer_config.honour(self.layers, config.layer, WHAT)
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.lm_head = nn.Linear(d, config.draft_vocab_size, bias=False)
        self.d2t = mx.zeros((config.draft_vocab_size,), dtype=mx.int32)

    @property
    def hidden_size(self) -> int:
        return self.fc.weight.shape[0]

    def __call__(self, tokens: mx.array, hidden: mx.array, cache: list | None = None, mask=None) -> mx.array:
        """mask: the attention's (a draft tree's), else causal."""
        if hidden.shape[-1] != self.hidden_size:
            hidden = self.fc(hidden)
        cache = cache if cache is not None else [None] * len(self.layers)
        mask = mask if mask is not None else create_attention_mask(hidden, cache[0])
        h = self.layers[0](self.embed(tokens), hidden, mask, cache[0])
        for layer, c in zip(self.layers[1:], cache[1:]):
            h = layer(h, mask, c)
        return h

    def embed(self, tokens: mx.array) -> mx.array:
        """The tokens' embedding: the head's own, or the target's it was given."""
        return self.embed_tokens(tokens) if "embed_tokens" in self else self.shared(tokens)

    def logits(self, h: mx.array) -> mx.array:
        """Draft-vocabulary logits of head states h."""
        return self.lm_head(self.norm(h))

    def ids(self) -> mx.array:
        """The target id of each draft-vocabulary id."""
        return mx.arange(self.d2t.size, dtype=mx.int32) + self.d2t.astype(mx.int32)


def tensors(head: Eagle3Head) -> dict[str, mx.array]:
    """What a head saves, as speculators names and types it: its parameters, `d2t` as int64 and, where the draft
    vocabulary is a part of the target's, `t2d` (the target ids it holds, a mask over the target vocabulary)."""
    out = dict(tree_flatten(head.parameters()))
    out["d2t"] = head.d2t.astype(mx.int64)
    if head.config.draft_vocab_size != head.config.vocab_size:
        out["t2d"] = mx.zeros((head.config.vocab_size,), dtype=mx.int32).at[head.ids()].add(1).astype(mx.bool_)
    return out


def _weights(folder: Path) -> dict[str, mx.array]:
    """A head's weights in this module's names (SafeAILab's `midlayer` is layer 0)."""
    out = {}
    for k, v in drafter_weights.read(folder).items():
        if k.startswith("midlayer."):
            k = "layers.0." + k[len("midlayer.") :]
        if k == "t2d" or k.startswith("verifier_"):
            continue  # the target->draft mask (d2t says it), the verifier's copies
        out[k] = v.astype(mx.int32) if k == "d2t" else v
    return out


def is_head(config: dict) -> bool:
    """Whether a config.json is an EAGLE-3 head's, in either published layout."""
    return config.get("speculators_model_type") == "eagle3" or any(
        "eagle3" in a.lower() for a in config.get("architectures") or ()
    )


def load(folder, embed: nn.Module | None = None) -> Eagle3Head:
    """The head in `folder` (config.json + safetensors, either layout); `embed`: the target's embedding, used where
    the head ships none (none given: the head has no embedding, to be converted or saved only). A missing, extra or
    misshapen weight is a one-line error."""
    folder = Path(folder).expanduser()
    try:
        config = Eagle3Config.from_dict(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{folder}: not an EAGLE-3 head: {type(e).__name__}: {e}") from None
    weights = _weights(folder)
    if config.draft_vocab_size == config.vocab_size and "d2t" not in weights:
        weights["d2t"] = mx.zeros((config.draft_vocab_size,), dtype=mx.int32)
    if (
        "lm_head.weight" not in weights
        and config.draft_vocab_size == config.vocab_size
        and "embed_tokens.weight" in weights
    ):
        weights["lm_head.weight"] = weights["embed_tokens.weight"]  # tied
    own = "embed_tokens.weight" in weights
    head = Eagle3Head(config, None if own or embed is None else embed)
    if not own and embed is None:
        head.pop("embed_tokens")  # never allocated: its random initialisation was lazy
    return drafter_weights.fill(
        head, weights, f"{folder}: weights do not fit the EAGLE-3 config", config.layer.get("quantization")
    )
