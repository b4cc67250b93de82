"""The server's rows: every request is a row of an engine (`gen.engine.Engine`), whose every round verifies all its
rows in one target forward pass (their draft model or view of the target, if their drafter has one, drafting for all
of them in one pass per position); each keeps its own session, sampling rule (a seed included) and stats.

Requests share one engine. A request whose cache cannot sit beside others (`joint.batchable`), or whose target cannot
run rows of different lengths in one pass (`gen.apart`, logged once), gets an engine of its own, and so does every
request where the measured round costs say a pass over several rows costs as much as one over each (`Costs.pays`:
the rows then take turns, an engine each) or the server runs with `--no-batch`. A request stays in its engine from its
first token to its last. Its prompt goes in a chunk per round, beside the running rows; it leaves with its caches back
in its session, so the conversation's next turn reuses them.
"""

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from mlx_spec.gen.apart import apart
from mlx_spec.gen.engine import Engine
from mlx_spec.gen.joint import batchable
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.rows import Row
from mlx_spec.gen.sampling import Sampler
from mlx_spec.gen.stream import Event
from mlx_spec.gen.tunables import PREFILL_STEP

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import StreamingDetokenizer


@dataclass
class Joined:
    """A request in an engine: its row, its engine and its own streaming detokenizer."""

    row: Row
    engine: Engine
    detok: "StreamingDetokenizer"


@dataclass
class Joining:
    """A request on its way into an engine: its row, and its prefill under way, a chunk per round."""

    row: Row
    prefill: Generator[tuple[bool, int], None, None]
    engine: Engine


log = logging.getLogger("mlx_spec.server")
J = TypeVar("J")  # the caller's job: what a row is known by


class Batcher(Generic[J]):
    """The engines and which request each of their rows serves."""

    def __init__(self, pair, batch: bool = True, chunk: int = PREFILL_STEP):
        self.pair, self.batch, self.chunk = pair, batch, chunk
        self.shared = Engine(pair.target, Planner(adaptive=pair.adaptive))
        # Engines of one row take turns: a row's queued step runs while the others' rounds do, so the seconds its
        # rounds measure are not a pass's cost. They learn in a planner of their own, apart from the costs that
        # decide whether a request joins the shared engine (`Costs.pays`).
        self.solo = Planner(adaptive=pair.adaptive)
        self.joined: dict[J, Joined] = {}  # job -> its row in an engine
        self.joining: dict[J, Joining] = {}  # job -> its prefill under way, in arrival order
        self._apart: str | None = None  # why the target's requests never share a pass
        self._asked = False  # whether `apart` probed the target yet

    @property
    def apart(self) -> str | None:
        """Why the target's requests never share a pass (None: they may), probed at the first request that could
        join others (not at start: a sharded target runs no pass that its other ranks do not), logged once."""
        if not self._asked:
            self._apart, self._asked = apart(self.pair.target), True
            if self._apart is not None:
                log.warning("every request runs alone: %s", self._apart)
        return self._apart

    def __len__(self) -> int:
        return len(self.joined) + len(self.joining)

    def __contains__(self, job) -> bool:
        return job in self.joined or job in self.joining

    def shared_rows(self) -> int:
        """Requests in the shared engine or joining it."""
        return sum(x.engine is self.shared for x in list(self.joined.values()) + list(self.joining.values()))

    @property
    def engines(self) -> list[Engine]:
        """Every engine with a row or a row on its way, the shared one first."""
        seen = {id(self.shared): self.shared}
        for x in list(self.joined.values()) + list(self.joining.values()):
            seen.setdefault(id(x.engine), x.engine)
        return list(seen.values())

    def join(self, job) -> bool:
        """Queue the request to join an engine: its prompt is prefilled on its session (reusing the cached prefix) a
        chunk per round (`step_joins`), beside the running rows, then it becomes a row. A bad option fails here.
        Returns whether it joins the shared engine."""
        p, session = job.params, job.session
        row = Row.start(
            self.pair.target,
            job.ids,
            p.max_tokens,
            drafter=session.drafter,
            k_max=session.num_draft,
            sampler=Sampler(p.temp, p.top_p, p.top_k, p.seed),
            accept=session.accept,
            eos=frozenset(self.pair.tokenizer.eos_token_ids),
        )
        rows = len(self.shared.rows) + sum(j.engine is self.shared for j in self.joining.values()) + 1
        pays = self.shared.planner.costs.pays(rows)
        together = self.batch and batchable(job.session.cache) and self.apart is None and pays
        engine = self.shared if together else Engine(self.pair.target, self.solo)
        engine.expect(True)  # no step queued ahead: the row joins between two rounds
        self.joining[job] = Joining(row, job.session.prefill(job.ids, self.chunk), engine)
        return together

    def step_joins(self) -> list[tuple[J, Exception]]:
        """One prefill chunk of the first request waiting to join; a request whose prompt is in becomes a row
        (once its engine queued nothing ahead). Returns the requests whose prefill failed, with the error (they
        are gone; the others go on)."""
        failed = []
        for job, j in list(self.joining.items()):
            if not j.engine.can_join():
                continue
            try:
                done, cached = next(j.prefill)
                if done:
                    del self.joining[job]
                    self._add(job, j, cached)
            except Exception as e:
                self.joining.pop(job, None)
                failed.append((job, e))
                continue
            if not done:
                break
        for engine in self.engines:
            engine.expect(any(j.engine is engine for j in self.joining.values()))
        return failed

    def _add(self, job, j: Joining, cached: int) -> None:
        j.row.stats.prompt_tokens, j.row.stats.prompt_cached = len(job.ids), cached
        j.engine.add(j.row, job.session.cache)
        detok = self.pair.tokenizer.detokenizer
        detok.reset()
        self.joined[job] = Joined(j.row, j.engine, detok)

    def leave(self, job) -> None:
        """Take the request's row out; its session gets the row's cache (context minus the last token). One still
        joining stops its prefill (its session forgets the conversation)."""
        if job in self.joining:
            self.joining.pop(job).prefill.close()
            return
        member = self.joined.pop(job)
        cache = member.engine.remove(member.row)
        job.session.restore(cache, member.row.context[:-1])

    def round(self, engine: Engine) -> list[tuple[J, Event]]:
        """One round of an engine: every member's new tokens, as events."""
        jobs = {id(m.row): job for job, m in self.joined.items()}
        out = []
        rows = engine.rows
        if rows:
            for i, steps in engine.round().items():
                job = jobs[id(rows[i])]
                member = self.joined[job]
                for s in steps:
                    if s.token not in member.row.eos:
                        member.detok.add_token(s.token)
                    if s.finish_reason:
                        member.detok.finalize()
                    out.append(
                        (
                            job,
                            Event(s.token, member.detok.last_segment, s.from_draft, member.row.stats, s.finish_reason),
                        )
                    )
        return out

    def clear(self, engine: Engine) -> list[J]:
        """Forget an engine after a failed round: the jobs that were in it or joining it."""
        jobs = [job for job, x in list(self.joined.items()) + list(self.joining.items()) if x.engine is engine]
        for job in jobs:
            x = self.joined.pop(job, None) or self.joining.pop(job)
            if isinstance(x, Joining):
                x.prefill.close()
        if engine is self.shared:
            self.shared = Engine(self.pair.target, self.shared.planner)
        return jobs
