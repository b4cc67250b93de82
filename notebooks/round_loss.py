"""Time each drafting source saved (+) or lost (-) against plain steps, from the per-round traces of a run.

    python notebooks/round_loss.py notebooks/runs/engine2-....json [--rows hybrid:qwen2.5-coder-0.5b]
    python notebooks/round_loss.py notebooks/runs/ngram-gate-ab-20261124.json   # a policy_ab.py / pad_ab.py file
    python notebooks/round_loss.py notebooks/runs/engine2-....json --set edit   # one prompt set of a bench run

A round saves (tokens it produced x a plain step) - (its verify + drafting time). The plain step is the median
step of the prompt's plain row (`none`) in a bench run, and in an A/B file the median plain step over every run
of that prompt, both sides pooled (a copying reply has one or two of its own). Prints one line per run, then the
totals per row (per side in an A/B). A development tool, not part of the package (BENCHMARKS.md §13 quotes it).
"""

import argparse
import json
import statistics
from collections import defaultdict

# A bench record's compact trace row: [source, proposed, accepted, verify_s, draft_s, ...]; an A/B run's: a dict.
FIELDS = ("source", "proposed", "accepted", "verify_s", "draft_s")


def rounds(trace):
    return [dict(zip(FIELDS, r)) if isinstance(r, list) else r for r in trace or []]


def plain_steps(trace):
    return [r["verify_s"] for r in rounds(trace) if not r["source"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--rows", help="comma list of rows to show (default: all drafted rows)")
    ap.add_argument("--set", help="only the prompts of this set (humaneval, edit, prose) of a bench run")
    args = ap.parse_args()
    data = json.load(open(args.file))
    ab = "runs" in data
    runs = data["runs"] if ab else data["records"]
    name = (lambda r: f"{r['row']} {r['policy']}") if ab else (lambda r: r["row"].split("|")[1])
    by_prompt = defaultdict(list)
    for r in runs:
        if not args.set or r.get("set") == args.set:
            by_prompt[r["prompt"]].append(r)
    want = set(args.rows.split(",")) if args.rows else None
    totals = defaultdict(lambda: defaultdict(lambda: [0, 0, 0.0]))
    for prompt, group in by_prompt.items():
        if ab:
            steps = [s for r in group for s in plain_steps(r["stats"].get("trace"))]
        else:
            steps = [plain_steps((r.get("stats") or {}).get("trace")) for r in group if r["row"].endswith("|none")]
            steps = steps[0] if steps else []
        if not steps:
            continue
        step = statistics.median(steps)
        for r in group:
            if (not ab and r["row"].endswith("|none")) or (want and r["row"].split("|")[-1] not in want):
                continue
            per = defaultdict(lambda: [0, 0, 0.0])
            for t in rounds((r.get("stats") or {}).get("trace")):
                tokens = t["accepted"] + 1 if t["source"] else 1
                p = per[t["source"] or "plain"]
                p[0], p[1], p[2] = p[0] + 1, p[1] + tokens, p[2] + tokens * step - t["verify_s"] - t["draft_s"]
            if not per:
                continue
            for src, p in per.items():
                tot = totals[name(r)][src]
                tot[0], tot[1], tot[2] = tot[0] + p[0], tot[1] + p[1], tot[2] + p[2]
            cells = "  ".join(f"{s} {p[0]}r/{p[1]}t {p[2]:+.1f}s" for s, p in sorted(per.items()))
            print(f"{prompt:24s} {name(r):36s} step {step:.3f}s  {cells}")
    print()
    for row, per in totals.items():
        print(f"{row:36s} " + "  ".join(f"{s} {p[0]}r/{p[1]}t {p[2]:+.1f}s" for s, p in sorted(per.items())))


if __name__ == "__main__":
    main()
