"""A row's acceptance of a source's draft tokens, learned round by round: what the planner's expected tokens read."""

from collections.abc import Sequence
from dataclasses import dataclass

from .tunables import DISCOUNT, PRIOR_ACCEPT, PRIOR_TRIALS


@dataclass
class SourceStats:
    """One row's acceptance of one source's draft tokens, older rounds discounted."""

    accepted_w: float = PRIOR_ACCEPT * PRIOR_TRIALS  # discounted accepted draft tokens
    judged_w: float = PRIOR_TRIALS  # discounted judged draft tokens (accepted + the first rejected)

    @property
    def accept(self) -> float:
        """Probability that a draft token is accepted, the tokens before it accepted."""
        return self.accepted_w / self.judged_w

    def observe(self, proposed: int, accepted: int) -> None:
        judged = accepted + (accepted < proposed)  # tokens after the first rejection were never judged
        self.accepted_w = DISCOUNT * self.accepted_w + accepted
        self.judged_w = DISCOUNT * self.judged_w + judged

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
        """Tokens a round drafting k tokens yields: 1 + a + ... + a^k (the geometric model of Leviathan et al.)."""
        a = min(self.accept, 0.999)
        return (1 - a ** (k + 1)) / (1 - a)
