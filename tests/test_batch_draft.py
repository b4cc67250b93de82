"""A draft model, or a view of the target (self, quant-self), drafting for all rows of a batch in one pass per
position: every row still equals its solo greedy run, a row whose draft model is the target accepts everything, a
row leaves with its draft cache exact, sampled drafts keep the target's law (and a rule that forgets to subtract
their distribution fails), and the planner runs the model only where it pays."""

import pytest
from conftest import (N_TOKENS, PROMPT, REPEATING, SAMPLES, V, chi_square_pvalue_ok, exact_joint, plain_greedy,
                      sample_pairs, tiny)
from test_batch import row, rows_with, run, sample_first_row

from mlx_spec.gen import verify
from mlx_spec.gen.batch import Batch, BatchPlanner
from mlx_spec.gen.batch_draft import SelfDraft
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.quant_self import QuantSelfDrafter
from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import speculative_generate_step
from mlx_spec.gen.sampling import make_probs_fn

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


def test_rows_drafting_with_a_draft_model_in_one_batched_pass_equal_their_solo_runs(target, draft):
    drafters = [ModelDrafter(draft, V), HybridDrafter([SuffixDrafter()], ModelDrafter(draft, V)), SuffixDrafter(),
                ModelDrafter(draft, V)]
    maxes = [14, 20, 9, 16]
    b, outs, rows = Batch(target, 3, adaptive=False), {}, []
    for p, d, m in list(zip(PROMPTS, drafters, maxes))[:3]:
        r, cache = row(target, p, d, m, k=3)
        b.add(r, cache)
        rows.append(r)
    run(b, outs, rounds=2)
    r, cache = row(target, PROMPTS[3], drafters[3], maxes[3], k=3)  # joins two rounds in, its draft cache empty
    b.add(r, cache)
    rows.append(r)
    run(b, outs)
    for r, p, m in zip(rows, PROMPTS, maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    model_rows = [rows[0], rows[3]]
    assert all(r.stats.proposed > r.stats.accepted > 0 for r in model_rows)  # drafted, some rejected: rewound
    assert b.drafting is not None and not b.drafting.rows and b.drafting.cache is None  # every row took its cache back


def test_a_row_drafting_with_the_target_itself_in_a_batch_accepts_every_draft_token(target):
    rows, b, outs = [], Batch(target, 3, adaptive=False), {}
    for p, m in zip(PROMPTS[:3], (12, 7, 10)):
        r, cache = row(target, p, ModelDrafter(target, V), m, k=3)
        b.add(r, cache)
        rows.append(r)
    run(b, outs)
    for r, p, m in zip(rows, PROMPTS, (12, 7, 10)):
        assert outs[id(r)] == plain_greedy(target, p, m)
        assert r.stats.proposed > 0 and r.stats.accepted == r.stats.proposed


def test_a_row_leaving_gets_its_draft_cache_back_and_continues_alone(target, draft):
    b, outs = Batch(target, 3, adaptive=False), {}
    mine = ModelDrafter(draft, V)
    a, cache_a = row(target, REPEATING, mine, 30, k=3)
    c, cache_c = row(target, PROMPT, ModelDrafter(draft, V), 30, k=3)
    b.add(a, cache_a)
    b.add(c, cache_c)
    run(b, outs, rounds=3)
    cache = b.remove(a)
    assert {x.offset for x in mine.cache} == {len(mine._fed)} and mine._fed == a.context[: len(mine._fed)]
    rest = [s.token for s in speculative_generate_step(a.context, target, mine, prompt_cache=cache,
                                                        max_tokens=30 - len(outs[id(a)]))]
    assert outs[id(a)] + rest == plain_greedy(target, REPEATING, 30)
    run(b, outs)
    assert outs[id(c)] == plain_greedy(target, PROMPT, 30)


def test_rows_drafting_with_a_view_of_the_target_in_one_batched_pass_equal_their_solo_runs(target):
    half, whole = SelfDrafter(target, [0], V), SelfDrafter(target, [0, 1], V)
    drafters = [half, SuffixDrafter(), SelfDrafter(target, [0], V), whole, SelfDrafter(target, [0], V)]
    maxes = [14, 9, 16, 12, 11]
    b, outs, rows = Batch(target, 3, adaptive=False), {}, []
    for p, d, m in list(zip(PROMPTS + [PROMPT], drafters, maxes))[:4]:
        r, cache = row(target, p, d, m, k=3)
        b.add(r, cache)
        rows.append(r)
    run(b, outs, rounds=2)
    r, cache = row(target, PROMPT, drafters[4], maxes[4], k=3)  # joins two rounds in
    b.add(r, cache)
    rows.append(r)
    run(b, outs)
    for r, p, m in zip(rows, PROMPTS + [PROMPT], maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    assert isinstance(b.drafting, SelfDraft) and b.drafting.blocks == [id(target.model.layers[0])]
    viewed = (rows[0], rows[2], rows[4])  # drafted through layer 0 beside the others, some drafts rejected: rewound
    assert all(r.stats.accepted > 0 and set(r.rates) == {"self"} for r in viewed)
    assert sum(r.stats.proposed for r in viewed) > sum(r.stats.accepted for r in viewed)
    assert rows[3].stats.proposed == 0  # another view of the target than the batch's: no drafts of its own


def test_a_row_taking_the_place_of_one_that_left_drafts_from_its_own_row_of_the_cache(target):
    b, outs = Batch(target, 3, adaptive=False), {}
    plan = [(REPEATING, 12), (PROMPT, 2), ([2, 2, 1, 0, 2, 2, 1], 12), ([0, 1], 10)]
    rows = []
    for p, m in plan[:3]:  # every row drafts with all of the target's layers: each draft token is the target's
        r, cache = row(target, p, SelfDrafter(target, [0, 1], V), m, k=3)
        b.add(r, cache)
        rows.append(r)
    while not rows[1].done:
        run(b, outs, rounds=1)
    r, cache = row(target, plan[3][0], SelfDrafter(target, [0, 1], V), plan[3][1], k=3)
    b.add(r, cache)  # into the place the second row left, between two rounds: no packing before the view drafts
    rows.append(r)
    assert b.slots == [rows[0], rows[3], rows[2]]
    run(b, outs)
    for r, (p, m) in zip(rows, plan):
        assert outs[id(r)] == plain_greedy(target, p, m)
        assert r.stats.proposed > 0 and r.stats.accepted == r.stats.proposed  # drafted from its own context


def test_a_batch_of_quant_self_rows_drafts_with_one_shared_copy_and_each_row_equals_its_solo_run(tiny_models):
    from mlx_spec.named import load_model

    model = load_model(str(tiny_models["qwen2"]))[0]
    v = model.args.vocab_size
    drafters = [QuantSelfDrafter(model, "int4", v) for _ in range(3)]
    assert len({id(d.model.model.layers[0]) for d in drafters}) == 1  # one copy for every session
    prompts, maxes = [[5, 9, 5, 9, 5, 9, 5], [7, 3, 1], [11, 12, 13, 11, 12]], [12, 9, 15]
    b, outs, rows = Batch(model, 4, adaptive=False), {}, []
    for p, d, m in zip(prompts, drafters, maxes):
        r, cache = row(model, p, d, m, k=4)
        b.add(r, cache)
        rows.append(r)
    run(b, outs)
    for r, p, m in zip(rows, prompts, maxes):
        assert outs[id(r)] == plain_greedy(model, p, m)
        assert r.stats.proposed > 0 and r.stats.accepted > 0


MAKERS = {"model": lambda target, draft: ModelDrafter(draft, V),
          "quant-self": lambda target, draft: QuantSelfDrafter(target, "mxfp4", V)}  # 32 wide: mxfp4's group


def sample_model_row(target, draft, kw, kind):
    """Row 0 drafting 2 sampled tokens with a draft model or a view of the target (`kind`) beside a greedy row
    drafting with it too: row 0's tokens."""
    make = MAKERS[kind]
    return sample_first_row(target, [(PROMPT, lambda: make(target, draft), make_probs_fn(**kw), N_TOKENS),
                                     (REPEATING, lambda: make(target, draft), None, 6)])


@pytest.mark.parametrize("kind", MAKERS)
def test_sampled_model_drafts_in_a_batch_keep_the_targets_law(spread, draft, kind):
    kw, target = dict(temp=1.0), spread
    fn, seen = sample_model_row(target, draft, kw, kind)
    counts = sample_pairs(fn, SAMPLES)
    assert min(seen) == max(seen) == 2
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, make_probs_fn(**kw)), SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize("kind", MAKERS)
def test_a_rule_that_resamples_from_the_target_on_rejection_fails_the_same_test(spread, draft, kind, monkeypatch):
    monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft's law
    kw, target = dict(temp=1.0), spread
    fn, _ = sample_model_row(target, draft, kw, kind)
    counts = sample_pairs(fn, SAMPLES)
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, make_probs_fn(**kw)), SAMPLES)
    assert not ok, f"resampling from the target passed: chi2 {stat:.1f} < {crit:.1f}"


def test_the_batch_planner_runs_the_draft_model_only_where_its_passes_pay(target, draft):
    rows = rows_with(0.8, 4)
    for r in rows:
        r.model = ModelDrafter(draft, V)
    lookups, none = [0] * 4, [""] * 4
    planners = {}
    for name, draft_pass in (("cheap", 0.002), ("dear", 0.030)):
        p = BatchPlanner(8)
        for t in (1, 3, 9):
            for _ in range(2):
                p.record(4, t, 0.010)  # a launch-bound target: 10 ms a pass at any width
        assert p.choose(rows, lookups, none).model  # not timed yet: the model drafts once to be
        p.record_draft(4, 8, 8 * draft_pass)
        planners[name] = p.choose(rows, lookups, none)
    assert planners["cheap"].model and planners["cheap"].k >= 4
    assert not planners["dear"].model and planners["dear"].k == 0  # nothing else offered: plain
    for r in rows:
        r.model = None
    assert not BatchPlanner(8).choose(rows, lookups, none).model  # no row has a draft model
