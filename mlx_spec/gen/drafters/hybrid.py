"""Hybrid drafting: the context's own sources (suffix, n-gram) and a model (or self) source, chosen per round."""

from collections.abc import Sequence

from .base import Draft, Drafter


class HybridDrafter(Drafter):
    """Free parts (suffix, n-gram) the engine asks in order and a costly one its planner weighs against them."""

    name = "hybrid"

    def __init__(self, free: Sequence[Drafter], costly: Drafter | None = None, left_out: str | None = None):
        """left_out: the costly source asked for and refused by the target, with the refusal (it runs without it)."""
        self._parts = (*free, costly) if costly is not None else tuple(free)
        self.left_out = left_out

    @property
    def parts(self) -> Sequence[Drafter]:
        return self._parts

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        for d in self._parts:
            d.reset(prompt, target_cache)

    def propose(self, context: list[int], k: int, sampler=None) -> Draft:
        """The first part's non-empty draft, in order (for callers outside the engine)."""
        for d in self._parts:
            draft = d.propose(context, k, sampler)
            if len(draft):
                return draft
        return Draft.of([], source=self.name)
