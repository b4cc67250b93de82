"""A row's acceptance of a source's draft tokens, learned round by round: what the planner's expected tokens read."""

from collections.abc import Sequence
from dataclasses import dataclass

from .tunables import DISCOUNT, FIRST_PRIOR, PRIOR_ACCEPT, PRIOR_TRIALS


@dataclass
class SourceStats:
    """One row's acceptance of one source's draft tokens, older rounds discounted."""

    accepted_w: float = PRIOR_ACCEPT * PRIOR_TRIALS  # discounted accepted draft tokens
    judged_w: float = PRIOR_TRIALS  # discounted judged draft tokens (accepted + the first rejected)
    first_accepted_w: float = 0.0  # discounted rounds whose first draft token was accepted
    first_judged_w: float = 0.0

    @property
    def accept(self) -> float:
        """Probability that a draft token after an accepted one is accepted."""
        return self.accepted_w / self.judged_w

    @property
    def first_accept(self) -> float:
        """Probability that a round's first draft token is accepted (shrunk toward `accept`)."""
        return (self.first_accepted_w + FIRST_PRIOR * self.accept) / (self.first_judged_w + FIRST_PRIOR)

    def observe(self, proposed: int, accepted: int) -> None:
        judged = accepted + (accepted < proposed)  # tokens after the first rejection were never judged
        self.accepted_w = DISCOUNT * self.accepted_w + accepted
        self.judged_w = DISCOUNT * self.judged_w + judged
        if proposed:
            self.first_accepted_w = DISCOUNT * self.first_accepted_w + (accepted > 0)
            self.first_judged_w = DISCOUNT * self.first_judged_w + 1

    def hindsight(self, matches: Sequence[bool], k: int) -> None:
        """Greedy drafts over output the source sat out (`matches[i]`: its prediction was the i-th token), replayed
        as rounds of k tokens, each ending at its first miss."""
        i = 0
        while i < len(matches):
            n, m = min(k, len(matches) - i), 0
            while m < n and matches[i + m]:
                m += 1
            self.observe(n, m)
            i += m + 1

    def expected(self, k: int) -> float:
        """Tokens a round drafting k tokens yields."""
        a = min(self.accept, 0.999)
        return 1 + self.first_accept * (1 - a**k) / (1 - a)
