"""Batched speculation: rows verified in one forward pass each equal their solo runs (greedy), keep the target's law
(sampling, a chi-square test that a broken rule fails), leave with an exact cache, and the batch planner chooses
plain batched decoding where drafting cannot pay."""

import mlx.core as mx
import pytest
from conftest import (N_TOKENS, PROMPT, REPEATING, SAMPLES, V, chi_square_pvalue_ok, exact_joint, plain_greedy,
                      sample_pairs, tiny)

from mlx_spec.gen import batch as B
from mlx_spec.gen import batch_cache
from mlx_spec.gen.batch import Batch, BatchPlanner, Row
from mlx_spec.gen.cache import new_cache
from mlx_spec.gen.planner import SourceStats
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import prefill_cache, speculative_generate_step
from mlx_spec.gen.sampling import make_probs_fn


@pytest.fixture(scope="module")
def target():
    return tiny(1, 3.0, layers=2)


def row(model, prompt, drafter, max_tokens, probs_fn=None, eos=(), k=4):
    """A row and its solo-prefilled cache (the context minus its last token)."""
    cache = new_cache(model)
    prefill_cache(model, cache, prompt[:-1], None)
    return Row(list(prompt), drafter, probs_fn, max_tokens, "length", frozenset(eos), k), cache


def run(b: Batch, outs: dict, rounds=None):
    """Rounds until every row is done (or `rounds` of them); finished rows leave, their caches checked."""
    n = 0
    while b.rows and (rounds is None or n < rounds):
        for i, steps in b.round().items():
            outs.setdefault(id(b.rows[i]), []).extend(s.token for s in steps)
        for r in [r for r in b.rows if r.done]:
            cache = b.remove(r)
            assert {c.offset for c in cache} == {len(r.context) - 1}
        n += 1


def test_every_row_of_a_batch_equals_its_solo_greedy_run_as_rows_join_and_leave(target):
    prompts = [REPEATING, PROMPT, [2, 2, 1, 0, 2, 2, 1], REPEATING + [2, 1, 3], [0, 1]]
    drafters = [NGramDrafter(), SuffixDrafter(), None, HybridDrafter([SuffixDrafter(), NGramDrafter()], None),
                SuffixDrafter()]
    maxes, eos = [12, 20, 7, 16, 10], [(), (), (), (3,), ()]
    b, outs = Batch(target, 4, adaptive=False), {}  # every round drafts what the rows offer
    rows = []
    for p, d, m, e in list(zip(prompts, drafters, maxes, eos))[:4]:
        r, cache = row(target, p, d, m, eos=e)
        b.add(r, cache)
        rows.append(r)
    run(b, outs, rounds=2)
    r, cache = row(target, prompts[4], drafters[4], maxes[4])  # joins two rounds in
    b.add(r, cache)
    rows.append(r)
    run(b, outs)
    drafted = 0
    for r, p, m, e in zip(rows, prompts, maxes, eos):
        assert outs[id(r)] == plain_greedy(target, p, m, eos=e)
        drafted += r.stats.accepted
    assert drafted > 10  # drafts were accepted, so rows were rewound by different amounts


def test_a_row_leaving_mid_generation_continues_alone_from_its_extracted_cache(target):
    b = Batch(target, 4, adaptive=False)
    a, cache_a = row(target, REPEATING, SuffixDrafter(), 30)
    c, cache_c = row(target, PROMPT, NGramDrafter(), 30)
    b.add(a, cache_a)
    b.add(c, cache_c)
    outs = {}
    run(b, outs, rounds=3)
    cache = b.remove(a)  # cancelled, say: the session keeps the cache for the conversation's next turn
    assert {x.offset for x in cache} == {len(a.context) - 1}
    rest = [s.token for s in speculative_generate_step(a.context, target, SuffixDrafter(), prompt_cache=cache,
                                                        max_tokens=30 - len(outs[id(a)]))]
    assert outs[id(a)] + rest == plain_greedy(target, REPEATING, 30)
    run(b, outs)
    assert outs[id(c)] == plain_greedy(target, PROMPT, 30)


def test_a_row_rewound_further_than_the_others_keeps_a_masked_gap_and_no_keys_move(target):
    prompts = [REPEATING, PROMPT, [2, 2, 1, 0, 2]]
    fed = [[0, 1, 2], [3, 0, 1], [2, 2, 3]]  # one pass of three positions per row, after each cache's context
    drop = [1, 3, 2]  # each row keeps the first 2, 0 and 1 of them
    joint = None
    for p in prompts:
        joint = batch_cache.join(joint, row(target, p, None, 1)[1])
    target(mx.array(fed), cache=joint)
    keys = [c.keys for c in joint]
    batch_cache.rewind(joint, drop)
    assert all(c.keys is k for c, k in zip(joint, keys))  # the rows dropped different counts; nothing was copied
    kept = [p[:-1] + f[: 3 - d] for p, f, d in zip(prompts, fed, drop)]
    nxt = mx.array([[1], [2], [0]])
    logits = target(nxt, cache=joint)[:, -1]
    for i, ctx in enumerate(kept):  # each row's next pass sees exactly its own kept context
        solo = target(mx.array([ctx + [nxt[i, 0].item()]]))[0, -1]
        assert mx.allclose(logits[i], solo, atol=1e-4)
    batch_cache.keep_rows(joint, [0, 2])  # a row leaves: the rest are packed again, their gaps gone
    assert all(c.gaps is None and c.size() == max(len(kept[0]), len(kept[2])) + 1 for c in joint)
    for i, j in enumerate([0, 2]):
        mine = batch_cache.extract(joint, i, len(kept[j]) + 1)
        solo = new_cache(target)
        target(mx.array([kept[j] + [nxt[j, 0].item()]]), cache=solo)
        assert all(mx.allclose(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :], atol=1e-5)
                   for a, b in zip(mine, solo))


def test_a_row_that_leaves_leaves_a_place_that_runs_along_until_a_new_row_takes_it(target, monkeypatch):
    monkeypatch.setattr(BatchPlanner, "packs", lambda self, *a: False)  # the cache is never packed
    b, outs = Batch(target, 4, adaptive=False), {}
    plan = [(REPEATING, SuffixDrafter(), 24), (PROMPT, None, 3), ([2, 2, 1, 0, 2, 2, 1], NGramDrafter(), 20)]
    rows = [row(target, p, d, m) for p, d, m in plan]
    for r, cache in rows:
        b.add(r, cache)
    rows = [r for r, _ in rows]
    while not rows[1].done:
        run(b, outs, rounds=1)
    assert b.slots == [rows[0], None, rows[2]]
    run(b, outs, rounds=2)  # the empty place runs along
    late = [([0, 1], SuffixDrafter(), 12), (REPEATING * 6, NGramDrafter(), 8)]  # the second is longer than the cache
    for p, d, m in late:
        r, cache = row(target, p, d, m)
        b.add(r, cache)
        rows.append(r)
    assert b.slots == [rows[0], rows[3], rows[2], rows[4]]  # the short one took the place, the long one could not
    run(b, outs)
    for r, (p, _, m) in zip(rows, plan + late):
        assert outs[id(r)] == plain_greedy(target, p, m)


def sample_first_row(target, rows, k=2):
    """A sampler of row 0's tokens in a fresh batch of `rows`: (prompt, make its drafter, probs_fn, max tokens)
    each; the rows' prefilled caches are made once (joining a batch copies a cache, never changes it). Also returns
    how many draft positions row 0 verified, per sample."""
    caches = [row(target, p, None, 1)[1] for p, _, _, _ in rows]
    seen = []

    def one():
        b = Batch(target, k, adaptive=False)
        made = [Row(list(p), make(), fn, n, "length", frozenset(), k) for p, make, fn, n in rows]
        for r, c in zip(made, caches):
            b.add(r, c)
        toks = []
        while not made[0].done:
            toks += [s.token for s in b.round()[0]]
        seen.append(len(made[0].stats.proposed_by_position))
        return toks
    return one, seen


def sample_row0(target, kw, others=True):
    """Row 0 (REPEATING, n-gram drafts of 2, sampling) beside a sampling row of another length: row 0's N_TOKENS."""
    probs_fn = make_probs_fn(**kw)
    rows = [(REPEATING, NGramDrafter, probs_fn, N_TOKENS)] + ([(PROMPT, SuffixDrafter, probs_fn, 6)] if others else [])
    return sample_first_row(target, rows)


def test_a_batched_round_keeps_the_targets_law(target):
    kw = dict(temp=1.0)
    fn, seen = sample_row0(target, kw)
    counts = sample_pairs(fn, SAMPLES)
    assert min(seen) == max(seen) == 2  # every sample verified two draft positions
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, make_probs_fn(**kw), REPEATING), SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_a_broken_acceptance_rule_in_the_batch_fails_the_same_test(target, monkeypatch):
    real = B.sampling_targets
    monkeypatch.setattr(B, "sampling_targets", lambda q, d, p: (mx.ones(d.shape, dtype=mx.bool_), real(q, d, p)[1]))
    kw = dict(temp=1.0)
    fn, _ = sample_row0(target, kw, others=False)
    counts = sample_pairs(fn, SAMPLES // 4)
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, make_probs_fn(**kw), REPEATING), SAMPLES // 4)
    assert not ok, f"always accepting passed: chi2 {stat:.1f} < {crit:.1f}"


def rows_with(accept: float, n: int):
    rows = []
    for _ in range(n):
        r = Row([0], None, None, 100, "length", frozenset(), 8)
        r.rates = {s: SourceStats(accepted_w=accept, judged_w=1.0) for s in ("suffix", "model")}
        rows.append(r)
    return rows


SUFFIX = ["suffix"] * 4


def test_the_batch_planner_drafts_where_a_pass_costs_its_launches_and_not_where_it_costs_its_positions():
    launch_bound = BatchPlanner(8)  # a GPU's small model: a round costs the same at any width
    per_position = BatchPlanner(8)  # a CPU: a round costs its rows times positions
    for b in (1, 4):
        for t in (1, 3, 9):
            launch_bound.record(b, t, 5.0)  # the first round of a shape is not kept: a kernel build on a GPU
            per_position.record(b, t, 5.0)
            launch_bound.record(b, t, 0.010)
            per_position.record(b, t, 0.0002 + 0.010 * b * t)
    assert launch_bound.choose(rows_with(0.7, 4), [8] * 4, SUFFIX).k == 8
    assert per_position.choose(rows_with(0.7, 4), [8] * 4, SUFFIX).k == 0  # plain batched decoding
    assert launch_bound.pays(4) and not per_position.pays(4)  # there, a request keeps its own turns
    assert BatchPlanner().pays(4)  # until measured: batch, and measure
    fresh = BatchPlanner(8)
    assert fresh.choose(rows_with(0.5, 2), [5, 0], SUFFIX).k == 0  # plain first, then the widest draft within
    fresh.record(2, 1, 0.01)  # twice the positions timed, then the fit within twice those
    assert fresh.choose(rows_with(0.5, 2), [5, 0], SUFFIX).k == 0  # the first round of a shape does not count
    fresh.record(2, 1, 0.01)
    assert fresh.choose(rows_with(0.5, 2), [5, 0], SUFFIX).k == 1  # 2 x 2 positions: twice 2 x 1
    fresh.record(2, 2, 0.01)
    fresh.record(2, 2, 0.01)
    assert fresh.choose(rows_with(0.5, 2), [5, 0], SUFFIX).k == 3  # 2 x 4 positions: twice 2 x 2
    assert fresh.choose(rows_with(0.5, 2), [0, 0], SUFFIX).k == 0  # nothing offered: plain


def test_the_batch_planner_prices_a_pass_by_the_times_measured_for_its_positions_kept_rising():
    p = BatchPlanner(8)
    measured = {(1, 1): 0.29, (2, 1): 0.32, (8, 1): 0.57, (16, 1): 0.58, (16, 2): 0.84, (16, 3): 1.27}  # this CPU
    for (b, t), seconds in measured.items():
        for _ in range(4):  # the first of each shape is not kept
            p.record(b, t, seconds)
    assert all(p.cost(b, t) == pytest.approx(s) for (b, t), s in measured.items())
    assert p.cost(2, 2) == pytest.approx(0.32 + (0.57 - 0.32) * 2 / 6)  # 4 positions: between 2 and 8
    assert p.cost(16, 4) > 1.27 and p.cost(4, 4) == pytest.approx(0.58)  # past the measured: their slope
    p.record(14, 1, 5.0)
    p.record(14, 1, 1.5)  # one stalled round at 14 positions: pooled with 16's three, so the cost still rises
    assert p.cost(8, 1) <= p.cost(14, 1) == pytest.approx(p.cost(16, 1)) == pytest.approx((1.5 + 3 * 0.58) / 4)


def test_the_batch_planner_scales_the_rows_estimates_by_what_its_drafting_rounds_delivered():
    p = BatchPlanner(8)
    for b in (1, 4, 16):
        for t in (1, 2, 3, 4):
            for _ in range(2):
                p.record(b, t, 0.3 + 0.016 * b * t)
    p.refilled_w = p.left_w  # a busy server: the rows' tokens per second decide
    rows = rows_with(0.97, 16)
    assert p.calibration == 1.0 and p.choose(rows, [3] * 16, ["suffix"] * 16).k == 3
    promised = p.promised
    assert promised == pytest.approx(16 * (rows[0].expected(3, "suffix") - 1))
    p.delivered(promised)  # kept what was promised: nothing changes
    assert p.calibration == pytest.approx(1.0) and p.choose(rows, [3] * 16, ["suffix"] * 16).k == 3
    for _ in range(6):  # the rounds keep a tenth of it (the rows' estimates run ahead)
        p.delivered(p.promised / 10)
        p.choose(rows, [3] * 16, ["suffix"] * 16)
    assert p.calibration < 0.5 and p.choose(rows, [3] * 16, ["suffix"] * 16).k == 0
    p.delivered(0)  # a plain round promised nothing: no evidence either way
    assert p.promised == 0.0


def test_the_batch_planner_packs_the_cache_where_empty_places_cost_more_than_the_copy():
    per_position, launch_bound = BatchPlanner(8), BatchPlanner(8)
    for b in (1, 8, 16):
        for _ in range(2):
            per_position.record(b, 1, 0.1 + 0.01 * b)
            launch_bound.record(b, 1, 0.01)
    assert per_position.packs(16, 8, 8 * 300, rounds=10)  # until a copy was timed: pack, and time it
    for p in (per_position, launch_bound):
        p.record_copy(1000, 0.01)
    assert per_position.packs(16, 8, 8 * 300, rounds=10)  # 8 empty places cost 0.8 s in 10 rounds; the copy 0.024 s
    assert not per_position.packs(16, 15, 15 * 300, rounds=0.5)  # one empty place for half a round: not worth it
    assert not launch_bound.packs(16, 8, 8 * 300, rounds=10)  # an empty place costs nothing
    per_position.refilled_w = per_position.left_w  # new rows take the places of rows that leave
    assert not per_position.packs(16, 8, 8 * 300, rounds=10)


def test_the_batch_planner_drafts_for_some_rows_only_where_the_places_of_rows_that_end_are_taken(target):
    planner = BatchPlanner(8)  # a CPU: a fixed part and a part per position
    for b in (1, 4, 16):
        for t in (1, 2, 3):
            for _ in range(2):
                planner.record(b, t, 0.3 + 0.016 * b * t)
    rows, some, every = rows_with(0.88, 16), [3] * 10 + [0] * 6, [3] * 16
    sources = ["suffix"] * 10 + [""] * 6
    for r, n in zip(rows, some):  # the rows' paces: ten copy their drafts, six offer none
        for _ in range(20):
            r.offers(n, "suffix")
    alike = rows_with(0.97, 16)  # rows that copy what they draft
    for r in alike:
        for _ in range(20):
            r.offers(3, "suffix")
    assert planner.refill == 0.0  # until rows are seen replaced: priced as a batch that drains
    assert planner.choose(rows, some, sources).k == 0  # the six rows without a draft bound the batch's rounds
    for n in reversed(range(16)):  # a wave drains: its rows leave and no new one comes
        planner.left(n)
    assert planner.refill == 0.0 and planner.choose(rows, some, sources).k == 0
    assert planner.choose(alike, every, ["suffix"] * 16).k >= 1  # every row drafts: the batch needs fewer rounds
    for _ in range(16):  # a busy server: a new request takes each place
        planner.left(15)
        planner.joined()
    assert planner.refill > 0.95 and planner.choose(rows, some, sources).k >= 1
    launch_bound = BatchPlanner(8)  # a GPU: a wider pass costs about nothing, so the drafted rows' speed decides
    for b in (1, 4, 16):
        for t in (1, 2, 3):
            for _ in range(2):
                launch_bound.record(b, t, 0.010)
    for n in reversed(range(16)):
        launch_bound.left(n)
    assert launch_bound.choose(rows, some, sources).k == 3

    b = Batch(target, 4)  # the batch tells its planner who joins and leaves
    first, second, third = (row(target, PROMPT, None, 4) for _ in range(3))
    b.add(*first)
    b.add(*second)
    b.remove(first[0])
    assert b.planner.open == 1
    b.add(*third)  # takes the place first left
    assert b.planner.open == 0 and b.planner.refill == pytest.approx(1 / 2.6)
    b.remove(second[0])
    b.remove(third[0])  # the batch empties: both places stay empty
    assert b.planner.open == 0 and b.planner.refill < 0.2


def test_sliding_window_caches_do_not_batch_and_a_row_knows_its_lookups_and_its_draft_model(target, tiny_models):
    from mlx_spec.gen.batch_cache import batchable
    from mlx_spec.named import load_model

    assert batchable(new_cache(target))
    gemma = load_model(str(tiny_models["gemma3"]))[0]  # sliding-window layers: RotatingKVCache
    assert not batchable(new_cache(gemma))
    suffix, model = SuffixDrafter(), ModelDrafter(tiny(0, 1.5), V)
    r = Row([0], HybridDrafter([suffix], model), None, 10, "length", frozenset(), 4)
    assert r.sources() == [suffix] and r.model is model
    view = SelfDrafter(target, [1], V)
    assert Row([0], view, None, 10, "length", frozenset(), 4).model is view  # drafts in the batch's target cache


def test_the_first_request_of_a_batch_asks_whether_a_batch_of_all_generating_requests_pays(target):
    from types import SimpleNamespace

    from mlx_spec_apps.server.batching import Batcher

    batcher = Batcher(SimpleNamespace(target=target, adaptive=True))
    for b in (1, 2, 4):  # a launch-bound device: batching pays
        for _ in range(2):
            batcher.batch.planner.record(b, 1, 0.010)
    job = SimpleNamespace(params=SimpleNamespace(seed=None), session=SimpleNamespace(cache=new_cache(target)))
    assert not batcher.batch.rows and batcher.can_join(job, rows=2)  # not "a batch of one row costs one row"
    job.params.seed = 7
    assert not batcher.can_join(job, rows=2)  # a seeded request keeps its own turns


def test_a_joining_prompt_is_prefilled_a_chunk_per_round_beside_the_running_rows(served_pair):
    from mlx_spec_apps.server.batching import Batcher
    from mlx_spec_apps.server.params import Params

    tok, model = served_pair.tokenizer, served_pair.target
    batcher = Batcher(served_pair, chunk=8)
    class Job:  # what the batcher reads of the scheduler's jobs (hashable by identity, as they are)
        def __init__(self, text, n):
            self.ids, self.params, self.session = tok.encode(text), Params(max_tokens=n), served_pair.new_session()

    jobs = [Job("def add(a, b):", 30), Job("class Point:\n    def __init__(self, x, y):\n" * 4, 10)]
    out = {0: [], 1: []}
    batcher.join(jobs[0])
    out[0] += [ev.token for _, ev in batcher.round()]  # its prompt fits one chunk: it joins, then runs a round
    assert out[0]
    batcher.join(jobs[1])
    beside = 0
    while len(batcher):
        joining = jobs[1] in batcher.joining
        for job, ev in batcher.round():
            i = jobs.index(job)
            out[i].append(ev.token)
            beside += joining and i == 0
            if ev.finish_reason:
                batcher.leave(job)
    assert len(jobs[1].ids) > 4 * 8 and beside >= 4  # the first kept generating while the second's chunks went in
    for i, job in enumerate(jobs):
        assert out[i] == plain_greedy(model, job.ids, job.params.max_tokens, eos=tok.eos_token_ids)
