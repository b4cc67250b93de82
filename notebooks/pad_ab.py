"""A/B of verify padding (`Policy.padded`): the engine with padding off ("old") against on ("new"), on the same
loaded target, each drafter made afresh for every run, greedy, the two sides' order alternating.

    python notebooks/pad_ab.py --prompts HumanEval/8,HumanEval/8:rename --rows hybrid:qwen2.5-coder-0.5b \
        --out notebooks/runs/pad-ab.json
    python notebooks/policy_ab.py --report --out notebooks/runs/pad-ab.json --old - --prompts - --rows -

A development tool, not part of the package (BENCHMARKS.md §14 quotes it); the table comes from policy_ab.py's
report.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  (first: the BLAS it loads must be there before MLX's)

from mlx_spec.gen.engine import Stats, speculative_generate_step
from mlx_spec.gen.policy import Policy
from mlx_spec.gen.registry import default_num_draft
from mlx_spec.named import make_drafter
from policy_ab import load  # a sibling script: python puts notebooks/ on the path


class NoPad(Policy):
    """The policy with verify padding off, whatever the engine allows."""

    @property
    def pad(self) -> bool:
        return False

    @pad.setter
    def pad(self, value: bool) -> None:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target, tok, prompts, eos = load(args.target, args.prompts)
    out = []
    for i, p in enumerate(prompts):
        for j, row in enumerate(args.rows.split(",")):
            for name in ["old", "new"][:: -1 if (i + j) % 2 else 1]:
                drafter = make_drafter(row, target, tok)
                policy = (NoPad if name == "old" else Policy)(default_num_draft(drafter))
                stats = Stats(trace=[])
                t0 = time.perf_counter()
                tokens = [s.token for s in speculative_generate_step(
                    p.ids, target, drafter, max_tokens=args.max_tokens, eos_token_ids=eos, stats=stats,
                    policy=policy)]
                out.append({"prompt": p.id, "row": row, "policy": name, "total": time.perf_counter() - t0,
                            "tokens": tokens, "stats": stats.as_dict(),
                            "verify_sizes": {str(k): round(v, 4) for k, v in sorted(policy.verify.items())}})
                print(f"{p.id:24s} {row:28s} {name} {out[-1]['total']:6.1f} s", file=sys.stderr, flush=True)
                Path(args.out).write_text(json.dumps({"old": "padding off", "file": "mlx_spec/gen/policy.py",
                                                      "target": args.target, "runs": out}))
                del drafter


if __name__ == "__main__":
    main()
