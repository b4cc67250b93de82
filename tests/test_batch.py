"""Rows generating together in one engine: each equals its solo run (greedy), keeps the target's law (sampling, a
chi-square test that a broken rule fails), a seeded row gives the same tokens alone and beside others, rows leave with
an exact cache, and the planner drafts for a batch only where that does not lower its throughput."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import (
    N_TOKENS,
    PROMPT,
    REPEATING,
    SAMPLES,
    chi_square_pvalue_ok,
    close,
    exact_joint,
    plain_greedy,
    sample_pairs,
    tiny,
)

from mlx_spec.gen import verify
from mlx_spec.gen.acceptance import SourceStats
from mlx_spec.gen.cache import new_cache, prefill_cache
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import Engine
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.joint import JointCache, batchable
from mlx_spec.gen.planner import PLAIN, Ask, Plan, Planner
from mlx_spec.gen.rows import Row
from mlx_spec.gen.sampling import GREEDY, Sampler


@pytest.fixture(scope="module")
def target():
    return tiny(1, 3.0, layers=2)


def row(model, prompt, drafter, max_tokens, sampler=GREEDY, eos=(), k=4):
    """A row and its solo-prefilled cache (the context minus its last token)."""
    cache = new_cache(model)
    prefill_cache(model, cache, prompt[:-1], None)
    return Row(list(prompt), drafter, sampler, max_tokens, "length", frozenset(eos), k), cache


def fixed(model):
    """An engine whose every round drafts all that its rows offer."""
    return Engine(model, Planner(adaptive=False))


def run(e: Engine, outs: dict, rounds=None):
    """Rounds until every row is done (or `rounds` of them); finished rows leave, their caches checked."""
    n = 0
    while e.rows and (rounds is None or n < rounds):
        rows = e.rows
        for i, steps in e.round().items():
            outs.setdefault(id(rows[i]), []).extend(s.token for s in steps)
        for r in [r for r in e.rows if r.done]:
            cache = e.remove(r)
            assert {c.offset for c in cache} == {len(r.context) - 1}
        n += 1


def test_every_row_equals_its_solo_greedy_run_as_rows_join_and_leave(target):
    prompts = [REPEATING, PROMPT, [2, 2, 1, 0, 2, 2, 1], REPEATING + [2, 1, 3], [0, 1]]
    drafters = [
        NGramDrafter(),
        SuffixDrafter(),
        None,
        HybridDrafter([SuffixDrafter(), NGramDrafter()], None),
        SuffixDrafter(),
    ]
    maxes, eos = [12, 20, 7, 16, 10], [(), (), (), (3,), ()]
    e, outs, rows = fixed(target), {}, []
    for p, d, m, s in list(zip(prompts, drafters, maxes, eos))[:4]:
        r, cache = row(target, p, d, m, eos=s)
        e.add(r, cache)
        rows.append(r)
    run(e, outs, rounds=2)
    r, cache = row(target, prompts[4], drafters[4], maxes[4])  # joins two rounds in
    e.add(r, cache)
    rows.append(r)
    run(e, outs)
    for r, p, m, s in zip(rows, prompts, maxes, eos):
        assert outs[id(r)] == plain_greedy(target, p, m, eos=s)
    assert sum(r.stats.accepted for r in rows) > 10  # drafts were accepted, so rows were rewound by different counts
    assert max(r.stats.widest for r in rows) == 4


def test_rows_on_plain_steps_queued_ahead_equal_their_solo_runs_as_one_joins(target):
    """Plain rounds queue every row's next step before the host reads the last; a row joining drops that step."""
    e, outs = Engine(target), {}
    a, cache_a = row(target, PROMPT, None, 20)
    e.add(a, cache_a)
    run(e, outs, rounds=5)
    assert not e.can_join()  # a plain step is queued ahead: a row joining now undoes it
    c, cache_c = row(target, REPEATING, None, 12)
    e.add(c, cache_c)
    run(e, outs)
    assert outs[id(a)] == plain_greedy(target, PROMPT, 20) and outs[id(c)] == plain_greedy(target, REPEATING, 12)


def test_a_row_leaving_mid_generation_continues_alone_from_its_cache(target):
    e = fixed(target)
    a, cache_a = row(target, REPEATING, SuffixDrafter(), 30)
    c, cache_c = row(target, PROMPT, NGramDrafter(), 30)
    e.add(a, cache_a)
    e.add(c, cache_c)
    outs = {}
    run(e, outs, rounds=3)
    cache = e.remove(a)  # cancelled, say: the session keeps the cache for the conversation's next turn
    assert {x.offset for x in cache} == {len(a.context) - 1}
    rest = [
        s.token
        for s in speculative_generate_step(
            a.context, target, SuffixDrafter(), prompt_cache=cache, max_tokens=30 - len(outs[id(a)])
        )
    ]
    assert outs[id(a)] + rest == plain_greedy(target, REPEATING, 30)
    run(e, outs)
    assert outs[id(c)] == plain_greedy(target, PROMPT, 30)


def test_a_row_rewound_further_than_the_others_keeps_a_masked_gap_and_no_keys_move(target):
    prompts = [REPEATING, PROMPT, [2, 2, 1, 0, 2]]
    fed = [[0, 1, 2], [3, 0, 1], [2, 2, 3]]  # one pass of three positions per row, after each cache's context
    drop = [1, 3, 2]  # each row keeps the first 2, 0 and 1 of them
    rows = JointCache()
    for i, p in enumerate(prompts):
        rows.add(i, row(target, p, None, 1)[1])
    rows.start_round()
    target(mx.array(fed), cache=rows.layers)
    keys = [c.keys for c in rows.layers]
    rows.rewind(drop)
    assert all(c.keys is k for c, k in zip(rows.layers, keys))  # the rows dropped different counts; nothing copied
    kept = [p[:-1] + f[: 3 - d] for p, f, d in zip(prompts, fed, drop)]
    nxt = mx.array([[1], [2], [0]])
    logits = target(nxt, cache=rows.layers)[:, -1]
    for i, ctx in enumerate(kept):  # each row's next pass sees exactly its own kept context
        solo = target(mx.array([ctx + [nxt[i, 0].item()]]))[0, -1]
        assert close(logits[i], solo)
    mine = rows.remove(1, len(kept[1]) + 1)
    rows.pack([len(kept[0]) + 1, len(kept[2]) + 1])  # the place row 1 left goes, and so do the gaps
    assert rows.owners == [0, 2] and all(c.gaps is None for c in rows.layers)
    for j, cache in ((0, rows.remove(0, len(kept[0]) + 1)), (1, mine), (2, rows.remove(2, len(kept[2]) + 1))):
        solo = new_cache(target)
        target(mx.array([kept[j] + [nxt[j, 0].item()]]), cache=solo)
        assert all(close(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :], 1e-5) for a, b in zip(cache, solo))


def launch_bound(planner: Planner, places=(1, 2, 3, 4, 8, 16), sizes=(1, 2, 3, 4), seconds=0.01, copy=10.0):
    """Tell a planner a device where a pass costs the same at any width and packing the cache is dear."""
    for b in places:
        for t in sizes:
            planner.record(Plan(t - 1, ("x",) * b, t) if t > 1 else PLAIN, b, seconds, [])
    planner.record_copy(1, copy)


def test_a_row_that_leaves_leaves_a_place_that_runs_along_until_a_new_row_takes_it(target):
    planner = Planner(adaptive=False)
    launch_bound(planner)  # an empty place costs nothing here: the cache is not packed
    e, outs = Engine(target, planner), {}
    plan = [(REPEATING, SuffixDrafter(), 24), (PROMPT, None, 3), ([2, 2, 1, 0, 2, 2, 1], NGramDrafter(), 20)]
    rows = [row(target, p, d, m) for p, d, m in plan]
    for r, cache in rows:
        e.add(r, cache)
    rows = [r for r, _ in rows]
    while not rows[1].done:
        run(e, outs, rounds=1)
    assert e.cache.owners == [rows[0], None, rows[2]]
    run(e, outs, rounds=2)  # the empty place runs along
    late = [([0, 1], SuffixDrafter(), 12), (REPEATING * 6, NGramDrafter(), 8)]  # the second is longer than the cache
    for p, d, m in late:
        r, cache = row(target, p, d, m)
        e.add(r, cache)
        rows.append(r)
    assert e.cache.owners == [rows[0], rows[3], rows[2], rows[4]]  # the short one took the place, the long one not
    run(e, outs)
    for r, (p, _, m) in zip(rows, plan + late):
        assert outs[id(r)] == plain_greedy(target, p, m)


def sample_first_row(target, rows, k=2):
    """A sampler of row 0's tokens in a fresh engine of `rows`: (prompt, make its drafter, sampler, max tokens)
    each; the rows' prefilled caches are made once (joining beside others copies a cache, never changes it). Also
    returns how many draft positions row 0 verified, per sample."""
    caches = [row(target, p, None, 1)[1] for p, _, _, _ in rows]
    seen = []

    def one():
        e = fixed(target)
        made = [Row(list(p), make(), s, n, "length", frozenset(), k) for p, make, s, n in rows]
        for r, c in zip(made, caches):
            e.add(r, c)
        toks = []
        while not made[0].done:
            toks += [s.token for s in e.round()[0]]
        seen.append(len(made[0].stats.proposed_by_position))
        return toks

    return one, seen


def sample_row0(target, kw, others=True):
    """Row 0 (REPEATING, n-gram drafts of 2, sampling) beside a sampling row of another length: row 0's N_TOKENS."""
    s = Sampler(**kw)
    rows = [(REPEATING, NGramDrafter, s, N_TOKENS)] + ([(PROMPT, SuffixDrafter, s, 6)] if others else [])
    return sample_first_row(target, rows)


def test_a_batched_round_keeps_the_targets_law(target):
    kw = dict(temp=1.0)
    fn, seen = sample_row0(target, kw)
    counts = sample_pairs(fn, SAMPLES)
    assert min(seen) == max(seen) == 2  # every sample verified two draft positions
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, Sampler(**kw).probs, REPEATING), SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_a_broken_acceptance_rule_in_the_batch_fails_the_same_test(target, monkeypatch):
    real = verify.sampling_targets
    monkeypatch.setattr(
        verify, "sampling_targets", lambda q, d, p: (mx.ones(d.shape, dtype=mx.bool_), real(q, d, p)[1])
    )
    kw = dict(temp=1.0)
    fn, _ = sample_row0(target, kw, others=False)
    counts = sample_pairs(fn, SAMPLES // 4)
    ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(target, Sampler(**kw).probs, REPEATING), SAMPLES // 4)
    assert not ok, f"always accepting passed: chi2 {stat:.1f} < {crit:.1f}"


def seeded(target, seed, drafter, others, adaptive=False):
    """Row 0's 24 tokens, seeded, with `drafter`, beside `others` rows (a greedy, two sampling rows unseeded)."""
    e = Engine(target, Planner(adaptive=adaptive))
    s = Sampler(temp=1.0, seed=seed)
    mine, cache = row(target, PROMPT, drafter, 24, s, k=3)
    e.add(mine, cache)
    for p, d, smp in [
        (REPEATING, SuffixDrafter(), GREEDY),
        ([2, 2, 1, 0], NGramDrafter(), Sampler(temp=0.8)),
        (REPEATING + [1], None, Sampler(temp=1.2)),
    ][:others]:
        e.add(*row(target, p, d, 30, smp))
    out = {}
    run(e, out)
    return out[id(mine)]


def test_a_seeded_row_gives_the_same_tokens_alone_beside_others_and_with_any_drafter(target):
    for seed in (1, 7):
        alone = [s.token for s in speculative_generate_step(PROMPT, target, None, max_tokens=24, temp=1.0, seed=seed)]
        assert seeded(target, seed, None, 0) == alone  # plain decoding, alone
        assert seeded(target, seed, NGramDrafter(), 3) == alone  # drafted, beside three others
        assert seeded(target, seed, SuffixDrafter(), 2, adaptive=True) == alone
    assert seeded(target, 1, None, 0) != seeded(target, 7, None, 0)


def test_seeded_rows_keep_the_targets_law_and_a_rule_keyed_by_round_fails(target, monkeypatch):
    """Over seeds, a seeded row's tokens follow the target's law; noise drawn per round (the same at each position
    of a round) does not."""
    kw = dict(temp=1.0)
    joint = exact_joint(target, Sampler(**kw).probs, REPEATING)

    def counts(n):
        out = {}
        for i in range(n):
            e = fixed(target)
            r, cache = row(target, REPEATING, NGramDrafter(), N_TOKENS, Sampler(seed=5000 + i, **kw), k=2)
            e.add(r, cache)
            run(e, {})
            key = tuple(r.context[len(REPEATING) :])
            out[key] = out.get(key, 0) + 1
        return out

    ok, stat, crit = chi_square_pvalue_ok(counts(SAMPLES), joint, SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"
    real = Sampler._key
    monkeypatch.setattr(Sampler, "_key", lambda self, position: real(self, 0))  # one noise for every position
    ok, stat, crit = chi_square_pvalue_ok(counts(SAMPLES // 4), joint, SAMPLES // 4)
    assert not ok, f"noise shared by positions passed: chi2 {stat:.1f} < {crit:.1f}"


def asks(accept: float, offers, cost_rows=None, left=100):
    """One Ask per offered draft length, every source accepted at `accept`."""
    out = []
    for n in offers:
        a = {s: SourceStats(accepted_w=accept, judged_w=1.0) for s in ("suffix", "model")}
        out.append(Ask(a, ("suffix", n) if n else ("", 0), left=left))
    return out


def measured(planner: Planner, cost, places=(1, 4, 16), sizes=(1, 2, 3, 4, 9)):
    for b in places:
        for t in sizes:
            for _ in range(2):
                planner.record(Plan(t - 1, ("x",) * b, t) if t > 1 else PLAIN, b, cost(b, t), [])


def test_the_planner_drafts_for_a_batch_where_a_pass_costs_its_launches_and_not_where_it_costs_its_positions():
    flat, steep = Planner(), Planner()
    measured(flat, lambda b, t: 0.010)  # a GPU's small model: a round costs the same at any width
    measured(steep, lambda b, t: 0.0002 + 0.010 * b * t)  # a CPU: a round costs its rows times positions
    assert flat.plan(asks(0.7, [8] * 4)).k >= 7  # the longest length it weighs (one that fills a verify size)
    assert steep.plan(asks(0.7, [8] * 4)) == PLAIN  # plain batched decoding
    assert flat.costs.pays(4) and not steep.costs.pays(4)  # there, requests take turns, an engine each
    assert flat.costs.pays(1) and steep.costs.pays(1)  # the first request into an empty batch: as alone either way
    stale = Planner()
    for b, seconds in ((1, 0.010), (2, 0.030), (8, 0.020)):  # two rows timed once in a slow spell, eight since
        stale.record(PLAIN, b, seconds, [])
    assert stale.costs.pays(2)  # eight rows in a pass pay: two rows are let in (else two rows are never timed again)
    assert Planner().costs.pays(4)  # until measured: batch, and measure
    fresh = Planner()
    assert fresh.plan(asks(0.5, [5] * 16)) == PLAIN  # plain first, then no wider than twice the positions timed
    fresh.record(PLAIN, 16, 0.01, [])
    assert fresh.plan(asks(0.5, [5] * 16)).k == 1  # 16 x 2 positions: twice 16 x 1
    fresh.record(Plan(1, ("suffix",) * 16, 2), 16, 0.01, [])
    assert fresh.plan(asks(0.5, [5] * 16)).k == 3  # 16 x 4 positions: twice 16 x 2
    assert fresh.plan(asks(0.5, [5, 0])).k == 5  # a pass of two rows may reach the largest verify size at once
    assert fresh.plan(asks(0.5, [0, 0])) == PLAIN  # nothing offered: plain


def test_the_planner_prices_a_pass_by_the_times_measured_for_its_positions_kept_rising():
    p = Planner()
    cost = p.costs.cost
    times = {(1, 1): 0.29, (2, 1): 0.32, (8, 1): 0.57, (16, 1): 0.58, (16, 2): 0.84, (16, 3): 1.27}  # this CPU
    for (b, t), seconds in times.items():
        for _ in range(3):
            p.record(Plan(t - 1, ("x",) * b, t) if t > 1 else PLAIN, b, seconds, [])
    assert all(cost(b, t) == pytest.approx(s) for (b, t), s in times.items())
    # past the sizes measured at as many rows: the largest's cost, and each position more at the slope of every pass
    # measured (least squares over positions; priced flat, a draft model's long rounds looked cheap: notebook §40)
    slope = float(np.polyfit([b * t for b, t in times], list(times.values()), 1)[0])
    assert cost(2, 2) == pytest.approx(0.32 + 2 * slope) and cost(16, 4) == pytest.approx(1.27 + 16 * slope)
    assert cost(4, 4) == pytest.approx(0.58)  # no pass of 4 rows measured: by positions, those of 16 x 1
    for seconds in (0.58, 5.0, 0.58):  # one stalled round among three at 14 rows: the median moves by nothing
        p.record(PLAIN, 14, seconds, [])
    assert cost(14, 1) == pytest.approx(0.58) and cost(8, 1) <= cost(12, 1) <= cost(16, 1)


def test_the_planner_packs_the_cache_where_empty_places_cost_more_than_the_copy():
    per_position, flat = Planner(), Planner()
    measured(per_position, lambda b, t: 0.1 + 0.01 * b, places=(1, 8, 16), sizes=(1,))
    measured(flat, lambda b, t: 0.01, places=(1, 8, 16), sizes=(1,))
    assert per_position.packs(16, 8, 8 * 300, rounds=10)  # until a copy was timed: pack, and time it
    for p in (per_position, flat):
        p.record_copy(1000, 0.01)
    assert per_position.packs(16, 8, 8 * 300, rounds=10)  # 8 empty places cost 0.8 s in 10 rounds; the copy 0.024 s
    assert not per_position.packs(16, 15, 15 * 300, rounds=0.5)  # one empty place for half a round: not worth it
    assert not flat.packs(16, 8, 8 * 300, rounds=10)  # an empty place costs nothing
    for _ in range(20):  # new rows take the places of rows that leave
        per_position.left(8)
        per_position.joined()
    assert not per_position.packs(16, 8, 8 * 300, rounds=10)


def test_the_planner_drafts_for_some_rows_only_where_the_places_of_rows_that_end_are_taken():
    cpu = lambda b, t: 0.3 + 0.016 * b * t  # noqa: E731  (a fixed part and a part per position)
    planner = Planner()
    measured(planner, cpu, sizes=(1, 2, 3, 4))
    some = asks(0.88, [3] * 10 + [0] * 6)
    for a in some:  # the rows' paces: ten copy their drafts, six offer none
        a.pace = a.stats("suffix").expected(3) if a.offer[1] else 1.0
    alike = asks(0.97, [3] * 16)
    for a in alike:
        a.pace = a.stats("suffix").expected(3)
    assert planner.refill == 0.0  # until rows are seen replaced: priced as rows that drain
    assert planner.plan(some) == PLAIN  # the six rows without a draft bound the rounds still needed
    assert planner.plan(alike).k >= 1  # every row drafts: fewer rounds
    for _ in range(16):  # a busy server: a new request takes each place
        planner.left(15)
        planner.joined()
    assert planner.refill > 0.95 and planner.plan(some).k >= 1
    flat = Planner()  # a GPU: a wider pass costs about nothing, so the drafted rows' speed decides
    measured(flat, lambda b, t: 0.010, sizes=(1, 2, 3, 4))
    assert flat.plan(some).k == 3


def test_an_engine_tells_its_planner_who_joins_and_leaves(target):
    e = Engine(target)
    first, second, third = (row(target, PROMPT, None, 4) for _ in range(3))
    e.add(*first)
    e.add(*second)
    e.remove(first[0])
    assert e.planner.open == 1
    e.add(*third)  # takes the place first left
    assert e.planner.open == 0 and e.planner.refill == pytest.approx(1 / 2.6)
    e.remove(second[0])
    e.remove(third[0])  # the engine empties: both places stay empty
    assert e.planner.open == 0 and e.planner.refill < 0.2


def test_sliding_window_rows_batch_past_their_window_and_equal_their_solo_runs(tiny_models):
    """Rows of a sliding-window model (window 32) share passes; each rewinds by its own count, leaving gaps that the
    window skips by position, with prompts past the window and generations crossing it."""
    from mlx_spec.named import load_model

    gemma = load_model(str(tiny_models["gemma3"]))[0]
    assert batchable(new_cache(gemma))
    prompts = [REPEATING * 5, (PROMPT * 16)[:47], [5, 9, 4] + REPEATING * 50]
    drafters = [SuffixDrafter(), NGramDrafter(), HybridDrafter([SuffixDrafter(), NGramDrafter()], None)]
    e, outs, rows = fixed(gemma), {}, []
    for p, d in zip(prompts, drafters):
        r, cache = row(gemma, p, d, 60)
        e.add(r, cache)
        rows.append(r)
    run(e, outs, rounds=1)
    sliding = [c for c in e.cache.layers if c.window is not None]
    assert sliding and all(c.size() < 300 for c in sliding)  # the long row's positions out of sight are gone
    run(e, outs)
    for r, p in zip(rows, prompts):
        assert outs[id(r)] == plain_greedy(gemma, p, 60)
    assert max(r.stats.widest for r in rows) == 3
    assert sum(r.stats.proposed - r.stats.accepted for r in rows) > 10  # rows rewound by different counts


def test_a_joining_prompt_is_prefilled_a_chunk_per_round_beside_the_running_rows(served_pair):
    from mlx_spec.server.batching import Batcher
    from mlx_spec.server.params import Params

    tok, model = served_pair.tokenizer, served_pair.target
    batcher = Batcher(served_pair, chunk=8)

    class Job:  # what the batcher reads of the scheduler's jobs (hashable by identity, as they are)
        def __init__(self, text, n):
            self.ids, self.params, self.session = tok.encode(text), Params(max_tokens=n), served_pair.new_session()

    jobs = [Job("def add(a, b):", 30), Job("class Point:\n    def __init__(self, x, y):\n" * 4, 10)]
    out = {0: [], 1: []}

    def rounds():
        assert not batcher.step_joins()
        return [x for e in batcher.engines for x in batcher.round(e)]

    batcher.join(jobs[0])
    out[0] += [ev.token for _, ev in rounds()]  # its prompt fits one chunk: it joins, then runs a round
    assert out[0]
    batcher.join(jobs[1])
    beside = 0
    while len(batcher):
        joining = jobs[1] in batcher.joining
        for job, ev in rounds():
            i = jobs.index(job)
            out[i].append(ev.token)
            beside += joining and i == 0
            if ev.finish_reason:
                batcher.leave(job)
    assert len(jobs[1].ids) > 4 * 8 and beside >= 4  # the first kept generating while the second's chunks went in
    for i, job in enumerate(jobs):
        assert out[i] == plain_greedy(model, job.ids, job.params.max_tokens, eos=tok.eos_token_ids)


def test_the_one_adapter_of_mlx_lms_batch_cache_agrees_with_it(target):
    """`RaggedKVCache` reads `BatchKVCache`'s columns in use (`_idx`) and builds on its merge, mask and trim: while no
    row has a gap it must behave as mlx-lm's own joint cache, pass after pass (this fails when mlx-lm changes them)."""
    from mlx_lm.models.cache import BatchKVCache

    solo = [row(target, p, None, 1)[1] for p in (REPEATING, PROMPT)]
    rows = JointCache()
    for i, c in enumerate(solo):
        rows.add(i, c)
    theirs = [BatchKVCache.merge([a, b]) for a, b in zip(*solo)]
    for fed in ([[1, 2], [3, 0]], [[2], [1]]):
        mine_logits = target(mx.array(fed), cache=rows.layers)
        their_logits = target(mx.array(fed), cache=theirs)
        assert close(mine_logits, their_logits, 1e-5)
        for a, b in zip(rows.layers, theirs):
            assert a.size() == b.size() and mx.array_equal(a.offset, b.offset).item()
            assert all(mx.array_equal(x, y).item() for x, y in zip(a.keys_and_values(), b.keys_and_values()))
    for c in rows.layers + theirs:
        c.trim(1)
    assert [a.size() for a in rows.layers] == [b.size() for b in theirs]


def _chunked_row(n: int, chunk: int, room: int):
    """A llama4 chunked layer's cache of one row holding positions 0 .. n - 1, each key the position plus one."""
    from mlx_spec.models.window import RoomyChunkedKVCache

    c = RoomyChunkedKVCache(chunk, room)
    pos = (mx.arange(n) + 1).astype(mx.float32)[None, None, :, None]  # (1, 1, n, 1)
    c.update_and_fetch(pos, pos)
    return [c]


def _chunk_masks(c, N: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(the mask each row's N next positions need over a joint cache's columns plus themselves, mlx-lm's llama4 mask
    by column) from the positions the keys hold: a row's query at p sees its held positions and new ones in p's
    chunk, up to p."""
    keys = np.array(c.keys_and_values()[0])[:, 0, :, 0].astype(int) - 1  # (B, C): a column's position, -1: padding
    offset = np.array(c.offset)
    B, C = keys.shape
    want = np.zeros((B, 1, N, C + N), dtype=bool)
    for b in range(B):
        held = np.where((keys[b] >= 0) & (keys[b] < offset[b]), keys[b], -1)  # -1: padding, or a gap a rewind left
        pos = np.concatenate([held, offset[b] + np.arange(N)])
        for n in range(N):
            p = offset[b] + n
            want[b, 0, n] = (pos >= 0) & (pos <= p) & (pos // chunk == p // chunk)
    cols, q = np.arange(C + N), C + np.arange(N)[:, None]
    by_column = (cols <= q) & (cols // chunk == q // chunk)
    return want, np.broadcast_to(by_column, want.shape)


def test_a_joint_chunked_cache_masks_each_rows_chunk_by_its_positions():
    """llama4's chunked layers over a joint cache: rows of 11 and 5 positions (one left-padded, one with a gap a
    rewind left) each see their own chunk by position, not by column; a commit drops the columns no row needs, and
    rows in different chunks keep all of theirs."""
    chunk, N = 4, 3
    rows = JointCache()
    for i, n in enumerate((11, 5)):
        rows.add(i, _chunked_row(n, chunk, room=2))
    rows.rewind([1, 0])  # the first row drops position 10: a gap at its last column
    (c,) = rows.layers
    want, by_column = _chunk_masks(c, N, chunk)
    assert np.array_equal(np.array(c.make_mask(N)), want)
    assert not np.array_equal(want, by_column)  # (mlx-lm's mask by column gives these rows others' chunks)
    rows = JointCache()
    for i, n in enumerate((403, 298)):  # next positions in chunks 100 and 74
        rows.add(i, _chunked_row(n, chunk, room=2))
    rows.start_round()
    (c,) = rows.layers
    assert c.size() < 298  # the columns of positions no row can see again are gone
    want, _ = _chunk_masks(c, 1, chunk)
    assert np.array_equal(np.array(c.make_mask(1)), want)
    keys = np.array(c.keys_and_values()[0])[:, 0, :, 0].astype(int) - 1
    for b, (n, w) in enumerate(zip((403, 298), want[:, 0, 0, :-1])):
        assert sorted(keys[b][w]) == list(range(n // chunk * chunk, n))  # each row's whole chunk is still held
    out = rows.remove(1, 298)[0]
    assert (out.offset, out.start_position) == (298, 298 - out.keys.shape[2])
