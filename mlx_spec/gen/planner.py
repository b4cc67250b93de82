"""Which rows draft next, from which source and how many tokens: the one owner of every cost estimate.

A round drafting k tokens for a row whose first draft token is accepted with probability p and each later one with
a yields E(k) = 1 + p (1 - a^k) / (1 - a) tokens for it (the geometric model of Leviathan et al., its first token
apart). The round costs a target pass over the rows' places at the size it is verified at (k + 1 positions, or a
larger size of `SIZES` padded with dummy positions where that size was measured cheaper), plus, where a costly
source (a draft model, a view of the target) drafts, its k passes over its rows and the catch-up it feeds first.
Each round the planner takes the plan with the most expected tokens per second among those that do not lower the
rows' throughput below plain decoding's, and drafts only where that promises MARGIN more.

Costs are wall-clock times the engine measured (the host's work included): a pass's cost is the median of its latest
rounds by (places, size), and where a shape was not timed, the measured medians interpolated by positions (places x
size), kept rising, past them extended by their least-squares slope; no pass spans more than twice the positions
timed so far. A costly source's time beyond the verify pass is split between its drafted positions and its catch-up
tokens by least squares, per count of rows it drafted for. A round that ran a shape for the first time is not timed.

Acceptance is each row's own (`SourceStats`, kept by its session across turns). What an extra token saves depends on
what happens when its row ends: a waiting request takes its place (a busy server: it saves a plain round's share per
row), or nobody does (the rows drain: as far as the row is the one that ends last, a round of it alone). The chance
of the first, `refill`, is learned from the rows that left. A costly source passed over earns PROBE_BUDGET of each
round's time and drafts a one-token probe once its credit covers what the probe is expected to lose; one that could
not beat plain decoding with every token accepted is not probed.
"""

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from .tunables import (CATCH_UP_HORIZON, DISCOUNT, EMA, FIRST_PRIOR, MARGIN, PRIOR_ACCEPT, PRIOR_TRIALS,
                       PROBE_BUDGET, PROBE_MIN, SIZES, TIMINGS)


@dataclass(frozen=True)
class Plan:
    """A round: row i drafts at most k tokens from `sources[i]` ("" for none), verified at `size` positions a row
    (k = 0: a plain step for every row)."""

    k: int = 0
    sources: Tuple[str, ...] = ()
    size: int = 1
    probe: bool = False

    def source(self, i: int = 0) -> str:
        return self.sources[i] if self.k and i < len(self.sources) else ""


PLAIN = Plan()


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
        return 1 + self.first_accept * (1 - a ** k) / (1 - a)


@dataclass
class Ask:
    """What one row could draft this round."""

    accept: Dict[str, SourceStats]  # the row's acceptance by source
    offer: Tuple[str, int] = ("", 0)  # a table lookup's draft: its source and length
    costly: str = ""  # the source that drafts at a cost for this row (a model, a view of the target), if any
    cap: int = 0  # the most tokens the costly source drafts for it
    behind: int = 0  # tokens the costly source feeds it before drafting
    left: int = 1  # tokens the row may still produce
    pace: float = 1.0  # tokens its rounds yield, the mean over its rounds

    def stats(self, source: str) -> SourceStats:
        return self.accept.setdefault(source, SourceStats())


@dataclass
class Outcome:
    """One row's part of a finished round."""

    accept: Dict[str, SourceStats]
    source: str = ""  # what it drafted with ("" for none)
    proposed: int = 0
    accepted: int = 0
    behind: int = 0
    costly: bool = False  # the source drafts at a cost: the round's time beyond its verify pass is its own
    judged: Optional[Tuple[str, int, int]] = None  # an unverified lookup draft: (source, judged, matched)
    hindsight: Optional[Tuple[List[bool], int]] = None  # whether a catch-up's greedy predictions were the output it
    # sat out, replayed as rounds of that many tokens


class _Fit:
    """seconds = d n + c b by decayed least squares (a weak prior puts a catch-up token at an eighth of a drafted
    position, so one round with a long catch-up splits; later rounds outweigh it)."""

    def __init__(self):
        self.f, self.d, self.c = [0.0] * 5, 0.0, 0.0

    def add(self, n: int, b: int, seconds: float) -> None:
        f = self.f
        for i, v in enumerate((n * n, n * b, b * b, n * seconds, b * seconds)):
            f[i] = (1 - EMA) * f[i] + v
        ridge = 1e-3 * (f[0] + f[2])  # the prior: d - 8 c = 0
        a11, a12, a22 = f[0] + ridge, f[1] - 8 * ridge, f[2] + 64 * ridge
        det = a11 * a22 - a12 * a12
        d, c = (f[3] * a22 - f[4] * a12) / det, (f[4] * a11 - f[3] * a12) / det
        if c < 0:
            d, c = f[3] / f[0], 0.0
        elif d < 0:
            d, c = 0.0, (f[4] / f[2] if f[2] else 0.0)
        self.d, self.c = max(d, 0.0), c


def _line(points: List[Tuple[float, float]]) -> Tuple[float, float]:
    """Least-squares (c0, c1) of y = c0 + c1 x, c1 >= 0; a single x gives (its y, 0)."""
    n = len(points)
    mx_, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx_) ** 2 for x, _ in points)
    if sxx == 0:
        return my, 0.0
    c1 = max(0.0, sum((x - mx_) * (y - my) for x, y in points) / sxx)
    return my - c1 * mx_, c1


def _rising(points: List[Tuple[float, float, int]]) -> List[Tuple[float, float]]:
    """The non-decreasing least-squares fit of (x, y, weight) points (pool adjacent violators), as sorted (x, y)."""
    blocks: List[list] = []  # [mean y, weight, xs]
    for x, y, w in sorted(points):
        blocks.append([y, w, [x]])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, x2 = blocks.pop()
            y1, w1, x1 = blocks.pop()
            blocks.append([(y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, x1 + x2])
    return [(x, y) for y, _, xs in blocks for x in xs]


@dataclass
class Planner:
    """Chooses each round's Plan; `adaptive=False` drafts every row's first offer, as long as it is, every round.
    One Planner can serve many generations (a session keeps one), so later turns start from what earlier measured."""

    adaptive: bool = True
    timed: Dict[Tuple[int, int], Deque[float]] = field(default_factory=dict)  # (places, size) -> latest seconds
    costs: Dict[Tuple[int, int], float] = field(default_factory=dict)  # their medians
    drafts: Dict[Tuple[str, int], _Fit] = field(default_factory=dict)  # (costly source, rows) -> its cost fit
    idle: Dict[str, int] = field(default_factory=dict)  # rounds since a costly source last drafted
    credit: Dict[str, float] = field(default_factory=dict)  # probe budget it earned while passed over (seconds)
    refilled_w: float = 0.0  # discounted rows whose place a new row took, of `left_w` that left: none until seen
    left_w: float = PRIOR_TRIALS
    open: int = 0  # rows that left whose place no row has taken yet
    kept_w: float = PRIOR_TRIALS  # discounted extra tokens drafting rounds delivered, and what they promised
    promised_w: float = PRIOR_TRIALS
    copies: List[float] = field(default_factory=list)  # seconds per position of packing the cache
    ran: int = 0  # the most positions of a pass in a round a costly source drafted in (its fit times that round)
    _curve: List[Tuple[float, float]] = field(default_factory=list)
    _slope: float = 0.0

    # --- costs ---

    def cost(self, places: int, size: int) -> Optional[float]:
        """Seconds of a target pass over `places` rows of `size` positions: measured; else interpolated between the
        sizes measured at as many places (past the largest, its cost plus the slope over positions); else predicted
        by positions from every pass measured; None before any pass was timed."""
        if (places, size) in self.costs:
            return self.costs[(places, size)]
        same = sorted((s, c) for (p, s), c in self.costs.items() if p == places)
        below, above = [x for x in same if x[0] < size], [x for x in same if x[0] > size]
        if below and above:
            (sa, ca), (sb, cb) = below[-1], above[0]
            return ca + (cb - ca) * (size - sa) / (sb - sa)
        if below:
            return below[-1][1] + self._slope * places * (size - below[-1][0])
        if above:
            return above[0][1]  # a smaller pass is taken to cost no more until it is timed
        if not self._curve:
            return None
        x, (x0, y0), (xn, yn) = places * size, self._curve[0], self._curve[-1]
        if x <= x0:
            return max(1e-6, y0 - self._slope * (x0 - x))
        if x >= xn:
            return yn + self._slope * (x - xn)
        i = next(j for j, (xj, _) in enumerate(self._curve) if xj >= x)
        (xa, ya), (xb, yb) = self._curve[i - 1], self._curve[i]
        return ya + (yb - ya) * (x - xa) / (xb - xa)

    def plain_step(self) -> Optional[float]:
        """Seconds of one row's plain step on this machine, once measured or predicted."""
        return self.cost(1, 1)

    def size(self, places: int, k: int, pad: bool) -> int:
        """Positions to verify k drafts at: k + 1, or with padding the size of `SIZES` at or above it that costs
        least (the smallest one until it has been measured)."""
        sizes = [s for s in SIZES if s >= k + 1]
        if not pad or not sizes:
            return k + 1
        timed = [s for s in sizes if (places, s) in self.costs]
        return min(timed, key=lambda s: (self.costs[(places, s)], s)) if sizes[0] in timed else sizes[0]

    def draft_cost(self, source: str, rows: int, k: int, behind: float) -> float:
        """Seconds a costly source adds to a round: k passes over `rows` rows after feeding `behind` tokens."""
        fits = {m: f for (s, m), f in self.drafts.items() if s == source}
        if rows in fits:
            return fits[rows].d * k + fits[rows].c * behind
        c0, c1 = _line([(m, f.d) for m, f in fits.items()])
        c = min(fits.items(), key=lambda mf: abs(mf[0] - rows))[1].c
        return max(0.0, c0 + c1 * rows) * k + c * behind

    def reach(self) -> int:
        """The most positions a pass may span: twice those timed so far, alone or in a costly source's round (past them
        its cost is a guess), and at least the largest verify size once a pass was timed."""
        timed = max(max((p * s for p, s in self.costs), default=0), self.ran)
        return max(2 * timed, SIZES[-1]) if timed else 0

    # --- choosing ---

    @property
    def refill(self) -> float:
        """Estimated chance that a row's place is taken by a new row when it leaves."""
        return self.refilled_w / self.left_w

    @property
    def calibration(self) -> float:
        """Extra tokens the drafting rounds delivered per extra token the rows' estimates promised."""
        return self.kept_w / self.promised_w

    def plan(self, asks: Sequence[Ask], places: Optional[int] = None, pad: bool = False) -> Plan:
        """The next round for rows that could draft as `asks` say, in a pass over `places` rows (default: one per
        ask; more where rows that left still hold places). pad: dummy positions may pad the pass."""
        b, n = places or len(asks), len(asks)
        if not any(a.offer[1] or (a.costly and a.cap) for a in asks):
            return PLAIN
        if not self.adaptive:
            sources = tuple(a.offer[0] if a.offer[1] else a.costly for a in asks)
            k = max(a.offer[1] if a.offer[1] else a.cap for a in asks)
            return Plan(k, sources, k + 1)
        plain = self.cost(b, 1)
        if plain is None:
            return PLAIN  # the baseline every draft must beat is measured first
        widest = max(0, self.reach() // b - 1)
        costly = sorted({a.costly for a in asks if a.costly and a.cap})
        fresh = [s for s in costly if not any(key[0] == s for key in self.drafts)]
        for s in fresh:  # a costly source never timed drafts a one-token probe first; one that must catch up waits
            if not any(a.behind for a in asks if a.costly == s):
                return self._probe(s, asks, b, pad)
        best, best_rate, best_seconds = PLAIN, n / plain, plain
        last, cal = self._last(asks), self.calibration
        for option in [""] + [s for s in costly if s not in fresh]:
            top = max(max((a.offer[1] for a in asks), default=0),
                      max((a.cap for a in asks if option and a.costly == option), default=0))
            for k in self._lengths(min(top, widest), pad):
                sources, gains = [], []
                for a in asks:
                    free = a.stats(a.offer[0]).expected(min(k, a.offer[1])) if a.offer[1] else 1.0
                    model = a.stats(option).expected(min(k, a.cap)) if option and a.costly == option else 0.0
                    pick, g = (option, model) if model > free else (a.offer[0] if a.offer[1] else "", free)
                    sources.append(pick)
                    gains.append(1 + (min(g, a.left) - 1) * cal)
                if not any(sources):
                    continue
                size = self.size(b, k, pad)
                rows = [a for a, s in zip(asks, sources) if s and s == option]
                seconds = self.cost(b, size)
                if rows:
                    horizon = min(min(a.left for a in rows), CATCH_UP_HORIZON)
                    behind = sum(a.behind * min(1.0, g / horizon) for a, g in zip(asks, gains) if a in rows)
                    seconds += self.draft_cost(option, len(rows), k, behind)
                rate = sum(gains) / seconds
                if self._value(gains, last, plain, seconds) >= 1 and rate > best_rate * (1 + MARGIN * (not best.k)):
                    best, best_rate, best_seconds = Plan(k, tuple(sources), size), rate, seconds
        probe = self._credit(costly, fresh, best, best_seconds, best_rate, asks, b, pad)
        if probe is not None:
            return probe
        if not best.k and fresh:  # nothing else would draft: now a new source's catch-up is worth a look
            return self._probe(fresh[0], asks, b, pad)
        return best

    def promised(self, plan: Plan, asks: Sequence[Ask]) -> float:
        """Extra tokens the rows' estimates promise for a plan."""
        return sum(min(a.stats(s).expected(plan.k), a.left) - 1 for a, s in zip(asks, plan.sources) if s)

    def _value(self, gains: List[float], last: List[float], plain: float, seconds: float) -> float:
        """Plain-decoding seconds a round's extra tokens save per second it takes (plain decoding's is 1)."""
        n, alone = len(gains), self.cost(1, 1)
        refilled = (sum(gains) - n) * plain / n
        draining = sum((g - 1) * c * alone for g, c in zip(gains, last))
        return (plain + self.refill * refilled + (1 - self.refill) * draining) / seconds

    @staticmethod
    def _last(asks: Sequence[Ask]) -> List[float]:
        """Each row's chance of ending last: a softmax of the rounds it still needs at its pace, over the counting
        noise of the most (their square root)."""
        rounds = [a.left / a.pace for a in asks]
        top = max(rounds)
        w = [math.exp((x - top) / max(1.0, math.sqrt(top))) for x in rounds]
        return [x / sum(w) for x in w]

    @staticmethod
    def _lengths(cap: int, pad: bool) -> List[int]:
        """The draft lengths worth weighing up to `cap`: each that fills a size of `SIZES`, and with padding cap."""
        ks = {s - 1 for s in SIZES if 1 <= s - 1 <= cap}
        if (pad or not ks) and cap > 0:
            ks.add(cap)
        return sorted(ks)

    def _probe(self, source: str, asks: Sequence[Ask], places: int, pad: bool) -> Plan:
        self.idle[source], self.credit[source] = 0, 0.0
        return Plan(1, tuple(source if a.costly == source and a.cap else "" for a in asks),
                    self.size(places, 1, pad), probe=True)

    def _credit(self, costly, fresh, best: Plan, seconds: float, rate: float, asks, places: int,
                pad: bool) -> Optional[Plan]:
        """Costly sources passed over earn probe credit, and probe once it covers what a probe would lose against
        rounds at `rate` tokens per second."""
        chosen = set(best.sources) if best.k else set()
        for s in costly:
            if s in fresh:
                continue
            if s in chosen:
                self.idle[s], self.credit[s] = 0, 0.0
                continue
            self.idle[s] = self.idle.get(s, 0) + 1
            self.credit[s] = self.credit.get(s, 0.0) + PROBE_BUDGET * seconds
            rows = [a for a in asks if a.costly == s and a.cap]
            tokens = len(asks) + sum(a.stats(s).expected(1) - 1 for a in rows)
            lose = max(0.0, self._probe_cost(s, rows, places, pad, 1) - tokens / rate)
            if self.idle[s] >= PROBE_MIN and self._hopeful(s, rows, asks, places, pad) and self.credit[s] >= lose:
                return self._probe(s, asks, places, pad)
        return None

    def _hopeful(self, source: str, rows: Sequence[Ask], asks: Sequence[Ask], places: int, pad: bool) -> bool:
        """Whether `source` could beat plain decoding with every draft token accepted."""
        plain = self.cost(places, 1)
        cap = max(a.cap for a in rows)
        return any((len(asks) + len(rows) * k) / self._probe_cost(source, rows, places, pad, k)
                   > (1 + MARGIN) * len(asks) / plain for k in self._lengths(cap, pad))

    def _probe_cost(self, source: str, rows: Sequence[Ask], places: int, pad: bool, k: int) -> float:
        behind = sum(a.behind * min(1.0, 1.0 / min(a.left, CATCH_UP_HORIZON)) for a in rows)
        return self.cost(places, self.size(places, k, pad)) + self.draft_cost(source, len(rows), k, behind)

    # --- learning ---

    def record(self, plan: Plan, places: int, seconds: float, outcomes: Sequence[Outcome], warm: bool = True,
               promised: float = 0.0) -> None:
        """A finished round over `places` rows: what each row drafted and kept, in `seconds` of wall clock (warm
        False: a shape ran for the first time, so the time is not a cost)."""
        for o in outcomes:
            if o.proposed:
                o.accept.setdefault(o.source, SourceStats()).observe(o.proposed, o.accepted)
            if o.judged is not None:
                o.accept.setdefault(o.judged[0], SourceStats()).observe(*o.judged[1:])
            if o.hindsight is not None:
                o.accept.setdefault(o.source, SourceStats()).hindsight(*o.hindsight)
        if plan.k and promised:
            self.kept_w = DISCOUNT * self.kept_w + sum(o.accepted for o in outcomes)
            self.promised_w = DISCOUNT * self.promised_w + promised
        if not warm:
            return
        costly = [o for o in outcomes if o.proposed and o.costly]
        if not costly:
            self._time((places, plan.size if plan.k else 1), seconds)
        elif (places, plan.size) in self.costs or self._curve:
            source = costly[0].source
            fit = self.drafts.setdefault((source, len(costly)), _Fit())
            fit.add(plan.k, sum(o.behind for o in costly), max(0.0, seconds - self.cost(places, plan.size)))
            self.ran = max(self.ran, places * plan.size)

    def _time(self, key: Tuple[int, int], seconds: float) -> None:
        """A cost is the median of the shape's latest TIMINGS rounds: a stall moves it by nothing."""
        samples = self.timed.setdefault(key, deque(maxlen=TIMINGS))
        samples.append(seconds)
        self.costs[key] = statistics.median(samples)
        by: Dict[int, List[float]] = {}
        for (p, s), v in self.timed.items():
            by.setdefault(p * s, []).extend(v)
        pts = [(x, statistics.median(v), len(v)) for x, v in by.items()]
        self._slope = _line([(x, y) for x, y, _ in pts])[1] if len(pts) > 1 else 0.0
        self._curve = _rising(pts)

    # --- rows joining and leaving ---

    def joined(self) -> None:
        """A row joined: it takes the place of one that left, if one is open (that row now counts as replaced)."""
        if self.open:
            self.open -= 1
            self.refilled_w = min(self.left_w, self.refilled_w + 1)

    def left(self, remaining: int) -> None:
        """A row left, `remaining` stay: it counts as not replaced until a row joins."""
        self.left_w = DISCOUNT * self.left_w + 1
        self.refilled_w = DISCOUNT * self.refilled_w
        self.open = self.open + 1 if remaining else 0

    def record_copy(self, positions: int, seconds: float) -> None:
        """A packing of the cache: `positions` (rows x columns) copied in `seconds`."""
        self.copies = (self.copies + [seconds / max(1, positions)])[-TIMINGS:]

    def packs(self, places: int, live: int, positions: int, rounds: float) -> bool:
        """Whether to pack the cache now: the empty places' part of every pass, over the `rounds` the rows still
        run where no new row takes their place, costs more than the copy (True until both were timed)."""
        full, kept = self.cost(places, 1), self.cost(live, 1)
        if not self.copies or full is None:
            return True
        return (1 - self.refill) * (full - kept) * rounds > statistics.median(self.copies) * positions

    def pays(self, rows: int) -> bool:
        """Whether one pass over `rows` rows costs MARGIN less than as many passes over one (True until timed)."""
        batched, alone = self.cost(rows, 1), self.cost(1, 1)
        return batched is None or alone is None or batched < (1 - MARGIN) * rows * alone
