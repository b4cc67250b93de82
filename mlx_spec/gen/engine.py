"""The speculative engine: rows generating together, each round planned, proposed, verified in one target pass,
accepted, rewound, recorded and delivered row by row. A request alone is an engine of one row."""

import dataclasses
import time
from collections import Counter

import mlx.core as mx
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache

from ..errors import UnsupportedError
from ..models.base import params_bytes, text_of
from ..models.cache import unrewindable
from . import hidden, recurrent, shapes, tree, verify
from .ahead import Ahead
from .apart import apart
from .cache import context_limit
from .drafters.base import Draft, Drafting, Member
from .joint import JointCache
from .planner import PLAIN, Ask, Outcome, Plan, Planner, tree_key
from .registry import default_num_draft
from .rows import Row, Step
from .tunables import PREFILL_STEP
from .verify import shadow_judgement


class Engine:
    """The rows generating together over one target: their cache (`JointCache`), one planner, one drafting per
    costly source, and a plain step queued ahead where the rounds are plain."""

    def __init__(self, model, planner: Planner | None = None, chunk: int = PREFILL_STEP):
        """chunk: the most catch-up tokens a row's draft model is fed in a round beside other rows."""
        self.target, self.model = model, recurrent.recording(model)
        self.limit, self.chunk = context_limit(model), chunk
        self.taps: hidden.Taps | None = None  # the view that keeps the states some row's drafter reads
        self.planner = planner if planner is not None else Planner()
        self.cache: JointCache[Row] = JointCache()
        self.drafting: dict[str, Drafting] = {}
        self.shares: dict[str, float] = {}  # a costly source's expected share of a plain step (`Ask.share`)
        self.ahead = Ahead()
        self.last_read, self.outside = time.perf_counter(), 0.0  # the round clock; seconds spent in the caller since
        self.returned: float | None = None  # when the last round returned (None: no round yet)

    @property
    def rows(self) -> list[Row]:
        """The rows, in the order of their places in the cache."""
        return [r for r in self.cache.owners if r is not None]

    def expect(self, joining: bool) -> None:
        """Whether a row is on its way in: while one is, no plain step is queued ahead, so it joins with none to
        undo (`can_join`)."""
        self.ahead.joining = joining

    def can_join(self) -> bool:
        """Whether a row joins now without undoing a step queued ahead for the others."""
        return not self.ahead.queued

    def add(self, row: Row, cache: list) -> None:
        """A row joins whose `cache` holds its context minus the last token (a lone row's cache is used as it is). A
        step queued ahead for the others is undone (`expect` spares it: call it a round before). A drafter whose
        rejected drafts the target's cache cannot take back is refused here, before the first token."""
        why = unrewindable(cache, len(text_of(self.target).blocks)) if row.parts else None
        if row.drafter is not None and why is not None:
            raise UnsupportedError(f"{row.drafter.name} drafting: the target's cache cannot take back a draft: {why}")
        if self.cache.owners and (why := apart(self.target)) is not None:
            raise UnsupportedError(why)
        self.ahead.drop(self.cache)
        self.cache.add(row, cache)
        self.planner.joined()
        read = hidden.reads([p for r in self.rows for p in r.parts])
        self.taps = hidden.taps(self.target, read) if read else None
        if len(self.cache.owners) == 1:  # the round clock starts with the first row
            self.last_read, self.outside, self.returned = time.perf_counter(), 0.0, None
        for part in row.parts:
            part.reset(row.context, cache)
        row.caps = {
            p.name: min(row.k_max, default_num_draft(p) if len(row.parts) > 1 else row.k_max) for p in row.parts
        }

    def remove(self, row: Row) -> list:
        """Take a row out: its cache, holding exactly its context minus the last token (drafts, queued steps gone);
        its drafters get back what drafting together held for them."""
        for part in row.parts:
            if part.name in self.drafting:
                self.drafting[part.name].leave(part)
        if self.cache.joint and not self.cache.paddable():  # a joint recurrent state cannot drop its row's queued
            self.ahead.drop(self.cache)  # step alone: the step is undone for every place
        out = self.cache.remove(row, len(row.context) - 1)
        self.planner.left(len(self.rows))
        if not self.cache.owners:
            self.ahead.step = None
        return out

    # --- one round: plan, propose, verify, accept, rewind, record, deliver ---

    def round(self) -> dict[int, list[Step]]:
        """One round of every row: {the row's index in `rows`: the steps it produced}; a finished row is `done`."""
        now = time.perf_counter()
        self.outside += now - self.returned if self.returned is not None else 0.0
        self._pack()
        rows = self.rows
        offers = [self._lookup(r) for r in rows]
        asks = [self._ask(r, o) for r, o in zip(rows, offers)]
        plan, drain = self._plan(rows, asks)
        drafts = self._propose(plan, rows, offers)
        lengths = [self._length(plan, i, r, d) for i, (r, d) in enumerate(zip(rows, drafts))]
        plan = plan if any(lengths) else PLAIN
        built, fed, cold, states = self._verify(plan, rows, drafts, lengths)
        queued = self._launch(built, rows) if self.ahead.wanted(not plan.k and not drain, rows) else None
        seconds = self._read(rows, built, drafts, lengths)
        kept = [verify.accept(r.sampler, b, d, n) for r, b, d, n in zip(rows, built, drafts, lengths)]
        self._rewind(rows, kept, fed)
        self._show_states(rows, kept, states)
        # a plain round is timed where it read a step queued ahead and queued the next: one that queues nothing read a
        # step already under way, and its seconds do not hold a pass
        warm = not cold and not drain and (plan.k > 0 or self.ahead.queued and queued is not None)
        self.ahead.step = queued
        self._record(plan, rows, asks, offers, drafts, lengths, kept, seconds, warm)
        out = {i: r.deliver(d[:a] + [t], a) for i, (r, (d, a, t, _)) in enumerate(zip(rows, kept))}
        self.returned = time.perf_counter()
        return out

    @staticmethod
    def _length(plan: Plan, i: int, row: Row, draft: Draft | None) -> int:
        """The draft tokens of row i the round verifies: its draft's, up to the plan's k and the row's room (a tree:
        all of it, if no path is deeper)."""
        if draft is None or draft.source != plan.source(i):
            return 0
        if draft.parents is not None:
            return len(draft) if max(tree.depths(draft.parents), default=0) <= min(plan.k, row.room) else 0
        return min(len(draft), plan.k, row.room)

    def _lookup(self, row: Row) -> Draft | None:
        """The row's first table-lookup draft (a suffix match before an n-gram's), or None."""
        for part in row.parts if row.room > 0 else ():
            if part.free:
                d = part.propose(row.context, min(row.caps[part.name], row.room), row.sampler)
                if len(d):
                    return d
        return None

    def _ask(self, row: Row, offer: Draft | None) -> Ask:
        """What the row could draft: its lookup's draft, and its costly source where this engine's drafting of
        that source takes it (one draft model, one view of the target per engine)."""
        ask = Ask(
            row.accept, (offer.source, len(offer)) if offer is not None else ("", 0), left=row.room + 1, pace=row.pace
        )
        costly = next((p for p in row.parts if not p.free), None)
        if costly is not None and costly.name not in self.drafting:
            self.drafting[costly.name] = costly.drafting()
            share = params_bytes(costly.model) / params_bytes(self.target) if costly.model is not None else 1.0
            self.shares[costly.name] = share if 0 < share < 1 else 0.0
        if costly is not None and self.drafting[costly.name].takes(costly):
            ask.costly, ask.cap = costly.name, min(row.caps[costly.name], row.room)
            ask.share = self.shares[costly.name]
            ask.behind = costly.behind(row.context)
            ask.tree = costly.trees and len(self.cache.owners) == 1 and self._treeable()
        row.offered(
            max(
                ask.stats(ask.offer[0]).expected(ask.offer[1]) if offer is not None else 1.0,
                ask.stats(ask.costly).expected(ask.cap) if ask.cap else 1.0,
            )
        )
        return ask

    def _treeable(self) -> bool:
        """Whether a lone row's tree can be verified: plain attention caches, the target's blocks as mlx-lm lays
        them out (trees are not offered beside other rows)."""
        return all(type(c) is KVCache for c in self.cache.layers) and tree.view(self.target).model is not None

    def _plan(self, rows: list[Row], asks: list[Ask]):
        """(the round's Plan, whether it drains a queued step instead: the plan drafts through the target's cache)."""
        layers = self.cache.layers
        if not (self.cache.joint or can_trim_prompt_cache(layers)):  # a sliding window past its size
            for r in rows:
                if r.parts:
                    r.stats.fallback = r.stats.fallback or "the target's cache cannot rewind: plain decoding from here"
            return PLAIN, False
        plan = self.planner.plan(asks, len(self.cache.owners), self.cache.paddable(), self.ahead.queued)
        if plan.k and self.limit is not None:  # no position, dummies included, past the model's context
            fit = min(self.limit - len(r.context) for r in rows) + 1  # positions a row's pass may span
            short = dataclasses.replace(
                plan, k=min(plan.k, fit - 1), size=min(plan.size, fit), tree=min(plan.tree, fit - 1)
            )
            plan = short if fit > 1 else PLAIN
        in_target = plan.k and any(p.in_target_cache and p.name in plan.sources for r in rows for p in r.parts)
        if in_target and self.ahead.queued:
            return PLAIN, True
        return plan, False

    def _propose(self, plan: Plan, rows: list[Row], offers: list[Draft | None]) -> list[Draft | None]:
        """Each row's draft: its lookup's, or from the costly source the plan names, all its rows in one drafting."""
        drafts = list(offers)
        wanted: dict[str, list[int]] = {}
        for i, d in enumerate(offers):
            s = plan.source(i)
            if s and (d is None or d.source != s):
                wanted.setdefault(s, []).append(i)
        chunk = self.chunk if len(rows) > 1 else None
        for s, idx in wanted.items():
            asked = [(rows[i], next(p for p in rows[i].parts if p.name == s)) for i in idx]
            members = [Member(p, r.context, r.sampler, self.cache.index(r)) for r, p in asked]
            for i, d in zip(idx, self.drafting[s].propose(members, plan.k, self.cache, chunk, plan.tree)):
                drafts[i] = d
        return drafts

    def _verify(self, plan: Plan, rows: list[Row], drafts, lengths: list[int]):
        """One target pass over every place: [its last token] + its draft, padded to the plan's size (after a queued
        step: the draft alone, that step's logits its first row; a plain round: the queued step itself). Returns
        (per row what acceptance needs, lazy; positions fed; whether a shape ran for the first time)."""
        at = {id(r): i for i, r in enumerate(rows)}
        places, pending = self.cache.owners, self.ahead.step
        if not plan.k and pending is not None:  # read as queued: a new op on it would wait for the next queued step
            return [verify.Given(pending.tokens, self.cache.index(r)) for r in rows], 0, False, pending.states
        width = plan.size - (pending is not None) if plan.k else 1
        inputs = []
        for r in places:
            i = at[id(r)] if r is not None else None
            fill = r.context[-1] if r is not None else 0
            parts = [] if pending is not None else [mx.array([fill], dtype=mx.uint32)]
            if i is not None and lengths[i]:
                parts.append(drafts[i].tokens[: lengths[i]].astype(mx.uint32))
            n = sum(p.size for p in parts)
            inputs.append(mx.concatenate(parts + [mx.full((width - n,), fill, dtype=mx.uint32)]))
        self.cache.start_round()
        treed = next((d.parents for d, n in zip(drafts, lengths) if n and d.parents is not None), None)
        shape = tree.layout(treed, width, pending is None, self.cache.layers[0].offset) if treed is not None else None
        logits, states = self._run(mx.stack(inputs), shape)  # (places, width, V), (places, width, n * d) or None
        if pending is not None:
            logits = mx.concatenate([pending.logits[:, None], logits], axis=1)
            held = pending.states
            states = mx.concatenate([held, states], axis=1) if states is not None and held is not None else None
        cold = shapes.first_time(self.model, (len(places), width)) or any(d is not None and d.cold for d in drafts)
        built = [
            verify.targets(r.sampler, len(r.context), logits[self.cache.index(r), : n + 1], drafts[i], n)
            for i, (r, n) in enumerate(zip(rows, lengths))
        ]
        return built, width, cold, states

    def _run(self, x: mx.array, shape: tuple | None = None):
        """The target's pass over x (places, L): (logits, the states its drafters read or None); shape: a tree's
        (mask, positions), `tree.layout`."""
        layers = self.cache.layers
        if shape is not None:
            view = tree.view(self.target)
            taps = hidden.taps(view.model, self.taps.reads) if self.taps is not None else None
            return view.run(lambda m: taps(x, layers) if taps is not None else (m(x, cache=layers), None), *shape)
        return self.taps(x, layers) if self.taps is not None else (self.model(x, cache=layers), None)

    def _launch(self, built: list, rows: list[Row]):
        """Queue the next plain step of every place on the round's lazy tokens, before the host reads them."""
        if self.ahead.step is not None:  # the round was the queued step: its tokens feed the next
            tokens = self.ahead.step.tokens
        else:
            mine = {id(r): b if r.sampler.exact else b[1] for r, b in zip(rows, built)}
            tokens = mx.concatenate(
                [mine[id(r)][:1] if r is not None else mx.zeros((1,), dtype=mx.uint32) for r in self.cache.owners]
            ).astype(mx.uint32)
            mx.async_eval(tokens)  # its own event: the round's read then waits for this step, not the queued one
        return self.ahead.queue(self._run, tokens, self.cache.owners)

    def _read(self, rows: list[Row], built, drafts, lengths) -> float:
        """The round's one host synchronisation; returns the round's seconds: since the last read, less the time
        spent outside the engine (the caller's)."""
        t = time.perf_counter()
        seen = [d.hindsight[0] for d in drafts if d is not None and d.hindsight is not None]
        lazy = [b[:1] if isinstance(b, verify.Given) else b if isinstance(b, tuple) else (b,) for b in built]
        mx.eval(*[a for b in lazy for a in b], *[d.tokens for d, n in zip(drafts, lengths) if n], *seen)
        now = time.perf_counter()
        for r in rows:
            r.stats.syncs += 1
            r.stats.wait_time += now - t
        seconds, self.last_read, self.outside = now - self.last_read - self.outside, now, 0.0
        return seconds

    def _rewind(self, rows: list[Row], kept: list[tuple], fed: int) -> None:
        """Each place drops what it was fed beyond its kept tokens (a queued step is its first position)."""
        own = 0 if self.ahead.queued else 1
        path = next((p for *_, p in kept if p is not None), None)
        if path is not None:  # a lone row's tree: the path's positions kept, in order
            self.cache.keep(list(range(own)) + [j + own for j in path], fed)
            return
        keep = {id(r): own + a for r, (_, a, _, _) in zip(rows, kept)}
        drop = [fed - keep[id(r)] if r is not None else fed for r in self.cache.owners]  # an empty place keeps none
        if any(drop):
            self.cache.rewind(drop)

    def _show_states(self, rows: list[Row], kept: list[tuple], states: mx.array | None) -> None:
        """The drafters that read the target's states get those of the positions each row kept."""
        if states is not None and self.taps is not None:
            for r, (_, a, _, path) in zip(rows, kept):
                mine = states[self.cache.index(r)]
                mine = mine[mx.array([0] + [j + 1 for j in path])] if path is not None else mine[: a + 1]
                hidden.show(r.parts, len(r.context) - 1, mine, self.taps.reads)

    def _record(self, plan: Plan, rows, asks, offers, drafts, lengths, kept, seconds: float, warm: bool) -> None:
        """One observation of the round, which the planner, each row's stats and trace, and the drafters learn."""
        outcomes, together = [], Counter(plan.source(i) for i, n in enumerate(lengths) if n)
        for i, (r, offer, d, n, (drafted, a, nxt, path)) in enumerate(zip(rows, offers, drafts, lengths, kept)):
            source = plan.source(i) if n else ""
            part = next((p for p in r.parts if p.name == source), None)
            nodes = n if path is not None else 0
            n = max(tree.depths(d.parents)) if nodes else n  # a tree proposes as many tokens as it is deep
            o = Outcome(
                r.accept,
                tree_key(source) if nodes else source,
                n,
                a,
                d.behind if n else 0,
                part is not None and not part.free,
            )
            if offer is not None and offer.source != source:
                o.judged = (offer.source, *shadow_judgement(offer.tokens.tolist(), drafted[:a] + [nxt]))
                next(p for p in r.parts if p.name == offer.source).learn(*o.judged[1:])
            if n and d.hindsight is not None and r.sampler.temp == 0 and not nodes:
                o.hindsight = ([p == t for p, t in zip(d.hindsight[0].tolist(), d.hindsight[1])], r.k_max)
            if part is not None:
                part.learn(n, a)
            r.stats.record(n, a)
            r.stats.widest = max(r.stats.widest, len(rows))
            if o.costly and n:
                r.stats.drafted_together = max(r.stats.drafted_together, together[source])
            if r.stats.trace is not None:
                entry = {
                    "source": source,
                    "proposed": n,
                    "accepted": a,
                    "seconds": seconds,
                    "size": plan.size if plan.k else 1,
                    "behind": o.behind,
                }
                if plan.probe:
                    entry["probe"] = True
                if nodes:
                    entry["tree"] = nodes
                if o.hindsight:
                    entry["hindsight"] = [sum(o.hindsight[0]), len(o.hindsight[0])]
                r.stats.trace.append(entry)
            outcomes.append(o)
        self.planner.record(plan, len(self.cache.owners), seconds, outcomes, warm, asks)

    def _pack(self) -> None:
        """Drop the places of rows that left, where the planner finds the copy cheaper than running them along
        (always before a view of the target drafts: it drafts over every place)."""
        rows, places = self.rows, len(self.cache.owners)
        if places == len(rows):
            return
        rounds = max((r.room + 1) / r.pace for r in rows)
        positions = len(rows) * self.cache.columns()
        views = any(p.in_target_cache for r in rows for p in r.parts)
        if not views and not self.planner.packs(places, len(rows), positions, rounds):
            return
        start, live = time.perf_counter(), mx.array([i for i, r in enumerate(self.cache.owners) if r is not None])
        self.cache.pack([len(r.context) - (not self.ahead.queued) for r in rows])  # a queued step holds the last one
        self.ahead.keep(live)
        self.planner.record_copy(positions, time.perf_counter() - start)
