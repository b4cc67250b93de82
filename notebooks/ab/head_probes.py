"""Where a random head's cost goes with the planner choosing: per prompt, plain decoding then the head, each on a fresh
planner; the head's drafting rounds (probes), their seconds and catch-up, and the round after each (BENCHMARKS §37).
    python notebooks/ab/head_probes.py qwen2.5-coder-0.5b /work/heads/random-0.5b 128 4"""
import sys, statistics, time
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.stats import Stats

target, head, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, tok, _ = named.load_model(target)
prompts = build(tok, 10, 10)[:int(sys.argv[4]) if len(sys.argv) > 4 else 4]
tot = {}
for p in prompts:
    for s in ["none", f"eagle3:{head}"]:
        d = named.make_drafter(s, model, tok) if s != "none" else None
        st = Stats(trace=[])
        t = time.perf_counter()
        toks = [x.token for x in speculative_generate_step(p.ids, model, d, max_tokens=n, stats=st, eos_token_ids=list(tok.eos_token_ids))]
        el = time.perf_counter() - t
        tr = st.trace
        probes = [i for i, e in enumerate(tr) if e["source"]]
        after = [tr[i + 1]["seconds"] for i in probes if i + 1 < len(tr)]
        plain = [e["seconds"] for e in tr if not e["source"]]
        tot.setdefault(s, []).append(el)
        print(p.id, s[:6], f"{el:.2f}s rounds {len(tr)} drafting {len(probes)} at {probes[:12]}",
              f"drafting s {[round(tr[i]['seconds'],3) for i in probes][:8]} behind {[tr[i]['behind'] for i in probes][:8]}",
              f"next {[round(x,3) for x in after][:8]} plain median {statistics.median(plain):.3f}", flush=True)
for s, v in tot.items():
    print(s, f"{sum(v):.2f}")
