"""What the planner expects a random head's drafting rounds to cost, printed as it plans them, beside the rounds' measured
seconds (BENCHMARKS §37).
    python notebooks/ab/probe_costs.py qwen2.5-coder-0.5b /work/heads/random-0.5b"""
import sys
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.stats import Stats

class Dbg(Planner):
    n = 0
    def plan(self, asks, places=None, pad=False, queued=False):
        self.n += 1
        p = super().plan(asks, places, pad, queued)
        if p.k and any(k[0] == 'eagle3' for k in self.drafts):
            a = [x for x in asks if x.costly][0]
            pc = self._probe_cost(a.costly, [a], 1, False, 1)
            print(f"round {self.n} probe={p.probe} queued={queued} cost11={self.cost(1,1):.3f} cost12={self.cost(1,2):.3f}"
                  f" probe_cost={pc:.3f} restart={self.started_w/self.drafted_w:.2f} draft={self.draft_cost(a.costly,1,1,a.behind):.3f}"
                  f" behind={a.behind} exp1={a.stats(a.costly).expected(1):.3f} costs={ {k: round(v,3) for k,v in self.costs.items()} }", flush=True)
        return p

target, head = sys.argv[1], sys.argv[2]
model, tok, _ = named.load_model(target)
p = build(tok, 10, 10)[0]
d = named.make_drafter(f"eagle3:{head}", model, tok)
st = Stats(trace=[])
for x in speculative_generate_step(p.ids, model, d, max_tokens=128, stats=st, planner=Dbg(), eos_token_ids=list(tok.eos_token_ids)):
    pass
tr = st.trace
print([ (i, round(e['seconds'],3)) for i, e in enumerate(tr) if e['source'] or (i and tr[i-1]['source'])])
