"""Verification that reuses a first-L self draft: the draft's pass through blocks 0..L-1 is the target's own.

A self draft with the contiguous first L blocks writes the target's cache for those blocks, and the hidden
state it leaves after block L-1 is exactly what the target computes there. So the verify pass keeps those
cache entries and runs the drafted positions through blocks L..N-1 only (plus the last draft token, which no
draft step fed, through the first L). On this CPU a verify pass over k+1 tokens costs 1.2-1.8x one over a
single token, so sparing the first L blocks the extra positions saves part of every round.

Both halves run through mlx-lm's own model code: views of the target (shallow copies sharing its weights)
with blocks 0..L-1 and no final norm, and with blocks L..N-1 fed `input_embeddings`. A model whose forward
is not that split (probed once on three tokens) keeps the plain verify pass.
"""

import inspect
from typing import List

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from ..cache import rewind


class _Identity(nn.Module):
    def __call__(self, x):
        return x


def prefix_view(model, layer_view, n: int):
    """Runs embed -> blocks 0..n-1 and returns the hidden state before the final norm."""
    view = layer_view(model, range(n))
    view.model.norm = _Identity()
    return view


def supports(model, layer_view, n: int) -> bool:
    """Whether model(x) equals the suffix view fed the prefix view's hidden states (a probe on scratch caches)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not 0 < n < len(layers):
        return False
    if "input_embeddings" not in inspect.signature(type(model).__call__).parameters:
        return False
    try:
        cache = make_prompt_cache(model)
        if not all(c.is_trimmable() and hasattr(c, "offset") for c in cache):
            return False
        x = mx.array([[1, 2, 3]])
        h = prefix_view(model, layer_view, n).model(x, cache=cache[:n])
        split = layer_view(model, range(n, len(layers)))(None, cache=cache[n:], input_embeddings=h)
        return split.shape == model(x).shape and mx.allclose(split, model(x), rtol=1e-3, atol=1e-3).item()
    except Exception:  # a model laid out differently: keep the plain verify pass
        return False


class Reuse:
    """The verify pass of one round: the hidden states the draft kept, then blocks n.. on every position."""

    def __init__(self, prefix, suffix, cache: List, n: int, offset: int, kept: List[mx.array]):
        self.prefix, self.suffix, self.cache, self.n, self.offset, self.kept = prefix, suffix, cache, n, offset, kept

    def __call__(self, tokens: List[int]) -> mx.array:
        """Logits (len(tokens), V) for the verify tokens [last context token] + draft, as model() gives them."""
        hidden = mx.concatenate(self.kept, axis=1) if self.kept else None
        fed = 0 if hidden is None else hidden.shape[1]
        if fed > len(tokens):  # the engine cut the draft: the first blocks drop the positions it will not verify
            rewind(self.cache[: self.n], self.offset + len(tokens))
            hidden, fed = hidden[:, : len(tokens)], len(tokens)
        if fed < len(tokens):  # the last draft token(s): no draft step fed them
            more = self.prefix.model(mx.array(tokens[fed:])[None], cache=self.cache[: self.n])
            hidden = more if hidden is None else mx.concatenate([hidden, more], axis=1)
        return self.suffix(None, cache=self.cache[self.n:], input_embeddings=hidden)[0]
