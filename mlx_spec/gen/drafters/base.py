"""The one interface every drafter implements (propose, learn, say how far behind), and what it declares."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import mlx.core as mx

from ..sampling import Sampler
from ..tunables import NGRAM_SYNC_TAIL as SYNC_TAIL

if TYPE_CHECKING:
    import mlx.nn as nn


@dataclass
class Draft:
    """Up to k proposed tokens continuing a context (`Draft.of` a list of ids)."""

    tokens: mx.array  # (n,) token ids, lazy for a model's draft: the engine reads them with the verify pass
    probs: mx.array | None = None  # (n, V) the row's distributions they were sampled from; None: one-hot
    source: str = ""
    behind: int = 0  # context tokens the drafter fed before drafting
    hindsight: tuple[mx.array, list[int]] | None = None  # a catch-up over output the drafter sat out: its lazy
    # (m,) greedy predictions there and the m tokens the target produced
    cold: bool = False  # a pass of a shape this drafter never ran before (on a GPU: a kernel build, not a cost)
    parents: tuple[int, ...] | None = None  # a tree (`gen.tree`): each token's parent, -1 for the last token's

    @classmethod
    def of(cls, ids: Sequence[int], source: str = "", behind: int = 0) -> "Draft":
        """A draft of token ids in a list (a table lookup's; [] for none)."""
        return cls(mx.array(list(ids), dtype=mx.uint32), source=source, behind=behind)

    def __len__(self) -> int:
        return self.tokens.size


@dataclass
class Kept:
    """A drafter's state over a conversation's first tokens, copied (`Drafter.fork`): `key` names the drafters that
    can adopt it (a table's source, a draft model's id), `nbytes` the memory it holds."""

    key: str | int
    state: Any
    nbytes: int = 0


class Member(NamedTuple):
    """A row a drafter drafts for: its part, context, sampling rule (None: greedy) and place in the target's cache."""

    part: "Drafter"
    context: list[int]
    sampler: Sampler | None = None
    place: int = 0


class Drafting:
    """Drafts for several rows at once, one per source in an engine; this one asks each row's drafter in turn."""

    def takes(self, part: "Drafter") -> bool:
        """Whether a row drafting with `part` can draft here."""
        return True

    def propose(
        self, members: Sequence[Member], k: int, target=None, chunk: int | None = None, tree: int = 0
    ) -> list[Draft]:
        """At most k tokens a member; target: the engine's `JointCache`; chunk: the most catch-up a member is fed;
        tree: a drafter that `trees` drafts a tree of that many tokens, k deep, for a member alone (else a chain)."""
        return [m.part.propose(m.context, k, m.sampler) for m in members]

    def leave(self, part: "Drafter") -> None:
        """A row stops generating: its drafter gets back whatever state drafting together held for it."""


class Drafter:
    """Proposes tokens continuing `context` (prompt + output so far), keeping its state from it; learns verdicts."""

    name = "drafter"
    free = False  # proposing is a table lookup: the engine asks every round and judges the draft against the output
    in_target_cache = False  # drafts through the target's own cache, which must then hold the context but its last
    model: "nn.Module | None" = None  # the network it runs (a draft model, a view of the target); None: a lookup
    reads: tuple[int, ...] = ()  # the target's blocks whose outputs it reads (a learned drafter): given with `see`
    trees = False  # drafts a tree (several continuations) for a row alone when asked
    left_out: str | None = None  # a source it was asked for and cannot run on this target, and why (one line)

    @property
    def parts(self) -> Sequence["Drafter"]:
        """The sources the planner chooses between each round (a hybrid has several)."""
        return (self,)

    def drafting(self) -> Drafting:
        """What drafts for every row of an engine whose drafter has this source (made once per engine)."""
        return Drafting()

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        """A generation starts at `prompt`, the target's cache holding `prompt[:-1]`; state agreeing with it is kept."""

    def propose(self, context: list[int], k: int, sampler: Sampler | None = None) -> Draft:
        """At most k tokens continuing `context`, sampled by the row's `sampler` if it samples (None: greedy)."""
        raise NotImplementedError

    def learn(self, proposed: int, accepted: int) -> None:
        """Of the `proposed` tokens of the last draft, the first `accepted` were the target's."""

    def see(self, at: int, states: mx.array) -> None:
        """The target's states (n, len(reads) * d) at context positions at..at+n-1, from the pass that kept them."""

    def behind(self, context: list[int]) -> int:
        """Context tokens this drafter would feed before drafting at `context` (0 for table lookups)."""
        return 0

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays it holds of its own (a draft model's cache; 0 for none)."""
        return 0

    def fork(self, tokens: list[int]) -> Kept | None:
        """A copy of its state over `tokens`, a conversation's first tokens, for a later one to `adopt` (None: it
        keeps none)."""
        return None

    def adopt(self, kept: Kept, n: int) -> None:
        """Start from `kept`'s state over its first `n` tokens, a prefix of the next context, where `kept` is of its
        kind (its `key`); else keep its own."""


def extends(context: list[int], held: list[int]) -> bool:
    """Whether `context` extends what a drafter `held`, judged in O(1) by its first and last few tokens."""
    n = len(held)
    return context[: min(n, 1)] == held[:1] and context[max(0, n - SYNC_TAIL) : n] == held[-SYNC_TAIL:]
