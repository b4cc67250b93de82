"""The one thread that runs the models: admits jobs FIFO and runs their engines' rounds.

MLX must not compute from several threads at once, so every forward pass happens here. Each active job has its own
`Session` and is a row of an engine (`batching.py`): requests share one, whose every round advances all of them in one
forward pass, and a request that cannot sit beside others has its own, the engines taking turns. A cancelled job is
closed before the next round, so it stops within one round, and its session (with its caches) is freed. On a target
sharded across ranks (`shard`), rank 0 shares each turn of this loop and the other ranks replay it (`lockstep.py`).
"""

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import mlx.core as mx

from mlx_spec.errors import MlxSpecError
from mlx_spec.gen.session import Session
from mlx_spec.gen.stats import Stats

from .batching import Batcher
from .defaults import PREFIX_CACHE_BYTES
from .errors import ApiError
from .lockstep import Lockstep, SharedStep
from .pair import Pair
from .params import Params
from .pool import IDLE_EXTRA, SessionPool
from .prefixes import PrefixCache
from .stops import Mark, Piece, StopText

QUEUE_PER_SLOT = 4  # waiting requests allowed per concurrent slot before new ones get a 429
RECENT = 64  # finished requests whose counters /health keeps

log = logging.getLogger("mlx_spec.server")


@dataclass
class Delta:
    """Text ready to send, one piece per token with its draft flag, and the counters so far."""

    pieces: list[Piece]
    live: dict[str, int]


@dataclass
class Done:
    """The reply is complete."""

    finish_reason: str  # OpenAI's: "stop" or "length"
    stats: dict  # Stats.as_dict() plus the engine's own finish reason and every token's draft flag


@dataclass
class Failed:
    """The generation failed; the error goes to the client."""

    error: ApiError


class QueueFull(Exception):
    """No room in the waiting queue."""


class _Broken(Exception):
    """The group under a sharded target broke during a round: the model thread stops."""


@dataclass
class Job:
    """One request as the scheduler sees it. `send` hands an item to the request's event loop, thread-safely."""

    id: str
    ids: list[int]
    params: Params
    send: Callable[[object], None]
    state: str = "queued"  # queued, active, completed, cancelled, failed
    submitted: float = field(default_factory=time.monotonic)
    started: float = 0.0
    cancel_requested: bool = False
    rounds_at_cancel: int | None = None
    rounds: int = 0
    tokens: int = 0
    prompt_cached: int = 0
    flags: list[bool] = field(default_factory=list)
    pos: int = 0  # the last token's position in its round's draft (0: the target's own)
    session: Session | None = None
    produced: list[int] = field(default_factory=list)  # its tokens so far
    stats: Stats | None = None  # the engine's counters of its reply so far
    stops: StopText = field(default_factory=StopText)  # the request's own, set when it starts

    __hash__ = object.__hash__  # a job is itself: the batcher keys its rows by job

    def summary(self) -> dict:
        """This request's counters, for /health."""
        d = {
            "id": self.id,
            "state": self.state,
            "prompt_tokens": len(self.ids),
            "prompt_cached": self.prompt_cached,
            "tokens": self.tokens,
            "rounds": self.rounds,
            "max_tokens": self.params.max_tokens,
            "batched": bool(self.stats and self.stats.widest > 1),
        }
        if self.rounds_at_cancel is not None:
            d["rounds_after_cancel"] = self.rounds - self.rounds_at_cancel
        return d


class Scheduler:
    """Runs up to `max_concurrency` jobs in turn on its own thread; up to `max_queue` more wait FIFO."""

    def __init__(
        self,
        pair: Pair,
        max_concurrency: int,
        max_queue: int | None = None,
        batch: bool = True,
        prefix_bytes: int = PREFIX_CACHE_BYTES,
    ):
        if max_concurrency < 1:
            raise MlxSpecError(f"--max-concurrency must be >= 1, got {max_concurrency}")
        self.pair, self.max_concurrency = pair, max_concurrency
        self.batcher: Batcher[Job] = Batcher(pair, batch)
        self.max_queue = QUEUE_PER_SLOT * max_concurrency if max_queue is None else max_queue
        self.pool = SessionPool(pair.new_session, max_concurrency + IDLE_EXTRA, PrefixCache(prefix_bytes))
        self.counts = dict(completed=0, cancelled=0, failed=0, rejected=0, rounds=0, tokens=0)
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []
        self._recent: deque[Job] = deque(maxlen=RECENT)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.lockstep: Lockstep | None = None

    def shard(self, lockstep: Lockstep) -> None:
        """Run over a sharded target: every rank replays rank 0's steps, so one request runs at a time (which rows
        share a pass is not shared yet), each engine planning with rank 0's plans; a broken group fails every
        request with a 503."""
        self.lockstep, self.max_concurrency = lockstep, 1
        self.batcher.batch = False  # a row's engine of its own, chosen alike on every rank
        self.batcher.solo = lockstep.planner(self.pair.adaptive)
        lockstep.on_broke = self._broke

    # --- the request side (any thread) ---

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull when every slot is taken and `max_queue` jobs wait already, a 503 when the group
        under a sharded target broke."""
        with self._cv:
            if self.lockstep is not None and self.lockstep.broken is not None:
                self.counts["rejected"] += 1
                raise self._down(self.lockstep.broken)
            free = max(0, self.max_concurrency - len(self._active))  # slots the thread has yet to fill
            if len(self._waiting) >= self.max_queue + free:
                self.counts["rejected"] += 1
                raise QueueFull(
                    f"the server is busy: {len(self._active)} requests generating and "
                    f"{len(self._waiting)} waiting (the queue holds {self.max_queue}); retry later"
                )
            self._waiting.append(job)
            self._cv.notify()

    def cancel(self, job: Job, unanswered: bool = False) -> None:
        """Stop a job: drop a waiting one now, stop an active one at its next turn. unanswered: its client went away
        before the whole reply reached it, so a job that completed meanwhile counts as cancelled too."""
        with self._cv:
            if unanswered and job.state == "completed":
                job.state = "cancelled"
                self.counts["completed"] -= 1
                self.counts["cancelled"] += 1
            elif job in self._waiting:
                self._waiting.remove(job)
                job.state = "cancelled"
                self.counts["cancelled"] += 1
                self._recent.append(job)
            elif job.state == "active" and not job.cancel_requested:
                job.rounds_at_cancel = job.rounds  # a round may be running now: it is the last
                job.cancel_requested = True

    def health(self) -> dict:
        """Counters for /health."""
        with self._cv:
            jobs = list(self._active) + list(self._recent)
            idle = list(self.pool.idle)  # idle only: an active one's caches change under the model thread
            broken = self.lockstep.broken if self.lockstep is not None else None
            sharded = None
            if self.lockstep is not None:
                ranks = self.lockstep.cluster.size
                sharded = {"ranks": ranks, "one_request_at_a_time": True, "error": broken}
            return {
                "status": "broken" if broken else "ok" if self._thread and self._thread.is_alive() else "stopped",
                "sharded": sharded,
                "active": len(self._active),
                "queued": len(self._waiting),
                "max_concurrency": self.max_concurrency,
                "max_queue": self.max_queue,
                "batched": self.batcher.shared_rows(),
                **self.counts,
                "sessions": {"total": self.pool.total, "idle": len(idle), "idle_bytes": sum(s.nbytes for s in idle)},
                "prefix_cache": self.pool.prefixes.stats() if self.pool.prefixes is not None else None,
                "requests": [j.summary() for j in jobs],
            }

    # --- the scheduler thread ---

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mlx-spec-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; jobs still running are closed, their clients see the stream end."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            self._serve_jobs()
        finally:
            # MLX 0.32 leaves the streams a thread made to that thread: without this, their worker threads
            # are still joinable when the process exits and C++ aborts it ("terminate called ...").
            mx.clear_streams()

    def follow(self) -> None:
        """A rank other than 0: replay rank 0's steps on this thread until rank 0 stops."""
        self._run()

    def _next_step(self) -> SharedStep:
        """The loop's next step: the jobs admitted and cancelled (rank 0 shares it; the other ranks take rank 0's)."""
        if self.lockstep is not None and not self.lockstep.lead:
            step = self.lockstep.follow()
            for i, ids, params in step.admitted:  # rank 0's request, its replies going nowhere
                job = Job(i, ids, params, lambda _item: None, state="active", started=time.monotonic())
                self._active.append(job)
            return step
        with self._cv:
            while not self._stopping and not self._active and not self._waiting:
                self._cv.wait()
            step = SharedStep(stop=self._stopping)
            while not self._stopping and self._waiting and len(self._active) < self.max_concurrency:
                job = self._waiting.popleft()
                job.state, job.started = "active", time.monotonic()
                self._active.append(job)
                step.admitted.append((job.id, job.ids, job.params))
            step.cancelled = {j.id for j in self._active if j.cancel_requested}
        if self.lockstep is not None:
            self.lockstep.share(step)
        return step

    def _serve_jobs(self) -> None:
        while self.lockstep is None or self.lockstep.broken is None:  # a broken group: `_broke` failed every request
            try:
                step = self._next_step()
            except Exception as e:
                if self.lockstep is None or self.lockstep.broke(e) is None:
                    raise
                return
            if step.stop:
                break
            with self.lockstep.watch() if self.lockstep is not None else contextlib.nullcontext():
                for job in list(self._active):
                    try:
                        self._advance(job, job.id in step.cancelled)
                    except Exception as e:  # a bug in the bookkeeping: fail this request, keep the thread alive
                        log.exception("request %s failed", job.id)
                        err = ApiError(500, f"{type(e).__name__}: {e}", type="server_error")
                        self._finish(job, "failed", Failed(err))
                if len(self.batcher):
                    try:
                        self._rounds()
                    except _Broken:
                        return
        if self.lockstep is not None and self.lockstep.broken is not None:
            return
        gone = Failed(ApiError(503, "the server is shutting down", type="server_error"))
        for job in list(self._active) + list(self._waiting):
            self._finish(job, "cancelled", gone)

    def _advance(self, job: Job, cancelled: bool) -> None:
        """A job's turn: a new job takes a session and queues to join an engine; a cancelled one is closed (a
        job's tokens come from its engine's rounds)."""
        if cancelled:
            return self._finish(job, "cancelled", None)
        if job.session is not None:
            return
        p = job.params
        try:
            job.session = self.pool.acquire(job.ids)
            self.pair.use(job.session, p.draft)
            job.stops = StopText(p.stop)
            self.batcher.join(job)
        except MlxSpecError as e:
            return self._finish(job, "failed", Failed(ApiError(400, str(e))))

    def _rounds(self) -> None:
        """A prefill chunk of a joining job, then one round of every engine, then each job's events in order."""
        for job, e in self.batcher.step_joins():
            self._check_group(e)
            self._fail(job, e)
        for engine in self.batcher.engines:
            try:
                events = self.batcher.round(engine)
            except Exception as e:  # a bug: fail this engine's requests, keep serving the others
                self._check_group(e)
                log.exception("a round failed")
                for job in self.batcher.clear(engine):
                    self._fail(job, e)
                continue
            for job, ev in events:
                if job.state == "active":  # a stop string may have ended it at an earlier token of this round
                    self._handle(job, ev)

    def _check_group(self, e: Exception) -> None:
        """Raise _Broken where `e` broke the group under a sharded target (`_broke` failed every request)."""
        if self.lockstep is not None and self.lockstep.broke(e) is not None:
            raise _Broken() from e

    def _down(self, msg: str) -> ApiError:
        return ApiError(
            503, f"the sharded model is down: {msg}; restart every rank", type="server_error", code="group_broke"
        )

    def _broke(self, msg: str) -> None:
        """The group broke (any thread): every request waiting or generating ends with a 503, new ones get one.
        The model thread may be stuck in a collective that never returns: it is left there."""
        log.error("stopped generating: %s", msg)
        with self._cv:
            jobs = list(self._active) + list(self._waiting)
            self._active.clear()
            self._waiting.clear()
            for job in jobs:
                job.state = "failed"
                self.counts["failed"] += 1
                self._recent.append(job)
            self._cv.notify()
        for job in jobs:
            job.send(Failed(self._down(msg)))

    def _fail(self, job: Job, e: Exception) -> None:
        if isinstance(e, MlxSpecError):
            return self._finish(job, "failed", Failed(ApiError(400, str(e))))
        log.error("request %s failed: %s: %s", job.id, type(e).__name__, e)
        self._finish(
            job, "failed", Failed(ApiError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error"))
        )

    def _handle(self, job: Job, ev) -> None:
        """A job's next token: counters, stop strings, the delta to send, and its end."""
        s = ev.stats
        job.produced.append(ev.token)
        job.stats = s
        self.counts["rounds"] += s.rounds - job.rounds
        self.counts["tokens"] += 1
        job.pos = ((job.pos if s.rounds == job.rounds else 0) + 1) if ev.from_draft else 0
        job.rounds, job.tokens, job.prompt_cached = s.rounds, len(job.produced), s.prompt_cached
        job.flags.append(ev.from_draft)
        pieces = job.stops.add(ev.text, Mark(job.pos, s.rounds))
        reason = "stop_string" if job.stops.hit else ev.finish_reason  # the engine's: stop, length, context
        if reason:
            pieces += job.stops.flush()
        if pieces:
            job.send(
                Delta(
                    pieces,
                    dict(
                        tokens=s.generation_tokens,
                        rounds=s.rounds,
                        spec_rounds=s.spec_rounds,
                        drafted=s.proposed,
                        accepted=s.accepted,
                    ),
                )
            )
        if reason:
            sent = replace(s, generation_tokens=len(job.produced), from_draft=sum(job.flags))  # a stop string's cut
            stats = dict(
                sent.as_dict(),
                finish_reason=reason,
                stop_sequence=job.stops.matched,
                draft_flags=list(job.flags),
                queued_s=job.started - job.submitted,
            )
            self._finish(job, "completed", Done("length" if reason in ("length", "context") else "stop", stats))

    def _finish(self, job: Job, state: str, item) -> None:
        """Close the job's generator here, on the model thread, and give its session back (or free it)."""
        if job in self.batcher:
            self.batcher.leave(job)  # its cache goes back to its session
        if job.session is not None:
            # A finished reply keeps its caches for the conversation's next turn; a client that went away
            # (or a failure) frees them: nobody is coming back for that state.
            (self.pool.release if state == "completed" else self.pool.drop)(job.session)
        job.session = None
        with self._cv:
            if job in self._active:
                self._active.remove(job)
            if job in self._waiting:
                self._waiting.remove(job)
            job.state = state
            self.counts[state] += 1
            self._recent.append(job)
        if item is not None:
            job.send(item)
