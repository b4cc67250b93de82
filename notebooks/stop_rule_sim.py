"""Replay draft-length stop rules offline: the 0.5B teacher-forced over the target's greedy replies of a bench run.

    python notebooks/stop_rule_sim.py notebooks/runs/engine2-....json [--draft qwen2.5-coder-0.5b] [--row ROW]

Within a round the draft model's greedy tokens equal the target's up to the first rejection, so one pass of the
draft over prompt + reply gives, at every reply position, the token it would draft there and its confidence (the
softmax probability of its top token). Each rule is replayed as rounds over the reply (every round drafts from the
position after the last one's bonus token) and priced with the costs measured in the same run (median verify
seconds by draft count, a count of 3 or more at the cheapest such size as the engine pads, and the median draft
step of the row). Prints the draft's calibration (how often its top token was the target's, by probability), then
seconds per rule and set. "rate" is the shipped rule (`pays_to_go_on`).
A development tool, not part of the package.
"""

import argparse
import json
import statistics
from collections import defaultdict

import mlx_spec  # noqa: F401  (BLAS first)
import mlx.core as mx
from mlx_lm import load

from mlx_spec.bench import prompts as P
from mlx_spec.gen.drafters.model import pays_to_go_on
from mlx_spec.make.paths import home

K = 15


def positions(model, ids, out):
    """For each reply position: (draft's greedy token == target's, its confidence)."""
    x = mx.array(ids + out[:-1])[None]
    logits = model(x)[0, len(ids) - 1:].astype(mx.float32)
    probs = mx.softmax(logits, axis=-1)
    best = mx.argmax(logits, axis=-1)
    conf = mx.take_along_axis(probs, best[:, None], axis=-1)[:, 0]
    mx.eval(best, conf)
    return [(b == t, c) for b, t, c in zip(best.tolist(), out, conf.tolist())]


def replay(pos, rule, verify, step):
    """(seconds, rounds) of decoding the reply with drafts cut by `rule(i, conf, cum, expected)`: go on after the
    i-th token."""
    p, seconds, rounds = 0, 0.0, 0
    while p < len(pos):
        k, cum, acc, alive, expected = 0, 1.0, 0, True, 1.0
        while k < K and p + k < len(pos) - 1:
            ok, c = pos[p + k]
            k += 1
            cum *= c
            expected += cum
            if alive and ok:
                acc += 1
            else:
                alive = False
            if not rule(k, c, cum, expected):
                break
        seconds += verify(k) + k * step
        rounds += 1
        p += acc + 1
    return seconds, rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--row", default="qwen2.5-coder-0.5b", help="the run's row whose costs price the rounds")
    args = ap.parse_args()
    data = json.load(open(args.file))
    plain = {r["prompt"]: r for r in data["records"] if r["row"].endswith("|none")}
    costs = defaultdict(list)
    steps = []
    for r in data["records"]:
        if r["row"].endswith("|" + args.row):
            for t in r["stats"]["trace"]:
                costs[t[1]].append(t[3])
                if t[1]:
                    steps.append((t[4] - t[5]) / t[1])
    med = {k: statistics.median(v) for k, v in costs.items()}
    padded = min(v for k, v in med.items() if k >= 3)
    verify = lambda k: min(med.get(k, padded), padded) if k >= 3 else med[k]  # noqa: E731
    step = statistics.median(steps)
    print(f"verify {[round(verify(k), 3) for k in range(K + 1)]}  draft step {step:.3f}s")
    model, tok = load(str(home() / "models" / args.draft))
    n = defaultdict(int)
    for r in data["records"]:
        if r["row"].endswith("|none"):
            n[r["set"]] += 1
    built = {p.id: p for p in P.build(tok, n["humaneval"], n["edit"], n_prose=n["prose"])}
    ratio = step / verify(0)
    rules = {
        "conf<0.5 (now)": lambda i, c, cum, e: c >= 0.5,
        "no stop": lambda i, c, cum, e: True,
        "conf<0.7": lambda i, c, cum, e: c >= 0.7,
        "conf<0.9": lambda i, c, cum, e: c >= 0.9,
        "cum<step ratio": lambda i, c, cum, e: c >= 0.5 and cum >= ratio,
        "cum*c<step ratio": lambda i, c, cum, e: c >= 0.5 and cum * c >= ratio,
        "cum<0.5": lambda i, c, cum, e: c >= 0.5 and cum >= 0.5,
        "cum<0.2": lambda i, c, cum, e: c >= 0.5 and cum >= 0.2,
        "rate": lambda i, c, cum, e: c >= 0.5 and pays_to_go_on(i, c, cum, e, verify, step),  # the shipped rule
    }
    calib = defaultdict(lambda: [0, 0])
    total = defaultdict(lambda: defaultdict(float))
    for pid, rec in plain.items():
        pos = positions(model, built[pid].ids, rec["tokens"])
        for ok, c in pos:
            b = calib[(rec["set"], min(int(c * 10), 9))]
            b[0] += ok
            b[1] += 1
        for name, rule in rules.items():
            s, _ = replay(pos, rule, verify, step)
            total[rec["set"]][name] += s
        total[rec["set"]]["plain"] += len(pos) * verify(0)
    for (st, b), (ok, n) in sorted(calib.items()):
        print(f"{st} conf {b / 10:.1f}-{(b + 1) / 10:.1f}: {ok}/{n} = {ok / n:.2f} right")
    for st, t in total.items():
        base = t["conf<0.5 (now)"]
        print(st, "  ".join(f"{k}: {v:.0f}s ({base / v:.3f}x)" for k, v in t.items()))


if __name__ == "__main__":
    main()
