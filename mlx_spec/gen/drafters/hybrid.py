"""Hybrid drafting: free sources (n-gram, suffix) and a model (or self) source; the engine's policy picks one each
round. A suffix draft that ends early may be continued by the model in the same round (source "suffix+model")."""

from typing import Dict, List, Optional, Sequence, Set, Tuple

import mlx.core as mx

from .base import Draft, Drafter

JOIN = "+"  # "suffix+model": the suffix draft, continued by the model


class HybridDrafter(Drafter):
    """Offers each extra free source (the suffix) where the context has a match, the n-gram where none has, the
    model draft always, and for every `extra` source the same draft continued by the model.

    It does not choose: the policy weighs each source's measured acceptance and cost per round.
    fallback_k caps the model's drafts (the policy's K may be longer, for long suffix matches).
    """

    name = "hybrid"

    def __init__(self, ngram: Drafter, fallback: Drafter, extra: Sequence[Drafter] = (),
                 fallback_k: Optional[int] = None):
        self.ngram, self.fallback, self.extra, self.fallback_k = ngram, fallback, list(extra), fallback_k
        self._drafters = (ngram, *self.extra, fallback)  # every drafter it holds
        self._owner = {d.name: d for d in self._drafters}
        self._split = 0  # cheap tokens at the head of the last joined draft

    def _parts(self, source: str) -> Tuple[Drafter, str]:
        """(the cheap drafter, the fallback's source) of a joined source."""
        cheap, _, rest = source.partition(JOIN)
        return self._owner[cheap], rest

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        for d in self._drafters:
            d.reset(prompt, target_cache)

    def price(self, verify_cost) -> None:
        for d in self._drafters:
            d.price(verify_cost)

    def sources(self, context: List[int]) -> Dict[str, int]:
        """The free sources first, then the fallback's, then the joined ones.

        The n-gram is offered only where no extra source (the suffix) matches: there the suffix's longer match
        is the better guide, and where it has none the n-gram's short keys are all that is left. Offered (and so
        judged by the engine's shadow drafts) only where it could be chosen, its odds are those of that case: in
        the engine2 run of revision 40509be, where it was offered beside the suffix, the hybrid's n-gram rounds
        lost time against plain steps on each of the 10 HumanEval and edit prompts they came on (0.5-2.3 s
        each), their odds raised by the copies the suffix was drafting (BENCHMARKS.md §13)."""
        out: Dict[str, int] = {}
        for d in self.extra:
            out.update(d.sources(context))
        if not out:
            out.update(self.ngram.sources(context))
        fb = {s: min(c, self.fallback_k or c) for s, c in self.fallback.sources(context).items()}
        joined = {f"{d.name}{JOIN}{s}": out[d.name] + c for d in self.extra if d.name in out for s, c in fb.items()}
        return {**out, **fb, **joined}

    def free_sources(self) -> Set[str]:
        return set().union(*(d.free_sources() for d in self._drafters))

    def lag(self, source: str, context: List[int]) -> int:
        if JOIN in source:
            return self.fallback.lag(self._parts(source)[1], context)
        return self._owner[source].lag(source, context)

    def step_cost(self, source: str) -> Tuple[Optional[float], Optional[float]]:
        if JOIN in source:
            return self.fallback.step_cost(self._parts(source)[1])
        return self._owner[source].step_cost(source)

    def propose(self, context: List[int], k: int, probs_fn=None, source: Optional[str] = None) -> Draft:
        """From `source`; with none given, the n-gram draft, else the fallback's."""
        if source is None:
            draft = self.ngram.propose(context, k, probs_fn)
            return draft if draft.tokens else self.fallback.propose(context, k, probs_fn)
        if JOIN in source:
            return self._joined(context, k, probs_fn, source)
        if source == self.fallback.name and self.fallback_k:
            k = min(k, self.fallback_k)
        return self._owner[source].propose(context, k, probs_fn, source)

    def _joined(self, context: List[int], k: int, probs_fn, source: str) -> Draft:
        cheap, rest_source = self._parts(source)
        head = cheap.propose(context, k, probs_fn).tokens[:k]
        self._split = len(head)
        room = min(k - len(head), self.fallback_k or k)
        if room <= 0:
            return Draft(head)
        tail = self.fallback.propose(context + head, room, probs_fn, rest_source)
        probs = tail.probs
        if probs is not None and head:  # the cheap tokens are deterministic: one-hot rows of the same width
            one_hot = mx.arange(probs.shape[-1])[None] == mx.array(head)[:, None]
            probs = mx.concatenate([one_hot.astype(probs.dtype), probs])
        seen = tail.hindsight
        if seen is not None:  # the model also judged the cheap head, which nothing has verified yet: drop those
            seen = (seen[0], seen[1][: len(seen[1]) - len(head)]) if len(seen[1]) > len(head) else None
        return Draft(head + tail.tokens, probs, tail.catch_up_s, tail.catch_up_tokens, tail.verify, seen)

    def feedback(self, source: str, proposed: int, accepted: int) -> None:
        if JOIN not in source:
            self._owner[source].feedback(source, proposed, accepted)
            return
        cheap, rest_source = self._parts(source)
        n = min(proposed, self._split)
        cheap.feedback(cheap.name, n, min(accepted, n))
        if proposed > n:
            self.fallback.feedback(rest_source, proposed - n, max(0, accepted - n))
