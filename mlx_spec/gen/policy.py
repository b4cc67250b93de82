"""Which source drafts next and how many tokens: a cost model fed by measured acceptance and timings.

Expected tokens from a round with k drafts and per-token acceptance a (the geometric model of
Leviathan et al.): E(k) = (1 - a^(k+1)) / (1 - a). Its cost is verify(k) + k * draft_per_token,
both measured online. Each round the policy takes, over every source the drafter offers and every
k up to what that source can draft, the pair with the highest E(k) / cost(k); k = 0 is plain
decoding, so speculation switches itself off wherever it would make the user slower, and periodic
probe rounds switch it back on. Acceptance and draft cost are kept per source (a hybrid's free
n-gram drafts and its costly model drafts differ); the verify cost belongs to the target.
A source never measured gets a short probe round first, so an expensive drafter shows its cost
before it is trusted with a long draft.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

EMA = 0.3  # weight of the newest measurement: adapts within a few rounds, smooths one-off stalls
PRIOR_ACCEPT = 0.6  # acceptance assumed before any measurement: optimistic, so speculation gets tried
PRIOR_VERIFY_SLOPE = 0.05  # verify(k) ~ verify(0) * (1 + 0.05 k) until measured (CPU: 633 ms -> 809 ms at k=4)
PROBE_K = 2  # draft length of a probe round (first use of a source, or a re-check while it is off)
PROBE_EVERY = 8  # plain steps between probe rounds while a source is off; doubles up to PROBE_MAX
PROBE_MAX = 64


@dataclass
class SourceStats:
    """What one draft source has shown so far."""

    accept: float = PRIOR_ACCEPT
    draft_per_token: Optional[float] = None  # seconds per drafted token (EMA); None: never measured
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    off_steps: int = 0
    probe_every: int = PROBE_EVERY


@dataclass
class Policy:
    """Chooses (source, k) each round; `adaptive=False` always drafts k_max from the first source offered.

    One Policy can serve many generations (a session keeps it), so later turns start from what
    earlier turns measured.
    """

    k_max: int
    adaptive: bool = True
    verify: Dict[int, float] = field(default_factory=dict)  # seconds per verify of k drafts (EMA)
    sources: Dict[str, SourceStats] = field(default_factory=dict)

    def stats(self, source: str) -> SourceStats:
        return self.sources.setdefault(source, SourceStats())

    def verify_cost(self, k: int) -> float:
        """Seconds (or relative units before any measurement) to verify k drafts in one target pass."""
        if k in self.verify:
            return self.verify[k]
        known = sorted(self.verify)
        if not known:
            return 1.0 + PRIOR_VERIFY_SLOPE * k  # relative units: only ratios matter
        lo = max((j for j in known if j < k), default=None)
        hi = min((j for j in known if j > k), default=None)
        if lo is not None and hi is not None:  # interpolate between measured sizes
            w = (k - lo) / (hi - lo)
            return self.verify[lo] * (1 - w) + self.verify[hi] * w
        ref = lo if lo is not None else hi
        return self.verify[ref] * (1 + PRIOR_VERIFY_SLOPE * k) / (1 + PRIOR_VERIFY_SLOPE * ref)

    def expected_rate(self, k: int, source: str = "") -> float:
        """Expected tokens per second (or per relative unit) of a round drafting k tokens from `source`."""
        if k == 0:
            return 1.0 / self.verify_cost(0)
        s = self.stats(source)
        a = min(s.accept, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        return tokens / (self.verify_cost(k) + k * (s.draft_per_token or 0.0))

    def choose(self, offers: Dict[str, int], limit: int) -> Tuple[str, int]:
        """(source, k) for the next round; ("", 0) is a plain step.

        offers: each source that could draft now -> the most tokens it could draft (`Drafter.sources`).
        limit: the most draft tokens the round may have (tokens left to generate minus one).
        """
        limit = min(limit, self.k_max)
        caps = {src: min(cap, limit) for src, cap in offers.items() if min(cap, limit) > 0}
        if not caps:
            return "", 0
        if not self.adaptive:
            src = next(iter(caps))
            return src, caps[src]
        for src, cap in caps.items():  # measure a new source's cost with a short draft first
            if self.stats(src).draft_per_token is None:
                return src, min(PROBE_K, cap)
        best, best_rate = ("", 0), self.expected_rate(0)
        for src, cap in caps.items():
            for k in range(1, cap + 1):
                rate = self.expected_rate(k, src)
                if rate > best_rate:
                    best, best_rate = (src, k), rate
        if best[1] > 0:
            self.stats(best[0]).off_steps = 0
            return best
        for src, cap in caps.items():  # nothing pays now: probe a source that has been off long enough
            s = self.stats(src)
            s.off_steps += 1
            if s.off_steps >= s.probe_every:
                s.off_steps = 0
                s.probe_every = min(s.probe_every * 2, PROBE_MAX)
                return src, min(PROBE_K, cap)
        return "", 0

    def update(self, source: str, proposed: int, accepted: int, verify_s: float, draft_s: float) -> None:
        """Record one round: `accepted` of `proposed` drafts from `source`, and what verify and drafting cost."""
        old = self.verify.get(proposed)
        self.verify[proposed] = verify_s if old is None else (1 - EMA) * old + EMA * verify_s
        if proposed == 0:
            return
        s = self.stats(source)
        s.rounds += 1
        s.proposed += proposed
        s.accepted += accepted
        trials = accepted + (1 if accepted < proposed else 0)  # geometric: stop at first rejection
        s.accept = (1 - EMA) * s.accept + EMA * accepted / trials
        per_tok = draft_s / proposed
        s.draft_per_token = per_tok if s.draft_per_token is None else (1 - EMA) * s.draft_per_token + EMA * per_tok
        if accepted > 0:
            s.probe_every = PROBE_EVERY
