"""How many tokens to draft next: a cost model fed by measured acceptance and timings.

Expected tokens from a round with k drafts and per-token acceptance a (the geometric model of
Leviathan et al.): E(k) = (1 - a^(k+1)) / (1 - a). Its cost is verify(k) + k * draft_per_token,
both measured online. We draft the k that maximizes E(k) / cost(k); k = 0 is plain decoding,
so speculation switches itself off wherever it would make the user slower, and periodic
probe rounds switch it back on when acceptance recovers.
"""

from dataclasses import dataclass, field
from typing import Dict

EMA = 0.3  # weight of the newest measurement: adapts within a few rounds, smooths one-off stalls
PRIOR_ACCEPT = 0.6  # acceptance assumed before any measurement: optimistic, so speculation gets tried
PRIOR_VERIFY_SLOPE = 0.05  # verify(k) ~ verify(0) * (1 + 0.05 k) until measured (CPU: 633 ms -> 809 ms at k=4)
PROBE_EVERY = 8  # plain steps between probe rounds while speculation is off; doubles up to PROBE_MAX
PROBE_MAX = 64


@dataclass
class AdaptiveK:
    """Chooses the draft length each round; `adaptive=False` always asks for k_max."""

    k_max: int
    adaptive: bool = True
    accept: float = PRIOR_ACCEPT
    verify: Dict[int, float] = field(default_factory=dict)  # seconds per verify of k drafts (EMA)
    draft_per_token: float = 0.0  # seconds per drafted token (EMA)
    _off_steps: int = 0
    _probe_every: int = PROBE_EVERY

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

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second of a round drafting k tokens."""
        a = min(self.accept, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        return tokens / (self._verify_cost(k) + k * self.draft_per_token)

    def next_k(self, limit: int) -> int:
        """Draft length for the next round, at most `limit` (0 means a plain step)."""
        limit = min(limit, self.k_max)
        if not self.adaptive or limit <= 0:
            return max(limit, 0)
        best = max(range(limit + 1), key=self.expected_rate)
        if best > 0:
            self._off_steps = 0
            return best
        self._off_steps += 1
        if self._off_steps >= self._probe_every:  # probe: is drafting paying again?
            self._off_steps = 0
            self._probe_every = min(self._probe_every * 2, PROBE_MAX)
            return min(2, limit)
        return 0

    def update(self, proposed: int, accepted: int, verify_s: float, draft_s: float) -> None:
        """Record one round: `accepted` of `proposed` drafts, and what verify and drafting cost."""
        old = self.verify.get(proposed)
        self.verify[proposed] = verify_s if old is None else (1 - EMA) * old + EMA * verify_s
        if proposed == 0:
            return
        trials = accepted + (1 if accepted < proposed else 0)  # geometric: stop at first rejection
        rate = accepted / trials
        self.accept = (1 - EMA) * self.accept + EMA * rate
        per_tok = draft_s / proposed
        self.draft_per_token = per_tok if self.draft_per_token == 0 else (1 - EMA) * self.draft_per_token + EMA * per_tok
        if accepted > 0:
            self._probe_every = PROBE_EVERY
