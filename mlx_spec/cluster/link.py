"""A simulated slow link between ranks: each collective evaluated where it is made, timed, then followed by a wait of
the link's latency; and a planner that splits each round's time into compute and communication."""

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import mlx.core as mx

from .agree import Agreed

# Published per-collective latencies (an all_sum over 2 ranks is one exchange: a round trip), in microseconds:
# - RDMA over Thunderbolt 5 (MLX's JACCL backend, macOS 26.2): "< 50 µs", down from ~300 µs over TCP/IP (Jeff
#   Geerling, "1.5 TB of VRAM on Mac Studio - RDMA over Thunderbolt 5", jeffgeerling.com, 2025-12-18; Apple TN3205).
# - 10 GbE, TCP application to application: ~120-180 µs for a 1500-byte ping-pong on a tuned 1 GbE LAN, a third of it
#   serialization, which 10 GbE cuts tenfold (AppNeta, "Why is 10G better for network latency?", 2009): ~100 µs.
# - Thunderbolt bridge, TCP/IP (MLX's ring backend over Thunderbolt): ~300 µs (Geerling, as above).
LINKS_US = {"tb5-rdma": 50.0, "10gbe": 100.0, "tb-bridge": 300.0}
# Their nominal line rates in GB/s (Thunderbolt 5: 80 Gb/s; 10 GbE; Thunderbolt 4: 40 Gb/s): an upper bound on what
# a collective's payload moves at, so a prediction from them is a lower bound on communication.
LINKS_GBS = {"tb5-rdma": 10.0, "10gbe": 1.25, "tb-bridge": 5.0}
COLLECTIVES = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv", "recv_like")


@dataclass
class Tally:
    """Collectives so far, the seconds they took (`measured`) and the seconds waited after them (`waited`)."""

    collectives: int = 0
    measured: float = 0.0
    waited: float = 0.0

    @property
    def seconds(self) -> float:
        """Communication: the collectives' measured time plus the simulated wait."""
        return self.measured + self.waited

    def __sub__(self, o: "Tally") -> "Tally":
        return Tally(self.collectives - o.collectives, self.measured - o.measured, self.waited - o.waited)

    def copy(self) -> "Tally":
        return Tally(self.collectives, self.measured, self.waited)


@dataclass
class Link:
    """A link of `latency` seconds per collective, simulated (this kernel has no `netem` to delay the ranks' TCP).

    While `installed`, every `mx.distributed` collective (mlx-lm's sharded layers, the round's agreement, a gathered
    head: all look them up there when called) first evaluates its inputs, then runs and is evaluated alone, timed,
    then waits `latency`. MLX collectives are lazy graph ops: a wait at graph-building time would overlap with
    passes already queued, and one wait per evaluated pass would miss that a pass's collectives are serial (each
    layer's all_sum waits on the last). Evaluated one by one, every wait lands on the critical path, once per
    collective. The cost: passes are no longer queued ahead of the host, the same at every latency (0 included)."""

    latency: float
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.perf_counter
    tally: Tally = field(default_factory=Tally)

    @contextlib.contextmanager
    def installed(self) -> Iterator["Link"]:
        """`mx.distributed`'s collectives timed and delayed inside; left as they were after."""
        ops = {name: getattr(mx.distributed, name) for name in COLLECTIVES if hasattr(mx.distributed, name)}
        for name, op in ops.items():
            setattr(mx.distributed, name, self._wrap(op))
        try:
            yield self
        finally:
            for name, op in ops.items():
                setattr(mx.distributed, name, op)

    def _wrap(self, op):
        def collective(*args, **kw):
            mx.eval([a for a in (*args, *kw.values()) if isinstance(a, mx.array)])  # what it sums is computed
            t0 = self.clock()
            out = op(*args, **kw)
            mx.eval(out)
            t1 = self.clock()
            if self.latency > 0:
                self.sleep(self.latency)
            t2 = self.clock()
            self.tally.collectives += 1
            self.tally.measured += t1 - t0
            self.tally.waited += t2 - t1
            return out

        return collective


@dataclass(kw_only=True)
class Marked(Agreed):
    """`Agreed`, noting the link's tally when decoding starts and at the end of every round: `rounds` holds each
    round's communication, in the order of the engine's trace."""

    link: Link
    rounds: list[Tally] = field(default_factory=list)
    _mark: Tally | None = None

    def plan(self, asks, places=None, pad=False, queued=False):
        if self._mark is None:  # the first round: what came before (the prompt's pass) is not a round's
            self._mark = self.link.tally.copy()
        return super().plan(asks, places, pad, queued)

    def record(self, *args, **kw):
        now = self.link.tally.copy()
        self.rounds.append(now - (self._mark or now))
        self._mark = now
        return super().record(*args, **kw)
