"""Per prompt set: each row of a bench run (engine2) over plain decoding and over mlx-lm's speculative decoding.

    python notebooks/engine2_sets.py notebooks/runs/engine2-....json

Aggregate tokens/s ratios on the prompts both rows finished (per-prompt min-max, n prompts), outputs identical to
plain, prompts below 0.95x, and the hybrid's tokens by drafting source. A development tool (BENCHMARKS.md §18).
"""
import json, sys, statistics
from collections import defaultdict
d = json.load(open(sys.argv[1]))
recs = d["records"]
by = defaultdict(dict)
for r in recs:
    by[r["prompt"]][r["row"].split("|")[-1]] = r
rows = list(dict.fromkeys(r["row"].split("|")[-1] for r in recs))
print("rows", rows, "prompts", len(by), "records", len(recs))
same = sum(1 for r in recs if r["row"].split("|")[-1] != "none" and by[r["prompt"]].get("none") and r["tokens"] == by[r["prompt"]]["none"]["tokens"])
print("identical", same, "of", sum(1 for r in recs if r["row"].split("|")[-1] != "none" and by[r["prompt"]].get("none")))
def agg(row, base, kind):
    ps = [p for p, g in by.items() if row in g and base in g and g[row]["set"] == kind]
    if not ps: return None
    tr = sum(by[p][row]["n_tokens"] for p in ps) / sum(by[p][row]["total"] for p in ps)
    tb = sum(by[p][base]["n_tokens"] for p in ps) / sum(by[p][base]["total"] for p in ps)
    per = [by[p][row]["e2e_tps"] / by[p][base]["e2e_tps"] for p in ps]
    return f"{tr/tb:.2f}x ({min(per):.2f}-{max(per):.2f}) n={len(ps)}"
for row in rows:
    if row == "none": continue
    print(f"{row:34s}", " | ".join(str(agg(row, b, k)) for b in ("none", [r for r in rows if r.startswith("mlx-lm")][0]) for k in ("humaneval", "edit")))
# per-prompt below 0.95 over plain
for p, g in by.items():
    for row, r in g.items():
        if row != "none" and "none" in g and r["e2e_tps"] / g["none"]["e2e_tps"] < 0.95:
            print("below 0.95:", p, row, round(r["e2e_tps"] / g["none"]["e2e_tps"], 2))

# the hybrid's tokens by source, per set
from collections import Counter
for kind in ("humaneval", "edit"):
    c = Counter()
    for r in recs:
        if r["row"].endswith("hybrid:qwen2.5-coder-0.5b") and r["set"] == kind:
            for t in (r.get("stats") or {}).get("trace") or []:
                c[t[0] or "plain"] += (t[2] + 1) if t[0] else 1
    print(kind, dict(c), sum(c.values()))
