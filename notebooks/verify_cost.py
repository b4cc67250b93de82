"""What one target pass over M positions costs (a verify pass of M - 1 drafts), on a cache holding a prompt: the
table behind verify padding (`Policy.padded`, PAD_SIZES).

    python notebooks/verify_cost.py [--target qwen2.5-coder-1.5b] [--context 250]

Each size is timed 5 times after a warm-up, twice over (the sizes in order, then again); the cache is trimmed
back after each pass. A development tool, not part of the package (BENCHMARKS.md §14 quotes it). Run it on an
idle machine.
"""

import argparse
import statistics
import time

import mlx_spec  # noqa: F401  (first: the BLAS it loads must be there before MLX's)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlx_spec.named import load_model

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--context", type=int, default=250, help="tokens in the cache before each pass")
    args = ap.parse_args()
    model, tok, _ = load_model(args.target)
    ids = tok.encode("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 40)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(ids[: args.context])[None], cache=cache))

    def timed(m: int) -> float:
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            mx.eval(model(mx.array(ids[args.context : args.context + m])[None], cache=cache))
            times.append(time.perf_counter() - t0)
            trim_prompt_cache(cache, m)
        return statistics.median(times[1:])

    runs = {m: [] for m in SIZES}
    for _ in range(2):
        for m in SIZES:
            runs[m].append(timed(m))
    one = min(runs[1])
    print(f"{args.target}, {args.context} tokens cached; ms per pass (two medians of 5), and the faster one over M=1")
    for m, t in runs.items():
        print(f"M={m:2d}  {1000 * t[0]:6.0f} {1000 * t[1]:6.0f}  {min(t) / one:5.2f}x")


if __name__ == "__main__":
    main()
