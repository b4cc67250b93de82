"""`bench serve` records of two revisions side by side: tokens/s per client count and mode (median over repeats,
each repeat's figure in brackets), after / before, and the drafter batched over plain batched cell by cell.
Usage: python notebooks/ab/serve_compare.py --before REC... --after REC..."""
import json, statistics, sys
args, side, files = sys.argv[1:], None, {"before": [], "after": []}
for a in args:
    if a in ("--before", "--after"):
        side = a[2:]
    else:
        files[side].append(a)
MODES = {"off": "plain, batched", "turns": "drafter, turn-taking", "on": "drafter, batched", "mlx-lm": "mlx-lm"}
def cells(fs):
    out = {}
    for f in fs:
        for c in json.load(open(f))["cells"]:
            out.setdefault((c["clients"], c["mode"]), {})[c["repeat"]] = c["tokens"] / c["wall_s"]
    return out
b, a = cells(files["before"]), cells(files["after"])
print("| Clients | Mode | before tok/s | after tok/s | after / before |")
print("|---|---|---|---|---|")
for key in sorted(set(a) & set(b)):
    x, y = b[key], a[key]
    mb, ma = statistics.median(x.values()), statistics.median(y.values())
    fmt = lambda d: ", ".join(f"{d[r]:.2f}" for r in sorted(d))
    print(f"| {key[0]} | {MODES[key[1]]} | {mb:.2f} ({fmt(x)}) | {ma:.2f} ({fmt(y)}) | {ma / mb:.2f}× |")
for name, d in (("before", b), ("after", a)):
    for c in sorted({k[0] for k in d}):
        on, off = d.get((c, "on"), {}), d.get((c, "off"), {})
        r = [on[i] / off[i] for i in sorted(on) if i in off]
        print(f"{name}, {c} clients: drafter batched / plain batched per cell " + ", ".join(f"{x:.2f}" for x in r))
