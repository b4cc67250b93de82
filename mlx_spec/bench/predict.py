"""The `predict` suite: the speed-up a draft model would give larger targets, from costs measured on this machine.

A round drafting K tokens yields E(K) = 1 + sum_{i<K} P_i tokens, P_i the share of rounds whose first i+1 draft
tokens were all accepted; it costs a target pass over K+1 positions plus K draft steps; plain decoding costs a
step a token. So the speed-up at K is E(K) x step / (verify(K+1) + K x draft step), and the table gives its best K.
P_i is measured on the suite's real pair (its first target, drafted by its draft at fixed K); the costs are
measured for every target: the real ones, and shapes of larger models with random weights (`random:NAME`, whose
pass costs do not depend on the values), at the precision asked. The real pair's own prediction is checked
against its measured speed-up with the same draft. Every other row is a prediction, and says so.
"""

import time
from collections.abc import Callable

from .common import median, params_gb, warm
from .report import aligned_table

K_MAX = 15  # the drafts the acceptance is measured at: every shorter K's acceptance is a prefix of it
REPEATS = 5  # timings per size (median)
CONTEXT = 256  # tokens in the cache when passes are timed: a prompt and some reply
DRAFT_RUN = 8  # draft steps timed together, queued lazily and read once, as a draft is


def _timed(fn, repeats: int = REPEATS) -> float:
    """Median seconds of fn() (which evaluates what it computes), after a first untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return median(times)


def costs(model, sizes=(2, 3, 4, 6, 8, 12, 16)) -> dict:
    """Seconds of this model's plain step as our engine runs it (queued ahead), of a pass over each size at a
    CONTEXT-token cache, and of a draft step when DRAFT_RUN are queued and read at once."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ..gen.generate import Stats, speculative_generate_step

    warm(model, (1, CONTEXT, *sizes))
    prompt = list(range(1, CONTEXT + 1))

    def plain():
        stats = Stats()
        for _ in speculative_generate_step(prompt, model, None, max_tokens=49, stats=stats):
            pass
        return stats.generation_time / (stats.generation_tokens - 1)

    plain()
    step = median([plain() for _ in range(3)])
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([prompt]), cache=cache))

    def run(size):
        def go():
            mx.eval(model(mx.ones((1, size), dtype=mx.uint32), cache=cache))
            for c in cache:
                c.trim(size)

        return go

    def chain():
        y = mx.ones((1, 1), dtype=mx.uint32)
        for _ in range(DRAFT_RUN):
            y = mx.argmax(model(y, cache=cache)[:, -1:], axis=-1)
        mx.eval(y)
        for c in cache:
            c.trim(DRAFT_RUN)

    return {
        "step": step,
        "verify": {s: _timed(run(s)) for s in sizes},
        "draft_step": _timed(chain) / DRAFT_RUN,
        "weights_gb": params_gb(model),
    }


def acceptance(target, drafter, prompts: list[list[int]], max_tokens: int, eos) -> list[float]:
    """P_i: the share of rounds of K_MAX drafts whose first i+1 tokens were all accepted."""
    from ..gen.generate import Stats, speculative_generate_step

    proposed, accepted = [0] * K_MAX, [0] * K_MAX
    for ids in prompts:
        stats = Stats()
        for _ in speculative_generate_step(
            ids, target, drafter, max_tokens=max_tokens, num_draft=K_MAX, adaptive=False, eos_token_ids=eos, stats=stats
        ):
            pass
        for i, (p, a) in enumerate(zip(stats.proposed_by_position, stats.accepted_by_position)):
            proposed[i], accepted[i] = proposed[i] + p, accepted[i] + a
    return [a / p if p else 0.0 for a, p in zip(accepted, proposed)]


def speedups(target: dict, draft_step: float, p: list[float]) -> dict[int, float]:
    """Predicted speed-up over plain decoding at each K: E(K) x step / (verify(K+1) + K x draft step), with a
    size not timed interpolated between the nearest timed ones."""
    verify = {int(s): v for s, v in target["verify"].items()}
    verify.setdefault(1, target["step"])

    def cost(size):
        below = max(s for s in verify if s <= size)
        above = min((s for s in verify if s >= size), default=below)
        if above == below:
            return verify[below]
        return verify[below] + (size - below) / (above - below) * (verify[above] - verify[below])

    out = {}
    for k in range(1, min(K_MAX, max(verify) - 1) + 1):
        out[k] = (1 + sum(p[:k])) * target["step"] / (cost(k + 1) + k * draft_step)
    return out


def run(suite, result, log: Callable[[str], None]) -> None:
    """Measure the pair's acceptance and costs, then its speed-up at the predicted best K (and with the planner
    choosing), then every other target's costs; everything in result.data["predict"]."""
    from ..gen.generate import speculative_generate_step
    from ..make import random
    from ..named import load_model, make_drafter
    from .common import free
    from .prompts import build

    data = result.data.setdefault("predict", {"targets": {}})
    pair = suite.targets[0]
    if "acceptance" not in data:
        model, tok, _ = load_model(str(pair.model), log)
        draft_spec = pair.drafts[0]
        drafter = make_drafter(draft_spec, model, tok, log=log)
        prompts = [
            p.ids for p in build(tok, suite.prompts["humaneval"], suite.prompts["edit"], n_prose=suite.prompts["prose"])
        ]
        eos = tuple(tok.eos_token_ids)
        data["pair"] = {"target": str(pair.model), "draft": draft_spec, "prompts": len(prompts)}
        data["acceptance"] = acceptance(model, drafter, prompts, suite.max_tokens, eos)
        data["targets"][str(pair.model)] = costs(model)
        # A target drafting for itself (a check of the method): the same weights cost the same, measured once.
        data["draft"] = data["targets"][str(pair.model)] if draft_spec == str(pair.model) else costs(drafter.model)
        sp = speedups(data["targets"][str(pair.model)], data["draft"]["draft_step"], data["acceptance"])
        best = max(sp, key=sp.get)

        def timed(d, **kw):
            t0, n = time.perf_counter(), 0
            for ids in prompts:
                n += sum(
                    1
                    for _ in speculative_generate_step(
                        ids, model, d, max_tokens=suite.max_tokens, eos_token_ids=eos, **kw
                    )
                )
            return n / (time.perf_counter() - t0)

        runs = {"plain": {}, "fixed": dict(num_draft=best, adaptive=False), "planner": {}}
        timed(drafter, **runs["fixed"])  # warm-up: every shape built
        tps = {name: [] for name in runs}
        for _ in range(suite.repeats):  # interleaved
            for name, kw in runs.items():
                tps[name].append(timed(None if name == "plain" else drafter, **kw))
        data["pair"].update(
            best_k=best,
            measured_speedup=sum(tps["fixed"]) / sum(tps["plain"]),
            planner_speedup=sum(tps["planner"]) / sum(tps["plain"]),
        )
        result.flush()
        del model, drafter
        free()
    for t in suite.targets[1:]:
        name = str(t.model)
        if name in data["targets"]:
            continue
        log(f"timing {name}")
        shape = random.shape(t.model.spec)
        model = random.build(shape, quantize=t.model.quant) if shape else load_model(t.model.spec, log)[0]
        data["targets"][name] = costs(model)
        result.flush()
        del model
        free()
    result.data["complete"] = True


def markdown(data: dict) -> str:
    """The predicted table, the pair's check first."""
    d = data.get("predict") or {}
    if "acceptance" not in d:
        return "Nothing measured yet."
    p, draft = d["acceptance"], d["draft"]
    rows = []
    for name, c in d["targets"].items():
        sp = speedups(c, draft["draft_step"], p)
        k = max(sp, key=sp.get)
        pair = d["pair"]
        measured = "predicted only"
        if name == pair["target"] and "best_k" in pair:
            measured = (
                f"{pair['measured_speedup']:.2f}× at K = {pair['best_k']}; "
                f"{pair['planner_speedup']:.2f}× with the planner choosing"
            )
        elif name == pair["target"]:  # a record written before the fixed-K measurement: the planner chose
            measured = f"{pair['measured_speedup']:.2f}× with the planner choosing"
        rows.append(
            [
                name,
                f"{c['weights_gb']:.1f}",
                f"{1000 * c['step']:.2f}",
                f"{c['verify'].get('16', c['verify'].get(16, 0)) / c['step']:.2f}",
                str(k),
                f"{sp[k]:.2f}×",
                measured,
            ]
        )
    head = ("Target", "Weights GB", "Plain step ms", "Verify 16 / step", "Best K", "Predicted speed-up", "Measured")
    acc = " ".join(f"{x:.2f}" for x in p[:8])
    return (
        f"Draft `{d['pair']['draft']}` (a step {1000 * draft['draft_step']:.2f} ms queued, "
        f"{1000 * draft['step']:.2f} ms as a target); rounds with all of the first i+1 drafts accepted, "
        f"measured with `{d['pair']['target']}` on {d['pair']['prompts']} prompts at K = {K_MAX}: {acc} ...\n\n"
        + aligned_table(head, rows)
        + "\n"
    )
