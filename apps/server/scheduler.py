"""The one thread that runs the models: admits jobs FIFO, advances the active ones in turn, one event each.

MLX must not compute from several threads at once, so every forward pass happens here. Each active job
has its own `Session`; one turn asks its generator for one event, which runs a speculative round when
the last one's tokens are used up and otherwise hands out an already verified token for free. Turns
go round-robin, so a short request is never stuck behind a long one and every request keeps
speculating. A request that starts while others generate joins the batch instead (`batching.py`):
one batched round per turn advances all its rows in one forward pass. A cancelled job is closed at
its next turn, so it stops within one round, and its session (with its caches) is freed.
"""

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional

import mlx.core as mx

from mlx_spec.errors import MlxSpecError

from .batching import Batcher
from .errors import ApiError
from .pair import Pair
from .params import Params
from .pool import IDLE_EXTRA, SessionPool
from .stops import Mark, Piece, StopText

QUEUE_PER_SLOT = 4  # waiting requests allowed per concurrent slot before new ones get a 429
RECENT = 64  # finished requests whose counters /health keeps
SEED_MIX = 1_000_003  # seeded requests reseed at every turn from (seed, turn): reproducible whatever runs beside them

log = logging.getLogger("mlx_spec.server")


@dataclass
class Delta:
    """Text ready to send, one piece per token with its draft flag, and the counters so far."""

    pieces: List[Piece]
    live: Dict[str, int]


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


@dataclass
class Job:
    """One request as the scheduler sees it. `send` hands an item to the request's event loop, thread-safely."""

    id: str
    ids: List[int]
    params: Params
    send: Callable[[object], None]
    state: str = "queued"  # queued, active, completed, cancelled, failed
    submitted: float = field(default_factory=time.monotonic)
    started: float = 0.0
    cancel_requested: bool = False
    rounds_at_cancel: Optional[int] = None
    rounds: int = 0
    tokens: int = 0
    prompt_cached: int = 0
    turns: int = 0
    flags: List[bool] = field(default_factory=list)
    pos: int = 0  # the last token's position in its round's draft (0: the target's own)
    session: object = None
    events: object = None
    batched: bool = False  # its rounds run in the batch
    produced: List[int] = field(default_factory=list)  # its tokens so far
    stats: object = None  # the engine's counters of its reply so far
    stops: Optional[StopText] = None

    __hash__ = object.__hash__  # a job is itself: the batcher keys its rows by job

    def summary(self) -> dict:
        """This request's counters, for /health."""
        d = {"id": self.id, "state": self.state, "prompt_tokens": len(self.ids), "prompt_cached": self.prompt_cached,
             "tokens": self.tokens, "rounds": self.rounds, "max_tokens": self.params.max_tokens,
             "batched": self.batched}
        if self.rounds_at_cancel is not None:
            d["rounds_after_cancel"] = self.rounds - self.rounds_at_cancel
        return d


class Scheduler:
    """Runs up to `max_concurrency` jobs in turn on its own thread; up to `max_queue` more wait FIFO."""

    def __init__(self, pair: Pair, max_concurrency: int, max_queue: Optional[int] = None, batch: bool = True):
        if max_concurrency < 1:
            raise MlxSpecError(f"--max-concurrency must be >= 1, got {max_concurrency}")
        self.pair, self.max_concurrency = pair, max_concurrency
        self.batcher = Batcher(pair) if batch else None
        self.max_queue = QUEUE_PER_SLOT * max_concurrency if max_queue is None else max_queue
        self.pool = SessionPool(pair.new_session, max_concurrency + IDLE_EXTRA)
        self.counts = dict(completed=0, cancelled=0, failed=0, rejected=0, rounds=0, tokens=0)
        self._cv = threading.Condition()
        self._waiting: Deque[Job] = deque()
        self._active: List[Job] = []
        self._recent: Deque[Job] = deque(maxlen=RECENT)
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    # --- the request side (any thread) ---

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull when every slot is taken and `max_queue` jobs wait already."""
        with self._cv:
            free = max(0, self.max_concurrency - len(self._active))  # slots the thread has yet to fill
            if len(self._waiting) >= self.max_queue + free:
                self.counts["rejected"] += 1
                raise QueueFull(f"the server is busy: {len(self._active)} requests generating and "
                                f"{len(self._waiting)} waiting (the queue holds {self.max_queue}); retry later")
            self._waiting.append(job)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: drop a waiting job now, stop an active one at its next turn."""
        with self._cv:
            if job in self._waiting:
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
            return {"status": "ok" if self._thread and self._thread.is_alive() else "stopped",
                    "active": len(self._active), "queued": len(self._waiting),
                    "max_concurrency": self.max_concurrency, "max_queue": self.max_queue,
                    "batched": len(self.batcher) if self.batcher is not None else None,
                    **self.counts, "sessions": {"total": self.pool.total, "idle": len(self.pool.idle)},
                    "requests": [j.summary() for j in jobs]}

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

    def _serve_jobs(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._active and not self._waiting:
                    self._cv.wait()
                if self._stopping:
                    break
                while self._waiting and len(self._active) < self.max_concurrency:
                    job = self._waiting.popleft()
                    job.state, job.started = "active", time.monotonic()
                    self._active.append(job)
                turn = list(self._active)
            for job in turn:
                try:
                    self._advance(job)
                except Exception as e:  # a bug in the bookkeeping: fail this request, keep the thread alive
                    log.exception("request %s failed", job.id)
                    self._finish(job, "failed", Failed(ApiError(500, f"{type(e).__name__}: {e}", type="server_error")))
            if self.batcher is not None and len(self.batcher):
                self._batched_round()
        gone = Failed(ApiError(503, "the server is shutting down", type="server_error"))
        for job in list(self._active) + list(self._waiting):
            self._finish(job, "cancelled", gone)

    def _advance(self, job: Job) -> None:
        """One event of one job: its next token, from a new round if the last one is used up (a batched job: only
        a cancel, its tokens come from the batched round)."""
        if job.cancel_requested:
            return self._finish(job, "cancelled", None)
        if job.batched:
            return
        p = job.params
        try:
            if job.events is None:
                job.session = self.pool.acquire(job.ids)
                self.pair.use(job.session, p.draft)
                job.stops = StopText(p.stop)
                rows = len(self._active)  # the batch it would make with every request generating now
                if self.batcher is not None and rows > 1 and self.batcher.can_join(job, rows):
                    for other in self._active:  # those generating alone move into the batch first
                        if (other.events is not None and not other.cancel_requested
                                and self.batcher.can_join(other, rows)):
                            self._move_to_batch(other)
                    self.batcher.join(job)  # others are generating: it joins their batched rounds
                    job.batched = True
                    return
                job.events = job.session.generate(job.ids, max_tokens=p.max_tokens, temp=p.temp, top_p=p.top_p,
                                                  top_k=p.top_k)
            if p.seed is not None:
                mx.random.seed((p.seed * SEED_MIX + job.turns) % (1 << 64))
            job.turns += 1
            ev = next(job.events, None)
        except MlxSpecError as e:
            return self._finish(job, "failed", Failed(ApiError(400, str(e))))
        except Exception as e:  # a bug, not the client's: keep serving the others
            log.exception("generation %s failed", job.id)
            return self._finish(job, "failed", Failed(ApiError(500, f"generation failed: {type(e).__name__}: {e}",
                                                               type="server_error")))
        finally:
            if p.seed is not None:  # others draw fresh randomness, not a stream this seed made predictable
                mx.random.seed(random.getrandbits(64))
        if ev is None:  # the engine stopped without a finish reason (it always gives one; defensive)
            return self._finish(job, "completed", Done("stop", {}))
        self._handle(job, ev)

    def _move_to_batch(self, job: Job) -> None:
        """A job generating alone joins the batch between two of its tokens: its engine generator closes (the
        session's cache then holds its context minus the last token) and its row carries its tokens and stats."""
        job.events.close()
        job.events = None
        self.batcher.join(job, job.produced, job.stats, job.stops.text)
        job.batched = True

    def _batched_round(self) -> None:
        """One round of every batched job, then each one's events in order."""
        try:
            events = self.batcher.round()
        except Exception as e:  # a bug: fail the batched requests, keep serving the others
            log.exception("a batched round failed")
            error = Failed(ApiError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error"))
            for job in self.batcher.clear():
                self._finish(job, "failed", error)
            return
        for job, ev in events:
            if job.state == "active":  # a stop string may have ended it at an earlier token of this round
                self._handle(job, ev)

    def _handle(self, job: Job, ev) -> None:
        """A job's next token: counters, stop strings, the delta to send, and its end."""
        s = ev.stats
        job.produced.append(ev.token)
        job.stats = s
        self.counts["rounds"] += s.rounds - job.rounds
        self.counts["tokens"] += 1
        job.pos = ((job.pos if s.rounds == job.rounds else 0) + 1) if ev.from_draft else 0
        job.rounds, job.tokens, job.prompt_cached = s.rounds, s.generation_tokens, s.prompt_cached
        job.flags.append(ev.from_draft)
        pieces = job.stops.add(ev.text, Mark(job.pos, s.rounds))
        reason = "stop_string" if job.stops.hit else ev.finish_reason  # the engine's: stop, length, context
        if reason:
            pieces += job.stops.flush()
        if pieces:
            job.send(Delta(pieces, dict(tokens=s.generation_tokens, rounds=s.rounds, spec_rounds=s.spec_rounds,
                                        drafted=s.proposed, accepted=s.accepted)))
        if reason:
            stats = dict(s.as_dict(), finish_reason=reason, draft_flags=list(job.flags),
                         queued_s=job.started - job.submitted)
            self._finish(job, "completed", Done("length" if reason in ("length", "context") else "stop", stats))

    def _finish(self, job: Job, state: str, item) -> None:
        """Close the job's generator here, on the model thread, and give its session back (or free it)."""
        if job.events is not None:
            job.events.close()  # the session's caches are consistent after a close at any point
        if job.batched and job in self.batcher:
            self.batcher.leave(job)  # its cache goes back to its session
        if job.session is not None:
            # A finished reply keeps its caches for the conversation's next turn; a client that went away
            # (or a failure) frees them: nobody is coming back for that state.
            (self.pool.release if state == "completed" else self.pool.drop)(job.session)
        job.events = job.session = None
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
