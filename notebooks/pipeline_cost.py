"""Draft passes launched ahead (`ModelDrafter(pipeline=True)`, mx.async_eval before the token is read) against the
synchronous loop: seconds per drafted token, the host's share of a step, and what the measured rule decides.

    python notebooks/pipeline_cost.py [--draft qwen2.5-coder-0.5b] [--rounds 12] [--prose]

Two drafters with the vocabulary-subset head draft the same growing context in alternation, K=6 a round, each
draft taken as accepted, on the longest HumanEval prompt (or the first open prose question). With the confidence
stop off, no launch is wasted (the case most favourable to launching ahead); with the default stop on, the
wasted launches count. A development tool, not part of the package
(BENCHMARKS.md quotes it). Run it on an idle machine.
"""

import argparse
import statistics
import time

import mlx_spec  # noqa: F401  (first: the BLAS it loads must be there before MLX's)
import mlx.core as mx

from mlx_spec.bench.prompts import build
from mlx_spec.gen.drafters.model import DEFAULT_MIN_CONFIDENCE, ModelDrafter
from mlx_spec.gen.registry import head_ids
from mlx_spec.named import load_model

K = 6


def run(model, tok, prompt, rounds: int, min_confidence: float):
    ids = head_ids(tok, len(tok.get_vocab()))
    drafters = {mode: ModelDrafter(model, model.args.vocab_size, min_confidence=min_confidence, head_ids=ids,
                                   pipeline=mode) for mode in (False, True)}
    per_token = {False: [], True: []}
    for d in drafters.values():
        d.reset(prompt)
        d.propose(prompt, K)  # warm-up: the prompt's catch-up
    context = list(prompt)
    for r in range(rounds):
        drafts = {}
        for mode in ((False, True) if r % 2 == 0 else (True, False)):
            t0 = time.perf_counter()
            drafts[mode] = drafters[mode].propose(context, K).tokens
            mx.synchronize()  # a pass launched ahead and thrown away still runs: it is the round's cost
            per_token[mode].append((time.perf_counter() - t0) / len(drafts[mode]))
        assert drafts[False] == drafts[True], "launching ahead changed the draft"
        context += drafts[False]
    return drafters, per_token


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--prose", action="store_true", help="an open prose question, where drafts stop early")
    args = ap.parse_args()
    model, tok, _ = load_model(args.draft)
    prompt = (build(tok, 0, 0, n_prose=1)[0] if args.prose else max(build(tok, 1, 1), key=lambda p: len(p.ids))).ids
    print(f"{args.draft}, {len(prompt)}-token prompt, K={K}, {args.rounds} rounds a mode, alternating")
    for conf in (0.0, DEFAULT_MIN_CONFIDENCE):
        drafters, per_token = run(model, tok, prompt, args.rounds, conf)
        sync, ahead = (statistics.median(per_token[m]) for m in (False, True))
        d = drafters[False]
        launched, wasted = d.ahead
        print(f"min_confidence {conf}: synchronous {1000 * sync:.1f} ms a token "
              f"({1000 * min(per_token[False]):.1f}-{1000 * max(per_token[False]):.1f}), launched ahead "
              f"{1000 * ahead:.1f} ms ({1000 * min(per_token[True]):.1f}-{1000 * max(per_token[True]):.1f}): "
              f"{sync / ahead:.3f}x; host {1000 * d._host_s:.2f} ms of a {1000 * d._step_s:.1f} ms step; "
              f"{wasted} of {launched} launches wasted")
        auto = ModelDrafter(model, model.args.vocab_size, min_confidence=conf)
        auto._host_s, auto._step_s, auto._recent = d._host_s, d._step_s, d._recent
        print(f"  the rule on these measurements (recent waste {d.waste():.2f}): "
              f"{'launch ahead' if auto._launches() else 'synchronous'}")


if __name__ == "__main__":
    main()
