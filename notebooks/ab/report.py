"""Tables of an A/B of two revisions from driver.py's records (one or more runs): mean tokens/s by row and set."""
import json, sys, statistics
from collections import defaultdict
runs = [json.load(open(p)) for p in sys.argv[1:]]
recs = [dict(r, run=i) for i, run in enumerate(runs) for r in run["records"]]
sides = sorted({r["side"] for r in recs})
rows = list(dict.fromkeys(r["draft"] for r in recs))
sets = list(dict.fromkeys(r["set"] for r in recs))
by = defaultdict(list)
for r in recs:
    by[(r["run"], r["prompt"], r["draft"], r["side"], r.get("repeat", 0))].append(r)
plain = {(r["run"], r["prompt"], r["side"], r.get("repeat", 0)): r["tokens"] for r in recs if r["draft"] == "none"}
print("| Draft | Set | " + " | ".join(f"{s} tok/s" for s in sides) + (" | new / old | per prompt (min–max) |" if len(sides) == 2 else " |")
      + " identical to plain |")
print("|" + "---|" * (3 + len(sides) + (2 if len(sides) == 2 else 0)))
for d in rows:
    for st in sets + ["all"]:
        sel = [r for r in recs if r["draft"] == d and (st == "all" or r["set"] == st)]
        if not sel:
            continue
        means = {s: statistics.mean(r["decode_tps"] for r in sel if r["side"] == s) for s in sides}
        same = sum(r["tokens"] == plain[(r["run"], r["prompt"], r["side"], r.get("repeat", 0))] for r in sel)
        line = f"| {d} | {st} | " + " | ".join(f"{means[s]:.2f}" for s in sides)
        if len(sides) == 2:
            pairs = defaultdict(dict)
            for r in sel:
                pairs[(r["run"], r["prompt"], r.get("repeat", 0))][r["side"]] = r["decode_tps"]
            ratios = [p["new"] / p["old"] for p in pairs.values() if "new" in p and "old" in p]
            line += f" | **{means['new'] / means['old']:.3f}×** | {min(ratios):.2f}–{max(ratios):.2f} |"
        print(line + f" {same}/{len(sel)} |")
