"""Per-prompt ratios of each drafter row to plain decoding on the same prompt, from driver.py records (one side).
Usage: python notebooks/ab/floor.py RECORD.json [FLOOR]"""
import json, sys, statistics
recs = json.load(open(sys.argv[1]))["records"]
floor = float(sys.argv[2]) if len(sys.argv) > 2 else 0.95
plain = {(r["side"], r["prompt"]): r for r in recs if r["draft"] == "none"}
rows = [d for d in dict.fromkeys(r["draft"] for r in recs) if d != "none"]
print("| Prompt | plain tok/s | " + " | ".join(f"{d} / plain (drafted)" for d in rows) + " |")
print("|---|---|" + "---|" * len(rows))
ratios = {d: [] for d in rows}
same = {d: 0 for d in rows}
for (side, pid), p in plain.items():
    cells = []
    for d in rows:
        r = next(x for x in recs if x["side"] == side and x["prompt"] == pid and x["draft"] == d)
        q = r["decode_tps"] / p["decode_tps"]
        ratios[d].append(q)
        same[d] += r["tokens"] == p["tokens"]
        cells.append(f"{'**' if q < floor else ''}{q:.2f}{'**' if q < floor else ''} ({r['drafted']})")
    print(f"| {pid} | {p['decode_tps']:.2f} | " + " | ".join(cells) + " |")
for d in rows:
    x = ratios[d]
    print(f"{d}: mean {statistics.mean(x):.3f}, min {min(x):.2f}, max {max(x):.2f}, below {floor}: {sum(q < floor for q in x)}"
          f" of {len(x)}, identical to plain {same[d]}/{len(x)}")
