"""Sampling: one temperature/top-p/top-k transform for plain decoding, drafts and verification; a row's rule."""

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p

from ..errors import GenerationError

_MIX = 0x9E3779B97F4A7C15  # splitmix64's increment: (seed, position) -> a key of its own


def validate(temp: float, top_p: float = 0.0, top_k: int = 0) -> None:
    """Clear errors for sampling options mlx-lm would reject or misuse."""
    if temp < 0:
        raise GenerationError(f"--temp must be >= 0, got {temp}")
    if not 0.0 <= top_p <= 1.0:
        raise GenerationError(f"--top-p must be in [0, 1], got {top_p}")
    if top_k < 0:
        raise GenerationError(f"--top-k must be >= 0, got {top_k}")


def sample(probs: mx.array) -> mx.array:
    """One token id per row of `probs` (..., V)."""
    return mx.random.categorical(mx.log(probs))


@dataclass(frozen=True)
class Sampler:
    """A row's sampling rule: greedy (temp 0), speculative sampling, or with a seed the Gumbel-max rule: the token at t
    is argmax(log q_t + g_t), g_t keyed by (seed, t) alone; a draft is accepted where it equals that token."""

    temp: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        validate(self.temp, self.top_p, self.top_k)

    def probs(self, logits: mx.array) -> mx.array:
        """The distribution (..., V) mlx-lm's `make_sampler(temp, top_p, top_k)` samples from at `logits` (..., V), by
        its own filters in its order, so plain and speculative sampling draw from the same law (temp > 0)."""
        if self.temp == 0:
            raise GenerationError("a greedy rule samples from no distribution")
        logprobs = logits.astype(mx.float32)
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        return mx.softmax(logprobs * (1.0 / self.temp), axis=-1)

    @property
    def exact(self) -> bool:
        """Whether a draft token is accepted where it equals the row's own token (greedy, or seeded)."""
        return self.temp == 0 or self.seed is not None

    def pick(self, logits: mx.array, position: int) -> mx.array:
        """The token at each row of logits (n, V), the first at `position` (lazy): greedy or seeded."""
        if self.temp == 0:
            return mx.argmax(logits, axis=-1)
        q = self.probs(logits)
        noise = mx.stack([mx.random.gumbel(shape=q.shape[-1:], key=self._key(position + i)) for i in range(len(q))])
        return mx.argmax(mx.log(q) + noise, axis=-1)

    def draw(self, logits: mx.array, position: int) -> mx.array:
        """One plain step's token from logits (1, V) at `position` (lazy)."""
        return self.pick(logits, position) if self.exact else sample(self.probs(logits))

    def _key(self, position: int) -> mx.array:
        if self.seed is None:
            raise GenerationError("an unseeded rule has no noise keyed by position")
        z = (self.seed * _MIX + position + 1) & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return mx.random.key((z ^ (z >> 31)) & (2**63 - 1))


GREEDY = Sampler()
