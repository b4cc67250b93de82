"""Which rows draft next, from which source and how many tokens: the one owner of every decision about drafting.

A round drafting k tokens for a row yields E(k) = (1 - a^(k+1)) / (1 - a) tokens (Leviathan et al.; a: the row's
acceptance of the source). It costs the target's pass at its size or, where a costly source (a draft model, a view
of the target) drafts, a plain step and that source's part as its own rounds measured it (`costs.py`); after a plain
step queued ahead, also the step that restarts the queue. `plan`, a pure query, takes the plan with the most expected
tokens a second of those that keep the rows' throughput at plain decoding's or above; what an extra token saves
depends on whether a new row takes a row's place when it ends (`refill`, learned) or the rows drain. `record`, the
one place state changes, learns acceptance and costs; a costly source passed over earns probe credit, probes once it
covers the loss expected, and pays from it what the probe lost. A row alone whose costly source drafts trees may get
a tree of TREE_PER_DEPTH tokens a depth, learned apart from the chains (`tree_key`), first tried by such a probe.
What a row alone does was judged on the replay of recorded rounds (`mlx-spec bench replay`, docs/benchmarks.md);
what only batches and trees do (refill, draining, `Costs.reach`, packing, tree probes) awaits a replay of its own.
"""

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from .acceptance import SourceStats
from .costs import Costs
from .tunables import CATCH_UP_HORIZON, DISCOUNT, PRIOR_TRIALS, PROBE_BUDGET, SIZES, TREE_PER_DEPTH


@dataclass(frozen=True)
class Plan:
    """A round: row i drafts at most k tokens from `sources[i]` ("" for none), verified at `size` positions a row
    (k = 0: a plain step for every row); tree > 0: the costly source drafts a tree of that many tokens, k deep;
    queued: priced as verified after a plain step queued ahead."""

    k: int = 0
    sources: tuple[str, ...] = ()
    size: int = 1
    probe: bool = False
    tree: int = 0
    queued: bool = False

    def source(self, i: int = 0) -> str:
        return self.sources[i] if self.k and i < len(self.sources) else ""


def tree_key(source: str) -> str:
    """What a source's trees are learned under (acceptance by depth, drafting's cost): apart from its chains'."""
    return f"{source} tree"


PLAIN = Plan()


@dataclass
class Ask:
    """What one row could draft this round."""

    accept: dict[str, SourceStats]  # the row's acceptance by source
    offer: tuple[str, int] = ("", 0)  # a table lookup's draft: its source and length
    costly: str = ""  # the source that drafts at a cost for this row (a model, a view of the target), if any
    cap: int = 0  # the most tokens the costly source drafts for it
    behind: int = 0  # tokens the costly source feeds it before drafting
    left: int = 1  # tokens the row may still produce
    pace: float = 1.0  # tokens its rounds yield, the mean over its rounds
    tree: bool = False  # its costly source may draft it a tree
    share: float = 0.0  # its costly source's draft step over a plain step, by the weights each reads (0: unknown)

    def stats(self, source: str) -> SourceStats:
        """The row's acceptance of `source` (the prior where it never drafted): read, never added to `accept`."""
        return self.accept.get(source) or SourceStats()


@dataclass
class Outcome:
    """One row's part of a finished round."""

    accept: dict[str, SourceStats]
    source: str = ""  # what it drafted with ("" for none)
    proposed: int = 0
    accepted: int = 0
    behind: int = 0
    costly: bool = False  # the source drafts at a cost: the round's time beyond its verify pass is its own
    judged: tuple[str, int, int] | None = None  # an unverified lookup draft: (source, judged, matched)
    hindsight: tuple[list[bool], int] | None = None  # whether a catch-up's greedy predictions were the output it
    # sat out, replayed as rounds of that many tokens


@dataclass
class Planner:
    """Chooses each round's Plan by the `costs` it measured; `adaptive=False` drafts every row's first offer, as long as
    it is, every round. One Planner can serve many generations (a session keeps one): later turns start measured."""

    adaptive: bool = True
    trees: bool = True  # a row alone whose costly source drafts trees may be given one where it pays
    only_k: int = 0  # > 0: drafts of this length (or the longest within reach) are weighed alone against plain
    credit: dict[str, float] = field(default_factory=dict)  # probe budget a costly source (or its trees) earned
    refilled_w: float = 0.0  # discounted rows whose place a new row took, of `left_w` that left: none until seen
    left_w: float = PRIOR_TRIALS
    open: int = 0  # rows that left whose place no row has taken yet
    drafted_w: float = PRIOR_TRIALS  # discounted drafting rounds, and those of them that followed a queued step:
    started_w: float = PRIOR_TRIALS / 2  # a stretch of drafting rounds is taken as two rounds long until measured
    costs: Costs = field(default_factory=Costs)

    @property
    def refill(self) -> float:
        """Estimated chance that a row's place is taken by a new row when it leaves."""
        return self.refilled_w / self.left_w

    # --- choosing (pure) ---

    def plan(self, asks: Sequence[Ask], places: int | None = None, pad: bool = False, queued: bool = False) -> Plan:
        """The next round for rows that could draft as `asks` say, in a pass over `places` rows (default: one per
        ask; more where rows that left still hold places). pad: dummy positions may pad the pass. queued: a plain
        step is queued ahead (a drafting round then verifies after it, and plain decoding restarts its queue)."""
        b = places or len(asks)
        if not any(a.offer[1] or (a.costly and a.cap) for a in asks):
            return PLAIN
        if not self.adaptive:
            sources = tuple(a.offer[0] if a.offer[1] else a.costly for a in asks)
            k = max(a.offer[1] if a.offer[1] else a.cap for a in asks)
            return Plan(k, sources, k + 1)
        if self.costs.cost(b, 1) is None:
            return PLAIN  # the baseline every draft must beat is measured first
        costly = sorted({a.costly for a in asks if a.costly and a.cap})
        fresh = [s for s in costly if not self.costs.known(s)]
        if fresh:  # a costly source never timed drafts a one-token probe first
            return self._probe(fresh[0], asks, b, pad, queued)
        best, rate = self._best(asks, b, pad, queued, costly)
        for s in costly:
            if s not in best.sources and self._due(s, asks, b, queued, rate):
                return self._probe(s, asks, b, pad, queued)
        return self._tree_due(best, asks, b, pad) or best

    def _best(self, asks: Sequence[Ask], b: int, pad: bool, queued: bool, timed: list[str]) -> tuple[Plan, float]:
        """The plan with the most expected tokens a second that does not lower the rows' throughput, and that rate."""
        plain, n = self.costs.cost(b, 1) or 0.0, len(asks)
        best, best_rate = PLAIN, n / plain
        last, widest = self._last(asks), max(0, self.costs.reach() // b - 1)
        options = [("", False)] + [(s, False) for s in timed]
        options += [(s, True) for s in timed if self.trees and any(a.tree and a.costly == s for a in asks)]
        for option, treed in options:
            key = tree_key(option) if treed else option
            top = max([a.offer[1] for a in asks] + [a.cap for a in asks if option and a.costly == option])
            for k in self._lengths(min(top, widest // TREE_PER_DEPTH if treed else widest), pad):
                sources, gains = [], []
                for a in asks:
                    free = a.stats(a.offer[0]).expected(min(k, a.offer[1])) if a.offer[1] else 1.0
                    mine = option and a.costly == option and (a.tree or not treed)
                    model = a.stats(key if key in a.accept else option).expected(min(k, a.cap)) if mine else 0.0
                    pick, g = (option, model) if model > free else (a.offer[0] if a.offer[1] else "", free)
                    sources.append(pick)
                    gains.append(min(g, a.left))
                if not any(sources) or treed and option not in sources:
                    continue
                size = self.costs.size(b, TREE_PER_DEPTH * k if treed else k, pad)
                rows = [(a, g) for a, g, s in zip(asks, gains, sources) if s and s == option]
                if rows:  # a plain step and the source's part, as its rounds measured them; a catch-up is spread
                    # over the rounds it serves
                    horizon = min(min(a.left for a, _ in rows), CATCH_UP_HORIZON)
                    behind = sum(a.behind * min(1.0, g / horizon) for a, g in rows)
                    own = self.costs.known(key)  # a tree not timed: the chains' cost and its whole pass, a dear guess
                    seconds = self._verify_cost(b, 1 if own else size, queued)
                    seconds += self.costs.draft_cost(key if own else option, len(rows), k, behind)
                else:  # lookups alone: the pass, which their round times
                    seconds = self._verify_cost(b, size, queued, optimistic=True)
                rate = sum(gains) / seconds
                if self._value(gains, last, plain, seconds) >= 1 and rate > best_rate:
                    best, best_rate = Plan(k, tuple(sources), size, tree=(size - 1) * treed, queued=queued), rate
        return best, best_rate

    def _value(self, gains: list[float], last: list[float], plain: float, seconds: float) -> float:
        """Plain-decoding seconds a round's extra tokens save per second it takes (plain decoding's is 1)."""
        n, alone = len(gains), self.costs.cost(1, 1) or 0.0
        refilled = (sum(gains) - n) * plain / n
        draining = sum((g - 1) * c * alone for g, c in zip(gains, last))
        return (plain + self.refill * refilled + (1 - self.refill) * draining) / seconds

    @staticmethod
    def _last(asks: Sequence[Ask]) -> list[float]:
        """Each row's chance of ending last: a softmax of the rounds it still needs at its pace, over the counting
        noise of the most (their square root)."""
        rounds = [a.left / a.pace for a in asks]
        top = max(rounds)
        w = [math.exp((x - top) / max(1.0, math.sqrt(top))) for x in rounds]
        return [x / sum(w) for x in w]

    def _lengths(self, cap: int, pad: bool) -> list[int]:
        """The draft lengths weighed up to `cap`: each that fills a size of `SIZES`, and with padding cap (only_k:
        that one length, or cap below it)."""
        if self.only_k:
            return [min(self.only_k, cap)] if cap > 0 else []
        return sorted({s - 1 for s in SIZES if 1 <= s - 1 <= cap} | ({cap} if cap > 0 and pad else set()))

    def _probe(self, source: str, asks: Sequence[Ask], places: int, pad: bool, queued: bool) -> Plan:
        sources = tuple(source if a.costly == source and a.cap else "" for a in asks)
        return Plan(1, sources, self.costs.size(places, 1, pad), probe=True, queued=queued)

    def _due(self, s: str, asks: Sequence[Ask], places: int, queued: bool, rate: float) -> bool:
        """Whether costly source `s`, passed over, probes now: it sat out a round at least, it could beat plain
        decoding fully accepted, and its credit covers what a probe would lose against rounds at `rate`. The credit
        alone spaces the probes: one that lost by a hair probes again within a few rounds; a failed probe's debt
        holds it off for as long as the loss takes to earn back."""
        rows, credit = [a for a in asks if a.costly == s and a.cap], self.credit.get(s, 0.0)
        tokens = len(asks) + sum(a.stats(s).expected(1) - 1 for a in rows)
        if not 0 < credit >= self._probe_cost(s, rows, places, 1, queued) - tokens / rate:
            return False
        plain = self.costs.cost(places, 1) or 0.0
        return any(
            (len(asks) + len(rows) * k) * plain > len(asks) * self._probe_cost(s, rows, places, k, queued)
            for k in range(1, max(a.cap for a in rows) + 1)
        )

    def _probe_cost(self, s: str, rows: Sequence[Ask], places: int, k: int, queued: bool) -> float:
        """Seconds of a round in which `s` drafts k tokens for `rows`, its catch-up spread as `_best` spreads it."""
        behind = sum(a.behind * min(1.0, 1.0 / min(a.left, CATCH_UP_HORIZON)) for a in rows)
        return self._verify_cost(places, 1, queued) + self.costs.draft_cost(s, len(rows), k, behind)

    def _tree_due(self, best: Plan, asks: Sequence[Ask], places: int, pad: bool) -> Plan | None:
        """A tree probe, where a row alone given a chain it could have had as a tree has earned the credit for the
        extra positions (a tree's acceptance and cost are learned only where it drafts)."""
        ask = asks[0] if len(asks) == 1 else None
        if best.tree or not (self.trees and ask is not None and ask.tree and best.k and best.source(0) == ask.costly):
            return None
        size = self.costs.size(places, TREE_PER_DEPTH * best.k, pad)
        extra = self._verify_cost(places, size, best.queued) - self._verify_cost(places, best.size, best.queued)
        credit = self.credit.get(tree_key(ask.costly), 0.0)
        return dataclasses.replace(best, size=size, probe=True, tree=size - 1) if 0 < credit >= extra else None

    def _verify_cost(self, places: int, size: int, queued: bool, optimistic: bool = False) -> float:
        """Seconds of a drafting round's verify pass; after a plain step queued ahead, plus the step that queues
        again when plain decoding resumes, spread over the rounds a stretch of drafting rounds lasts."""
        restart = (self.costs.cost(places, 1) or 0.0) * self.started_w / self.drafted_w if queued else 0.0
        return (self.costs.cost(places, size, optimistic) or 0.0) + restart

    # --- learning: the one place the planner's state changes ---

    def record(
        self,
        plan: Plan,
        places: int,
        seconds: float,
        outcomes: Sequence[Outcome],
        warm: bool = True,
        asks: Sequence[Ask] = (),
    ) -> None:
        """A finished round over `places` rows, planned for `asks`: what each row drafted and kept, in `seconds` of
        wall clock (warm False: a shape ran for the first time, so the time is not a cost)."""
        for o in outcomes:
            if o.proposed:
                o.accept.setdefault(o.source, SourceStats()).observe(o.proposed, o.accepted)
            if o.judged is not None:
                o.accept.setdefault(o.judged[0], SourceStats()).observe(*o.judged[1:])
            if o.hindsight is not None:
                o.accept.setdefault(o.source, SourceStats()).hindsight(*o.hindsight)
        if plan.k:
            self.drafted_w = DISCOUNT * self.drafted_w + 1
            self.started_w = DISCOUNT * self.started_w + plan.queued
        self._earn(plan, places, seconds if warm else None, outcomes, asks)
        if not warm:
            return
        costly = [o for o in outcomes if o.proposed and o.costly]
        if not costly:
            self.costs.time_pass((places, plan.size if plan.k else 1), seconds)
        else:
            s, behind = costly[0].source, sum(o.behind for o in costly)
            share = next((a.share for a in asks if a.costly == s), 0.0)
            self.costs.time_draft(s, len(costly), plan.k, behind, places, plan.size, seconds, share)

    def _earn(self, plan: Plan, places: int, seconds: float | None, outcomes: Sequence[Outcome], asks) -> None:
        """Probe credit: a timed costly source passed over earns PROBE_BUDGET of the round's time (a tree, where its
        row was given the chain instead); one that drafts starts again from none; a probe pays what it lost as
        measured: its round's `seconds` (None: not a cost) and, after a queued plain step, the whole restart of the
        queue, beyond what plain decoding takes for the tokens it yielded. A source's first probe, which feeds the
        prompt any use of it pays once, is not timed yet (`Costs.known`) and pays nothing."""
        plain = self.costs.cost(places, 1) or 0.0
        earned = PROBE_BUDGET * (seconds if seconds is not None else plain)
        drafted = set(plan.sources) if plan.k else set()
        keys = {a.costly for a in asks if a.costly and a.cap and self.costs.known(a.costly)}
        ask = asks[0] if len(asks) == 1 else None
        if self.trees and ask is not None and ask.tree and plan.k and plan.source(0) == ask.costly:
            keys.add(tree_key(ask.costly))  # its chain was drafted: its tree was passed over (or drafted)
            if plan.tree:
                drafted.add(tree_key(ask.costly))
        for s in keys:
            if s in drafted and plan.probe and not plan.tree:
                yielded = (len(outcomes) + sum(o.accepted for o in outcomes)) / max(1, len(outcomes))
                lost = max(0.0, seconds + plain * plan.queued - plain * yielded) if seconds is not None else 0.0
                self.credit[s] = min(0.0, self.credit.get(s, 0.0) - lost)
            elif s in drafted:
                self.credit[s] = 0.0
            else:
                self.credit[s] = self.credit.get(s, 0.0) + earned

    # --- events between rounds: rows joining and leaving, the cache packed ---

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

    def packs(self, places: int, live: int, positions: int, rounds: float) -> bool:
        """Whether to pack the cache now: the empty places' part of every pass, over the `rounds` the rows still
        run where no new row takes their place, costs more than the copy (True until both were timed)."""
        full, kept = self.costs.cost(places, 1), self.costs.cost(live, 1)
        if not self.costs.copies or full is None or kept is None:
            return True
        return (1 - self.refill) * (full - kept) * rounds > statistics.median(self.costs.copies) * positions

    def record_copy(self, positions: int, seconds: float) -> None:
        """The rows' cache was packed: `positions` (rows x columns) copied in `seconds`."""
        self.costs.record_copy(positions, seconds)
