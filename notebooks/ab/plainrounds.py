"""Steady plain rounds (after the first 12) with and without a drafter, interleaved ABABAB in one process (BENCHMARKS §32).
Usage: python notebooks/ab/plainrounds.py PROMPT DRAFT MAX_TOKENS"""
import sys, statistics, time
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.stats import Stats
model, tok, _ = named.load_model("qwen2.5-coder-1.5b")
loaded = {"qwen2.5-coder-0.5b": named.load_model("qwen2.5-coder-0.5b")[:2]}
prompts = {p.id: p for p in build(tok, 0, 0, n_prose=24)}
pid, spec = sys.argv[1], sys.argv[2]
for s in ["none", spec, "none", spec, "none", spec]:
    d = named.make_drafter(s, model, tok, loaded=loaded) if s != "none" else None
    st = Stats(trace=[])
    t = time.perf_counter()
    toks = [x.token for x in speculative_generate_step(prompts[pid].ids, model, d, max_tokens=int(sys.argv[3]), stats=st, eos_token_ids=list(tok.eos_token_ids))]
    el = time.perf_counter() - t
    plain = [e["seconds"] for e in st.trace[12:-1] if not e["source"]]
    drafted = [e for e in st.trace if e["source"]]
    print(s, f"{el:.1f}s", "steady plain", round(statistics.mean(plain), 4), "median", round(statistics.median(plain), 4), "n", len(plain), "drafting rounds", len(drafted), round(sum(e["seconds"] for e in drafted), 2), flush=True)
