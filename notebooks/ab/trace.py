"""Per-round traces of the hybrid on prose prompts (BENCHMARKS §31): rounds by source, and the whole trace into a
JSON record. Usage: python notebooks/ab/trace.py OUT.json prose/0 prose/6"""
import sys, json, collections
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.stats import Stats
model, tok, _ = named.load_model("qwen2.5-coder-1.5b")
loaded = {}
loaded["qwen2.5-coder-0.5b"] = named.load_model("qwen2.5-coder-0.5b")[:2]
prompts = {p.id: p for p in build(tok, 0, 0, n_prose=12)}
out = {'script': open(__file__).read(), 'runs': []}
for pid in sys.argv[2:]:
    for spec in ("hybrid:qwen2.5-coder-0.5b",):
        d = named.make_drafter(spec, model, tok, loaded=loaded)
        st = Stats(trace=[])
        toks = [s.token for s in speculative_generate_step(prompts[pid].ids, model, d, max_tokens=128, stats=st,
                                                           eos_token_ids=list(tok.eos_token_ids))]
        agg = collections.defaultdict(lambda: [0, 0, 0, 0.0, 0])
        for e in st.trace:
            a = agg[e["source"] or "plain"]; a[0] += 1; a[1] += e["proposed"]; a[2] += e["accepted"]; a[3] += e["seconds"]; a[4] += e.get("behind", 0)
        print(pid, spec, len(toks), "tokens;", {k: dict(rounds=v[0], proposed=v[1], accepted=v[2], seconds=round(v[3], 1), behind=v[4]) for k, v in agg.items()})
        out["runs"].append({"prompt": pid, "draft": spec, "tokens": toks, "trace": st.trace})
        print("  first 30 rounds:", [(e["source"][:6] or "-", e["proposed"], e["accepted"], round(e["seconds"], 2), e.get("size")) for e in st.trace[:30]])
json.dump(out, open(sys.argv[1], "w"))
