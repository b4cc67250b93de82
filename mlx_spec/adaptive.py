"""How many tokens to draft next: a cost model fed by measured acceptance and timings.

Expected tokens from a round with k drafts and per-token acceptance a (the geometric model of
Leviathan et al.): E(k) = (1 - a^(k+1)) / (1 - a). Its cost is verify(k) + k * draft_per_token,
both measured online. We draft the k that maximizes E(k) / cost(k); k = 0 is plain decoding,
so speculation switches itself off wherever it would make the user slower, and periodic
probe rounds switch it back on when acceptance recovers. Acceptance and draft cost are kept per
draft source (a hybrid's free n-gram drafts and its costly model drafts differ); the verify cost
belongs to the target and is shared.
"""

from dataclasses import dataclass, field
from typing import Dict

EMA = 0.3  # weight of the newest measurement: adapts within a few rounds, smooths one-off stalls
PRIOR_ACCEPT = 0.6  # acceptance assumed before any measurement: optimistic, so speculation gets tried
PRIOR_VERIFY_SLOPE = 0.05  # verify(k) ~ verify(0) * (1 + 0.05 k) until measured (CPU: 633 ms -> 809 ms at k=4)
PROBE_EVERY = 8  # plain steps between probe rounds while speculation is off; doubles up to PROBE_MAX
PROBE_MAX = 64


@dataclass
class Source:
    """What one draft source has shown so far."""

    accept: float = PRIOR_ACCEPT
    draft_per_token: float = 0.0  # seconds per drafted token (EMA)
    off_steps: int = 0
    probe_every: int = PROBE_EVERY


@dataclass
class AdaptiveK:
    """Chooses the draft length each round; `adaptive=False` always asks for k_max."""

    k_max: int
    adaptive: bool = True
    verify: Dict[int, float] = field(default_factory=dict)  # seconds per verify of k drafts (EMA)
    sources: Dict[str, Source] = field(default_factory=dict)

    def _verify_cost(self, k: int) -> float:
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
        """Expected tokens per second of a round drafting k tokens from `source`."""
        s = self.sources.setdefault(source, Source())
        a = min(s.accept, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        return tokens / (self._verify_cost(k) + k * s.draft_per_token)

    def next_k(self, limit: int, source: str = "") -> int:
        """Draft length for the next round from `source`, at most `limit` (0 means a plain step)."""
        limit = min(limit, self.k_max)
        if not self.adaptive or limit <= 0:
            return max(limit, 0)
        s = self.sources.setdefault(source, Source())
        best = max(range(limit + 1), key=lambda k: self.expected_rate(k, source))
        if best > 0:
            s.off_steps = 0
            return best
        s.off_steps += 1
        if s.off_steps >= s.probe_every:  # probe: is drafting paying again?
            s.off_steps = 0
            s.probe_every = min(s.probe_every * 2, PROBE_MAX)
            return min(2, limit)
        return 0

    def update(self, proposed: int, accepted: int, verify_s: float, draft_s: float, source: str = "") -> None:
        """Record one round: `accepted` of `proposed` drafts, and what verify and drafting cost."""
        old = self.verify.get(proposed)
        self.verify[proposed] = verify_s if old is None else (1 - EMA) * old + EMA * verify_s
        if proposed == 0:
            return
        s = self.sources.setdefault(source, Source())
        trials = accepted + (1 if accepted < proposed else 0)  # geometric: stop at first rejection
        s.accept = (1 - EMA) * s.accept + EMA * accepted / trials
        per_tok = draft_s / proposed
        s.draft_per_token = per_tok if s.draft_per_token == 0 else (1 - EMA) * s.draft_per_token + EMA * per_tok
        if accepted > 0:
            s.probe_every = PROBE_EVERY
