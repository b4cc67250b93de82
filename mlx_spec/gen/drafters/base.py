"""The one interface every drafter implements; the verifier never knows which drafter it has."""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

import mlx.core as mx

NO_LIMIT = 1 << 30  # a source with no length limit of its own offers this many tokens


@dataclass
class Draft:
    """Up to k proposed tokens.

    probs: (n, V) the draft distribution each token was sampled from, after the same
    temperature/top-p/top-k transform the target uses. None means deterministic: the
    verifier treats each token as drawn from a one-hot distribution.
    catch_up_s: seconds spent bringing the drafter's state up to date with the context before
    drafting (a draft model feeding the catch_up_tokens it had not seen: the prompt on its first
    round, the tokens accepted since it last ran after that); the policy costs it per token behind,
    not per drafted token.
    verify: the verify pass for this draft when the drafter has done part of it (a first-L self draft):
    given [last context token] + tokens, the target's logits for them, as model() would give; None: the
    engine runs the target (and first rewinds anything a drafter left in the target's cache).
    hindsight: (source, matches) when the catch-up pass also judged the output tokens it fed: for each, in
    order, whether the drafter's greedy prediction there was that token, i.e. whether a greedy draft
    would have been accepted at that position. None: nothing judged.
    """

    tokens: List[int]
    probs: Optional[mx.array] = None
    catch_up_s: float = 0.0
    catch_up_tokens: int = 0
    verify: Optional[Callable[[List[int]], mx.array]] = None
    hindsight: Optional[Tuple[str, List[bool]]] = None


class Drafter:
    """Proposes tokens that continue `context`; learns from how many were accepted.

    `context` is always the full token list so far (prompt + accepted output, including the
    token the target produced last and has not yet consumed). A drafter keeps whatever state
    it needs (a KV cache, an n-gram table) and brings it up to date from `context` itself, so
    callers never replay tokens into it. A drafter may have several *sources* (a hybrid has an
    n-gram source and a model source); the engine's policy picks one each round.
    """

    name = "drafter"
    # Seconds to verify k drafts, as the engine's policy measured them on this machine (None: not known yet), or
    # None when the engine does not price drafts (fixed-K decoding): a model drafter cuts a draft where one more
    # token no longer pays (`price`).
    verify_cost: Optional[Callable[[int], Optional[float]]] = None

    def price(self, verify_cost: Optional[Callable[[int], Optional[float]]]) -> None:
        """The engine's verify costs for this generation (`verify_cost`); drafters whose drafts cost nothing
        ignore them."""
        self.verify_cost = verify_cost

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """A generation starts whose context begins with `prompt`.

        target_cache: the target's per-layer cache, holding `prompt[:-1]` once the engine has
        prefilled it (drafters that share it, like the self drafter, keep a reference). State that
        still agrees with `prompt` (a session's earlier turns) is kept; the rest is rebuilt.
        """

    def sources(self, context: List[int]) -> Dict[str, int]:
        """Each source that could draft at `context`, with the most tokens it could draft there.

        Free of side effects on what the drafter would propose: asking twice, or asking and then
        proposing, gives the same answer. An empty dict means nothing to draft this round.
        """
        return {self.name: NO_LIMIT}

    def free_sources(self) -> Set[str]:
        """The sources whose drafts cost nothing worth measuring (an n-gram lookup, not a forward pass).

        The engine also asks a free source for a draft in rounds it was not chosen for and judges that
        draft against the tokens the round produced, so its acceptance is measured every round (a
        "shadow" draft) and it never needs a probe round.
        """
        return set()

    def lag(self, source: str, context: List[int]) -> int:
        """How many tokens `source` would have to feed before drafting at `context` (side-effect free).

        A draft model with its own cache is behind by the whole prompt until it first drafts (its prompt is
        fed then, not in `reset`, so a draft the policy never uses costs nothing) and by the tokens produced
        since it last drafted after that. 0 for sources with no state to bring up to date.
        """
        return 0

    def step_cost(self, source: str) -> Tuple[Optional[float], Optional[float]]:
        """(seconds per drafted token, seconds per token of catch-up) as the drafter measured them, or None.

        A draft model times a short pass of its own when it starts, so the policy can tell before feeding it
        the prompt whether it can pay at all.
        """
        return None, None

    def propose(self, context: List[int], k: int, probs_fn=None, source: Optional[str] = None) -> Draft:
        """At most k tokens continuing `context` from `source` (default: the drafter's first).

        probs_fn: None for greedy decoding; otherwise a function mapping logits (..., V)
        to the sampling distribution, which model drafters sample from and return.
        """
        raise NotImplementedError

    def feedback(self, source: str, proposed: int, accepted: int) -> None:
        """The verifier accepted `accepted` of the `proposed` tokens `source` drafted last."""
