"""Which source drafts next and how many tokens: the one owner of every cost estimate.

Expected tokens from a round that drafts k tokens, the first accepted with probability p and each later one with
a (the geometric model of Leviathan et al., its first token apart): E(k) = 1 + p (1 - a^k) / (1 - a). The round
costs what the planner measured on this machine: a target pass at the size the round is verified at (k + 1
positions, or a larger size of `SIZES` padded with dummy positions where that size was measured cheaper), plus,
for a costly source (a draft model), its k draft steps and the catch-up it feeds first. Each round the planner
takes the source and k with the highest E(k) / cost, or a plain step unless drafting promises MARGIN more tokens
per second: speculation switches itself off wherever it would make the user slower.

Every cost is a wall-clock time the engine measured from the host's read of the last round to its read of this one
(less the time its caller held the generator), so the host's own work counts as well as the device's; a verify
size's cost is the median of its latest rounds, so a stall moves nothing. A round that ran a pass at a shape first
seen in the process is not timed: on a GPU that is a kernel build, not a cost. A plain step is timed as the engine
runs it, the next step queued before the host reads the current one. A costly source's draft time is what its
rounds took beyond the verify pass, split between its drafted tokens (d per token) and the tokens it caught up on
(c per token) by least squares over its recent rounds.

Acceptance comes from discounted counts (accepted / judged draft tokens, older rounds weighing less). Free
sources (table lookups) are judged every round, their draft compared with the tokens the round produced. A
costly source passed over earns PROBE_BUDGET of each round's time and drafts a one-token probe once its credit
covers what the probe is expected to lose, so probing a source that does not pay costs about that share; one
that could not beat plain decoding even with every token accepted is not probed at all. A draft model that sat
out also judges, as it catches up, the output it missed (`hindsight`), so one probe tells how drafting would have
done over all of it.
"""

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Collection, Deque, Dict, List, Optional, Sequence

from .tunables import (CATCH_UP_HORIZON, DISCOUNT, EMA, FIRST_PRIOR, MARGIN, PRIOR_ACCEPT, PRIOR_TRIALS,
                       PROBE_BUDGET, PROBE_MIN, SIZES, TIMINGS)


@dataclass(frozen=True)
class Plan:
    """A round: `k` tokens from `source` verified at `size` positions (k = 0: a plain step)."""

    source: str = ""
    k: int = 0
    size: int = 1
    probe: bool = False


PLAIN = Plan()


@dataclass
class SourceStats:
    """What one draft source has shown: acceptance, and for a costly source its draft and catch-up costs."""

    accepted_w: float = PRIOR_ACCEPT * PRIOR_TRIALS  # discounted accepted draft tokens
    judged_w: float = PRIOR_TRIALS  # discounted judged draft tokens (accepted + the first rejected)
    first_accepted_w: float = 0.0  # discounted rounds whose first draft token was accepted
    first_judged_w: float = 0.0
    proposed: int = 0
    accepted: int = 0
    draft: Optional[float] = None  # seconds per drafted token; None: never timed
    catch_up: float = 0.0  # seconds per token fed before drafting
    fit: List[float] = field(default_factory=lambda: [0.0] * 5)  # decayed sums n², nb, b², ny, by of the cost fit
    idle: int = 0  # rounds since it last drafted
    credit: float = 0.0  # probe budget earned while passed over (seconds)

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
        self.proposed, self.accepted = self.proposed + proposed, self.accepted + accepted
        if proposed:
            self.first_accepted_w = DISCOUNT * self.first_accepted_w + (accepted > 0)
            self.first_judged_w = DISCOUNT * self.first_judged_w + 1

    def time(self, n: int, behind: int, seconds: float) -> None:
        """A round drafted n tokens after feeding `behind` and spent `seconds` beyond its verify pass: refit
        seconds = d n + c behind by decayed least squares (a weak prior puts a catch-up token at an eighth of a
        draft step, so one round with a long catch-up splits; later rounds outweigh it)."""
        f = self.fit
        for i, v in enumerate((n * n, n * behind, behind * behind, n * seconds, behind * seconds)):
            f[i] = (1 - EMA) * f[i] + v
        ridge = 1e-3 * (f[0] + f[2])  # the prior: d - 8 c = 0
        a11, a12, a22 = f[0] + ridge, f[1] - 8 * ridge, f[2] + 64 * ridge
        det = a11 * a22 - a12 * a12
        d = (f[3] * a22 - f[4] * a12) / det
        c = (f[4] * a11 - f[3] * a12) / det
        if c < 0:
            d, c = f[3] / f[0], 0.0
        elif d < 0:
            d, c = 0.0, (f[4] / f[2] if f[2] else 0.0)
        self.draft, self.catch_up = max(d, 0.0), c


@dataclass
class Planner:
    """Chooses each round's Plan; `adaptive=False` always drafts k_max from the first source offered.

    One Planner can serve many generations (a session keeps one), so later turns start from what earlier ones
    measured. `pad`: the engine may pad a verify pass with dummy positions (a plain KV cache), set per generation.
    """

    k_max: int
    adaptive: bool = True
    pad: bool = False
    costs: Dict[int, float] = field(default_factory=dict)  # seconds per round verified at a size (1: a plain step)
    timed: Dict[int, Deque[float]] = field(default_factory=dict)  # the latest timings behind each cost
    sources: Dict[str, SourceStats] = field(default_factory=dict)

    def stats(self, source: str) -> SourceStats:
        return self.sources.setdefault(source, SourceStats())

    def plain_step(self) -> Optional[float]:
        """Seconds per plain token on this machine, once measured."""
        return self.costs.get(1)

    def cost(self, size: int) -> float:
        """Seconds of a round at `size` positions: measured, interpolated between measured sizes, or that of the
        nearest measured one (a larger size is taken to cost no more until it is tried)."""
        if size in self.costs:
            return self.costs[size]
        below = max((s for s in self.costs if s < size), default=None)
        above = min((s for s in self.costs if s > size), default=None)
        if below is None or above is None:
            return self.costs[below if above is None else above]
        return self.costs[below] + (size - below) / (above - below) * (self.costs[above] - self.costs[below])

    def size(self, k: int) -> int:
        """Positions to verify k drafts at: k + 1, or with padding the size of `SIZES` at or above it that costs
        least (the smallest one until it has been measured)."""
        need = k + 1
        sizes = [s for s in SIZES if s >= need]
        if not self.pad or not sizes or sizes[0] not in self.costs:
            return sizes[0] if self.pad and sizes else need
        return min((s for s in sizes if s in self.costs), key=lambda s: (self.costs[s], s))

    def lengths(self, cap: int) -> List[int]:
        """The draft lengths worth weighing up to `cap`: each that fills a size of `SIZES`, and with padding cap."""
        ks = {s - 1 for s in SIZES if 1 <= s - 1 <= cap}
        if self.pad or not ks:
            ks.add(cap)
        return sorted(ks)

    def expected(self, source: str, k: int, accept: Optional[float] = None) -> float:
        """Expected tokens from a round drafting k tokens from `source` (`accept`: at that acceptance instead)."""
        s = self.stats(source)
        a = min(s.accept if accept is None else accept, 0.999)
        p = s.first_accept if accept is None else accept
        return 1 + p * (1 - a ** k) / (1 - a)

    def round_cost(self, source: str, k: int, behind: int = 0, tokens: float = 1.0, horizon: int = 0) -> float:
        """Seconds of a round drafting k tokens from `source` after feeding `behind` tokens; with a horizon the
        catch-up is spread over that many output tokens, of which the round yields `tokens`."""
        s = self.sources.get(source)
        cost = self.cost(self.size(k))
        if s is not None and s.draft is not None:
            share = min(1.0, tokens / horizon) if horizon else 1.0
            cost += k * s.draft + s.catch_up * behind * share
        return cost

    def plan(self, offers: Dict[str, int], room: int, behind: Optional[Dict[str, int]] = None,
             free: Collection[str] = ()) -> Plan:
        """The next round. offers: each source that could draft -> the most tokens it could (a free source's draft
        length, a costly source's cap); room: the most draft tokens the round may have; behind: each costly
        source's catch-up (missing: 0); free: the sources that are table lookups."""
        behind = behind or {}
        caps = {s: min(c, room, self.k_max) for s, c in offers.items() if min(c, room, self.k_max) > 0}
        if not caps:
            return PLAIN
        if not self.adaptive:
            source = next(iter(caps))
            return Plan(source, caps[source], caps[source] + 1)
        plain = self.costs.get(1)
        if plain is None:
            return PLAIN  # the baseline every draft must beat is measured first
        fresh = [s for s in caps if s not in free and self.stats(s).draft is None]
        for s in fresh:  # a costly source never timed drafts a one-token probe first; one that must catch up waits
            if not behind.get(s):
                return self._probe(s)
        horizon = min(room + 1, CATCH_UP_HORIZON)
        best, best_rate = PLAIN, 1.0 / plain
        for s, cap in caps.items():
            if s in fresh:
                continue
            for k in self.lengths(cap):
                e = self.expected(s, k)
                rate = e / self.round_cost(s, k, behind.get(s, 0), e, horizon)
                if rate > best_rate * (1 + MARGIN * (best.k == 0)):
                    best, best_rate = Plan(s, k, self.size(k)), rate
        if best.k == 0 and fresh:  # nothing else would draft: now a new source's catch-up is worth a look
            return self._probe(fresh[0])
        spent = 1.0 / best_rate * self.expected(best.source, best.k) if best.k else plain
        for s, cap in caps.items():  # costly sources passed over earn probe credit, and probe once it covers a probe
            if s == best.source or s in free or s in fresh:
                continue
            st = self.stats(s)
            st.idle += 1
            st.credit += PROBE_BUDGET * spent
            if (st.idle >= PROBE_MIN and self._hopeful(s, cap)
                    and st.credit >= self._probe_loss(s, best_rate, behind.get(s, 0), horizon)):
                return self._probe(s)
        if best.k:
            self.stats(best.source).idle, self.stats(best.source).credit = 0, 0.0
        return best

    def _probe(self, source: str) -> Plan:
        s = self.stats(source)
        s.idle, s.credit = 0, 0.0
        return Plan(source, 1, self.size(1), probe=True)

    def _hopeful(self, source: str, cap: int) -> bool:
        """Whether `source` could beat plain decoding with every draft token accepted."""
        plain = self.costs[1]
        return any((k + 1) / self.round_cost(source, k) > (1 + MARGIN) / plain for k in self.lengths(cap))

    def _probe_loss(self, source: str, rate: float, behind: int, horizon: int) -> float:
        """Seconds a one-token probe of `source` is expected to lose against rounds at `rate` tokens per second."""
        tokens = self.expected(source, 1)
        return max(0.0, self.round_cost(source, 1, behind, tokens, horizon) - tokens / rate)

    def _time(self, size: int, seconds: float) -> None:
        """A cost is the median of the size's latest TIMINGS rounds: a stall (a round several times the usual, seen
        on a GPU host) moves it by nothing, and a plain step timed high does not keep a losing drafter on."""
        samples = self.timed.setdefault(size, deque(maxlen=TIMINGS))
        samples.append(seconds)
        self.costs[size] = statistics.median(samples)

    def record(self, plan: Plan, proposed: int, accepted: int, seconds: float, behind: int = 0,
               warm: bool = True, free: bool = True) -> None:
        """A finished round: `accepted` of the `proposed` tokens drafted under `plan`, in `seconds` of wall clock
        (warm False: a first-seen shape ran, so the time is not a cost). free: the source is a table lookup, whose
        round time is the verify size's cost; a costly source's time beyond the verify pass is its drafting."""
        if proposed:
            self.stats(plan.source).observe(proposed, accepted)
        if not warm:
            return
        if plan.k == 0 or free:
            self._time(plan.size if plan.k else 1, seconds)
        elif proposed:
            if 1 not in self.costs:
                return
            self.stats(plan.source).time(proposed, behind, max(0.0, seconds - self.cost(plan.size)))

    def judge(self, source: str, proposed: int, accepted: int) -> None:
        """A free source's draft that was not verified, judged against the tokens the round produced."""
        self.stats(source).observe(proposed, accepted)

    def hindsight(self, source: str, matches: Sequence[bool]) -> None:
        """What greedy drafts from `source` would have done over output it sat out (`matches[i]`: its prediction
        was the i-th token), replayed as rounds of k_max tokens, each ending at its first miss."""
        s, i = self.stats(source), 0
        while i < len(matches):
            k, m = min(self.k_max, len(matches) - i), 0
            while m < k and matches[i + m]:
                m += 1
            s.observe(k, m)
            i += m + 1
