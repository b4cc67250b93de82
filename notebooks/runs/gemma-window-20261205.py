"""Gemma 3 270M (sliding window 512) on prompts before and past its window: plain, suffix and hybrid, interleaved.

Driver of the record gemma-window-20261205.txt: for each prompt (a code edit and a repeat, each ~200 and ~1,100
tokens), each configuration runs `repeats` times in turn; every output is checked against plain decoding and against
mlx-lm's own generate_step. Prints tokens/s end to end (prefill included) and the share of tokens from drafts.
Run: .venv/bin/python notebooks/runs/gemma-window-20261205.py [repeats]
"""

import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.gen.registry import build
from mlx_spec.named import load_model

SOURCE = (Path(__file__).parents[2] / "mlx_spec" / "gen" / "verify.py").read_text()
MAX_TOKENS = 64


def prompts(tok) -> dict[str, list[int]]:
    """A code edit and a repeat, each short (~200 tokens) and long (~1,100): the same kind, the file cut."""
    lines = SOURCE.splitlines(keepends=True)
    out = {}
    for size, want in (("200", 200), ("1100", 1100)):
        code, n = "", 0
        for line in lines * 3:
            if len(tok.encode(code + line)) > want - 40:
                break
            code += line
        head = "".join(code.splitlines(keepends=True)[:3])
        out[f"edit-{size}"] = tok.encode(
            f"```python\n{code}```\n\nThe same file with `mx` renamed to `mlx_core` everywhere:\n\n```python\n"
        )
        out[f"repeat-{size}"] = tok.encode(f"```python\n{code}```\n\nThe file again, unchanged:\n\n```python\n{head}")
    return out


def run(model, ids, drafter):
    stats, t = Stats(), time.perf_counter()
    toks = [s.token for s in speculative_generate_step(ids, model, drafter, max_tokens=MAX_TOKENS, stats=stats)]
    return toks, time.perf_counter() - t, stats


def main(repeats: int) -> None:
    model, tok, _ = load_model("gemma-3-270m")
    print(f"model gemma-3-270m: {type(model).__module__}, sliding_window {model.args.sliding_window}, float dtype "
          f"{model.model.embed_tokens.weight.dtype}; {MAX_TOKENS} new tokens, greedy; {repeats} runs each, interleaved")
    configs = {"plain": None, "suffix": "suffix", "hybrid": "hybrid"}
    for name, ids in prompts(tok).items():
        ref = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=MAX_TOKENS)]
        times: dict[str, list[float]] = {c: [] for c in configs}
        share, same, notes = {}, {}, {}
        for _ in range(repeats):
            for c, spec in configs.items():
                drafter = build(spec, model, tok) if spec else None
                toks, seconds, stats = run(model, ids, drafter)
                times[c].append(len(toks) / seconds)
                share[c] = stats.accepted / max(1, len(toks))
                same[c] = toks == ref[: len(toks)] and len(toks) == len(ref)
                notes[c] = stats.fallback
        base = statistics.median(times["plain"])
        print(f"\n{name}: {len(ids)} prompt tokens")
        for c in configs:
            med = statistics.median(times[c])
            print(f"  {c:7s} {med:6.1f} tok/s (runs {min(times[c]):.1f}-{max(times[c]):.1f}) {med / base:5.2f}x plain"
                  f"  from drafts {share[c]:5.1%}  equal to mlx-lm: {same[c]}  fallback: {notes[c]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
