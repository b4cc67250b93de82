"""The `cluster` suite: plain sharded decoding against each drafter over the ranks `mlx.launch` starts, at simulated
link latencies (`cluster.link`), each round's time split into compute and communication; and a predicted table for
published multi-Mac setups from those measurements.

Every rank runs the suite; rank 0 writes the result, rank r > 0 its own beside it (`rank-r/`)."""

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .common import ours_stream, params_gb, time_stream
from .report import aligned_table
from .results import ResultFile

if TYPE_CHECKING:
    from ..cluster.link import Link

Log = Callable[[str], None]
US = 1e-6

# Apple's Mac Studio (2025) technical specifications: M3 Ultra, 819 GB/s of unified memory bandwidth.
M3_ULTRA_GBS = 819.0
BYTES_4BIT = 4.5 / 8  # a 4-bit weight with a bf16 scale and bias per group of 64 (mlx's default quantization)
# Published shapes (the models' config.json files): billions of parameters every token reads outside the routed
# experts (`dense_b`), one routed expert's over all MoE layers (`expert_b`), experts per layer and chosen per token,
# layers. DeepSeek-V3: 37B active, 58 of 61 layers MoE, 256 experts of 3 x 7168 x 2048, 8 chosen; GLM-4.6: 32B active,
# 89 of 92 layers MoE, 160 experts of 3 x 5120 x 1536, 8 chosen. A tensor-parallel layer makes 2 all_sums, each of
# one `hidden`-wide bf16 state a position.
MODELS = {
    "Llama-3.3-70B 4-bit (dense)": dict(dense_b=70.6, expert_b=0.0, experts=1, chosen=1, layers=80, hidden=8192),
    "DeepSeek-V3 671B 4-bit (MoE)": dict(dense_b=16.6, expert_b=2.554, experts=256, chosen=8, layers=61, hidden=7168),
    "GLM-4.6 355B 4-bit (MoE)": dict(dense_b=15.2, expert_b=2.10, experts=160, chosen=8, layers=92, hidden=5120),
}
SETUPS = [(m, n) for m in MODELS for n in (2, 4)]  # 2 to 4 Mac Studios M3 Ultra (512 GB each: every model fits)


def run(suite, out: str, log: Log) -> ResultFile:
    """Load the suite's first target sharded by tensor over the group, then measure every (repeat, prompt,
    latency, row) interleaved; each rank writes its result file."""
    from ..cluster import Cluster
    from ..cluster.link import LINKS_US, Link
    from ..gen.registry import parse
    from ..named import make_drafter
    from .common import machine_info
    from .prompts import build
    from .table import folder_of

    cluster = Cluster.join("tensor")
    target = suite.targets[0]
    folder = folder_of(target.model, log)
    model, tok = cluster.load(folder)
    drafters = {"none": None}
    for d in target.drafts:
        drafters[d] = make_drafter(cluster.drafter(parse(d), folder), model, tok, log=log)
    cluster.agree_seed(0)  # a barrier: no rank starts before all have loaded
    where = Path(out) if cluster.lead else Path(out) / f"rank-{cluster.rank}"
    result = ResultFile.create(where, suite.as_dict(), machine_info())
    result.data["cluster"] = {
        "ranks": cluster.size,
        "shard": "tensor",
        "simulated": True,
        "latencies_us": list(suite.latencies_us),
        "published_links_us": LINKS_US,
        "draft_gb": {d: _weights_gb(dr) for d, dr in drafters.items() if dr is not None},
    }
    log(f"writing {result.path}")
    prompts = build(tok, 0, suite.prompts["edit"], n_prose=suite.prompts["prose"])
    eos = tuple(tok.eos_token_ids)
    with cluster.guard():
        for drafter in drafters.values():  # warm-up, not recorded: every shape built once
            measure(suite, cluster, model, drafter, prompts[0].ids, Link(0.0), eos, max_tokens=8)
        for rep in range(suite.repeats):
            for p in prompts:
                for lat in suite.latencies_us:
                    for name, drafter in drafters.items():
                        rec = measure(suite, cluster, model, drafter, p.ids, Link(lat * US), eos)
                        row = f"{lat:g}us|{name}"
                        rec.update(key=f"{row}|{p.id}|{rep}", row=row, draft=name, prompt=p.id, set=p.set, repeat=rep)
                        result.add(rec)
    result.data["complete"] = True
    result.publish(render)
    return result


def measure(suite, cluster, model, drafter, ids, link: "Link", eos, max_tokens: int | None = None) -> dict:
    """One reply over the group through `link` (fresh): its timing, the engine's stats, and each round's
    communication (collectives, seconds measured in them, seconds waited) and compute (the rest of its time)."""
    from ..cluster.link import Marked
    from ..gen.stats import Stats
    from .table import compact_trace

    planner = Marked(adaptive=suite.adaptive, cluster=cluster, link=link)
    stats = Stats(trace=[])
    n = max_tokens or suite.max_tokens
    kw = dict(max_tokens=n, eos_token_ids=eos, temp=suite.temp, num_draft=suite.num_draft, planner=planner)
    with link.installed():
        t = time_stream(lambda: ours_stream(ids, model, drafter, stats=stats, **kw), n, eos)
    d = stats.as_dict()
    d["trace"] = compact_trace(d["trace"])
    seconds = [r[3] for r in d["trace"] or []]
    comm = [r.seconds for r in planner.rounds]
    return {
        **t.as_dict(),
        "prompt_tokens": len(ids),
        "stats": d,
        "link": {
            "latency_us": round(link.latency / US, 3),
            "simulated": True,
            "collectives": link.tally.collectives,
            "measured_s": link.tally.measured,
            "waited_s": link.tally.waited,
            "rounds": [[r.collectives, round(r.measured, 6), round(r.waited, 6)] for r in planner.rounds],
        },
        "compute_s": sum(seconds) - sum(comm[: len(seconds)]),
        "comm_s": sum(comm[: len(seconds)]),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": os.getloadavg()[0],
    }


def _weights_gb(drafter) -> float:
    """GB of the networks a drafter's parts run (0 for n-gram and suffix, which run none)."""
    return sum(params_gb(p.model) for p in drafter.parts if p.model is not None)


def summarize(data: dict) -> list[dict]:
    """Per (latency, row): tokens/s, speed-up over plain sharded decoding at that latency, tokens per round, compute
    and communication per round, collectives per round, and replies equal to plain's."""
    recs = data.get("records", [])
    plain = {(r["link"]["latency_us"], r["prompt"], r["repeat"]): r for r in recs if r["draft"] == "none"}
    rows: dict[str, list[dict]] = {}
    for r in recs:
        rows.setdefault(r["row"], []).append(r)
    out = []
    for row, rs in rows.items():
        rounds = sum(r["stats"]["rounds"] for r in rs) or 1
        tokens, total = sum(r["n_tokens"] for r in rs), sum(r["total"] for r in rs)
        base = [plain.get((r["link"]["latency_us"], r["prompt"], r["repeat"])) for r in rs]
        base_tps = sum(b["n_tokens"] for b in base if b) / (sum(b["total"] for b in base if b) or 1)
        out.append(
            {
                "row": row,
                "latency_us": rs[0]["link"]["latency_us"],
                "draft": rs[0]["draft"],
                "tokens_per_second": tokens / total if total else 0.0,
                "speedup": (tokens / total) / base_tps if total and base_tps else None,
                "tokens_per_round": tokens / rounds,
                "drafted_per_round": sum(r["stats"]["proposed"] for r in rs) / rounds,
                "model_steps_per_round": sum(
                    t[1] + t[5] for r in rs for t in r["stats"]["trace"] or [] if t[0] == "model"
                )
                / rounds,
                "compute_ms_per_round": 1000 * sum(r["compute_s"] for r in rs) / rounds,
                "comm_ms_per_round": 1000 * sum(r["comm_s"] for r in rs) / rounds,
                "collectives_per_round": sum(r["link"]["collectives"] for r in rs) / rounds,
                "identical": sum(b is not None and b["tokens"] == r["tokens"] for r, b in zip(rs, base)),
                "compared": sum(bool(b) for b in base),
            }
        )
    return out


def pass_s(model: dict, ranks: int, size: int, gbs: float = M3_ULTRA_GBS) -> float:
    """Roofline seconds of a tensor-parallel pass over `size` positions: each rank reads its share of the weights
    the pass touches (for an MoE, the experts `size` tokens choose: E x (1 - (1 - k/E)^size) a layer expected)."""
    experts = model["experts"] * (1 - (1 - model["chosen"] / model["experts"]) ** size) if model["expert_b"] else 0
    return (model["dense_b"] + model["expert_b"] * experts) * 1e9 * BYTES_4BIT / ranks / (gbs * 1e9)


def comm_s(model: dict, ranks: int, size: int, us: float, gbs: float) -> float:
    """Seconds of a round's (2 x layers + 1) collectives over a link of `us` µs and `gbs` GB/s: a ring's all_sum
    over n ranks makes n - 1 round trips and moves 2 (n - 1) / n of its payload, a bf16 state a position. (Not this
    run's collectives: on one machine they time the ranks waiting for each other on shared cores, not a link.)"""
    payload = 2 * model["hidden"] * size
    return (2 * model["layers"] + 1) * (ranks - 1) * (us * US + 2 / ranks * payload / (gbs * 1e9))


def predicted(data: dict, summary: list[dict]) -> list[list[str]]:
    """Per published setup and link: plain tokens/s and each drafter's predicted speed-up. A round costs a pass
    over its drafted + 1 positions, its collectives over the link (`comm_s`) and its draft-model steps at the
    draft's roofline; it yields the tokens per round measured here."""
    from ..cluster.link import LINKS_GBS

    links = data["cluster"]["published_links_us"]
    draft_gb = data["cluster"].get("draft_gb", {})
    drafts: dict[str, list[dict]] = {}
    for s in summary:
        if s["draft"] != "none":
            drafts.setdefault(s["draft"], []).append(s)
    rows = []
    for name, ranks in SETUPS:
        m = MODELS[name]
        for link, us in links.items():
            gbs = LINKS_GBS[link]
            plain = pass_s(m, ranks, 1) + comm_s(m, ranks, 1, us, gbs)
            cells = [name, str(ranks), f"{link} ({us:g} µs)", f"{1 / plain:.1f}"]
            for d, ss in drafts.items():
                tpr = sum(s["tokens_per_round"] for s in ss) / len(ss)
                size = round(1 + sum(s["drafted_per_round"] for s in ss) / len(ss))
                steps = sum(s["model_steps_per_round"] for s in ss) / len(ss)
                step = draft_gb.get(d, 0.0) / M3_ULTRA_GBS
                round_s = pass_s(m, ranks, size) + comm_s(m, ranks, size, us, gbs) + steps * step
                cells.append(f"{tpr * plain / round_s:.2f}×")
            rows.append(cells)
    return rows


def render(data: dict) -> str:
    """The measured table (simulated links) and the predicted one."""
    from .common import page_head

    summary = data["summary"] = summarize(data)
    c = data["cluster"]
    head = page_head(data) + (
        f"- {c['ranks']} ranks, target sharded by tensor; link latency **simulated** (a wait after each collective: "
        f"{', '.join(f'{x:g}' for x in c['latencies_us'])} µs)\n\n"
    )
    cols = ["Latency µs (simulated)", "Draft", "tok/s", "Speed-up", "Tokens/round", "Compute ms/round"]
    cols += ["Comm ms/round", "Collectives/round", "Equal to plain"]
    measured = [
        [
            f"{s['latency_us']:g}",
            s["draft"],
            f"{s['tokens_per_second']:.2f}",
            "baseline" if s["draft"] == "none" else f"{s['speedup']:.2f}×" if s["speedup"] else "-",
            f"{s['tokens_per_round']:.2f}",
            f"{s['compute_ms_per_round']:.1f}",
            f"{s['comm_ms_per_round']:.1f}",
            f"{s['collectives_per_round']:.1f}",
            f"{s['identical']}/{s['compared']}",
        ]
        for s in summary
    ]
    if not summary:
        return head + "Nothing measured yet.\n"
    drafts = list(dict.fromkeys(s["draft"] for s in summary if s["draft"] != "none"))
    pcols = ("Setup (M3 Ultra Mac Studios)", "Ranks", "Link (published)", "Plain tok/s", *drafts)
    return (
        head
        + "## Measured here, links simulated\n\n"
        + aligned_table(cols, measured)
        + "\n\n## Predicted (not measured): published setups\n\n"
        + f"Compute: the roofline of {M3_ULTRA_GBS:g} GB/s (Apple's M3 Ultra specification) over 4-bit weights; a "
        + "collective: the published link latency (ranks - 1) times, plus its payload (a bf16 state a position) at "
        + "the link's nominal line rate; tokens per round: each drafter's, measured here. Speed-ups over plain "
        + "sharded decoding, **predicted**.\n\n"
        + aligned_table(pcols, predicted(data, summary))
        + "\n"
    )
