"""Would a draft model that skips most of a long catch-up still draft as well? An offline check on a bench run.

    python notebooks/gap_sim.py notebooks/runs/hybrid-suffix-....json [--window 16] [--after 48]

For every round of the hybrid row where its draft model caught up on output it sat out (the suffix source copying),
the draft model reads the reply teacher-forced twice: with the whole context, and with the sat-out output cut to
its last `window` tokens (the prompt is always kept whole). Over the next `after` reply tokens it counts where its
greedy token is the target's, in both readings. A development tool, not part of the package.
"""

import argparse
import json

import mlx_spec  # noqa: F401  (BLAS first)
import mlx.core as mx
from mlx_lm import load

from mlx_spec.bench import prompts as P
from mlx_spec.make.paths import home


def matches(model, ids, out, start, stop, cut=None):
    """Whether the draft's greedy token is the reply's at each of out[start:stop], reading prompt + out (out[a:b]
    left out when cut=(a, b))."""
    keep = list(range(len(out))) if cut is None else [i for i in range(len(out)) if not cut[0] <= i < cut[1]]
    seq = ids + [out[i] for i in keep if i < stop - 1]
    logits = model(mx.array(seq)[None])[0]
    where = {i: len(ids) + j for j, i in enumerate(keep) if i < stop - 1}  # reply index -> position in seq
    best = mx.argmax(logits, axis=-1).tolist()
    return [best[where[i - 1] if i else len(ids) - 1] == out[i] for i in range(start, stop)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--row", default="hybrid:qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--after", type=int, default=48)
    ap.add_argument("--least", type=int, default=32, help="output tokens sat out for a catch-up to count")
    args = ap.parse_args()
    data = json.load(open(args.file))
    model, tok = load(str(home() / "models" / args.draft))
    n = {}
    for r in data["records"]:
        if r["row"].endswith("|none"):
            n[r["set"]] = n.get(r["set"], 0) + 1
    built = {p.id: p for p in P.build(tok, n.get("humaneval", 0), n.get("edit", 0), n_prose=n.get("prose", 0))}
    plain = {r["prompt"]: r["tokens"] for r in data["records"] if r["row"].endswith("|none")}
    totals = {}
    for r in data["records"]:
        if not r["row"].endswith("|" + args.row):
            continue
        pos, last = 0, 0  # reply tokens so far; where the model last drafted (it holds the reply up to there)
        out, ids = plain[r["prompt"]], built[r["prompt"]].ids
        for t in r["stats"]["trace"]:
            source, accepted = t[0], t[2]
            if "model" in source:
                missed = pos - last
                if missed >= args.least and pos + 2 <= len(out):
                    stop = min(len(out), pos + args.after)
                    whole = matches(model, ids, out, pos, stop)
                    cut = matches(model, ids, out, pos, stop, (last, pos - args.window))
                    k = r["set"]
                    a = totals.setdefault(k, [0, 0, 0])
                    a[0] += sum(whole)
                    a[1] += sum(cut)
                    a[2] += len(whole)
                    print(f"{r['prompt']:24s} sat out {missed:3d}: whole {sum(whole)}/{len(whole)}, "
                          f"cut to {args.window}: {sum(cut)}/{len(cut)}", flush=True)
                pos += accepted + 1
                last = pos - 1  # the bonus token is not fed yet
            else:
                pos += (accepted + 1) if source else 1
    for k, (w, c, m) in totals.items():
        print(f"{k}: whole context {w}/{m} = {w / m:.3f}, cut {c}/{m} = {c / m:.3f}")


if __name__ == "__main__":
    main()
