"""A/B worker: loads a target once and answers timing requests on stdin (JSON lines), with this revision's engine."""
import json, sys, time
import mlx_spec  # noqa: F401  (first: the fast BLAS)
import mlx.core as mx
from mlx_spec import named
from mlx_spec.bench.common import ours_stream, time_stream
from mlx_spec.gen.stats import Stats

target = sys.argv[1]
model, tok, _ = named.load_model(target)
loaded = {}
eos = list(tok.eos_token_ids)
print(json.dumps({"ready": mlx_spec.__file__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    spec = "none" if req["draft"] == "control" else req["draft"]  # control: plain decoding again, the noise floor
    m = named.registry.parse(spec).model if spec != "none" else None
    if m and m not in loaded:
        loaded[m] = named.load_model(m)[:2]
    drafter = named.make_drafter(spec, model, tok, loaded=loaded) if spec != "none" else None
    stats = Stats()
    kw = dict(max_tokens=req["max_tokens"], eos_token_ids=eos, temp=req.get("temp", 0.0))
    t = time_stream(lambda: ours_stream(req["ids"], model, drafter, stats=stats, **kw), req["max_tokens"], eos)
    print(json.dumps({"decode_tps": t.decode_tps, "e2e_tps": t.e2e_tps, "tokens": t.tokens, "drafted": sum(t.from_draft),
                      "rounds": stats.rounds, "spec_rounds": stats.spec_rounds, "proposed": stats.proposed,
                      "accepted": stats.accepted, "accepted_by_position": stats.accepted_by_position,
                      "proposed_by_position": stats.proposed_by_position}), flush=True)
