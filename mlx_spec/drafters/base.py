"""The one interface every drafter implements; the verifier never knows which drafter it has."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx


@dataclass
class Draft:
    """Up to k proposed tokens.

    probs: (n, V) the draft distribution each token was sampled from, after the same
    temperature/top-p/top-k transform the target uses. None means deterministic: the
    verifier treats each token as drawn from a one-hot distribution.
    """

    tokens: List[int]
    probs: Optional[mx.array] = None


class Drafter:
    """Proposes tokens that continue `context`; learns from how many were accepted.

    `context` is always the full token list so far (prompt + accepted output, including the
    token the target produced last and has not yet consumed). A drafter keeps whatever
    state it needs (a KV cache, an n-gram table) and brings it up to date from `context`
    itself, so callers never replay tokens into it.
    """

    name = "drafter"

    def reset(self, prompt: List[int]) -> None:
        """Start a new generation whose context begins with `prompt`."""

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        """Return at most k tokens continuing `context` (possibly none).

        probs_fn: None for greedy decoding; otherwise a function mapping logits (..., V)
        to the sampling distribution, which model drafters sample from and return.
        """
        raise NotImplementedError

    def source(self, context: List[int]) -> str:
        """Which of its sources the next draft would come from (a hybrid has two); the engine
        keeps acceptance and cost statistics per source."""
        return self.name

    def feedback(self, proposed: int, accepted: int) -> None:
        """The verifier accepted `accepted` of the `proposed` tokens of the last draft."""
