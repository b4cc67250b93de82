"""The worker of `bench ab`: one side's engine, timing what the driver asks, one JSON line each way.

`bench/ab.py` runs this file's text as `python -c SOURCE TARGET` in the root of a checkout, so `import mlx_spec`
takes that checkout's package. It uses only names every revision since the one engine has (`named.load_model`,
`named.make_drafter`, `bench.common.ours_stream` and `time_stream`, `gen.stats.Stats`): an old checkout runs its
own engine under it.
"""

import json
import sys
from functools import partial


def main(target: str) -> None:
    """Load `target` once; then per request line {ids, draft, max_tokens} answer the timing and tokens."""
    import mlx_spec  # first: the fast BLAS, before anything imports mlx.core
    from mlx_spec import named
    from mlx_spec.bench.common import ours_stream, time_stream
    from mlx_spec.gen.stats import Stats

    model, tokenizer, _ = named.load_model(target)
    eos = list(tokenizer.eos_token_ids)
    loaded: dict[str, tuple] = {}  # draft models by spec, each loaded once
    print(json.dumps({"ready": mlx_spec.__file__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            drafter = None
            if req["draft"] != "none":
                name = named.registry.parse(req["draft"]).model
                if name and name not in loaded:
                    loaded[name] = named.load_model(name)[:2]
                drafter = named.make_drafter(req["draft"], model, tokenizer, loaded=loaded)
            stats = Stats()
            n = req["max_tokens"]
            run = partial(ours_stream, req["ids"], model, drafter, stats, max_tokens=n, eos_token_ids=eos)
            t = time_stream(run, n, eos)
            reply = {
                "tokens": t.tokens,
                "from_draft": sum(t.from_draft),
                "total": t.total,
                "ttft": t.ttft,
                "rounds": stats.rounds,
                "proposed": stats.proposed,
                "accepted": stats.accepted,
            }
        except Exception as e:  # noqa: BLE001  (the driver records it and goes on with the other rows)
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
