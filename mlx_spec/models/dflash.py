"""DFlash block drafters (z-lab's, e.g. `z-lab/Qwen3-8B-DFlash-b16`): the network over a target and its loader.

The published layout: a Qwen3 config.json with `dflash_config` (`target_layer_ids`: the target blocks whose outputs
it reads, `mask_token_id`), `block_size` and `num_target_layers`; safetensors weights `fc` (the read states side by
side -> hidden), `hidden_norm`, `layers.N.*` (Qwen3 decoder layers: q/k/v/o projections, q/k norms, MLP, two norms)
and `norm`; the token embedding and output layer are the target's. Drafting a block: the target's states, projected
(`fc`, `hidden_norm`), give each layer's keys and values of the context (its cache holds them, no block's); the block
[last known token, mask, mask, ...] is embedded and run through the layers, attending to the context and, without a
causal mask, to the whole block; the output layer reads it after `norm`, position j + 1 giving draft j.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3
from mlx_lm.models.cache import KVCache

from ..errors import SourceError, UnsupportedError
from . import drafter_weights, layer_config, rope
from .base import text_of

WHAT = "a DFlash drafter"  # the refusals' subject
UNSUPPORTED = {  # what other DFlash variants add, each a one-line refusal: (key in config or dflash_config, default)
    "causal": False,
    "dflash_query_causal": False,
    "attention_sink_bias": False,
    "final_logit_softcapping": None,
    "output_multiplier": 1.0,
    "input_embedding_scale": 1.0,
    "projector_type": None,
    "markov_rank": 0,
}


@dataclass
class DFlashConfig:
    """What a drafter is: its Qwen3 layers, the target blocks it reads, its block and mask token."""

    layer: dict  # the decoder layers' Qwen3 config (hidden_size, heads, rope ...): the config.json itself
    reads: list[int]  # `target_layer_ids`: the target blocks whose outputs it reads, in the order `fc` takes them
    block_size: int  # positions of the block it was trained on: the last known token and block_size - 1 masks
    mask_token_id: int  # the token of a masked position (an id of the target's embedding)
    target_layers: int | None = None  # `num_target_layers`: the blocks of the target it was made for

    @classmethod
    def from_dict(cls, c: dict) -> "DFlashConfig":
        """A z-lab config.json (a value in `dflash_config` wins over the same key at the top, as z-lab reads it)."""
        extra = c.get("dflash_config")
        if not isinstance(extra, dict) and not any("DFlash" in a for a in c.get("architectures") or ()):
            raise SourceError("not a DFlash drafter: config.json has no dflash_config")
        extra = extra or {}

        def value(key, default=None):
            return extra.get(key, c.get(key, default))

        if any("DFlash2" in a for a in c.get("architectures") or ()):
            raise UnsupportedError("DFlash2 drafters (a candidate selector and convolutions) do not run here")
        for key, default in UNSUPPORTED.items():
            if value(key, default) not in (default, None):
                raise UnsupportedError(
                    f"{WHAT} with {key}={value(key)!r} does not run here (only z-lab's "
                    "Qwen3 layout: non-causal blocks, the target's plain embedding and head)"
                )
        layer_config.check(c, WHAT)
        reads, mask = value("target_layer_ids"), value("mask_token_id")
        if not reads or mask is None:
            raise SourceError("a DFlash config needs dflash_config.target_layer_ids and mask_token_id")
        if "hidden_size" not in c or "num_attention_heads" not in c:
            raise SourceError("not a DFlash config: no hidden_size / num_attention_heads")
        target_layers = value("num_target_layers")
        config = cls(
            rope.normalize(c, "qwen3"),
            [int(i) for i in reads],
            int(value("block_size", 16)),
            int(mask),
            int(target_layers) if target_layers is not None else None,
        )
        config.args()  # a layer config mlx-lm's Qwen3 takes, or a TypeError here
        return config

    def args(self) -> qwen3.ModelArgs:
        """The decoder layers' arguments for mlx-lm's Qwen3 (what z-lab's configs leave out: Qwen3's defaults)."""
        c = self.layer
        return qwen3.ModelArgs.from_dict(
            dict(
                c,
                model_type="qwen3",
                head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                num_key_value_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
                max_position_embeddings=c.get("max_position_embeddings", 32768),
                tie_word_embeddings=c.get("tie_word_embeddings", False),
                rope_theta=c.get("rope_theta", 1000000.0),
                rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                vocab_size=c.get("vocab_size", 0),
            )
        )


class DFlash(nn.Module):
    """The drafter over a target: `context` adds the projected target states to its cache, `block` gives the states
    of a block of tokens beside them, `logits` reads those with the target's output layer."""

    def __init__(self, config: DFlashConfig, target=None):
        """target: the model whose embedding and output layer it reads (outside its parameters); None: weights only."""
        super().__init__()
        self.config = config
        args = config.args()
        d = args.hidden_size
        self.fc = nn.Linear(len(config.reads) * d, d, bias=False)
        self.hidden_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.layers = [qwen3.TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        layer_config.honour(self.layers, dict(config.layer, model_type="qwen3"), WHAT)
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        if target is not None:  # the target's, shared: never copied, trained or saved with the drafter
            text = text_of(target)  # through a vision-language wrapper
            object.__setattr__(self, "embed", text.embed)
            object.__setattr__(self, "head", text.logits)

    @property
    def hidden_size(self) -> int:
        return self.fc.weight.shape[0]

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def context(self, states: mx.array, cache: list) -> None:
        """Append the keys and values of target states (B, S, len(reads) * d) to every layer's cache, at the
        positions that follow what each row of the cache holds."""
        h = self.hidden_norm(self.fc(states))  # (B, S, d): one projected context for every layer
        B, S, _ = h.shape
        for layer, c in zip(self.layers, cache):
            a = layer.self_attn
            keys = a.k_norm(a.k_proj(h).reshape(B, S, a.n_kv_heads, -1)).transpose(0, 2, 1, 3)  # (B, kv, S, hd)
            values = a.v_proj(h).reshape(B, S, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            c.update_and_fetch(a.rope(keys, offset=c.offset), values)

    def block(self, tokens: mx.array, cache: list, mask: mx.array | None = None) -> mx.array:
        """Normed states (B, L, d) of a block of tokens (B, L) following the context each row's cache holds, every
        position seeing the whole block (mask: which cached columns each row may see, None: all). The block's keys
        are appended to the cache: the caller trims them."""
        h = self.embed(tokens)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)

    def logits(self, h: mx.array) -> mx.array:
        """The target's logits of drafter states h."""
        return self.head(h)


def load(folder, target=None) -> DFlash:
    """The drafter in `folder` (config.json + safetensors as z-lab ships them) over `target` (its embedding and
    output layer); a folder that is not a DFlash drafter, a variant that does not run here, or a missing, extra or
    misshapen weight is a one-line error."""
    folder = Path(folder).expanduser()
    try:
        config = DFlashConfig.from_dict(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{folder}: not a DFlash drafter: {type(e).__name__}: {e}") from None
    except (SourceError, UnsupportedError) as e:
        raise type(e)(f"{folder}: {e}") from None
    return drafter_weights.fill(
        DFlash(config, target),
        drafter_weights.read(folder),
        f"{folder}: weights do not fit the DFlash config",
        config.layer.get("quantization"),
    )
