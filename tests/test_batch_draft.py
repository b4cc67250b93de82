"""A draft model drafting for all rows of a batch in one pass per position: every row still equals its solo greedy
run, a self-drafting row accepts everything, a row leaves with its draft cache exact, sampled drafts keep the target's
law (and a rule that forgets to subtract their distribution fails), and the planner runs the model only where it
pays."""

import pytest
from conftest import (N_TOKENS, PROMPT, REPEATING, SAMPLES, V, chi_square_pvalue_ok, exact_joint, plain_greedy,
                      sample_pairs, tiny)
from test_batch import row, rows_with, run, sample_first_row

from mlx_spec.gen import verify
from mlx_spec.gen.batch import Batch, BatchPlanner
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
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


def sample_model_row(target, draft, kw):
    """Row 0 drafting 2 sampled tokens with a draft model beside a greedy row drafting with it too: row 0's tokens."""
    return sample_first_row(target, [(PROMPT, lambda: ModelDrafter(draft, V), make_probs_fn(**kw), N_TOKENS),
                                     (REPEATING, lambda: ModelDrafter(draft, V), None, 6)])


def test_sampled_model_drafts_in_a_batch_keep_the_targets_law(spread, draft):
    kw, target = dict(temp=1.0), spread
    fn, seen = sample_model_row(target, draft, kw)
    counts = sample_pairs(fn, SAMPLES)
    assert min(seen) == max(seen) == 2
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, make_probs_fn(**kw)), SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_a_rule_that_resamples_from_the_target_on_rejection_fails_the_same_test(spread, draft, monkeypatch):
    monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft's law
    kw, target = dict(temp=1.0), spread
    fn, _ = sample_model_row(target, draft, kw)
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
