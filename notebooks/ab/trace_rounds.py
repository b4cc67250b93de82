"""Per-round trace of plain decoding and one drafter on prose prompts, printed: rounds by source (count, proposed,
accepted, seconds, catch-up), then the drafter's rounds in order (BENCHMARKS §32). Usage: python trace_rounds.py DRAFT prose/1 ..."""
import sys, collections
import mlx_spec  # noqa
from mlx_spec import named
from mlx_spec.bench.prompts import build
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.stats import Stats
import time
model, tok, _ = named.load_model("qwen2.5-coder-1.5b")
loaded = {"qwen2.5-coder-0.5b": named.load_model("qwen2.5-coder-0.5b")[:2]}
prompts = {p.id: p for p in build(tok, 0, 0, n_prose=24)}
spec = sys.argv[1]
for pid in sys.argv[2:]:
    for s in ["none", spec]:
        d = named.make_drafter(s, model, tok, loaded=loaded) if s != "none" else None
        st = Stats(trace=[])
        t = time.perf_counter()
        toks = [x.token for x in speculative_generate_step(prompts[pid].ids, model, d, max_tokens=128, stats=st, eos_token_ids=list(tok.eos_token_ids))]
        el = time.perf_counter() - t
        agg = collections.defaultdict(lambda: [0, 0, 0, 0.0, 0])
        for e in st.trace:
            a = agg[(e["source"] or "plain") + ("*" if e.get("probe") else "")]; a[0] += 1; a[1] += e["proposed"]; a[2] += e["accepted"]; a[3] += e["seconds"]; a[4] += e.get("behind", 0)
        print(pid, s, len(toks), f"{el:.1f}s gen {st.generation_time:.1f}s", {k: dict(n=v[0], prop=v[1], acc=v[2], s=round(v[3], 1), behind=v[4]) for k, v in agg.items()}, flush=True)
        if s != "none":
            print("  ", [(e["source"][:2] + ("*" if e.get("probe") else "") if e["source"] else "-", e["proposed"], e["accepted"], round(e["seconds"], 2), e.get("behind", 0)) for e in st.trace if e["source"] or True][:140])
