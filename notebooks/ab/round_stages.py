"""Where a round's time goes, stage by stage (the engine's methods timed), for the rounds around a random head's
probes, one HumanEval prompt, 128 tokens (BENCHMARKS §37).
    python notebooks/ab/round_stages.py qwen2.5-coder-0.5b /work/heads/random-0.5b"""
import sys, time
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen import engine as E
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.stats import Stats

log = []
def wrap(name):
    f = getattr(E.Engine, name)
    def g(self, *a, **k):
        t = time.perf_counter(); r = f(self, *a, **k); log.append((name, time.perf_counter() - t)); return r
    setattr(E.Engine, name, g)
for n in ["_plan", "_propose", "_verify", "_launch", "_read", "_rewind", "_show", "_record", "_pack"]:
    wrap(n)
rf = E.Engine.round
rounds = []
def round_(self):
    log.clear(); t = time.perf_counter(); r = rf(self); rounds.append((time.perf_counter() - t, dict(log))); return r
E.Engine.round = round_
target, head = sys.argv[1], sys.argv[2]
model, tok, _ = named.load_model(target)
p = build(tok, 10, 10)[0]
d = named.make_drafter(f"eagle3:{head}", model, tok)
st = Stats(trace=[])
for x in speculative_generate_step(p.ids, model, d, max_tokens=128, stats=st, eos_token_ids=list(tok.eos_token_ids)):
    pass
tr = st.trace
for i, e in enumerate(tr):
    if e["source"] or (i and tr[i - 1]["source"]) or (i + 1 < len(tr) and tr[i + 1]["source"]) or i in (10, 50):
        w, stages = rounds[i]
        print(i, e["source"] or "-", f"trace {e['seconds']:.3f} wall {w:.3f}", {k: round(v * 1000) for k, v in stages.items()})
