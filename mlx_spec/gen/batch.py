"""Batched speculation: several generations verified in one target forward pass per round.

Each row is one generation with its own context, drafter, sampling rule and stats. A round asks every row's table
lookups (n-gram, suffix, a hybrid's) for a draft, lets the planner choose one draft length k for the batch and whether
the rows' draft model or view of the target (self, quant-self) drafts for the rows that have no lookup draft
(`BatchPlanner`: all of them in one pass per position, `batch_draft.py`), and feeds every row its last token plus up
to k draft tokens, right-padded to a common width, through the joint cache (`batch_cache.py`). Each row then accepts
its own prefix (greedy or speculative sampling) and is rewound on its own, so the next round starts level again.
Rows on plain KV caches batch, and so do rows of recurrent and hybrid models (a gated delta net's or Mamba's state is
rewound per row by replaying the layer's mixer on what the row kept, `recurrent.RewindableRows`); sliding-window
caches do not. A view of the target drafts in a batch only over attention layers.

Rows join after a solo prefill (their cache merged in) and leave with their cache extracted back, trimmed to the
context minus its last token: the engine's contract, so a conversation continues from a session either way."""

import math
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Dict, List, Optional, Tuple

import mlx.core as mx

from . import batch_cache
from .batch_draft import BatchDraft, SelfDraft
from .drafters.base import Drafter
from .drafters.model import ModelDrafter
from .engine import context_limit
from .planner import SourceStats
from .sampling import sample
from .stats import Stats
from .tunables import DISCOUNT, MARGIN, PRIOR_TRIALS, TIMINGS
from .verify import accept_greedy, accept_sampling, sampling_targets


@dataclass
class Step:
    """One token a row produced in a round."""

    token: int
    from_draft: bool
    pos: int  # its position in the round's draft (1 = first), 0 for the target's own token
    finish_reason: Optional[str]


@dataclass
class Row:
    """One generation in the batch: `context` ends with the token the target has not consumed yet."""

    context: List[int]
    drafter: Optional[Drafter]
    probs_fn: object
    budget: int  # tokens it may produce in all (its stats count those produced)
    at_limit: str  # the finish reason when the budget runs out: "length" or "context"
    eos: frozenset
    k_max: int
    stats: Stats = field(default_factory=Stats)
    rates: Dict[str, SourceStats] = field(default_factory=dict)  # each source's acceptance for this row
    model: Optional[ModelDrafter] = field(init=False, default=None)  # its drafter's draft model or self view, if any
    pace: float = 1.0  # tokens a round would yield it with all it offers to draft, the mean over its rounds
    paced: int = 0  # rounds in that mean
    done: bool = False
    started: float = field(default_factory=time.perf_counter)  # prompt time runs from here to the first token
    first_at: Optional[float] = None

    def __post_init__(self):
        parts = self.drafter.parts if self.drafter is not None else ()
        self.model = next((p for p in parts if isinstance(p, ModelDrafter)), None)

    def sources(self) -> List[Drafter]:
        """The row's table lookups (the sources a batched round asks first: free, no layer subset of the target)."""
        parts = self.drafter.parts if self.drafter is not None else ()
        return [p for p in parts if p.free and not p.in_target_cache]

    def rate(self, source: str) -> float:
        """The row's estimated acceptance of a source's draft tokens (the single-stream planner's `SourceStats`)."""
        return self.rates.setdefault(source, SourceStats()).accept

    def judge(self, source: str, proposed: int, accepted: int) -> None:
        """Count `accepted` of `proposed` draft tokens from `source` (older rounds discounted)."""
        self.rates.setdefault(source, SourceStats()).observe(proposed, accepted)

    def offers(self, n: int, source: str) -> None:
        """This round it offers n draft tokens from `source` (0: none): its pace follows."""
        self.paced += 1
        self.pace += ((self.expected(n, source) if n else 1.0) - self.pace) / self.paced

    def expected(self, n: int, source: str = "") -> float:
        """Tokens a round yields for this row with n draft tokens from `source`: 1 + a + ... + a^n (geometric)."""
        a = self.rate(source)
        return n + 1.0 if a >= 1 else (1 - a ** (n + 1)) / (1 - a)


def _line(points: List[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    """Least-squares (c0, c1) of y = c0 + c1 * x, both non-negative; a single x gives (its y, 0); None for none."""
    if not points:
        return None
    n = len(points)
    mx_, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx_) ** 2 for x, _ in points)
    if sxx == 0:
        return my, 0.0
    c1 = max(0.0, sum((x - mx_) * (y - my) for x, y in points) / sxx)
    return max(1e-6, my - c1 * mx_), c1


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
class Plan:
    """A round's drafting: k draft tokens at most per row, and whether the draft model drafts them."""

    k: int
    model: bool = False


class BatchPlanner:
    """Chooses each round's draft length, and whether the draft model runs, from measured times and each row's
    acceptance of each source.

    A target pass's cost is its measured times by positions (rows x width), interpolated, kept rising (a pass over
    more positions never costs less) and extended past the measured ones by their least-squares slope; a draft-model
    pass over m rows costs d0 + d1 * m, a least-squares line through its measured times. No pass spans more than
    twice the positions timed so far (past them, its cost is a guess). The plan with the most expected tokens per
    second wins (the rows' own speed), among those that do not lower the batch's throughput: a plan's value is the
    seconds of plain batched decoding its expected extra tokens save, per second it takes, at least 1 (plain
    batched decoding's, k = 0). Expected extra tokens are the rows' estimates (`Row.expected`) scaled by what the
    batch's drafting rounds delivered of what they promised (`calibration`). What a row's extra token saves
    depends on what happens when the row ends:
    - a new request takes its place (a busy server): a plain round's share per row, so the value is the rows'
      tokens per second against plain's;
    - nobody does (the batch drains): as far as the row is the one that will end last, a round of the batch
      alone; which row ends last is a softmax of the rounds each needs at its pace (what it offers to draft). A
      row that ends earlier but not last saves nothing: its place runs along until the batch is packed (`packs`).
      Drafting for some rows while others bound the batch then saves little: it runs where a wider pass costs
      about nothing, not where it costs its positions.
    The chance of the first, `refill`, is learned from the rows that left: a row's place counts as not taken from
    when it leaves until a new row joins. Until two position counts are timed the planner runs plain rounds, then
    the widest draft within reach; a draft model drafts until one of its rounds has been timed.
    """

    def __init__(self, k_max: Optional[int] = None, adaptive: bool = True):
        self.k_max, self.adaptive = k_max, adaptive
        self.times: Dict[Tuple[int, int], List[float]] = {}
        self.draft_times: Dict[int, List[float]] = {}  # members -> seconds per draft pass
        self.seen: set = set()
        self.curve: Optional[List[Tuple[float, float]]] = None  # (positions, seconds) measured, rising
        self.slope = 0.0  # seconds per position past the measured ones
        self.refilled_w, self.left_w = 0.0, PRIOR_TRIALS  # discounted rows whose place was taken, of those that
        # left: none until seen, so a batch is priced as draining (drafting pays less there) until rows are replaced;
        # places open now count as not taken, so a batch that starts to drain is priced so at once
        self.open = 0  # rows that left and whose place no row has taken yet
        self.copy_rates: List[float] = []  # seconds per row and column of packing the joint cache
        self.kept_w, self.promised_w = PRIOR_TRIALS, PRIOR_TRIALS  # discounted extra tokens the drafting rounds
        # delivered and the rows' estimates promised for them
        self.promised = 0.0  # what the last plan promised (0 for a plain round)

    @property
    def refill(self) -> float:
        """Estimated chance that a row's place in the batch is taken by a new one when it leaves."""
        return self.refilled_w / self.left_w

    def _left_one(self, refilled: bool) -> None:
        self.refilled_w = DISCOUNT * self.refilled_w + refilled
        self.left_w = DISCOUNT * self.left_w + 1

    def joined(self) -> None:
        """A row joined: it takes the place of one that left, if one is open (that row now counts as replaced)."""
        if self.open:
            self.open -= 1
            self.refilled_w = min(self.left_w, self.refilled_w + 1)

    def left(self, remaining: int) -> None:
        """A row left, `remaining` rows stay: it counts as not replaced until a row joins (when none stays, its
        place never will be)."""
        self._left_one(False)
        self.open = self.open + 1 if remaining else 0

    def record(self, rows: int, width: int, seconds: float) -> None:
        """A round's time; the first round of each (rows, width) is not kept (on a GPU it builds kernels)."""
        if (rows, width) not in self.seen:
            self.seen.add((rows, width))
            return
        self.times.setdefault((rows, width), []).append(seconds)
        del self.times[(rows, width)][:-TIMINGS]
        by_positions: Dict[int, List[float]] = {}
        for (b, t), v in self.times.items():
            by_positions.setdefault(b * t, []).extend(v)
        if len(by_positions) >= 2:
            pts = [(x, median(v), len(v)) for x, v in by_positions.items()]
            self.slope = _line([(x, y) for x, y, _ in pts])[1]
            self.curve = _rising(pts)

    def record_draft(self, members: int, passes: int, seconds: float) -> None:
        """A draft phase's time over `members` rows (not called for one that ran a shape for the first time)."""
        self.draft_times.setdefault(members, []).append(seconds / passes)
        del self.draft_times[members][:-TIMINGS]

    @property
    def calibration(self) -> float:
        """Extra tokens the drafting rounds delivered per extra token the rows' estimates promised."""
        return self.kept_w / self.promised_w

    def delivered(self, extra: float) -> None:
        """The last round's rows kept `extra` tokens past one each (counted where its plan drafted)."""
        if self.promised:
            self.kept_w = DISCOUNT * self.kept_w + extra
            self.promised_w = DISCOUNT * self.promised_w + self.promised

    def record_copy(self, positions: int, seconds: float) -> None:
        """A packing of the joint cache: `positions` (rows x columns) copied in `seconds`."""
        self.copy_rates.append(seconds / max(1, positions))
        del self.copy_rates[:-TIMINGS]

    def packs(self, slots: int, live: int, positions: int, rounds: float) -> bool:
        """Whether to pack the joint cache now (copy its `live` rows' `positions` without the slots of rows that
        left): the empty slots' part of every pass, over the `rounds` the batch still runs where no new row takes
        their place, costs more than the copy. True until a copy and two position counts were timed."""
        if not self.copy_rates or self.curve is None:
            return True
        waste = self.cost(slots, 1) - self.cost(live, 1)
        return (1 - self.refill) * waste * rounds > median(self.copy_rates) * positions

    def cost(self, rows: int, width: int) -> Optional[float]:
        """Predicted seconds of a target pass over rows x width positions: the measured times interpolated (past
        them, the least-squares slope), or None while fewer than two position counts were timed."""
        if self.curve is None:
            return None
        x, (x0, y0), (xn, yn) = rows * width, self.curve[0], self.curve[-1]
        if x <= x0:
            return max(1e-6, y0 - self.slope * (x0 - x))
        if x >= xn:
            return yn + self.slope * (x - xn)
        i = next(j for j, (xj, _) in enumerate(self.curve) if xj >= x)
        (xa, ya), (xb, yb) = self.curve[i - 1], self.curve[i]
        return ya + (yb - ya) * (x - xa) / (xb - xa)

    def draft_cost(self, members: int) -> Optional[float]:
        """Predicted seconds of one draft-model pass over `members` rows, or None before one was timed."""
        fit = _line([(m, median(v)) for m, v in self.draft_times.items()])
        return None if fit is None else fit[0] + fit[1] * members

    def pays(self, rows: int) -> bool:
        """Whether one batched round over `rows` rows costs MARGIN less than as many single-row rounds (a device
        whose pass costs its positions, as this CPU's, gains nothing); True until the fit says."""
        batched, alone = self.cost(rows, 1), self.cost(1, 1)
        return batched is None or batched < (1 - MARGIN) * rows * alone

    def choose(self, rows: List[Row], lengths: List[int], sources: List[str], draft_rows: int = 0,
               slots: Optional[int] = None) -> Plan:
        """This round's plan, given each row's table-lookup draft (its length and source; 0 for none). Rows with a
        `model` and no lookup draft draft with it when the plan says so, in passes over `draft_rows` rows. A pass
        runs over `slots` rows of the cache (the rows, and the empty places of rows that left)."""
        self.promised = 0.0
        longest = max(lengths, default=0)
        wants = [r.model is not None and n == 0 for r, n in zip(rows, lengths)]
        k_model = max([r.k_max for r, w in zip(rows, wants) if w], default=0)
        if self.k_max is not None:
            longest, k_model = min(longest, self.k_max), min(k_model, self.k_max)
        if not self.adaptive:
            return Plan(max(longest, k_model), k_model > 0)
        if max(longest, k_model) == 0:
            return Plan(0)
        b = slots or len(rows)
        reach = 2 * max((r * t for r, t in self.times), default=0)  # a pass may span twice the positions timed
        # so far, no more: past them its cost is a guess
        widest = max(1, min(max(longest, k_model), reach // b - 1))
        if self.cost(1, 1) is None:  # time plain, then the widest draft within reach
            return Plan(0) if not reach else Plan(widest, k_model > 0)
        per_pass = self.draft_cost(draft_rows)
        if k_model and per_pass is None:  # the draft model drafts once to be timed
            return Plan(widest, True)
        plain, alone, p = self.cost(b, 1), self.cost(1, 1), self.refill
        left = [r.budget - r.stats.generation_tokens for r in rows]
        last = self._last(rows, left)
        best, best_rate, cal = Plan(0), len(rows) / plain, self.calibration
        for model in (False, True) if k_model else (False,):
            for k in range(1, min(max(longest, k_model) if model else longest, widest) + 1):
                promised = [min(m, r.expected(min(k, n), s) if n else r.expected(k, r.model.name) if model and w
                                else 1.0) for r, m, n, s, w in zip(rows, left, lengths, sources, wants)]
                gains = [1 + (g - 1) * cal for g in promised]
                seconds = self.cost(b, k + 1) + (k * per_pass if model else 0.0)
                refilled = (sum(gains) - len(rows)) * plain / len(rows)
                draining = sum((g - 1) * c * alone for g, c in zip(gains, last))
                value = (plain + p * refilled + (1 - p) * draining) / seconds
                rate = sum(gains) / seconds
                if value >= 1 and rate > best_rate:
                    best, best_rate, self.promised = Plan(k, model), rate, sum(promised) - len(rows)
        return best

    @staticmethod
    def _last(rows: List[Row], left: List[int]) -> List[float]:
        """Each row's chance of ending last: a softmax of the rounds it still needs at its pace, over the counting
        noise of the most (their square root)."""
        rounds = [n / r.pace for r, n in zip(rows, left)]
        top = max(rounds)
        w = [math.exp((x - top) / max(1.0, math.sqrt(top))) for x in rounds]
        total = sum(w)
        return [x / total for x in w]


class Batch:
    """The rows generating together, their joint target cache and, where rows have one, their draft model's."""

    def __init__(self, model, k_max: Optional[int] = None, adaptive: bool = True):
        self.model, self.limit = model, context_limit(model)
        self.cache: Optional[list] = None  # the joint target cache (`batch_cache`)
        self.slots: List[Optional[Row]] = []  # the row in each row of the cache; None where one left (`_pack`)
        self.planner = BatchPlanner(k_max, adaptive)
        self.drafting = None  # the first drafting row's draft model (`BatchDraft`) or target view (`SelfDraft`)

    @property
    def rows(self) -> List[Row]:
        """The rows, in the order of the cache's rows."""
        return [r for r in self.slots if r is not None]

    def add(self, row: Row, cache: list) -> None:
        """Join a row whose `cache` holds its context minus the last token: into the place of a row that left
        where it fits, else as one more row."""
        free = next((i for i, r in enumerate(self.slots) if r is None), None)
        if free is not None and batch_cache.put(self.cache, free, cache):
            self.slots[free] = row
        else:
            self.cache = batch_cache.join(self.cache, cache)
            self.slots.append(row)
        self.planner.joined()
        for part in row.sources():
            part.reset(row.context, None)
        others = [r for r in self.rows if r is not row]
        if row.model is not None and not any(r.model is not None for r in others):  # the first decides
            self.drafting = SelfDraft(row.model) if row.model.in_target_cache else BatchDraft(row.model.model)
        if row.model is not None and not self.drafting.takes(row.model, self.cache):
            row.model = None  # one draft model or view per batch: another row's drafts with its lookups

    def remove(self, row: Row) -> list:
        """Take a row out; its cache comes back holding exactly its context minus the last token (its draft
        model's goes back to its drafter)."""
        if self.drafting is not None and row in self.drafting:
            self.drafting.leave(row)
        i = next(j for j, r in enumerate(self.slots) if r is row)
        out = batch_cache.extract(self.cache, i, len(row.context) - 1)
        self.slots[i] = None  # packed away or taken by a new row later (`_pack`, `add`)
        staying = len(self.rows)
        self.planner.left(staying)
        if not staying:
            self.cache, self.slots = None, []
        return out

    def _pack(self) -> None:
        """Drop the slots of rows that left from the joint cache, where the planner says the copy pays (always
        before a view of the target drafts: it drafts for every row of the cache)."""
        rows = self.rows
        if len(self.slots) == len(rows):
            return
        rounds = max((r.budget - r.stats.generation_tokens) / r.pace for r in rows)
        positions = len(rows) * batch_cache.columns(self.cache)
        if not isinstance(self.drafting, SelfDraft) and not self.planner.packs(
                len(self.slots), len(rows), positions, rounds):
            return
        start = time.perf_counter()
        batch_cache.keep_rows(self.cache, [i for i, r in enumerate(self.slots) if r is not None])
        mx.eval([c.state for c in self.cache])
        self.planner.record_copy(positions, time.perf_counter() - start)
        self.slots = rows

    def round(self) -> Dict[int, List[Step]]:
        """One round for every row: {row index: the steps it produced}. Finished rows are marked `done`."""
        self._pack()
        rows = self.rows
        rooms = [r.budget - r.stats.generation_tokens - 1 for r in rows]  # draft tokens each row may still use
        drafts = [self._lookup(r, room) for r, room in zip(rows, rooms)]
        lengths = [min(len(d), r.k_max, room) if d else 0 for r, d, room in zip(rows, drafts, rooms)]
        for r, d, n, room in zip(rows, drafts, lengths, rooms):
            if d is not None or r.model is None:
                r.offers(n, d.source if d else "")
            else:
                r.offers(min(r.k_max, room), r.model.name)
        draft_rows = len(rows) if isinstance(self.drafting, SelfDraft) else sum(r.model is not None for r in rows)
        plan = self.planner.choose(rows, lengths, [d.source if d else "" for d in drafts], draft_rows, len(self.slots))
        k = plan.k
        if self.limit is not None:  # no row's padding may reach past the context (absolute position tables)
            k = max(0, min([k] + [self.limit - len(r.context) for r in rows]))
        if plan.model and k:
            for i, d in self._model_drafts(k, draft_rows).items():
                if drafts[i] is None and rooms[i] > 0:
                    drafts[i], lengths[i] = d, min(k, rooms[i])
        tokens = [list(d.tokens[: min(k, n)]) if d else [] for d, n in zip(drafts, lengths)]
        width = 1 + max(len(t) for t in tokens)
        at = [i for i, r in enumerate(self.slots) if r is not None]  # each row's row in the cache
        inputs = [[0] * width] * len(self.slots)  # an empty slot runs along; it keeps none of it
        for r, t, s in zip(rows, tokens, at):
            inputs[s] = [r.context[-1]] + t + [r.context[-1]] * (width - 1 - len(t))
        batch_cache.start_round(self.cache)
        start = time.perf_counter()
        logits = self.model(mx.array(inputs), cache=self.cache)  # (slots, width, V)
        built = [self._targets(r, logits[s, : len(t) + 1], t, d) for r, t, s, d in zip(rows, tokens, at, drafts)]
        mx.eval(built)
        self.planner.record(len(self.slots), width, time.perf_counter() - start)
        keep, out = [], {}
        for i, (r, t, b) in enumerate(zip(rows, tokens, built)):
            n = len(t)
            if r.probs_fn is None:
                a, nxt = accept_greedy(t, b.tolist())
            else:
                a, nxt = accept_sampling(b[0].tolist(), b[1].tolist())
            r.stats.record(n, a)
            if n:
                r.judge(drafts[i].source, n, a)
                for part in r.sources():
                    if part.name == drafts[i].source:
                        part.learn(n, a)
            elif drafts[i] is not None:  # a draft the round did not verify is judged on the token it produced
                r.judge(drafts[i].source, 1, drafts[i].tokens[0] == nxt)
            keep.append(1 + a)
            out[i] = self._deliver(r, t[:a] + [nxt], a)
        if width > 1:  # a plan that drafted (the context limit may have cut it to none)
            self.planner.delivered(sum(keep) - len(rows))
        drop = [width] * len(self.slots)
        for s, n in zip(at, keep):
            drop[s] = width - n
        batch_cache.rewind(self.cache, drop)
        if self.drafting is not None and self.drafting.fed:  # each member keeps the model's drafts the target took
            used = {id(r): keep[i] - 1 for i, r in enumerate(rows) if drafts[i] is not None
                    and drafts[i].source == ModelDrafter.name}
            self.drafting.settle([used.get(id(r), 0) for r in self.drafting.rows])
        return out

    def _lookup(self, r: Row, room: int):
        """The row's first table-lookup draft (None if no source has one)."""
        for part in r.sources() if room > 0 else ():
            d = part.propose(r.context, min(r.k_max, room), r.probs_fn)
            if len(d):
                return d
        return None

    def _model_drafts(self, k: int, draft_rows: int) -> Dict[int, object]:
        """k draft tokens for every row with the batch's draft model (rows join its joint cache first) or view of
        the target, timed for the planner (passes over `draft_rows` rows): {row index: its draft}."""
        if isinstance(self.drafting, BatchDraft):
            for r in self.rows:
                if r.model is not None and r not in self.drafting and not self.drafting.join(r, r.model):
                    r.model = None  # its draft model's cache cannot batch: it drafts with its lookups
        if not any(r.model is not None for r in self.rows):
            return {}
        start = time.perf_counter()
        drafts = self.drafting.draft(self.cache, self.rows, k)
        if drafts and not self.drafting.cold:
            self.planner.record_draft(draft_rows, k, time.perf_counter() - start)
        return drafts

    @staticmethod
    def _targets(r: Row, logits: mx.array, t: List[int], d):
        """What acceptance needs of a row's logits (n + 1, V): the greedy tokens, or the sampling rule's draws."""
        n = len(t)
        if r.probs_fn is None:
            return mx.argmax(logits, axis=-1)
        q = r.probs_fn(logits)
        p = d.probs[:n] if d is not None and d.probs is not None else None
        if not n:
            return mx.zeros((0,), dtype=mx.bool_), sample(q)
        return sampling_targets(q, mx.array(t, dtype=mx.uint32), p)

    def _deliver(self, r: Row, new: List[int], drafted: int) -> List[Step]:
        steps, now = [], time.perf_counter()
        if r.first_at is None:
            r.first_at, r.stats.prompt_time = now, now - r.started
        r.stats.generation_time = now - r.first_at
        for j, tok in enumerate(new):
            r.stats.generation_tokens += 1
            finish = "stop" if tok in r.eos else (r.at_limit if r.stats.generation_tokens >= r.budget else None)
            r.context.append(tok)
            steps.append(Step(tok, j < drafted, j + 1 if j < drafted else 0, finish))
            if finish:
                r.done, r.stats.finish_reason = True, finish
                break
        return steps
