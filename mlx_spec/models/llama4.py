"""llama4 over a joint cache: mlx-lm's text body builds one chunk mask from the first layer's offset and its global
layers scale queries by one offset, for all rows; a view of it runs each row by its own positions."""

import copy

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.models.llama4 import Attention, LlamaModel

from .base import text_of


class RowsAttention(Attention):
    """A global (no-RoPE) attention whose query temperature follows each row's positions over a joint cache (mlx-lm's
    `Attention` reads them from one offset); alone, mlx-lm's own."""

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        if not isinstance(cache, BatchKVCache):
            return super().__call__(x, mask, cache)
        B, L, _ = x.shape
        queries = self.q_proj(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)  # (B, n_heads, L, head_dim)
        keys = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)  # (B, n_kv_heads, L, head_dim)
        values = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        pos = cache.offset[:, None] + mx.arange(1, L + 1)[None]  # (B, L) each row's positions, counted from 1
        scales = mx.log(mx.floor(pos / self.floor_scale) + 1.0) * self.attn_scale + 1.0
        queries = (queries * scales[:, None, :, None]).astype(queries.dtype)
        keys, values = cache.update_and_fetch(keys, values)
        out = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))  # (B, L, n_heads * head_dim)


class RowsBody(LlamaModel):
    """mlx-lm's llama4 text body whose layers, over a joint cache, each take their cache's mask (each row's own
    chunk by its positions: `RaggedKVCache.make_mask`); alone, mlx-lm's own pass."""

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        if cache is None or not isinstance(cache[0], BatchKVCache):
            return super().__call__(inputs, cache)
        h = self.embed_tokens(inputs)
        masks: dict = {}  # one for the chunked layers, one for the global ones (their caches hold the same columns)
        for layer, c in zip(self.layers, cache):
            if c.chunk not in masks:
                masks[c.chunk] = create_attention_mask(h, c)
            h = layer(h, masks[c.chunk], cache=c)
        return self.norm(h)


def _as(cls, module):
    """A shallow copy of `module` (sharing its weights) that runs as `cls`, a subclass of its own; `module` stays."""
    out = copy.copy(module)
    out.__class__ = cls
    return out


def _block(block):
    """`block`, or a copy whose global attention scales each row's queries by its positions."""
    attn = block.self_attn
    if attn.use_rope or not attn.attn_temperature_tuning:
        return block
    out = copy.copy(block)
    out.self_attn = _as(RowsAttention, attn)
    return out


def by_rows(model):
    """A view of `model` whose llama4 text body runs a joint cache's rows each by its own positions (the model
    itself where its body is not mlx-lm's llama4); `model` is unchanged."""
    text = text_of(model)
    if not isinstance(text.body, LlamaModel) or text.path is None:
        return model
    path = text.path.split(".")
    copies = [copy.copy(model)]
    for name in path:
        copies.append(copy.copy(getattr(copies[-1], name)))
    copies[-1] = body = _as(RowsBody, copies[-1])
    body.layers = [_block(b) for b in body.layers]
    for parent, name, child in zip(copies[:-1], path, copies[1:]):
        setattr(parent, name, child)
    return copies[0]
