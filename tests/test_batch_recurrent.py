"""Recurrent and hybrid targets as rows of one engine: each row is rewound on its own (its recurrent states replayed
on what it kept) and equals its solo greedy run, as rows join and leave; a row taken out continues alone to the same
tokens; skipping the replay breaks it."""

import mlx.core as mx
import pytest
from conftest import PROMPTS, close, make_model, plain_greedy
from mlx.utils import tree_flatten
from test_batch import launch_bound, run

from mlx_spec.gen import recurrent
from mlx_spec.gen.cache import new_cache, prefill_cache
from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import Engine
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.joint import JointCache, batchable
from mlx_spec.gen.load import vocab_width
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.rows import Row
from mlx_spec.named import load_model

# gated delta nets with attention every 4th layer; Mamba layers only; linear attention that never calls `advance`
ARCHS = ("qwen3_next", "mamba2", "qwen3_5", "bailing_moe_linear")
TEXTS = PROMPTS + ["x = 1\ny = 2\n"]
K = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_recurrent")
    out = {}
    for arch in ARCHS:
        model, tok, _ = load_model(str(make_model(root / arch, arch, seed=5, scale=4.0)))
        assert {v.dtype for _, v in tree_flatten(model.parameters())} == {mx.float32}
        out[arch] = model, [tok.encode(t) for t in TEXTS]
    return out


_SOLO = {}


def solo(model, prompt, n):
    key = (id(model), tuple(prompt), n)
    if key not in _SOLO:
        _SOLO[key] = plain_greedy(model, prompt, n)
    return _SOLO[key]


class Oracle(Drafter):
    """Proposes the row's solo continuation with one token wrong, at a place that moves each round (one round in
    K+1 none): rows accept different counts, 0 to K, so each row is rewound by its own."""

    name, free = "oracle", True

    def __init__(self, prompt_len, continuation, shift, vocab):
        self.start, self.cont, self.shift, self.vocab, self.rounds = prompt_len, continuation, shift, vocab, 0

    def propose(self, context, k, sampler=None):
        pos = len(context) - self.start
        toks = list(self.cont[pos : pos + k])
        wrong = (self.rounds + self.shift) % (K + 1)
        if wrong < len(toks):
            toks[wrong] = (toks[wrong] + 1) % self.vocab
        self.rounds += 1
        return Draft.of(toks, source=self.name)


def row(model, prompt, n, drafter):
    """A row and its solo-prefilled cache (the context minus its last token)."""
    cache = new_cache(model)
    prefill_cache(model, cache, prompt[:-1], None)
    assert batchable(cache)
    return Row(list(prompt), drafter, budget=n, k_max=K), cache


def oracle(model, prompt, n, shift):
    return Oracle(len(prompt), solo(model, prompt, n), shift, vocab_width(model))


def joining_and_leaving(model, prompts, planner=None):
    """Three rows of different prompt lengths (one leaves early), a fourth joining two rounds in: each row's tokens
    and its solo run's, and whether a round ran over a place whose row had left (the cache not packed)."""
    plan = [(prompts[0], 24, 0), (prompts[1], 6, 1), (prompts[2], 20, None), (prompts[3], 16, 3)]
    e, outs, rows, empty = Engine(model, planner or Planner(adaptive=False)), {}, [], False
    for p, n, shift in plan[:3]:
        r, cache = row(model, p, n, SuffixDrafter() if shift is None else oracle(model, p, n, shift))
        e.add(r, cache)
        rows.append(r)
    rounds = 0
    while e.rows:
        if rounds == 2:  # the fourth joins two rounds in
            r, cache = row(model, *plan[3][:2], oracle(model, *plan[3]))
            e.add(r, cache)
            rows.append(r)
        now = e.rows
        for i, steps in e.round().items():
            outs.setdefault(id(now[i]), []).extend(s.token for s in steps)
        empty = empty or None in e.cache.owners
        for r in [r for r in e.rows if r.done]:
            e.remove(r)
        rounds += 1
    return [(outs[id(r)], solo(model, p, n)) for r, (p, n, _) in zip(rows, plan)], empty


class AlwaysPacks(Planner):
    """A device where an empty place costs more than any copy (the timed choice is tested in test_batch; here the
    rows must be packed on every leave, whatever this machine's timings)."""

    def packs(self, places, live, positions, rounds):
        return True


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_row_equals_its_solo_greedy_run_as_rows_join_and_leave(models, arch, packing, monkeypatch):
    model, prompts = models[arch]
    planner = Planner(adaptive=False) if not packing else AlwaysPacks(adaptive=False)
    if not packing:  # a device where an empty place costs nothing and a copy is dear: the place runs along
        launch_bound(planner)
    drops, real = [], JointCache.rewind  # a spy: each rewind's drop per place, recorded, then the rewind itself
    monkeypatch.setattr(JointCache, "rewind", lambda self, drop: (drops.append(list(drop)), real(self, drop))[1])
    runs, empty = joining_and_leaving(model, prompts, planner)
    for got, want in runs:
        assert got == want
    assert empty == (not packing)
    assert sum(len(set(d)) > 2 for d in drops) >= 3  # rounds where rows dropped different counts
    assert any(0 in d and max(d) > 0 for d in drops)  # and where one row kept all while another dropped
    kept = {K + 1 - x for d in drops for x in d}
    assert kept - {0} == set(range(1, K + 2))  # rows kept every count from 1 to K+1
    assert (0 in kept) == (not packing)  # an empty place keeps nothing


def test_skipping_the_recurrent_replay_breaks_it(models, monkeypatch):
    """Control: restoring each row's state without replaying what it kept changes some row's tokens."""
    model, prompts = models["qwen3_next"]
    monkeypatch.setattr("mlx_spec.models.cache._replay", lambda *a: None)
    runs, _ = joining_and_leaving(model, prompts)
    assert any(got != want for got, want in runs)


@pytest.mark.parametrize("drafted", [True, False])  # rounds drafted (rewound), or plain with a step queued ahead
@pytest.mark.parametrize("arch", ARCHS)
def test_a_row_taken_out_continues_alone_to_its_solo_tokens(models, arch, drafted):
    model, prompts = models[arch]
    (pa, sa), (pc, sc), n = (prompts[0], 2), (prompts[2], 0), 30
    e = Engine(model, Planner(adaptive=not drafted))
    a, c = (row(model, p, n, oracle(model, p, n, s) if drafted else None) for p, s in ((pa, sa), (pc, sc)))
    e.add(*a)
    e.add(*c)
    a, c = a[0], c[0]
    for _ in range(K + 1):
        e.round()
    cache = e.remove(a)  # cancelled, say: the session keeps the cache for the conversation's next turn
    assert {x.offset for x in cache} == {len(a.context) - 1}
    made = a.context[len(pa) :]
    rest = [
        s.token
        for s in speculative_generate_step(
            a.context, model, oracle(model, pa, n, 1) if drafted else None, prompt_cache=cache, max_tokens=n - len(made)
        )
    ]
    assert made + rest == solo(model, pa, n)
    run(e, {})  # the row that stays is unchanged
    assert c.context[len(pc) :] == solo(model, pc, n)


@pytest.mark.parametrize("back", [(0,) * 5, (1, 1, 0, 1, 0)])
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_rewound_across_several_passes_equal_solo_caches(models, arch, back):
    """Passes of 2, 2 and 1 positions (as a draft model drafting for several rows makes), then rows dropping counts
    that reach back across passes (into one, to its start, to before them all): each row taken out gives the logits
    of a solo cache fed what it kept (its recurrent state replayed on it), or fed `back` tokens fewer, trimmed within
    the pass its kept part ends in (the third and fifth end where a pass begins)."""
    model, prompts = models[arch]
    prompts = prompts + [prompts[0][:5]]
    fed = [[5 * i + j for j in range(5)] for i in range(1, 6)]
    drop = [0, 2, 3, 4, 5]
    rows = JointCache()
    for i, p in enumerate(prompts):
        cache = new_cache(model)
        prefill_cache(model, cache, p[:-1], None)
        rows.add(i, cache)
    rows.start_round()
    view = recurrent.recording(model)  # the model as the engine runs it: its recurrent blocks record their calls
    for a, b in ((0, 2), (2, 4), (4, 5)):
        view(mx.array([f[a:b] for f in fed]), cache=rows.layers)
    rows.rewind(drop)
    for i, (p, f, d, m) in enumerate(zip(prompts, fed, drop, back)):
        kept = p[:-1] + f[: 5 - d]
        kept = kept[: len(kept) - m]
        mine = rows.remove(i, len(kept))
        assert {c.offset for c in mine} == {len(kept)}
        solo_cache = new_cache(model)
        prefill_cache(model, solo_cache, kept, None)
        nxt = mx.array([[3]])
        assert close(model(nxt, cache=mine), model(nxt, cache=solo_cache)), (arch, d, m)
    assert rows.owners == []
