"""Batched speculation: several generations verified in one target forward pass per round.

Each row is one generation with its own context, drafter, sampling rule and stats. A round asks every row's context
drafters for a draft, chooses one draft length k for the batch (`BatchPlanner`), and feeds every row its last token
plus up to k draft tokens, right-padded to a common width, through mlx-lm's `BatchKVCache` (rows of different lengths
sit left-padded in it). Each row then accepts its own prefix (greedy or speculative sampling) and is rewound on its
own: positions past what a row accepted are rolled to its left padding (`BatchKVCache.prepare(right_padding=...)`
then `finalize()`, the way mlx-lm's batch generator aligns prompts), so the next round starts level again.

Rows join after a solo prefill (their `KVCache` merged in) and leave with their cache extracted back, trimmed to the
context minus its last token: the engine's contract, so a conversation continues from a session either way.

Batched rows draft with the sources that need no target state of their own (n-gram, suffix, a hybrid's table
lookups); a draft model's or a layer subset's drafts run only in `engine.speculative_generate_step` (in a batch such
a row drafts with its lookups, or not at all). Only rows on plain KV caches batch (`batchable`).
"""

import time
from dataclasses import dataclass, field
from statistics import median
from typing import Dict, List, Optional, Tuple

import mlx.core as mx
from . import batch_cache
from .drafters.base import Drafter
from .engine import context_limit
from .sampling import sample
from .stats import Stats
from .tunables import DISCOUNT, MARGIN, PRIOR_ACCEPT, PRIOR_TRIALS, TIMINGS
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
    accepted: float = PRIOR_ACCEPT * PRIOR_TRIALS  # discounted counts of this row's judged draft tokens
    judged: float = PRIOR_TRIALS
    done: bool = False
    started: float = field(default_factory=time.perf_counter)  # prompt time runs from here to the first token
    first_at: Optional[float] = None

    def sources(self) -> List[Drafter]:
        """The row's drafting sources a batched round may use (no draft model, no layer subset of the target)."""
        parts = self.drafter.parts if self.drafter is not None else ()
        return [p for p in parts if p.free and not p.in_target_cache]

    def expected(self, n: int) -> float:
        """Tokens a round yields for this row with n draft tokens: 1 + a + a^2 + ... + a^n (geometric acceptance)."""
        a = self.accepted / self.judged
        return sum(a ** i for i in range(n + 1))


class BatchPlanner:
    """Chooses the batch's draft length from measured round times and each row's acceptance.

    A round over B rows and T positions per row costs, on any device, about c0 + c1 * B * T (a fixed part: weight
    reads and kernel launches; a part per position): the planner fits c0 and c1 by least squares to the median time
    of each (B, T) seen, and picks the k that maximises the expected tokens of all rows per second, k = 0 (plain
    batched decoding) included. Until the fit has two points it runs plain rounds, then the widest draft.
    """

    def __init__(self, k_max: Optional[int] = None, adaptive: bool = True):
        self.k_max, self.adaptive = k_max, adaptive
        self.times: Dict[Tuple[int, int], List[float]] = {}
        self.seen: set = set()

    def record(self, rows: int, width: int, seconds: float) -> None:
        """A round's time; the first round of each (rows, width) is not kept (on a GPU it builds kernels)."""
        if (rows, width) not in self.seen:
            self.seen.add((rows, width))
            return
        self.times.setdefault((rows, width), []).append(seconds)
        del self.times[(rows, width)][:-TIMINGS]

    def cost(self, rows: int, width: int) -> Optional[float]:
        """Predicted seconds of a round, or None while the fit has too few points."""
        pts = [(b * t, median(v)) for (b, t), v in self.times.items()]
        if len({x for x, _ in pts}) < 2:
            return None
        n = len(pts)
        mx_, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        sxx = sum((x - mx_) ** 2 for x, _ in pts)
        c1 = max(0.0, sum((x - mx_) * (y - my) for x, y in pts) / sxx)
        c0 = max(1e-6, my - c1 * mx_)
        return c0 + c1 * rows * width

    def pays(self, rows: int) -> bool:
        """Whether one batched round over `rows` rows costs MARGIN less than as many single-row rounds (a device
        whose pass costs its positions, as this CPU's, gains nothing); True until the fit says."""
        batched, alone = self.cost(rows, 1), self.cost(1, 1)
        return batched is None or batched < (1 - MARGIN) * rows * alone

    def choose(self, rows: List[Row], lengths: List[int]) -> int:
        """The draft length of this round (0: plain), given each row's available draft length."""
        longest = max(lengths, default=0)
        if self.k_max is not None:
            longest = min(longest, self.k_max)
        if longest == 0 or not self.adaptive:
            return longest
        widths = {t for (_, t) in self.times}
        if self.cost(len(rows), 1) is None:  # measure plain and the widest draft first
            return 0 if 1 not in widths else longest
        best, best_rate = 0, sum(r.expected(0) for r in rows) / self.cost(len(rows), 1)
        for k in range(1, longest + 1):
            gain = sum(r.expected(min(k, n)) for r, n in zip(rows, lengths))
            rate = gain / self.cost(len(rows), k + 1)
            if rate > best_rate:
                best, best_rate = k, rate
        return best


class Batch:
    """The rows generating together and their joint target cache."""

    def __init__(self, model, k_max: Optional[int] = None, adaptive: bool = True):
        self.model, self.limit = model, context_limit(model)
        self.rows: List[Row] = []
        self.cache: Optional[list] = None  # the joint target cache (`batch_cache`)
        self.planner = BatchPlanner(k_max, adaptive)

    def add(self, row: Row, cache: list) -> None:
        """Join a row whose `cache` holds its context minus the last token."""
        joined = batch_cache.merge(cache)
        if self.cache is None:
            self.cache = joined
        else:
            batch_cache.extend(self.cache, joined)
        self.rows.append(row)
        if row.drafter is not None:
            for part in row.sources():
                part.reset(row.context, None)

    def remove(self, row: Row) -> list:
        """Take a row out; its cache comes back holding exactly its context minus the last token."""
        i = self.rows.index(row)
        out = batch_cache.extract(self.cache, i, len(row.context) - 1)
        keep = [j for j in range(len(self.rows)) if j != i]
        self.rows.pop(i)
        if keep:
            batch_cache.keep_rows(self.cache, keep)
        else:
            self.cache = None
        return out

    def round(self) -> Dict[int, List[Step]]:
        """One round for every row: {row index: the steps it produced}. Finished rows are marked `done`."""
        rows = self.rows
        rooms = [r.budget - r.stats.generation_tokens - 1 for r in rows]  # draft tokens each row may still use
        drafts = []
        for r, room in zip(rows, rooms):
            d = None
            for part in r.sources() if room > 0 else ():
                d = part.propose(r.context, min(r.k_max, room), r.probs_fn)
                if len(d):
                    break
            drafts.append(d if d is not None and len(d) else None)
        lengths = [min(len(d), r.k_max, room) if d else 0 for r, d, room in zip(rows, drafts, rooms)]
        k = self.planner.choose(rows, lengths)
        if self.limit is not None:  # no row's padding may reach past the context (absolute position tables)
            k = max(0, min([k] + [self.limit - len(r.context) for r in rows]))
        tokens = [list(d.tokens[: min(k, n)]) if d else [] for d, n in zip(drafts, lengths)]
        width = 1 + max(len(t) for t in tokens)
        inputs = [[r.context[-1]] + t + [r.context[-1]] * (width - 1 - len(t)) for r, t in zip(rows, tokens)]
        batch_cache.start_round(self.cache)
        start = time.perf_counter()
        logits = self.model(mx.array(inputs), cache=self.cache)
        built = []
        for i, (r, t) in enumerate(zip(rows, tokens)):
            n = len(t)
            if r.probs_fn is None:
                built.append(mx.argmax(logits[i, : n + 1], axis=-1))
            else:
                q = r.probs_fn(logits[i, : n + 1])
                d = drafts[i]
                p = d.probs[:n] if d is not None and d.probs is not None else None
                built.append(sampling_targets(q, mx.array(t, dtype=mx.uint32), p) if n else
                             (mx.zeros((0,), dtype=mx.bool_), sample(q)))
        mx.eval(built)
        self.planner.record(len(rows), width, time.perf_counter() - start)
        keep, out = [], {}
        for i, (r, t, b) in enumerate(zip(rows, tokens, built)):
            n = len(t)
            if r.probs_fn is None:
                a, nxt = accept_greedy(t, b.tolist())
            else:
                a, nxt = accept_sampling(b[0].tolist(), b[1].tolist())
            r.stats.record(n, a)
            if n:
                r.accepted, r.judged = DISCOUNT * r.accepted + a, DISCOUNT * r.judged + n
                for part in r.sources():
                    if drafts[i] is not None and part.name == drafts[i].source:
                        part.learn(n, a)
            elif drafts[i] is not None:  # a draft the round did not verify is judged on the token it produced
                r.accepted, r.judged = DISCOUNT * r.accepted + (drafts[i].tokens[0] == nxt), DISCOUNT * r.judged + 1
            keep.append(1 + a)
            out[i] = self._deliver(r, t[:a] + [nxt], a)
        batch_cache.rewind(self.cache, [width - n for n in keep])
        return out

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
