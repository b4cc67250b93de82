"""A/B worker for draft trees: as worker.py, and a draft ending in '#chain' runs with a planner that never drafts a
tree (trees=False), so trees and chains of the same head are timed in one process, interleaved."""
import json, sys
import mlx_spec  # noqa: F401  (first: the fast BLAS)
from mlx_spec import named
from mlx_spec.bench.common import ours_stream, time_stream
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.stats import Stats

model, tok, _ = named.load_model(sys.argv[1])
eos = list(tok.eos_token_ids)
print(json.dumps({"ready": mlx_spec.__file__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    spec, _, mode = req["draft"].partition("#")
    drafter = named.make_drafter(spec, model, tok, loaded={}) if spec != "none" else None
    stats = Stats(trace=[])
    kw = dict(max_tokens=req["max_tokens"], eos_token_ids=eos, temp=req.get("temp", 0.0),
              planner=Planner(trees=mode != "chain"))
    t = time_stream(lambda: ours_stream(req["ids"], model, drafter, stats=stats, **kw), req["max_tokens"], eos)
    print(json.dumps({"decode_tps": t.decode_tps, "e2e_tps": t.e2e_tps, "tokens": t.tokens, "drafted": sum(t.from_draft),
                      "rounds": stats.rounds, "spec_rounds": stats.spec_rounds, "proposed": stats.proposed,
                      "accepted": stats.accepted, "accepted_by_position": stats.accepted_by_position,
                      "proposed_by_position": stats.proposed_by_position,
                      "tree_rounds": sum(1 for e in stats.trace if e.get("tree")),
                      "tree_accepted": sum(e["accepted"] for e in stats.trace if e.get("tree"))}), flush=True)
