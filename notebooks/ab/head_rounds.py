"""Per-round cost of a head that is never asked to draft (a planner that always plans plain steps): rounds with and
without it on two edit prompts, ABAB in one process (BENCHMARKS §37).
    python notebooks/ab/head_rounds.py qwen2.5-coder-0.5b /work/heads/random-0.5b 64"""
import sys, statistics, time
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.planner import PLAIN, Planner
from mlx_spec.gen.stats import Stats

class Never(Planner):
    def plan(self, asks, places=None, pad=False, queued=False):
        return PLAIN

target, head, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, tok, _ = named.load_model(target)
prompts = [p for p in build(tok, 10, 10) if p.set == "edit"][:2]
res = {}
for rep in range(3):
    for s in ["none", f"eagle3:{head}"]:
        for p in prompts:
            d = named.make_drafter(s, model, tok) if s != "none" else None
            st = Stats(trace=[])
            t = time.perf_counter()
            toks = [x.token for x in speculative_generate_step(p.ids, model, d, max_tokens=n, stats=st, planner=Never(),
                                                               eos_token_ids=list(tok.eos_token_ids))]
            plain = [e["seconds"] for e in st.trace[8:-1]]
            res.setdefault(s, []).append(statistics.median(plain))
            print(rep, s[:6], p.id, len(p.ids), f"median round {statistics.median(plain)*1000:.1f} ms mean {statistics.mean(plain)*1000:.1f}", flush=True)
for s, v in res.items():
    print(s, f"{statistics.mean(v)*1000:.2f} ms")
