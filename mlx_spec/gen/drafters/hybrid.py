"""Hybrid drafting: the context's own sources (suffix, n-gram) and a model (or self) source, chosen per round."""

from typing import List, Optional, Sequence

from .base import Draft, Drafter


class HybridDrafter(Drafter):
    """The suffix automaton where the context has a match, the n-gram table where it has none, and a costly
    source (a draft model, self, quant-self) the engine's planner weighs against them each round.

    It does not choose: the engine asks the free parts in order (the first with a draft offers it, so the n-gram is
    judged only where it could be chosen) and the planner weighs that draft against the costly part by their
    measured acceptance and cost.
    """

    name = "hybrid"

    def __init__(self, free: Sequence[Drafter], costly: Optional[Drafter] = None):
        self._parts = (*free, costly) if costly is not None else tuple(free)

    @property
    def parts(self) -> Sequence[Drafter]:
        return self._parts

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        for d in self._parts:
            d.reset(prompt, target_cache)

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        """The first part's non-empty draft, in order (for callers outside the engine)."""
        for d in self._parts:
            draft = d.propose(context, k, probs_fn)
            if len(draft):
                return draft
        return Draft([], source=self.name)
