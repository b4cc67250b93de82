"""The server over a target sharded across ranks: rank 0's scheduler steps (who is admitted with which prompt and
settings, who was cancelled, stop) shared with the other ranks, which replay them and so run the same passes."""

import contextlib
import json
import math
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from mlx_spec.cluster import Agreed, Cluster, ClusterError
from mlx_spec.cluster.group import ROUND_LIMIT, Deadline
from mlx_spec.gen import registry
from mlx_spec.make.resolve import resolve
from mlx_spec.named import Log, load_model

from .pair import Pair
from .params import Params

_RUN, _STOP = 1, 2  # a step to run, or the server stopping
# Seconds rank 0 gives one step (a prefill chunk of PREFILL_STEP tokens and one round of one request) before it takes
# the group for broken: a peer that went silent with its sockets open leaves rank 0 waiting in a pass, not only in a
# shared decision, and MLX's ring cannot time out either.
STEP_LIMIT = 20.0


@dataclass
class SharedStep:
    """One turn of the scheduler's loop as every rank runs it: the requests admitted (id, prompt ids, settings), the
    ids of active requests cancelled, and whether the server stops."""

    admitted: list[tuple[str, list[int], Params]] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    stop: bool = False


def encode(step: SharedStep) -> bytes:
    """A step's admissions and cancellations as JSON bytes (empty where it has none)."""
    if not step.admitted and not step.cancelled:
        return b""
    admitted = [[i, ids, asdict(p)] for i, ids, p in step.admitted]
    return json.dumps({"admitted": admitted, "cancelled": sorted(step.cancelled)}).encode()


def decode(op: int, payload: bytes) -> SharedStep:
    """The step `encode` wrote, under its op."""
    if op == _STOP:
        return SharedStep(stop=True)
    if op != _RUN:
        raise ClusterError(f"rank 0 sent a step this rank cannot read (op {op})")
    if not payload:
        return SharedStep()
    d = json.loads(payload)
    return SharedStep([(i, ids, Params(**p)) for i, ids, p in d["admitted"]], set(d["cancelled"]))


class Lockstep:
    """This rank's side of the shared steps. On rank 0 a wait past `limit` seconds, or a lost peer, breaks the group:
    `broken` says so from then on, and `on_broke` is told once (the server answers 503)."""

    def __init__(self, cluster: Cluster, limit: float = ROUND_LIMIT):
        self.cluster = replace(cluster, on_broke=self._broke) if cluster.lead else cluster
        self.limit = limit
        self.broken: str | None = None
        self.on_broke: Callable[[str], None] = lambda _msg: None
        self._lock = threading.Lock()

    @property
    def lead(self) -> bool:
        return self.cluster.lead

    def planner(self, adaptive: bool) -> Agreed:
        """The planner every engine of this rank plans with: rank 0's plans on every rank."""
        return Agreed(adaptive=adaptive, cluster=self.cluster, limit=self.limit)

    def share(self, step: SharedStep) -> None:
        """Rank 0: send the step to the other ranks (`Cluster.send`: its length, then its payload if any)."""
        with self.guard():
            self.cluster.send(None if step.stop else encode(step), self.limit, self.limit)

    def watch(self):
        """On rank 0, a bound of STEP_LIMIT seconds on the step run inside (past it the group is broken); nothing on
        the other ranks (they wait for rank 0 as long as it takes)."""
        return Deadline(self.cluster, STEP_LIMIT) if self.lead else contextlib.nullcontext()

    def follow(self) -> SharedStep:
        """The other ranks: rank 0's next step (waiting as long as rank 0 is idle)."""
        with self.guard():
            payload = self.cluster.send(None, math.inf, self.limit)
        return decode(_STOP, b"") if payload is None else decode(_RUN, payload)

    def guard(self):
        """The cluster's guard: a lost peer or a rank that diverged is one ClusterError naming the ranks."""
        return self.cluster.guard()

    def broke(self, e: BaseException) -> str | None:
        """The group's error where `e` (or an earlier wait past its limit) broke it, else None. A broken group stays
        broken: the other ranks cannot rejoin a running `mlx.launch`."""
        if self.broken is None and isinstance(e, ClusterError):
            self._broke(str(e))
        elif self.broken is None and isinstance(e, RuntimeError) and ("[ring]" in str(e) or "peer" in str(e)):
            self._broke(f"{self.cluster.broke()} ({e})")
        return self.broken

    def _broke(self, msg: str) -> None:
        with self._lock:
            if self.broken is not None:
                return
            self.broken = msg
        self.on_broke(msg)


def load_pair(
    cluster: Cluster,
    model: str,
    draft: registry.Spec,
    *,
    num_draft: int | None,
    adaptive: bool,
    fixed: bool,
    log: Log,
) -> Pair:
    """The served pair with its target sharded over the group (a draft model loads whole on every rank)."""
    folder = resolve(model, log)
    spec = cluster.drafter(registry.parse(draft), folder)  # refused before the target loads where it cannot run
    name = spec.model
    loaded = {name: load_model(name, log)[:2]} if name else {}
    target, tokenizer = cluster.load(folder)
    pair = Pair(model, spec, target, tokenizer, loaded, num_draft, adaptive=adaptive, fixed=fixed)
    pair.new_session()  # an incompatible draft fails at start, not per request
    return pair
