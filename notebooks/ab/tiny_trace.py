"""The rounds of a drafter on the random tiny model, by source (probes apart) and tokens accepted, 12 prompts of the
overhead suite on one planner and acceptance, as `bench run` keeps them (BENCHMARKS §37).
    python notebooks/ab/tiny_trace.py hybrid"""
import sys, time, collections
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.stats import Stats
spec = sys.argv[1]
model, tok, _ = named.load_model("/root/.cache/mlx-spec/models/random-tiny")
prompts = build(tok, 4, 4, n_prose=4)
planner, accept = Planner(), {}
tot = collections.Counter(); t0 = time.perf_counter(); ntok = 0
for p in prompts:
    d = named.make_drafter(spec, model, tok)
    st = Stats(trace=[])
    toks = [x.token for x in speculative_generate_step(p.ids, model, d, max_tokens=128, stats=st, planner=planner, accept=accept, eos_token_ids=list(tok.eos_token_ids))]
    ntok += len(toks)
    for e in st.trace:
        tot[(e["source"] or "-") + (" probe" if e.get("probe") else "")] += 1
        tot[(e["source"] or "-") + " acc"] += e["accepted"]
print(mlx_spec.__file__.split("/")[1:3], dict(tot), f"{ntok / (time.perf_counter() - t0):.0f} tok/s")
