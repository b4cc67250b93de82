"""Per-prompt ratios of each drafter row to plain decoding on the same prompt, from driver.py records (one side).
With a `control` row (plain again) the drafters are also compared with the mean of the two plain runs.
Prompts a cut-short run did not finish are left out. Usage: python notebooks/ab/floor.py RECORD.json... [--floor F]"""
import json, sys, statistics
args = sys.argv[1:]
floor = float(args[args.index("--floor") + 1]) if "--floor" in args else 0.95
recs = [r for f in args if f.endswith(".json") for r in json.load(open(f))["records"]]
rows = [d for d in dict.fromkeys(r["draft"] for r in recs) if d != "none"]
got = {(r["side"], r["prompt"], r["draft"]): r for r in recs}
done = [(s, p) for (s, p, d) in got if d == "none" and all((s, p, x) in got for x in rows)]
both = "control" in rows
mark = lambda q: f"**{q:.2f}**" if q < floor else f"{q:.2f}"
head = [f"{d} / plain" for d in rows] + ([f"{d} / mean plain" for d in rows if d != "control"] if both else [])
print("| Prompt | plain tok/s | " + " | ".join(head) + " |")
print("|---|---|" + "---|" * len(head))
ratios = {h: [] for h in head}
same = {d: 0 for d in rows}
for side, pid in done:
    p = got[(side, pid, "none")]
    base = (p["decode_tps"] + got[(side, pid, "control")]["decode_tps"]) / 2 if both else None
    cells = []
    for d in rows:
        r = got[(side, pid, d)]
        q = r["decode_tps"] / p["decode_tps"]
        ratios[f"{d} / plain"].append(q)
        same[d] += r["tokens"] == p["tokens"]
        cells.append(f"{mark(q)} ({r['drafted']})")
    for d in (rows if both else []):
        if d != "control":
            q = got[(side, pid, d)]["decode_tps"] / base
            ratios[f"{d} / mean plain"].append(q)
            cells.append(mark(q))
    print(f"| {pid} | {p['decode_tps']:.2f} | " + " | ".join(cells) + " |")
for h, x in ratios.items():
    print(f"{h}: mean {statistics.mean(x):.3f}, min {min(x):.2f}, max {max(x):.2f}, below {floor}: "
          f"{sum(q < floor for q in x)} of {len(x)}")
print("identical to plain: " + ", ".join(f"{d} {same[d]}/{len(done)}" for d in rows))
