"""An EAGLE-3 head drafts from the target's own hidden states: each context token is fed beside the target's states
of the position before it, each draft token beside the head's own state before it; one pass for all rows."""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from ..tunables import EAGLE_HELD_CHUNKS as HELD_CHUNKS
from .base import Draft, Drafting, Member
from .model import ModelDrafter, ModelDrafting


class Eagle3Drafter(ModelDrafter):
    """Drafts with an EAGLE-3 head (`make.eagle3.Eagle3Head`) in its own cache, which holds the context from its
    second token on (a token is fed beside the states before it, so the first has none)."""

    name = "eagle3"
    origin = 1

    def __init__(self, head, reads: Sequence[int], vocab_size: int, real_vocab: Optional[int] = None):
        """reads: the target's blocks whose outputs the head takes, in the order it concatenates them."""
        super().__init__(head, vocab_size, real_vocab)
        self.head, self.subset = None, False  # its own draft vocabulary, mapped by `ids`
        self.reads, self.ids = tuple(reads), head.ids()
        self.width = head.config.target_hidden_size * len(self.reads)
        self.held: List[Tuple[int, mx.array]] = []  # (first position, states (n, width)) not fed yet, in order

    def drafting(self) -> Drafting:
        return Eagle3Drafting(self)

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        super().reset(prompt[1:])

    def see(self, at: int, states: mx.array) -> None:
        keep = [(a, s[: at - a]) for a, s in self.held if a < at]  # what the target's cache no longer holds goes
        self.held = keep + [(at, states)]
        if len(self.held) > HELD_CHUNKS:  # one array again: the rounds' arrays are let go
            first, (a, s) = self.held[0][0], self.held[-1]
            self.held = [(first, self._at(first, a + s.shape[0] - first))]
            mx.async_eval(self.held[0][1])

    def behind(self, context: List[int]) -> int:
        return super().behind(context[1:]) if len(context) > 1 else 0

    def forward(self, x: mx.array, cache: list, states: Optional[mx.array] = None) -> mx.array:
        return self.model(x, states, cache)

    def given(self, owners: Sequence[Optional["Eagle3Drafter"]], starts: List[int], n: int) -> mx.array:
        """Each place's states for its n tokens fed from fed index `starts` (fed index j is context position j + 1,
        fed beside the states of position j); zeros where the target's states were never seen."""
        return mx.stack([o._at(a, n) if o is not None else mx.zeros((n, self.width)) for o, a in zip(owners, starts)])

    def _at(self, at: int, n: int) -> mx.array:
        """States of positions at..at+n-1, zeros where none is held."""
        pieces, pos = [], at
        for a, s in self.held:
            lo, hi = max(a, pos), min(a + s.shape[0], at + n)
            if hi > lo:
                pieces += ([mx.zeros((lo - pos, self.width))] if lo > pos else []) + [s[lo - a : hi - a]]
                pos = hi
        pieces += [mx.zeros((at + n - pos, self.width))] if pos < at + n else []
        return mx.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    def forget(self) -> None:
        """Drop the states of positions the head's cache holds (fed index j read the states of position j)."""
        n = len(self.fed)
        self.held = [(max(a, n), s[max(0, n - a) :]) for a, s in self.held if a + s.shape[0] > n]

    def full(self, h: mx.array) -> mx.array:
        logits = self.model.logits(h)
        out = mx.full((*logits.shape[:-1], self.vocab_size), -mx.inf, dtype=logits.dtype)
        out[..., self.ids] = logits
        return out

    def greedy(self, h: mx.array) -> mx.array:
        return self.ids[mx.argmax(self.model.logits(h), axis=-1)]


class Eagle3Drafting(ModelDrafting):
    """The rows drafting with one head: a draft model's drafting over each row's context from its second token."""

    def propose(self, members: Sequence[Member], k: int, target=None, chunk: Optional[int] = None) -> List[Draft]:
        ready = [m for m in members if len(m.context) > 1]
        out = dict(zip([id(m) for m in ready], super().propose([m._replace(context=m.context[1:]) for m in ready], k,
                                                              target, chunk))) if ready else {}
        for m in ready:
            m.part.forget()
        return [out.get(id(m), Draft([], source=self.part.name)) for m in members]
