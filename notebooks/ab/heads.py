"""A learned drafter's rows from driver.py records (one side): per row and prompt set, the speed-up over plain decoding
on the same prompts (mean of per-prompt ratios, min-max), tokens per drafting round (tau: the accepted draft tokens
plus the target's own, over the rounds that verified a draft), acceptance by draft position (a tree's: by depth), the
drafting rounds that verified a tree (worker_tree.py's records), outputs equal to plain.
Usage: python notebooks/ab/heads.py RECORD.json"""
import json, statistics, sys

recs = json.load(open(sys.argv[1]))["records"]
plain = {r["prompt"]: r for r in recs if r["draft"] == "none"}
rows = [d for d in dict.fromkeys(r["draft"] for r in recs) if d != "none"]
sets = list(dict.fromkeys(r["set"] for r in recs))
print("| Draft | Set | speed-up (min-max) | tau | acceptance by position (1..4) | tree rounds | equal to plain |")
print("|---|---|---|---|---|---|---|")
for d in rows:
    for s in sets + ["all"]:
        sel = [r for r in recs if r["draft"] == d and (s == "all" or r["set"] == s) and r["prompt"] in plain]
        if not sel:
            continue
        q = [r["decode_tps"] / plain[r["prompt"]]["decode_tps"] for r in sel]
        spec = sum(r.get("spec_rounds", 0) for r in sel)
        tau = (sum(r.get("accepted", 0) for r in sel) + spec) / spec if spec else float("nan")
        by_p = [sum(r.get("proposed_by_position", [])[i] if i < len(r.get("proposed_by_position", [])) else 0
                    for r in sel) for i in range(4)]
        by_a = [sum(r.get("accepted_by_position", [])[i] if i < len(r.get("accepted_by_position", [])) else 0
                    for r in sel) for i in range(4)]
        acc = " ".join(f"{a / p:.2f}" if p else "-" for a, p in zip(by_a, by_p))
        same = sum(r["tokens"] == plain[r["prompt"]]["tokens"] for r in sel)
        trees = f"{sum(r['tree_rounds'] for r in sel)}/{spec}" if all("tree_rounds" in r for r in sel) else "-"
        print(f"| {d} | {s} | {statistics.mean(q):.2f}x ({min(q):.2f}-{max(q):.2f}) | {tau:.2f} | {acc} | {trees} | "
              f"{same}/{len(sel)} |")
