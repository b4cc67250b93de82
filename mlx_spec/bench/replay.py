"""`bench replay`: recorded rounds (`recorded.py`) run again under cost profiles (`machines.py`) through the planner's
own `plan`/`record`, one row at a time as the engine runs it, so policies are compared on many prompts and
machines exactly, without a model and without this machine's noise.

A round: the row's lookups propose (the project's drafters, over the recorded context), the policy plans, the
draft's accepted length is read off the recording (a lookup's: its agreement with the continuation; the draft
model's: the run of positions where its greedy guess is the target's), the round costs the profile's pass at the
plan's size plus the model's draft steps and catch-up, and the planner records it with the engine's Ask and Outcome.
A plain step queued ahead is priced when it is queued: a stretch of plain rounds costs a step more than its rounds.
"""

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from ..errors import MlxSpecError
from ..gen.acceptance import SourceStats
from ..gen.drafters.base import Kept
from ..gen.drafters.ngram import NGramDrafter
from ..gen.drafters.suffix import SuffixDrafter
from ..gen.planner import PLAIN, Ask, Outcome, Planner
from ..gen.registry import DEFAULT_K
from ..gen.tunables import HINDSIGHT_MAX, HINDSIGHT_MIN
from ..gen.verify import shadow_judgement
from . import machines
from .recorded import Recorded, Recording, load
from .report import aligned_table

LOOKUPS = ("suffix", "ngram")  # the free sources, in the order the engine asks a hybrid's
MODEL = "model"  # the costly source: the recording's draft model
FIXED_K = {MODEL: (1, 2, 3, 4, 6, 8, 12, 15), "suffix": (2, 4, 8, 12, 16, 24), "ngram": (2, 3, 4, 7, 10)}
MEMBERS = (MODEL, *LOOKUPS)


@dataclass(frozen=True)
class Policy:
    """How a row drafts: its sources (lookups first, then the model), its K, and the planner's settings."""

    name: str
    sources: tuple[str, ...] = ()
    k_max: int = 1
    adaptive: bool = True
    only_k: int = 0

    def planner(self) -> Planner:
        return Planner(adaptive=self.adaptive, only_k=self.only_k)


def policies(names: Sequence[str] = ()) -> list[Policy]:
    """The named policies (all by default): plain; the planner with the hybrid and each member alone; each member at
    every fixed K; each member's on/off rule at every K (draft at K while its measured rate beats plain)."""
    every = [Policy("plain"), Policy("planner:hybrid", (*LOOKUPS, MODEL), DEFAULT_K["hybrid"])]
    every += [Policy(f"planner:{s}", (s,), DEFAULT_K[s]) for s in MEMBERS]
    every += [Policy(f"fixed:{s}:{k}", (s,), k, adaptive=False) for s in MEMBERS for k in FIXED_K[s]]
    every += [Policy(f"onoff:{s}:{k}", (s,), k, only_k=k) for s in MEMBERS for k in FIXED_K[s]]
    if not names:
        return every
    known = {p.name: p for p in every}
    bad = [n for n in names if n not in known]
    if bad:
        raise MlxSpecError(
            f"unknown policy '{bad[0]}' (known: plain, planner:hybrid|model|suffix|ngram, fixed:S:K, onoff:S:K)"
        )
    return [known[n] for n in names]


@dataclass
class ReplayedRun:
    """One prompt replayed: tokens produced, seconds, and each round's (source, proposed, accepted, seconds)."""

    tokens: int
    seconds: float
    trace: list[tuple[str, int, int, float]] = field(default_factory=list)


class _Lookups:
    """A recorded prompt's table lookups, made with the project's drafters: the suffix drafter's proposal at every
    output position (it learns nothing, so one pass serves every run), and an n-gram table with the prompt indexed
    that each run copies (its trust is learned per run)."""

    def __init__(self, rec: Recorded):
        self.rec, self._suffix = rec, cast(list[list[int]] | None, None)
        self.ngram = NGramDrafter()
        self.ngram.reset(rec.prompt)

    def suffix(self, i: int) -> list[int]:
        """The suffix drafter's proposal after i output tokens, at its longest."""
        if self._suffix is None:
            d, n = SuffixDrafter(), len(self.rec.target)
            d.reset(self.rec.prompt)
            self._suffix = [
                _ids(d.propose(self.rec.prompt + self.rec.target[:j], DEFAULT_K["suffix"])) for j in range(n)
            ]
        return self._suffix[i]

    def drafter(self, name: str):
        """A fresh lookup for one run: its propose(i, k) and learn(proposed, accepted)."""
        if name == "suffix":
            return _Drafted("suffix", lambda i, k: self.suffix(i)[:k], lambda n, a: None)
        d = NGramDrafter()
        d.adopt(Kept(d.name, self.ngram), len(self.rec.prompt))  # the prompt's tables, indexed once
        prompt, target = self.rec.prompt, self.rec.target
        return _Drafted("ngram", lambda i, k: _ids(d.propose(prompt + target[:i], k)), d.learn)


def _ids(draft) -> list[int]:
    return cast(list[int], draft.tokens.tolist())


@dataclass(frozen=True)
class _Drafted:
    name: str
    propose: Callable[[int, int], list[int]]
    learn: Callable[[int, int], None]


class _Model:
    """The draft model's place in the context: how many context tokens its cache agrees with."""

    def __init__(self):
        self.synced = 0

    def behind(self, context_len: int) -> int:
        return max(0, context_len - 1 - self.synced)


def replay_one(
    rec: Recorded,
    profile: machines.Profile,
    policy: Policy,
    seed: int = 0,
    share: float = 0.0,
    tables: _Lookups | None = None,
    budget: int = 0,
    planner: Planner | None = None,
) -> ReplayedRun:
    """One prompt's generation replayed for one row under `profile` with `policy`, as the engine runs it (share: the
    draft model's weights over the target's, the prior the engine gives the planner; tables: the prompt's lookups,
    shared between runs; budget: the tokens the run was allowed, which the planner knows, where the recorded
    continuation ended sooner at EOS, which it does not; planner: one that served earlier prompts, as a server's
    does, instead of a new one)."""
    target, n_out = rec.target, len(rec.target)
    budget = max(budget, n_out)
    context = list(rec.prompt)
    greedy = rec.greedy(MODEL) if MODEL in policy.sources else []
    rng = random.Random(f"{seed}|{rec.id}|{profile.name}|{policy.name}")
    planner, accept = planner or policy.planner(), cast(dict[str, SourceStats], {})
    tables = tables or _Lookups(rec)
    lookups = [tables.drafter(s) for s in policy.sources if s in LOOKUPS]
    model = _Model() if MODEL in policy.sources else None
    several = len(policy.sources) > 1
    caps = {s: min(policy.k_max, DEFAULT_K[s]) if several else policy.k_max for s in policy.sources}
    made, queued, pace, paced, run = 0, False, 1.0, 0, ReplayedRun(0, 0.0)
    while made < n_out:
        room, last = budget - made - 1, n_out - made - 1  # drafts may run past the EOS no round can accept past
        offer, tokens = ("", 0), []
        for d in lookups if room > 0 else ():
            tokens = d.propose(made, min(caps[d.name], room))
            if tokens:
                offer = (d.name, len(tokens))
                break
        ask = Ask(accept, offer, left=room + 1, pace=pace)
        if model is not None:
            ask.costly, ask.cap, ask.behind = MODEL, min(caps[MODEL], room), model.behind(len(context))
            ask.share = share if 0 < share < 1 else 0.0  # the prior the engine gives the planner
        best = max(
            ask.stats(offer[0]).expected(offer[1]) if offer[1] else 1.0,
            ask.stats(MODEL).expected(ask.cap) if ask.cap else 1.0,
        )
        paced += 1
        pace += (best - pace) / paced
        plan = planner.plan([ask], 1, True, queued)
        source = plan.source(0)
        if source == MODEL:
            n = min(plan.k, room)
            a = next((j for j in range(min(n, last)) if greedy[made + j] != target[made + j]), min(n, last))
        elif source and source == offer[0]:
            n = min(len(tokens), plan.k, room)
            a = next((j for j in range(min(n, last)) if tokens[j] != target[made + j]), min(n, last))
        else:
            n = a = 0
        if not n:
            plan, source = PLAIN, ""
        wanted = not plan.k and last > 0
        if plan.k:
            behind = ask.behind if source == MODEL else 0
            cost = profile.pass_cost(plan.size - queued)
            if source == MODEL:
                cost += plan.k * profile.draft[MODEL] + behind * profile.catch_up.get(MODEL, 0.0)
            warm = True
        else:
            behind = 0
            cost = profile.step * ((not queued) + wanted)  # its own pass unless queued, and the one it queues
            warm = queued and wanted
        cost = profile.noisy(cost, rng)
        outcome = Outcome(accept, source, n, a, behind, source == MODEL)
        produced = target[made : made + a + 1]
        if offer[1] and offer[0] != source:
            outcome.judged = (offer[0], *shadow_judgement(tokens, produced))
            next(d for d in lookups if d.name == offer[0]).learn(*outcome.judged[1:])
        if source in LOOKUPS:
            next(d for d in lookups if d.name == source).learn(n, a)
        if source == MODEL and model is not None:
            judged = min(behind, made, HINDSIGHT_MAX)
            if judged >= HINDSIGHT_MIN:
                outcome.hindsight = ([greedy[j] == target[j] for j in range(made - judged, made)], policy.k_max)
            model.synced = len(context) + min(a, plan.k - 1)
        planner.record(plan, 1, cost, [outcome], warm, [ask])
        context += produced
        made += len(produced)
        run.tokens, run.seconds, queued = made, run.seconds + cost, wanted
        run.trace.append((source, n, a, cost))
    return run


def oracle(
    rec: Recorded, profile: machines.Profile, sources: Sequence[str], tables: _Lookups | None = None
) -> ReplayedRun:
    """The most tokens a second any sequence of rounds could give, knowing the future: each round plain or a draft
    of any length from any of `sources` (lookups' drafts as a fresh drafter proposes them at its cap; the draft
    model's prompt catch-up paid once, later catch-ups free: an upper bound)."""
    target, n_out = rec.target, len(rec.target)
    tables = tables or _Lookups(rec)
    runs: dict[str, list[int]] = {}  # per source, the accepted run at each position
    for s in sources:
        if s == MODEL:
            g = rec.greedy(MODEL)
            runs[s] = [
                next((j for j in range(n_out - i) if g[i + j] != target[i + j]), n_out - i) for i in range(n_out)
            ]
            continue
        d = tables.drafter(s)
        runs[s] = []
        for i in range(n_out):
            tokens = d.propose(i, min(DEFAULT_K[s], n_out - i - 1))
            runs[s].append(next((j for j in range(len(tokens)) if tokens[j] != target[i + j]), len(tokens)))
    best = [0.0] * (n_out + 1)  # best[i]: least seconds to produce target[i:]
    for i in range(n_out - 1, -1, -1):
        t = profile.step + best[i + 1]
        for s, run in runs.items():
            cap = min(DEFAULT_K[s] if s != MODEL else DEFAULT_K[MODEL], n_out - i - 1)
            for k in range(1, cap + 1):
                a = min(k, run[i])
                c = profile.pass_cost(k + 1) + (k * profile.draft[MODEL] if s == MODEL else 0.0)
                t = min(t, c + best[i + a + 1])
                if a < k:
                    break  # a longer draft accepts no more and costs no less
        best[i] = t
    catch = profile.catch_up.get(MODEL, 0.0) * len(rec.prompt) if MODEL in sources else 0.0
    with_model = best[0] + catch
    if MODEL in sources and len(sources) > 1:
        without = oracle(rec, profile, [s for s in sources if s != MODEL], tables)
        return ReplayedRun(n_out, min(with_model, without.seconds))
    return ReplayedRun(n_out, with_model)


def replay(
    recording: Recording,
    profiles: Sequence[machines.Profile],
    chosen: Sequence[Policy],
    seed: int = 0,
    log: Callable[[str], None] = lambda _m: None,
    session: bool = False,
) -> dict:
    """{profile: {policy: {prompt id: ReplayedRun}}}, with the hindsight and oracle policies derived per prompt.
    session: each policy's planner serves the prompts one after another, as a server's or a chat's does (what it
    measured of the machine carried over); else a new planner a prompt, as `mlx-spec generate` runs."""
    out: dict = {}
    tables = {r.id: _Lookups(r) for r in recording.prompts}
    share = recording.shares.get(MODEL, 0.0)
    for profile in profiles:
        by = out.setdefault(profile.name, {})
        for policy in chosen:
            kept = policy.planner() if session else None
            by[policy.name] = {
                r.id: replay_one(r, profile, policy, seed, share, tables[r.id], recording.tokens, kept)
                for r in recording.prompts
            }
            log(f"{profile.name} {policy.name}")
        for s in MEMBERS:  # the best fixed K per prompt in hindsight, by member
            fixed = [name for name in by if name.startswith(f"fixed:{s}:")]
            if fixed:
                by[f"hindsight:{s}"] = {
                    r.id: min((by[f][r.id] for f in fixed + ["plain"] if f in by), key=lambda x: x.seconds)
                    for r in recording.prompts
                }
        for s in (*MEMBERS, "hybrid"):
            members = MEMBERS if s == "hybrid" else (s,)
            by[f"oracle:{s}"] = {r.id: oracle(r, profile, members, tables[r.id]) for r in recording.prompts}
    return out


def _speed(tps: float) -> str:
    """Tokens/s to a tenth, or to three significant digits where that hides them (a slow CPU's)."""
    return f"{tps:.1f}" if tps >= 10 else f"{tps:.3g}"


def _tps(runs: dict[str, ReplayedRun], ids: Sequence[str]) -> float:
    return sum(runs[i].tokens for i in ids) / sum(runs[i].seconds for i in ids)


def table(recording: Recording, results: dict) -> str:
    """Markdown: per profile, tokens/s of each policy by kind (and all), then the planner's ratios."""
    kinds = sorted({r.kind for r in recording.prompts})
    ids = {k: [r.id for r in recording.prompts if r.kind == k] for k in kinds}
    ids["all"] = [r.id for r in recording.prompts]
    cols = [*kinds, "all"]
    parts = [
        f"Recording: {len(recording.prompts)} prompts of `{recording.corpus}` "
        f"({', '.join(f'{k} {len(ids[k])}' for k in kinds)}), target `{recording.target}`, draft "
        f"`{recording.sources.get(MODEL, '-')}`, at most {recording.tokens} tokens. Tokens/s of one row, "
        "decode only (no prefill); `hindsight`: the best fixed K per prompt; `oracle`: per round, knowing the future."
    ]
    for name, by in results.items():
        rows = [[p] + [_speed(_tps(runs, ids[c])) for c in cols] for p, runs in by.items()]
        parts.append(f"### {name}\n\n" + aligned_table(["policy", *cols], rows))
        parts.append(_ratios(by, ids, cols))
    return "\n\n".join(parts) + "\n"


def _ratios(by: dict, ids: dict, cols: list[str]) -> str:
    """The planner's hybrid over plain, over the best fixed K of any member chosen per kind, over its best member
    alone; each member's planner over its own best fixed K per kind."""
    rows = []

    def ratio(a: str, bs: list[str], c: str) -> str:
        bs = [b for b in bs if b in by]
        if a not in by or not bs:
            return "-"
        best = max(bs, key=lambda b: _tps(by[b], ids[c]))
        return f"{_tps(by[a], ids[c]) / _tps(by[best], ids[c]):.2f}"

    fixed = [p for p in by if p.startswith("fixed:")]
    rows.append(["hybrid / plain"] + [ratio("planner:hybrid", ["plain"], c) for c in cols])
    rows.append(["hybrid / best fixed K"] + [ratio("planner:hybrid", fixed, c) for c in cols])
    rows.append(
        ["hybrid / best member"] + [ratio("planner:hybrid", [f"planner:{s}" for s in MEMBERS], c) for c in cols]
    )
    for s in MEMBERS:
        own = [p for p in fixed if p.startswith(f"fixed:{s}:")]
        rows.append([f"{s}: planner / best fixed K"] + [ratio(f"planner:{s}", own, c) for c in cols])
        rows.append([f"{s}: planner / plain"] + [ratio(f"planner:{s}", ["plain"], c) for c in cols])
    return aligned_table(["ratio (by kind)", *cols], rows)


def report(
    path: str,
    profile_names: Sequence[str] = (),
    policy_names: Sequence[str] = (),
    seed: int = 0,
    session: bool = False,
) -> str:
    """The replay table of a recording file, under the named profiles (all by default) and policies."""
    recording = load(path)
    if not recording.prompts:
        raise MlxSpecError(f"{path} holds no prompts yet")
    chosen = policies(policy_names)
    profiles = [machines.load(n) for n in (profile_names or machines.names())]
    missing = [p.name for p in profiles if MODEL not in p.draft]
    if missing and any(MODEL in p.sources for p in chosen):
        raise MlxSpecError(f"profile {missing[0]} has no draft step for the model: add [sources.model]")
    return table(recording, replay(recording, profiles, chosen, seed, session=session))


def check(path: str, profile_name: str, seed: int = 0) -> str:
    """Markdown: each recorded prompt's generating run (the engine's rounds on the recording machine) against its
    replay under `profile_name` with the planner and the same drafter: decode seconds measured and replayed, and
    how many rounds drafted from each source in each."""
    recording, profile = load(path), machines.load(profile_name)
    share, rows, errors = recording.shares.get(MODEL, 0.0), [], []
    for r in recording.prompts:
        if not r.measured.get("rounds"):
            continue
        drafter = r.measured["drafter"]
        policy = policies(["plain" if drafter == "none" else f"planner:{drafter}"])[0]
        run = replay_one(r, profile, policy, seed, share, budget=recording.tokens)
        measured = sum(x[3] for x in r.measured["rounds"])
        errors.append(run.seconds / measured - 1)

        def sources(trace) -> str:
            counts = {s: sum(1 for x in trace if x[0] == s and x[1]) for s in MEMBERS}
            return ", ".join(f"{s} {n}" for s, n in counts.items() if n) or "none"

        rows.append(
            [
                r.id,
                str(len(r.target)),
                f"{measured:.2f}",
                f"{run.seconds:.2f}",
                f"{100 * errors[-1]:+.1f} %",
                f"{len(r.measured['rounds'])} ({sources(r.measured['rounds'])})",
                f"{len(run.trace)} ({sources(run.trace)})",
            ]
        )
    if not rows:
        raise MlxSpecError(f"{path} holds no measured run to check")
    head = ["prompt", "tokens", "measured s", "replayed s", "error", "rounds measured (drafting)", "rounds replayed"]
    mean = statistics.mean(abs(e) for e in errors)
    return aligned_table(head, rows) + f"\n\nMean absolute error {100 * mean:.1f} % over {len(rows)} prompts.\n"
