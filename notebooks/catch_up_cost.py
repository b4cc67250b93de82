"""What a draft model's catch-up costs per token: the drafter's own seed (`ModelDrafter._calibrate`), and passes
of several lengths on a scratch cache, split evenly and beyond a one-token step.

    python notebooks/catch_up_cost.py [--draft qwen2.5-coder-0.5b]

A development tool, not part of the package (BENCHMARKS.md §11 quotes it). Run it on an idle machine.
"""

import argparse
import time

import mlx_spec  # noqa: F401  (first: the BLAS it loads must be there before MLX's)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec.bench.prompts import build
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.named import load_model


def pass_time(model, tokens) -> float:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(tokens[:1])[None], cache=cache))  # warm-up, as _calibrate does
    t0 = time.perf_counter()
    model(mx.array(tokens[1:])[None], cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    model, tok, _ = load_model(args.draft)
    prompt = max(build(tok, 1, 1), key=lambda p: len(p.ids)).ids
    for _ in range(3):
        d = ModelDrafter(model, model.args.vocab_size)
        d.reset(prompt)
        print(f"seed: one-token step {d._step_s:.3f} s, catch-up {d._catch_up_s:.4f} s a token beyond it")
    step = d._step_s
    for n in (15, 32, 128):
        t = pass_time(model, prompt[-n:] if len(prompt) >= n else (prompt * n)[:n])
        print(f"{n - 1:3d}-token pass {t:.3f} s: {t / (n - 1):.4f} s a token split evenly, "
              f"{max(t - step, 0) / (n - 2):.4f} s beyond a one-token step")


if __name__ == "__main__":
    main()
