"""What the planner's misses in `bench replay` owe to learning and what to its decision rule (notebook §50).

The planner is replayed as it is, then given what it otherwise learns: the machine's costs (the profile's passes by
size, the draft step and catch-up), then also each prompt's mean acceptance of every source (over the rounds it
drafts in a run that drafts every offer of the policy's sources), with no probes (nothing is left to learn). What it still misses knowing both is its decision rule's: a rate per source, tokens
expected by the geometric model, no tuning of how it learns gets past that.

    python notebooks/replay_bounds.py notebooks/runs/replay-qwen1.5b-0.5b.json.gz > notebooks/runs/replay-bounds.md
"""

import dataclasses
import math
import sys
from dataclasses import dataclass, field

from mlx_spec.bench import machines, replay
from mlx_spec.bench.recorded import Recorded, load
from mlx_spec.gen.acceptance import SourceStats
from mlx_spec.gen.costs import Costs
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.tunables import SIZES

MODEL = replay.MODEL


class Fixed(SourceStats):
    """An acceptance known, not learned."""

    def __init__(self, rate: float):
        super().__init__(rate, 1.0)

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def hindsight(self, matches, k: int) -> None:
        pass


@dataclass(kw_only=True)
class Known(Costs):
    """The profile's costs from the first round: a pass by size, the draft model's part of a round (its steps, its
    catch-up and what the pass at the round's size adds to one position's)."""

    profile: machines.Profile

    def cost(self, places: int, size: int, optimistic: bool = False) -> float | None:
        return self.profile.pass_cost(size) if places == 1 else None

    def draft_cost(self, source: str, rows: int, k: int, behind: float) -> float:
        p, size = self.profile, next((s for s in SIZES if s >= k + 1), k + 1)
        return k * p.draft[MODEL] + behind * p.catch_up.get(MODEL, 0.0) + p.pass_cost(size) - p.pass_cost(1)

    def known(self, source: str) -> bool:
        return True

    def reach(self) -> int:
        return 2 * SIZES[-1]


@dataclass
class Knowing(Planner):
    """A planner given the rates (source -> mean acceptance) of the prompt it serves: it never probes."""

    rates: dict[str, float] = field(default_factory=dict)

    def plan(self, asks, places=None, pad=False, queued=False):
        if self.rates:
            known = {s: Fixed(r) for s, r in self.rates.items()}
            asks = [dataclasses.replace(a, accept=known) for a in asks]
        return super().plan(asks, places, pad, queued)

    def _due(self, *args) -> bool:
        return not self.rates and super()._due(*args)

    def _tree_due(self, *args):
        return None if self.rates else super()._tree_due(*args)


def rates(rec: Recorded, profile: machines.Profile, tables, policy: replay.Policy) -> dict[str, float]:
    """Each source's mean acceptance over the prompt, where `policy` would draft it: its accepted draft tokens over
    the judged ones in a run that drafts every offer (a lookup's first, else the model) at the policy's K."""
    drafting = dataclasses.replace(policy, adaptive=False, only_k=0)
    trace = replay.replay_one(rec, profile, drafting, tables=tables).trace
    out = {}
    for source in policy.sources:
        a, j = sum(t[2] for t in trace if t[0] == source), sum(t[2] + (t[2] < t[1]) for t in trace if t[0] == source)
        out[source] = a / j if j else 0.0
    return out


def run(recording, profile, policy, know: str, session: bool, share: float) -> dict:
    """{prompt id: ReplayedRun} of `policy` knowing nothing, the costs ("costs") or the costs and rates ("all")."""
    kept, out = None, {}
    for rec in recording.prompts:
        tables = replay._Lookups(rec)
        planner = kept if session and kept is not None else policy.planner()
        if know and policy.name.startswith("planner:"):
            if not isinstance(planner, Knowing):
                planner = Knowing(costs=Known(profile=profile))
            planner.rates = rates(rec, profile, tables, policy) if know == "all" else {}
        kept = planner
        out[rec.id] = replay.replay_one(rec, profile, policy, 0, share, tables, recording.tokens, planner)
    return out


def scorecard(recording, by: dict) -> list[tuple[str, float]]:
    """The issue's targets per kind: (cell, ratio) for the hybrid over plain and over its best member, each member's
    planner over plain and over its best fixed K."""
    kinds = sorted({r.kind for r in recording.prompts})
    ids = {k: [r.id for r in recording.prompts if r.kind == k] for k in kinds}

    def tps(runs, k):
        return sum(runs[i].tokens for i in ids[k]) / sum(runs[i].seconds for i in ids[k])

    cells = []
    for k in kinds:
        plain = tps(by["plain"], k)
        cells.append((f"{k} hybrid/plain", tps(by["planner:hybrid"], k) / plain))
        best = max(tps(by[f"planner:{s}"], k) for s in replay.MEMBERS)
        cells.append((f"{k} hybrid/best member", tps(by["planner:hybrid"], k) / best))
        for s in replay.MEMBERS:
            fixed = max([tps(by[p], k) for p in by if p.startswith(f"fixed:{s}:")] + [plain])
            cells.append((f"{k} {s}/plain", tps(by[f"planner:{s}"], k) / plain))
            cells.append((f"{k} {s}/best fixed K", tps(by[f"planner:{s}"], k) / fixed))
    return cells


def main(path: str) -> None:
    recording = load(path)
    share = recording.shares.get(MODEL, 0.0)
    names = [p.name for p in replay.policies() if p.name.startswith(("plain", "planner", "fixed"))]
    pols = replay.policies(names)
    print("| knows | mode | profile | misses | below plain | hybrid/plain (geo mean by kind) | worst cell |")
    print("|---|---|---|---|---|---|---|")
    left = []
    for know in ("", "costs", "all"):
        for session in (False, True):
            total = 0
            for name in machines.names():
                profile = machines.load(name)
                by = {p.name: run(recording, profile, p, know, session, share) for p in pols}
                cells = scorecard(recording, by)
                miss = [(c, r) for c, r in cells if r < (1.0 if c.endswith("/plain") else 0.97) - 1e-9]
                below = [c for c, r in cells if c.endswith("/plain") and r < 1 - 1e-9]
                hyb = [r for c, r in cells if c.endswith("hybrid/plain")]
                gm = math.exp(sum(map(math.log, hyb)) / len(hyb))
                worst = min(miss, key=lambda cr: cr[1], default=("-", 1.0))
                total += len(miss)
                if know == "all":
                    left += [f"{name} {'session' if session else 'fresh'} {c} {r:.3f}" for c, r in miss]
                print(
                    f"| {know or 'nothing'} | {'session' if session else 'fresh'} | {name} | {len(miss)} | "
                    f"{len(below)} | {gm:.3f} | {worst[0]} {worst[1]:.2f} |",
                    flush=True,
                )
            print(f"| {know or 'nothing'} | {'session' if session else 'fresh'} | all | {total} | | | |", flush=True)
    print("\nWhat it misses knowing both:\n\n" + "\n".join(f"- {x}" for x in left))


if __name__ == "__main__":
    main(sys.argv[1])
