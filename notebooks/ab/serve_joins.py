"""A fresh "drafter batched" server as `bench serve` runs it (the 0.5B, suffix): its warm-up, then two cells of 8
concurrent clients; at each join, the shared planner's timed plain passes and whether the request joined (BENCHMARKS §37).
    python notebooks/ab/serve_joins.py"""
import sys
import mlx_spec  # noqa
from mlx_spec.bench import prompts as bench_prompts
from mlx_spec_apps.server import batching
from mlx_spec_apps.server.throughput import Cell, run_cell, plan_prompts, WARMUP_TOKENS
from mlx_spec_apps.server.pair import Pair
from mlx_spec_apps.server.app import build_app
from mlx_spec_apps.server.main import Running

orig = batching.Batcher.join
def join(self, job):
    p = self.shared.planner
    rows = len(self.shared.rows) + sum(j.engine is self.shared for j in self.joining.values()) + 1
    t = orig(self, job)
    print(f"join rows={rows} together={t} costs={ {k: round(v, 3) for k, v in p.costs.items()} } timed={ {k: [round(x, 3) for x in v] for k, v in p.timed.items()} }", flush=True)
    return t
batching.Batcher.join = join
on = Pair.load("qwen2.5-coder-0.5b", "suffix")
plan = plan_prompts(on.tokenizer, [8], 2)
with Running(build_app(on, max_concurrency=8, max_tokens=32)) as srv:
    print("warm-up", flush=True)
    run_cell(srv.url, Cell(2, -1, "on", [bench_prompts.WARMUP_PROMPT] * 2), WARMUP_TOKENS)
    for r in range(2):
        print("cell", r, flush=True)
        chosen = plan[(8, r)]
        c = run_cell(srv.url, Cell(8, r, "on", [p.text for p in chosen], [p.set for p in chosen]), 32)
        print("tok/s", c.tokens_per_second, "drafted", c.drafted, flush=True)
