"""One decision a round for the whole group: rank 0's planner plans, the other ranks take its plan."""

from collections.abc import Sequence
from dataclasses import dataclass

from ..gen.planner import Ask, Plan, Planner
from .group import ROUND_LIMIT, Cluster, ClusterError

_HEAD = 5  # k, size, probe, tree, queued; then per row: its source's code, tokens left, its lookup draft's length
_NONE, _OFFER, _COSTLY = 0, 1, 2  # a row's source, by where its ask names it


@dataclass(kw_only=True)
class Agreed(Planner):
    """A planner whose plans are rank 0's on every rank, shared by one small collective a round: ranks that measure
    other timings still run the same passes. Each rank's own position is checked against rank 0's; waiting over
    `limit` seconds for the group's decision ends the process with the group's error."""

    cluster: Cluster
    limit: float = ROUND_LIMIT

    def plan(self, asks: Sequence[Ask], places: int | None = None, pad: bool = False, queued: bool = False) -> Plan:
        """Rank 0's plan for `asks` (rank 0 plans; the others wait for it)."""
        n = _HEAD + 3 * len(asks)
        if self.cluster.lead:
            plan = super().plan(asks, places, pad, queued)
            self.cluster.share(encode(plan, asks), n, self.limit)
            return plan
        shared = self.cluster.share([], n, self.limit)
        rows = [shared[_HEAD + 3 * i : _HEAD + 3 * i + 3] for i in range(len(asks))]
        for i, (a, (_, left, offer)) in enumerate(zip(asks, rows)):
            if (a.left, a.offer[1]) != (left, offer):
                raise ClusterError(
                    f"rank {self.cluster.rank} diverged from rank 0: row {i} has {a.left} tokens left and a "
                    f"{a.offer[1]}-token lookup draft, rank 0's {left} and {offer}"
                )
        return decode(shared[:_HEAD], [c for c, _, _ in rows], asks)


def encode(plan: Plan, asks: Sequence[Ask]) -> list[int]:
    """A plan as integers, each row's source by where its ask names it."""
    codes = []
    for i, a in enumerate(asks):
        s = plan.source(i)
        code = _NONE if not s else _OFFER if s == a.offer[0] else _COSTLY if s == a.costly else -1
        if code < 0:
            raise ClusterError(f"the plan's source {s!r} for row {i} is none its ask offers")
        codes.append(code)
    head = [plan.k, plan.size, plan.probe, plan.tree, plan.queued]
    return head + [x for c, a in zip(codes, asks) for x in (c, a.left, a.offer[1])]


def decode(head: Sequence[int], codes: Sequence[int], asks: Sequence[Ask]) -> Plan:
    """The plan `encode` wrote, its sources named by this rank's asks."""
    k, size, probe, tree, queued = head
    named = tuple(a.offer[0] if c == _OFFER else a.costly if c == _COSTLY else "" for c, a in zip(codes, asks))
    return Plan(k, named if k else (), size, bool(probe), tree, bool(queued))
