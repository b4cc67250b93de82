"""Sampling distributions: the same temperature/top-p/top-k transform for plain decoding, drafts and verification."""

from typing import Callable, Optional

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p

from ..errors import GenerationError

ProbsFn = Callable[[mx.array], mx.array]


def validate(temp: float, top_p: float = 0.0, top_k: int = 0) -> None:
    """Clear errors for sampling options mlx-lm would reject or misuse."""
    if temp < 0:
        raise GenerationError(f"--temp must be >= 0, got {temp}")
    if not 0.0 <= top_p <= 1.0:
        raise GenerationError(f"--top-p must be in [0, 1], got {top_p}")
    if top_k < 0:
        raise GenerationError(f"--top-k must be >= 0, got {top_k}")


def make_probs_fn(temp: float = 0.0, top_p: float = 0.0, top_k: int = 0) -> Optional[ProbsFn]:
    """logits (..., V) -> the distribution mlx-lm's `make_sampler(temp, top_p, top_k)` samples from.

    None means greedy (temp == 0). Filters run on log-probabilities before the temperature,
    in mlx-lm's order, using mlx-lm's own filter functions, so plain and speculative
    sampling draw from exactly the same distribution.
    """
    validate(temp, top_p, top_k)
    if temp == 0:
        return None

    def probs_fn(logits: mx.array) -> mx.array:
        logprobs = logits.astype(mx.float32)
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if top_k > 0:
            logprobs = apply_top_k(logprobs, top_k)
        return mx.softmax(logprobs * (1.0 / temp), axis=-1)

    return probs_fn


def sample(probs: mx.array) -> mx.array:
    """One token id per row of `probs` (..., V)."""
    return mx.random.categorical(mx.log(probs))
