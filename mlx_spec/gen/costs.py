"""What passes cost on this machine, as the engine measured them: the target's by rows and positions (the median of
its latest rounds; a shape not timed is interpolated from those that were), a costly source's part of a round by least
squares, a copy of the rows' cache. No cost is a constant of a machine.
"""

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .tunables import CATCH_UP_RATIO, EMA, MARGIN, PRIOR_TRIALS, SIZES, TIMINGS


class _Fit:
    """seconds = d n + c b (n draft steps, b catch-up tokens) by decayed least squares, with a weak prior d = r c
    (r = CATCH_UP_RATIO, a thousandth of the rounds' weight) that splits a round with a long catch-up. step: a draft
    step's expected seconds, weighed as PRIOR_TRIALS rounds (one noisy first round cannot price a source out)."""

    def __init__(self, step: float | None = None):
        self.f, self.d, self.c = [0.0] * 5, 0.0, 0.0
        if step:
            self.f[0], self.f[3] = PRIOR_TRIALS, PRIOR_TRIALS * step
        self.known = False  # a round whose catch-up costs less than its drafting, by the prior, was timed: d is seen

    def add(self, n: int, b: int, seconds: float) -> None:
        f, r, self.known = self.f, CATCH_UP_RATIO, self.known or b <= CATCH_UP_RATIO * n
        for i, v in enumerate((n * n, n * b, b * b, n * seconds, b * seconds)):
            f[i] = (1 - EMA) * f[i] + v
        ridge = 1e-3 * (f[0] + f[2] / (r * r))
        a11, a12, a22 = f[0] + ridge, f[1] - r * ridge, f[2] + r * r * ridge
        det = a11 * a22 - a12 * a12
        d, c = (f[3] * a22 - f[4] * a12) / det, (f[4] * a11 - f[3] * a12) / det
        if c < 0:
            d, c = f[3] / f[0], 0.0
        elif d < 0:
            d, c = 0.0, (f[4] / f[2] if f[2] else 0.0)
        self.d, self.c = max(d, 0.0), c


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (c0, c1) of y = c0 + c1 x, c1 >= 0; a single x gives (its y, 0)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    c1 = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx) if sxx else 0.0
    return my - c1 * mx, c1


def _rising(points: Sequence[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """The non-decreasing least-squares fit of (x, y, weight) points (pool adjacent violators), as sorted (x, y)."""
    blocks: list[tuple[float, int, list[float]]] = []  # (mean y, weight, xs)
    for x, y, w in sorted(points):
        blocks.append((y, w, [x]))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (y2, w2, x2), (y1, w1, x1) = blocks.pop(), blocks.pop()
            blocks.append(((y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, x1 + x2))
    return [(x, y) for y, _, xs in blocks for x in xs]


@dataclass(kw_only=True)
class Costs:
    """Measured seconds of target passes by (places, size), of a costly source's part of a round, of a copy."""

    timed: dict[tuple[int, int], deque[float]] = field(default_factory=dict)  # (places, size) -> latest seconds
    passes: dict[tuple[int, int], float] = field(default_factory=dict)  # their medians
    drafts: dict[tuple[str, int], _Fit] = field(default_factory=dict)  # (costly source, rows) -> its cost fit
    copies: list[float] = field(default_factory=list)  # seconds per position of packing the cache
    ran: int = 0  # the most positions of a pass in a round a costly source drafted in (its fit times that round)
    slope: float = 0.0  # seconds a position (rows x size), fitted to every pass timed
    curve: list[tuple[float, float]] = field(default_factory=list)  # (positions, seconds), rising: every pass timed

    def cost(self, places: int, size: int, optimistic: bool = False) -> float | None:
        """Seconds of a pass over `places` rows of `size` positions: measured; else interpolated between the sizes
        timed at as many places, past the largest at `slope` (optimistic: at the largest's cost, for a round that
        times it: a lookup's long draft), below the smallest at its cost; else read by positions off `curve`, every
        pass timed; None before any pass was timed."""
        if (places, size) in self.passes:
            return self.passes[(places, size)]
        same = sorted((s, c) for (p, s), c in self.passes.items() if p == places)
        below, above = [x for x in same if x[0] < size], [x for x in same if x[0] > size]
        if below and above:
            (sa, ca), (sb, cb) = below[-1], above[0]
            return ca + (cb - ca) * (size - sa) / (sb - sa)
        if below or above:
            s, c = below[-1] if below else above[0]
            return c + (0.0 if optimistic else self.slope) * places * max(0, size - s)
        if not self.curve:
            return None
        x, (x0, y0), (xn, yn) = places * size, self.curve[0], self.curve[-1]
        if x <= x0:
            return max(1e-6, y0 - self.slope * (x0 - x))
        if x >= xn:
            return yn + self.slope * (x - xn)
        i = next(j for j, (xj, _) in enumerate(self.curve) if xj >= x)
        (xa, ya), (xb, yb) = self.curve[i - 1], self.curve[i]
        return ya + (yb - ya) * (x - xa) / (xb - xa)

    def plain_step(self) -> float | None:
        """Seconds of one row's plain step on this machine, once measured or predicted."""
        return self.cost(1, 1)

    def size(self, places: int, k: int, pad: bool) -> int:
        """Positions to verify k drafts at: k + 1, or with padding the size of `SIZES` at or above it that costs
        least (the smallest one until it has been measured)."""
        sizes = [s for s in SIZES if s >= k + 1]
        if not pad or not sizes:
            return k + 1
        timed = [s for s in sizes if (places, s) in self.passes]
        return min(timed, key=lambda s: (self.passes[(places, s)], s)) if sizes[0] in timed else sizes[0]

    def draft_cost(self, source: str, rows: int, k: int, behind: float) -> float:
        """Seconds a costly source adds to a round: k passes over `rows` rows after feeding `behind` tokens."""
        fits = {m: f for (s, m), f in self.drafts.items() if s == source}
        if rows in fits:
            return fits[rows].d * k + fits[rows].c * behind
        c0, c1 = _line([(m, f.d) for m, f in fits.items()])
        c = min(fits.items(), key=lambda mf: abs(mf[0] - rows))[1].c
        return max(0.0, c0 + c1 * rows) * k + c * behind

    def known(self, source: str) -> bool:
        """Whether `source`'s draft steps were timed apart from its catch-ups (a round of mostly draft steps ran)."""
        return any(f.known for (s, _), f in self.drafts.items() if s == source)

    def reach(self) -> int:
        """The most positions a pass may span: twice those timed so far (past them its cost is a guess), and at
        least the largest verify size once a pass was timed."""
        timed = max(max((p * s for p, s in self.passes), default=0), self.ran)
        return max(2 * timed, SIZES[-1]) if timed else 0

    def time_pass(self, key: tuple[int, int], seconds: float) -> None:
        """A cost is the median of the shape's latest TIMINGS rounds: a stall moves it by nothing."""
        samples = self.timed.setdefault(key, deque(maxlen=TIMINGS))
        samples.append(seconds)
        self.passes[key] = statistics.median(samples)
        by: dict[int, list[float]] = {}
        for (p, s), v in self.timed.items():
            by.setdefault(p * s, []).extend(v)
        points = [(x, statistics.median(v), len(v)) for x, v in by.items()]
        self.slope, self.curve = _line([(x, y) for x, y, _ in points])[1], _rising(points)

    def time_draft(
        self, source: str, rows: int, k: int, behind: int, places: int, size: int, seconds: float, share: float = 0.0
    ) -> None:
        """A round in which `source` drafted k tokens for `rows` rows after feeding `behind`, verified over `places`
        x `size` positions in `seconds`. Its part is what the round took beyond a plain step over as many places (the
        verify pass's positions past the first go in with the draft steps: a source is priced by its own rounds).
        share: its draft step over a plain step by the weights each reads (`Ask.share`), its first fit's prior."""
        verify = self.cost(places, 1)
        if verify is None:
            return
        if (source, rows) not in self.drafts:
            plain = self.cost(rows, 1)
            self.drafts[(source, rows)] = _Fit(share * plain if share and plain else None)
        self.drafts[(source, rows)].add(k, behind, max(0.0, seconds - verify))
        self.ran = max(self.ran, places * size)

    def record_copy(self, positions: int, seconds: float) -> None:
        """A packing of the cache: `positions` (rows x columns) copied in `seconds`."""
        self.copies = (self.copies + [seconds / max(1, positions)])[-TIMINGS:]

    def pays(self, rows: int) -> bool:
        """Whether one pass over `rows` rows, or over as many as any plain pass timed (a width refused is not timed
        again), costs MARGIN less than as many passes over one (True until timed; one row alone: True)."""
        alone, widths = self.cost(1, 1), [rows] + [p for p, s in self.passes if s == 1 and p > 1]
        return (
            rows <= 1
            or alone is None
            or any((c := self.cost(w, 1)) is None or c < (1 - MARGIN) * w * alone for w in widths)
        )
