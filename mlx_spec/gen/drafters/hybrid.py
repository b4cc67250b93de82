"""Hybrid drafting: an n-gram source and a model (or self) source; the engine's policy picks one each round."""

from typing import Dict, List, Optional, Set, Tuple

from .base import Draft, Drafter


class HybridDrafter(Drafter):
    """Offers the free n-gram draft where the context has a match and the model draft always.

    It does not choose: the policy weighs each source's measured acceptance and cost per round.
    """

    name = "hybrid"

    def __init__(self, ngram: Drafter, fallback: Drafter):
        self.ngram, self.fallback = ngram, fallback
        self._owner = {ngram.name: ngram, fallback.name: fallback}

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        self.ngram.reset(prompt, target_cache)
        self.fallback.reset(prompt, target_cache)

    def sources(self, context: List[int]) -> Dict[str, int]:
        """The n-gram source first (where it matches), then the fallback's sources."""
        return {**self.ngram.sources(context), **self.fallback.sources(context)}

    def free_sources(self) -> Set[str]:
        return self.ngram.free_sources() | self.fallback.free_sources()

    def lag(self, source: str, context: List[int]) -> int:
        return self._owner[source].lag(source, context)

    def step_cost(self, source: str) -> Tuple[Optional[float], Optional[float]]:
        return self._owner[source].step_cost(source)

    def propose(self, context: List[int], k: int, probs_fn=None, source: Optional[str] = None) -> Draft:
        """From `source`; with none given, the n-gram draft, else the fallback's."""
        if source is None:
            draft = self.ngram.propose(context, k, probs_fn)
            return draft if draft.tokens else self.fallback.propose(context, k, probs_fn)
        return self._owner[source].propose(context, k, probs_fn, source)

    def feedback(self, source: str, proposed: int, accepted: int) -> None:
        self._owner[source].feedback(source, proposed, accepted)
