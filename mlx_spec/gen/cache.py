"""Helpers over mlx-lm's per-layer caches: prefill, tokens held, rewinding and copying all layers, the context limit."""

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache, trim_prompt_cache

from ..device import builds_per_shape
from ..models.base import text_of
from ..models.cache import rewindable
from . import hidden, recurrent, shapes
from .tunables import PREFILL_STEP


def cache_tokens(cache: list) -> int | None:
    """Tokens held by every layer of `cache`, or None if the layers disagree (an interrupted update)."""
    offsets = {getattr(c, "offset", None) for c in cache}
    return offsets.pop() if len(offsets) == 1 and None not in offsets else None


def rewind(cache: list, n_tokens: int) -> bool:
    """Trim every layer back to `n_tokens` tokens; False where one cannot go that far (rebuild the cache then)."""
    ok = True
    for c in cache:
        extra = getattr(c, "offset", 0) - n_tokens
        if extra > 0:
            trimmed = c.trim(extra) if c.is_trimmable() else 0
            ok = ok and (trimmed is None or trimmed >= extra)
    return ok


def copy_prefix(cache: list, n: int, own: bool = True) -> list | None:
    """Attention caches holding the first `n` tokens of `cache` (own: in memory of their own, else views that copy
    on their first write); None where a layer is not a plain KV cache or holds fewer tokens."""
    if any(type(c) is not KVCache or c.offset < n for c in cache):
        return None
    out = [KVCache() for _ in cache]
    for c, o in zip(cache, out):
        if n:
            k, v = c.keys[..., :n, :], c.values[..., :n, :]  # (B, n_kv_heads, n, head_dim)
            o.keys, o.values = (mx.contiguous(k), mx.contiguous(v)) if own else (k, v)
            o.offset = n
    if own and n:
        mx.eval([c.keys for c in out] + [c.values for c in out])
    return out


def new_cache(model) -> list:
    """mlx-lm's cache for `model` (one object per layer), its recurrent layers rewindable."""
    cache = rewindable(make_prompt_cache(model))
    assert cache is not None  # an empty cache's length is known, so every layer rewinds
    return cache


def context_limit(model) -> int | None:
    """The model's maximum context, if its config states one."""
    args = text_of(model).args
    return getattr(args, "max_position_embeddings", None) or getattr(args, "context_length", None)


def prefill_cache(model, cache, tokens: list[int], room: int | None, readers: Sequence = ()) -> None:
    """Feed `tokens` in chunks, the last padded to a size built before where that is possible (room: context left);
    `readers`: drafters that read the target's hidden states, given those of the tokens fed."""
    pad = builds_per_shape() and all(type(c) is KVCache for c in cache)  # dummies trimmed at once: attention only
    read = hidden.reads(readers)
    run = hidden.taps(model, read) if read else None
    model, at = recurrent.recording(model), cache_tokens(cache) or 0
    for i in range(0, len(tokens), PREFILL_STEP):
        chunk = tokens[i : i + PREFILL_STEP]
        size = shapes.padded(len(chunk)) if pad else len(chunk)
        if room is not None and i + size > room:
            size = len(chunk)
        x = mx.array(chunk + chunk[-1:] * (size - len(chunk)))[None]
        if run is None:
            model(x, cache=cache)
        else:
            states = run(x, cache)[1][0, : len(chunk)]
        trim_prompt_cache(cache, size - len(chunk))  # the dummy positions
        mx.eval([c.state for c in cache], states if run is not None else [])
        if run is not None:
            hidden.show(readers, at + i, states, read)
