"""Hybrid drafting: the N-gram draft where the context has a match, a model (or self) draft elsewhere."""

from typing import List

from .base import Draft, Drafter


class HybridDrafter(Drafter):
    """Asks the free N-gram drafter first and falls back to the model drafter only on a miss."""

    name = "hybrid"

    def __init__(self, ngram: Drafter, fallback: Drafter):
        self.ngram, self.fallback = ngram, fallback
        self.last = None  # which drafter made the last draft, for feedback

    def reset(self, prompt: List[int]) -> None:
        self.ngram.reset(prompt)
        self.fallback.reset(prompt)

    def bind(self, target_cache) -> None:
        if hasattr(self.fallback, "bind"):
            self.fallback.bind(target_cache)

    def source(self, context: List[int]) -> str:
        """'ngram' when the n-gram table would draft here, else the fallback's name."""
        return self.ngram.name if self.ngram.propose(context, 1).tokens else self.fallback.name

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        draft = self.ngram.propose(context, k, probs_fn)
        self.last = self.ngram
        if not draft.tokens:
            draft = self.fallback.propose(context, k, probs_fn)
            self.last = self.fallback
        return draft

    def feedback(self, proposed: int, accepted: int) -> None:
        if self.last is not None:
            self.last.feedback(proposed, accepted)
