"""Gemma 3 270M (sliding window 512) on code edit and repeat prompts before and past its window: plain, suffix and
hybrid, interleaved, each from a copy of one prefilled cache.

Driver of the record gemma-window-20261205b.txt. The edit pair is one task, the long prompt putting ~900 tokens more
of surrounding code before the edited function; the repeat pair is gemma-window-20261205.py's. Per prompt: the prefill
(timed once), target passes of 1, 6 and 16 positions at that context (what a verify round costs), then each
configuration `repeats` times in turn; every output is checked against plain's. Prints the outputs, the share of
output 4-grams found in the prompt, the share of tokens from drafts, generation tokens/s (prefill excluded) and what
the suffix run's planner priced each verify size at.
Run: .venv/bin/python notebooks/runs/gemma-window-20261205b.py [repeats]
"""

import copy
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

from mlx_spec.gen.cache import new_cache, prefill_cache
from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.gen.registry import build
from mlx_spec.named import load_model

GEN = Path(__file__).parents[2] / "mlx_spec" / "gen"
MAX_TOKENS = 64
RENAME = "The same code with `mx` renamed to `mlx_core`:"


def cut(tok, lines: list[str], want: int, tail: bool = False) -> str:
    """Whole lines from the start (tail: from the end) of `lines`, as many as stay under `want` tokens."""
    out: list[str] = []
    for line in reversed(lines) if tail else lines:
        if len(tok.encode("".join([line, *out] if tail else [*out, line]))) > want:
            break
        out = [line, *out] if tail else [*out, line]
    return "".join(out)


def prompts(tok) -> dict[str, list[int]]:
    """The edit: verify.py's `_residual` onward (~150 tokens) to be rewritten, its first line given rewritten; the
    long one has the code before it in front (sampling.py and verify.py's head). The repeat: as the 20261205 record."""
    verify = (GEN / "verify.py").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(verify) if line.startswith("def _residual"))
    edited = cut(tok, verify[at:], 150)
    before = ((GEN / "sampling.py").read_text() + "\n\n" + "".join(verify[:at])).splitlines(keepends=True)
    first = edited.splitlines(keepends=True)[0].replace("mx.", "mlx_core.")
    out = {}
    for size, extra in (("200", ""), ("1100", cut(tok, before, 900, tail=True))):
        out[f"edit-{size}"] = tok.encode(f"```python\n{extra}{edited}```\n\n{RENAME}\n\n```python\n{first}")
    lines = "".join(verify).splitlines(keepends=True)
    for size, want in (("200", 200), ("1100", 1100)):
        code = cut(tok, lines * 3, want - 40)
        head = "".join(code.splitlines(keepends=True)[:3])
        out[f"repeat-{size}"] = tok.encode(f"```python\n{code}```\n\nThe file again, unchanged:\n\n```python\n{head}")
    return out


def copied(ids: list[int], out: list[int], n: int = 4) -> float:
    """Share of output tokens ending an n-gram (over prompt and output) that occurs in the prompt."""
    grams = {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}
    seq = ids + out
    return sum(tuple(seq[len(ids) + j + 1 - n : len(ids) + j + 1]) in grams for j in range(len(out))) / len(out)


def pass_seconds(model, cache, ids: list[int], size: int) -> float:
    c = copy.deepcopy(cache)
    mx.eval([x.state for x in c])
    t = time.perf_counter()
    mx.eval(model(mx.array(ids[-size:])[None], cache=c))
    return time.perf_counter() - t


def main(repeats: int) -> None:
    model, tok, _ = load_model("gemma-3-270m")
    print(
        f"model gemma-3-270m: {type(model).__module__}, sliding_window {model.args.sliding_window}, float dtype "
        f"{model.model.embed_tokens.weight.dtype}; {MAX_TOKENS} new tokens, greedy; {repeats} runs each, interleaved"
    )
    configs = {"plain": None, "suffix": "suffix", "hybrid": "hybrid"}
    for name, ids in prompts(tok).items():
        cache, t = new_cache(model), time.perf_counter()
        prefill_cache(model, cache, ids[:-1], None)
        prefill = time.perf_counter() - t
        passes = {s: [pass_seconds(model, cache, ids, s) for _ in range(3)] for s in (1, 6, 16)}
        times: dict[str, list[float]] = {c: [] for c in configs}
        out, share, same, stats_of = {}, {}, {}, {}
        for _ in range(repeats):
            for c, spec in configs.items():
                drafter = build(spec, model, tok) if spec else None
                stats, t = Stats(trace=[]), time.perf_counter()
                run = speculative_generate_step(
                    ids, model, drafter, prompt_cache=copy.deepcopy(cache), max_tokens=MAX_TOKENS, stats=stats
                )
                toks = [s.token for s in run]
                times[c].append(len(toks) / (time.perf_counter() - t))
                out[c], share[c], stats_of[c] = toks, stats.draft_share, stats
                same[c] = toks == out["plain"]
        base = statistics.median(times["plain"])
        print(f"\n{name}: {len(ids)} prompt tokens, prefilled in {prefill:.1f} s; one target pass at this context:")
        print("  " + ", ".join(f"{s} positions {statistics.median(v):.2f} s" for s, v in passes.items()))
        print(f"  output (plain), {copied(ids, out['plain']):.1%} of its tokens end a 4-gram found in the prompt:")
        print("    " + repr(tok.decode(out["plain"])))
        for c in configs:
            med, st = statistics.median(times[c]), stats_of[c]
            verified = [e for e in st.trace if e["proposed"]]
            print(
                f"  {c:7s} {med:6.2f} tok/s (runs {min(times[c]):.2f}-{max(times[c]):.2f}) {med / base:5.2f}x plain"
                f"  from drafts {share[c]:5.1%}  rounds {st.rounds}, drafting {len(verified)}"
                f" ({st.accepted}/{st.proposed} accepted)  equal to plain: {same[c]}  fallback: {st.fallback}"
            )
            if spec_costs := {k: round(v, 2) for k, v in sorted(st.costs.items())} if configs[c] else None:
                print(f"          priced verify seconds by size {spec_costs}; left out: {st.left_out}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
