"""The one interface every drafter implements: propose, learn what was accepted, say how far behind it is."""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import mlx.core as mx


@dataclass
class Draft:
    """Up to k proposed tokens continuing a context.

    tokens: a list (a context drafter's lookup) or a lazy (n,) array (a model's draft, read by the engine in the
    same host synchronisation as the verify pass). probs: the (n, V) distributions the tokens were sampled from,
    after the same temperature/top-p/top-k transform the target uses; None means deterministic (one-hot).
    behind: context tokens the drafter fed to catch up before drafting (its `behind` at the time).
    hindsight: (predictions, tokens) when the catch-up also scored output the drafter sat out: its lazy (m,)
    greedy predictions at those positions and the m tokens the target produced there.
    cold: a pass of a shape this drafter never ran before (on a GPU: a kernel compile, not a cost).
    """

    tokens: Union[List[int], mx.array]
    probs: Optional[mx.array] = None
    source: str = ""
    behind: int = 0
    hindsight: Optional[Tuple[mx.array, List[int]]] = None
    cold: bool = False

    def __len__(self) -> int:
        return len(self.tokens) if isinstance(self.tokens, list) else self.tokens.size


class Drafter:
    """Proposes tokens that continue `context`; learns how many of its tokens the target accepted.

    `context` is always the whole token list so far (prompt + output, ending with the token the target has not
    consumed yet). A drafter keeps whatever state it needs (a KV cache, an n-gram table) and brings it up to date
    from `context` itself. Cost is not its business: the engine's planner times every round and decides who
    drafts and how many tokens.
    """

    name = "drafter"
    free = False  # proposing is a table lookup: the engine asks every round and judges the draft against the output
    in_target_cache = False  # drafts through the target's own cache: the engine reads a queued plain step first

    @property
    def parts(self) -> Sequence["Drafter"]:
        """The sources the planner chooses between each round (a hybrid has several)."""
        return (self,)

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """A generation starts whose context begins with `prompt`; the target's cache holds `prompt[:-1]`.

        State that still agrees with `prompt` (a session's earlier turns) is kept; the rest is rebuilt.
        Drafters that share the target's cache (self, quant-self) keep a reference to it.
        """

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        """At most k tokens continuing `context`. probs_fn: None for greedy decoding, otherwise the map from
        logits (..., V) to the sampling distribution, which model drafters sample from and return."""
        raise NotImplementedError

    def learn(self, proposed: int, accepted: int) -> None:
        """Of the `proposed` tokens of the last draft, the first `accepted` were the target's."""

    def behind(self, context: List[int]) -> int:
        """Context tokens this drafter would feed before drafting at `context` (0 for table lookups)."""
        return 0
