"""Why mlx-lm's generate_step and mlx-spec's plain decoding parted on the conformance suite's tiny recurrent_gemma.

Driver of the record recurrent-gemma-20261205.txt. The suite's model (weights x4) with `logits_soft_cap` 1.0 saturates
tanh: several logits are exactly 1.0 in float32, so greedy is a tie, broken by argmax's first index, and mlx-lm's
argmax over logprobs (logits - logsumexp) merges values that argmax over logits keeps apart. With the real model's
cap (30.0) there is no tie, and the uncached pass, generate_step (chunked and one token at a time) and mlx-spec's
plain decoding agree at every prompt length, before, at and past the window of 8.
Run: PYTHONPATH=. .venv/bin/python notebooks/runs/recurrent-gemma-20261205.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))

import mlx_spec  # noqa: F401, E402, I001  (first: puts the fast BLAS under MLX)
import mlx.core as mx  # noqa: E402
from conformance import model  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from mlx_spec.gen.generate import speculative_generate_step  # noqa: E402

N = 12  # tokens generated


def uncached(m, prompt: list[int]) -> tuple[list[int], float]:
    """Greedy by the model's own full pass over the whole sequence at each step (no cache), and the least top-2 gap."""
    toks, out, gaps = list(prompt), [], []
    for _ in range(N):
        logits = m(mx.array([toks]))[0, -1]
        top = mx.sort(logits)[-2:].tolist()
        out.append(int(mx.argmax(logits).item()))
        gaps.append(top[1] - top[0])
        toks.append(out[-1])
    return out, min(gaps)


def runs(m, prompt: list[int]) -> dict[str, list[int]]:
    return {
        "generate_step": [int(t) for t, _ in generate_step(mx.array(prompt), m, max_tokens=N)],
        "generate_step(prefill_step_size=1)": [
            int(t) for t, _ in generate_step(mx.array(prompt), m, max_tokens=N, prefill_step_size=1)
        ],
        "mlx-spec plain": [s.token for s in speculative_generate_step(prompt, m, None, max_tokens=N)],
    }


for cap in (1.0, 30.0):
    m = model("recurrent_gemma", logits_soft_cap=cap)
    print(f"== logits_soft_cap {cap}")
    logits = m(mx.array([[5, 17, 42] * 2]))[0, -1]
    top = logits.max().item()
    tied = [i for i, v in enumerate(logits.tolist()) if v == top]
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    lp_tied = [i for i, v in enumerate(logprobs.tolist()) if v == logprobs.max().item()]
    print(f"prompt [5,17,42]*2: max logit {top!r} at ids {tied}, argmax(logits) {int(mx.argmax(logits).item())};")
    print(f"  max logprob at ids {lp_tied}, argmax(logprobs) {int(mx.argmax(logprobs).item())}")
    for L in (1, 3, 6, 7, 8, 9, 12, 24, 40):
        prompt = [(5, 17, 42)[i % 3] for i in range(L)]
        want, gap = uncached(m, prompt)
        agree = {k: v == want for k, v in runs(m, prompt).items()}
        print(f"prompt {L:2d} (window 8): least top-2 logit gap {gap:.3g}; equal to the uncached pass: {agree}")
