"""Why the 20261205 record's long edit drafted little: its edit prompts' plain and suffix outputs, the share of output
tokens ending a 4-gram of the prompt, every suffix offer (context length, k, match length, draft length), the rounds.
Run: .venv/bin/python notebooks/runs/gemma-window-20261205b-oldpair.py edit-200 edit-1100
"""

import importlib.util
import sys
import time
from pathlib import Path

from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.gen.registry import build
from mlx_spec.named import load_model


spec = importlib.util.spec_from_file_location("drv", Path(__file__).parent / "gemma-window-20261205.py")
drv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(drv)

model, tok, _ = load_model("gemma-3-270m")
P = drv.prompts(tok)


def ngram_share(ids, out, n=4):
    grams = {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}
    ctx = list(ids)
    hit = 0
    for j in range(len(out)):
        # output token j counts as copied if the n-gram ending at it (over prompt+output) appears in the prompt
        seq = ctx + out[: j + 1]
        if tuple(seq[-n:]) in grams:
            hit += 1
    return hit / max(1, len(out))


for name in sys.argv[1:]:
    ids = P[name]
    for spec_ in (None, "suffix"):
        stats = Stats()
        stats.trace = []
        drafter = build(spec_, model, tok) if spec_ else None
        offers = []
        if drafter is not None:
            orig = drafter.propose

            def prop(context, k, sampler=None, orig=orig):
                d = orig(context, k, sampler)
                st, ln = drafter.index.match()
                offers.append((len(context), k, ln, len(d)))
                return d

            drafter.propose = prop
        t = time.perf_counter()
        toks = [s.token for s in speculative_generate_step(ids, model, drafter, max_tokens=64, stats=stats)]
        dt = time.perf_counter() - t
        print(
            f"== {name} {spec_} prompt {len(ids)} tokens {len(toks)} in {dt:.1f}s; from drafts {stats.accepted}/{len(toks)}; 4-gram share in prompt {ngram_share(ids, toks):.1%}"
        )
        if spec_ is None:
            plain = toks
            print(repr(tok.decode(toks)))
        else:
            print("equal to plain:", toks == plain)
            print("offers (ctx len, k, match len, draft len):", offers)
            print(
                "trace:",
                [(e["source"], e["proposed"], e["accepted"], e["size"], round(e["seconds"], 3)) for e in stats.trace],
            )
            print("costs:", stats.costs)
