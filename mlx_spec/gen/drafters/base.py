"""The one interface every drafter implements: propose for a list of rows, learn what was accepted, say how far
behind it is; and what a drafter declares it can do."""

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

import mlx.core as mx


@dataclass
class Draft:
    """Up to k proposed tokens continuing a context.

    tokens: (n,) token ids (lazy for a model's draft: the engine reads it with the verify pass; a list given to the
    constructor is made an array). probs: the (n, V) distributions the tokens were sampled from, after the row's
    temperature/top-p/top-k transform; None means deterministic (one-hot). behind: context tokens the drafter fed
    before drafting. hindsight: (predictions, tokens) when that catch-up also scored output the drafter sat out: its
    lazy (m,) greedy predictions at those positions and the m tokens the target produced there. cold: a pass of a
    shape this drafter never ran before (on a GPU: a kernel build, not a cost).
    """

    tokens: mx.array
    probs: Optional[mx.array] = None
    source: str = ""
    behind: int = 0
    hindsight: Optional[Tuple[mx.array, List[int]]] = None
    cold: bool = False

    def __post_init__(self):
        if not isinstance(self.tokens, mx.array):
            self.tokens = mx.array(list(self.tokens), dtype=mx.uint32)

    def __len__(self) -> int:
        return self.tokens.size


class Member(NamedTuple):
    """A row a drafter drafts for: its drafter part, its context, its sampling rule (`sampling.Sampler`, None:
    greedy), and its place in the target's cache."""

    part: "Drafter"
    context: List[int]
    sampler: object = None
    place: int = 0


class Drafting:
    """Drafts for several rows at once, one per source in an engine. This one asks each row's drafter in turn (a
    table lookup); a draft model or a view of the target drafts for all its rows in one pass per position."""

    def takes(self, part: "Drafter") -> bool:
        """Whether a row drafting with `part` can draft here."""
        return True

    def propose(self, members: Sequence[Member], k: int, target=None, chunk: Optional[int] = None) -> List[Draft]:
        """At most k tokens for each member. target: the engine's `joint.Rows` (the rows' target cache); chunk: the
        most catch-up tokens a member is fed this round where other rows wait for it (None: all)."""
        return [m.part.propose(m.context, k, m.sampler) for m in members]

    def leave(self, part: "Drafter") -> None:
        """A row stops generating: its drafter gets back whatever state drafting together held for it."""


class Drafter:
    """Proposes tokens that continue `context`; learns how many of its tokens the target accepted.

    `context` is always the whole token list so far (prompt + output, ending with the token the target has not
    consumed yet). A drafter keeps whatever state it needs (a KV cache, an n-gram table) and brings it up to date
    from `context` itself. Cost is not its business: the engine's planner times every round and decides who
    drafts and how many tokens.
    """

    name = "drafter"
    free = False  # proposing is a table lookup: the engine asks every round and judges the draft against the output
    in_target_cache = False  # drafts through the target's own cache, which must then hold the context but its last
    model = None  # the network it runs (a draft model, a view of the target); None for a table lookup

    @property
    def parts(self) -> Sequence["Drafter"]:
        """The sources the planner chooses between each round (a hybrid has several)."""
        return (self,)

    def drafting(self) -> Drafting:
        """What drafts for every row of an engine whose drafter has this source (made once per engine)."""
        return Drafting()

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """A generation starts whose context begins with `prompt`; the target's cache holds `prompt[:-1]`.

        State that still agrees with `prompt` (a session's earlier turns) is kept; the rest is rebuilt.
        """

    def propose(self, context: List[int], k: int, sampler=None) -> Draft:
        """At most k tokens continuing `context`. sampler: the row's sampling rule (`sampling.Sampler`; None or
        greedy: greedy drafts); a model drafter samples from it and returns the distributions."""
        raise NotImplementedError

    def learn(self, proposed: int, accepted: int) -> None:
        """Of the `proposed` tokens of the last draft, the first `accepted` were the target's."""

    def behind(self, context: List[int]) -> int:
        """Context tokens this drafter would feed before drafting at `context` (0 for table lookups)."""
        return 0
