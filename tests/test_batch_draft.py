"""A draft model, or a view of the target (self, quant-self), drafting for several rows of one engine in one pass
per position: every row still equals its solo greedy run, a row whose draft model is the target accepts everything,
a row leaves with its draft cache and continues alone from it, sampled drafts keep the target's law (and a rule that
forgets to subtract their distribution fails), and the planner runs the model only where it pays."""

import pytest
from conftest import (
    N_TOKENS,
    PROMPT,
    REPEATING,
    SAMPLES,
    V,
    chi_square_pvalue_ok,
    exact_joint,
    plain_greedy,
    sample_pairs,
    tiny,
)
from test_batch import asks, fixed, measured, row, run, sample_first_row

from mlx_spec.gen import verify
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.self_draft import QuantSelfDrafter, SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import Engine
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.planner import PLAIN, Outcome, Plan, Planner
from mlx_spec.gen.sampling import GREEDY, Sampler
from mlx_spec.gen.stats import Stats

PROMPTS = [REPEATING, PROMPT, [2, 2, 1, 0, 2, 2, 1], REPEATING + [2, 1, 3]]


@pytest.fixture(scope="module")
def target():
    return tiny(1, 3.0, layers=2)


@pytest.fixture(scope="module")
def draft():
    return tiny(0, 1.5)


@pytest.fixture(scope="module")
def spread():
    return tiny(1, 3.0)  # a target of spread distributions (the two-layer one is nearly greedy on PROMPT)


def test_rows_drafting_with_a_draft_model_in_one_pass_equal_their_solo_runs(target, draft):
    drafters = [
        ModelDrafter(draft, V),
        HybridDrafter([SuffixDrafter()], ModelDrafter(draft, V)),
        SuffixDrafter(),
        ModelDrafter(draft, V),
    ]
    maxes = [14, 20, 9, 16]
    e, outs, rows = fixed(target), {}, []
    for p, d, m in list(zip(PROMPTS, drafters, maxes))[:3]:
        r, cache = row(target, p, d, m, k=3)
        e.add(r, cache)
        rows.append(r)
    run(e, outs, rounds=2)
    r, cache = row(target, PROMPTS[3], drafters[3], maxes[3], k=3)  # joins two rounds in, its draft cache empty
    e.add(r, cache)
    rows.append(r)
    run(e, outs)
    for r, p, m in zip(rows, PROMPTS, maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    model_rows = [rows[0], rows[3]]
    assert all(r.stats.proposed > r.stats.accepted > 0 for r in model_rows)  # drafted, some rejected: rewound
    assert all(r.stats.drafted_together >= 2 for r in model_rows)  # the model drafted for several rows at once
    assert max(r.stats.drafted_together for r in rows) == 3  # the hybrid's model too, beside the two


def test_a_joining_rows_draft_model_catches_up_a_chunk_a_round_while_the_others_go_on(target):
    """Beside other rows, a draft model is fed a long catch-up a chunk per round (the row decodes plainly meanwhile),
    then drafts; alone, it catches up at once."""
    e, outs = Engine(target, Planner(adaptive=False), chunk=8), {}
    other, cache = row(target, PROMPTS[1], SuffixDrafter(), 30, k=3)
    e.add(other, cache)
    prompt = (REPEATING * 4)[:40]
    late, cache = row(target, prompt, ModelDrafter(target, V), 20, k=3)
    late.stats.trace = []
    e.add(late, cache)
    run(e, outs)
    assert outs[id(late)] == plain_greedy(target, prompt, 20)
    assert outs[id(other)] == plain_greedy(target, PROMPTS[1], 30)
    drafted = [i for i, t in enumerate(late.stats.trace) if t["proposed"]]
    assert drafted[0] >= 4 and late.stats.trace[drafted[0]]["behind"] <= 8  # 39 tokens in chunks of 8 first
    alone = Engine(target, Planner(adaptive=False), chunk=8)
    solo, cache = row(target, prompt, ModelDrafter(target, V), 20, k=3)
    solo.stats.trace = []
    alone.add(solo, cache)
    run(alone, {})
    assert solo.stats.trace[0]["proposed"] and solo.stats.trace[0]["behind"] == len(prompt) - 1


def test_a_row_drafting_with_the_target_itself_accepts_every_draft_token(target):
    rows, e, outs = [], fixed(target), {}
    for p, m in zip(PROMPTS[:3], (12, 7, 10)):
        r, cache = row(target, p, ModelDrafter(target, V), m, k=3)
        e.add(r, cache)
        rows.append(r)
    run(e, outs)
    for r, p, m in zip(rows, PROMPTS, (12, 7, 10)):
        assert outs[id(r)] == plain_greedy(target, p, m)
        assert r.stats.proposed > 0 and r.stats.accepted == r.stats.proposed
    assert max(r.stats.drafted_together for r in rows) == 3


def test_a_row_leaving_gets_its_draft_cache_back_and_continues_alone_from_it(target):
    """The leaving row's draft model is the target: with its cache back exactly, its next generation feeds the
    model at most the token it has not seen and every draft is accepted; a lost cache would feed the whole context,
    a cache of another row's positions would draft wrong tokens."""
    e, outs = fixed(target), {}
    mine = ModelDrafter(target, V)
    a, cache_a = row(target, REPEATING, mine, 30, k=3)
    c, cache_c = row(target, PROMPT, ModelDrafter(target, V), 30, k=3)
    e.add(a, cache_a)
    e.add(c, cache_c)
    run(e, outs, rounds=3)
    assert a.stats.drafted_together == 2
    cache = e.remove(a)  # cancelled, say: the session keeps the caches for the conversation's next turn
    assert {x.offset for x in cache} == {len(a.context) - 1}
    stats = Stats(trace=[])
    rest = [
        s.token
        for s in speculative_generate_step(
            a.context,
            target,
            mine,
            prompt_cache=cache,
            adaptive=False,
            num_draft=3,
            max_tokens=30 - len(outs[id(a)]),
            stats=stats,
        )
    ]
    assert outs[id(a)] + rest == plain_greedy(target, REPEATING, 30)
    assert stats.trace[0]["source"] == "model" and stats.trace[0]["behind"] <= 1
    assert stats.proposed > 0 and stats.accepted == stats.proposed
    run(e, outs)
    assert outs[id(c)] == plain_greedy(target, PROMPT, 30)


def test_rows_drafting_with_a_view_of_the_target_in_one_pass_equal_their_solo_runs(target):
    half, whole = SelfDrafter(target, [0], V), SelfDrafter(target, [0, 1], V)
    drafters = [half, SuffixDrafter(), SelfDrafter(target, [0], V), whole, SelfDrafter(target, [0], V)]
    maxes = [14, 9, 16, 12, 11]
    e, outs, rows = fixed(target), {}, []
    for p, d, m in list(zip(PROMPTS + [PROMPT], drafters, maxes))[:4]:
        r, cache = row(target, p, d, m, k=3)
        e.add(r, cache)
        rows.append(r)
    run(e, outs, rounds=2)
    r, cache = row(target, PROMPT, drafters[4], maxes[4], k=3)  # joins two rounds in
    e.add(r, cache)
    rows.append(r)
    run(e, outs)
    for r, p, m in zip(rows, PROMPTS + [PROMPT], maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    viewed = (rows[0], rows[2], rows[4])  # drafted through layer 0 beside the others, some drafts rejected: rewound
    assert all(r.stats.accepted > 0 and set(r.accept) == {"self"} for r in viewed)
    assert sum(r.stats.proposed for r in viewed) > sum(r.stats.accepted for r in viewed)
    assert all(r.stats.drafted_together >= 2 for r in viewed)  # the view drafted for them in one pass
    assert rows[3].stats.proposed == 0  # another view of the target than the engine's: no drafts of its own


def test_a_row_taking_the_place_of_one_that_left_drafts_from_its_own_row_of_the_cache(target):
    e, outs = fixed(target), {}
    plan = [(REPEATING, 12), (PROMPT, 2), ([2, 2, 1, 0, 2, 2, 1], 12), ([0, 1], 10)]
    rows = []
    for p, m in plan[:3]:  # every row drafts with all of the target's layers: each draft token is the target's
        r, cache = row(target, p, SelfDrafter(target, [0, 1], V), m, k=3)
        e.add(r, cache)
        rows.append(r)
    while not rows[1].done:
        run(e, outs, rounds=1)
    r, cache = row(target, plan[3][0], SelfDrafter(target, [0, 1], V), plan[3][1], k=3)
    e.add(r, cache)  # into the place the second row left, between two rounds: no packing before the view drafts
    rows.append(r)
    assert e.cache.owners == [rows[0], rows[3], rows[2]]
    run(e, outs)
    for r, (p, m) in zip(rows, plan):
        assert outs[id(r)] == plain_greedy(target, p, m)
        assert r.stats.proposed > 0 and r.stats.accepted == r.stats.proposed  # drafted from its own context
    assert rows[3].stats.drafted_together == 3


def test_quant_self_rows_draft_with_one_shared_copy_and_each_row_equals_its_solo_run(tiny_models):
    from mlx_spec.named import load_model

    model = load_model(str(tiny_models["qwen2"]))[0]
    v = model.args.vocab_size
    drafters = [QuantSelfDrafter(model, "int4", v) for _ in range(3)]  # one per session
    prompts, maxes = [[5, 9, 5, 9, 5, 9, 5], [7, 3, 1], [11, 12, 13, 11, 12]], [12, 9, 15]
    e, outs, rows = fixed(model), {}, []
    for p, d, m in zip(prompts, drafters, maxes):
        r, cache = row(model, p, d, m, k=4)
        e.add(r, cache)
        rows.append(r)
    run(e, outs)
    for r, p, m in zip(rows, prompts, maxes):
        assert outs[id(r)] == plain_greedy(model, p, m)
        assert r.stats.proposed > 0 and r.stats.accepted > 0
        assert r.stats.drafted_together == 3  # one copy of the weights: the three drafted in one pass


MAKERS = {
    "model": lambda target, draft: ModelDrafter(draft, V),
    "quant-self": lambda target, draft: QuantSelfDrafter(target, "mxfp4", V),
}  # 32 wide: mxfp4's group


def sample_model_row(target, draft, kw, kind):
    """Row 0 drafting 2 sampled tokens with a draft model or a view of the target (`kind`) beside a greedy row
    drafting with it too: row 0's tokens, and how many draft positions it verified per sample."""
    make = MAKERS[kind]
    return sample_first_row(
        target,
        [
            (PROMPT, lambda: make(target, draft), Sampler(**kw), N_TOKENS),
            (REPEATING, lambda: make(target, draft), GREEDY, 6),
        ],
    )


@pytest.mark.slow  # a chi-square law (about 30 s)
@pytest.mark.parametrize("kind", MAKERS)
def test_sampled_model_drafts_beside_other_rows_keep_the_targets_law(spread, draft, kind):
    kw, target = dict(temp=1.0), spread
    fn, seen = sample_model_row(target, draft, kw, kind)
    counts = sample_pairs(fn, SAMPLES)
    assert min(seen) == max(seen) == 2
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, Sampler(**kw).probs), SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.slow  # a chi-square law (about 30 s)
@pytest.mark.parametrize("kind", ["model", "quant-self"])
def test_a_rule_that_resamples_from_the_target_on_rejection_fails_the_same_test(spread, draft, kind, monkeypatch):
    monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft's law
    kw, target = dict(temp=1.0), spread
    fn, _ = sample_model_row(target, draft, kw, kind)
    n = {"model": SAMPLES // 2, "quant-self": SAMPLES}[kind]  # chi-square on 400: 103 and 32 against 24.5
    counts = sample_pairs(fn, n)
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, Sampler(**kw).probs), n)
    assert not ok, f"resampling from the target passed: chi2 {stat:.1f} < {crit:.1f}"


def model_asks(accept: float, n: int = 4):
    """n rows whose draft model may draft 8 tokens (and no lookup offers any), every source accepted at `accept`."""
    out = asks(accept, [0] * n)
    for a in out:
        a.costly, a.cap = "model", 8
    return out


def test_the_planner_runs_the_draft_model_only_where_its_passes_pay():
    plans = {}
    for name, draft_pass in (("cheap", 0.001), ("dear", 0.030)):
        p = Planner()
        measured(p, lambda b, t: 0.010, places=(1, 4), sizes=(1, 2, 3, 9))  # a launch-bound target: 10 ms a pass
        rows = model_asks(0.8)
        probe = p.plan(rows, 4)
        assert probe == Plan(1, ("model",) * 4, 2, probe=True)  # not timed yet: the model drafts once to be
        for plan in (probe, Plan(8, ("model",) * 4, 9)):  # rounds whose model passes over the four rows cost this
            p.record(
                plan,
                4,
                p.costs.cost(4, plan.size) + plan.k * draft_pass,
                [Outcome(a.accept, "model", plan.k, plan.k, costly=True) for a in rows],
            )
        plans[name] = p.plan(model_asks(0.8), 4)
    assert plans["cheap"].sources == ("model",) * 4 and plans["cheap"].k >= 4
    assert plans["dear"] == PLAIN  # nothing else offered: plain
    lookups = Planner()
    measured(lookups, lambda b, t: 0.010, places=(1, 4), sizes=(1, 2, 3, 9))
    plan = lookups.plan(asks(0.8, [3] * 4), 4)  # no row has a draft model: the lookups draft
    assert plan.k and "model" not in plan.sources


def test_an_interrupt_inside_a_views_drafting_beside_other_rows_keeps_every_rows_cache(target):
    """Ctrl-C lands in the second draft pass of a view of the target drafting for two rows: only the entries its
    passes wrote are dropped, so the rows continue to their solo greedy runs."""
    e, outs, rows = fixed(target), {}, []
    plan = [(REPEATING, 12), ([2, 2, 1, 0, 2, 2, 1], 12)]
    for p, m in plan:
        r, cache = row(target, p, SelfDrafter(target, [0, 1], V), m, k=3)
        e.add(r, cache)
        rows.append(r)
    run(e, outs, rounds=1)
    layer, calls = target.model.layers[1], {"n": 0}
    original = type(layer).__call__

    class Boom(type(layer)):
        def __call__(self, *a, **kw):
            calls["n"] += 1
            if calls["n"] == 3:  # the view's pass from the last token, its first draft pass, then this one
                raise KeyboardInterrupt
            return original(self, *a, **kw)

    layer.__class__ = Boom
    try:
        with pytest.raises(KeyboardInterrupt):
            e.round()
    finally:
        layer.__class__ = type(layer).__mro__[1]
    assert calls["n"] == 3
    run(e, outs)
    for r, (p, m) in zip(rows, plan):
        assert outs[id(r)] == plain_greedy(target, p, m)
