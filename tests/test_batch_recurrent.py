"""Batched speculation on recurrent and hybrid targets: each row of a batch is rewound on its own (its recurrent
states replayed on what it kept) and equals its solo greedy run, as rows join and leave; a row taken out continues
alone to the same tokens; skipping the replay breaks it."""

import mlx.core as mx
import pytest
from conftest import PROMPTS, make_model, plain_greedy
from mlx.utils import tree_flatten
from test_batch import run

from mlx_spec.gen import batch_cache, recurrent
from mlx_spec.gen.batch import Batch, BatchPlanner, Row
from mlx_spec.gen.cache import new_cache
from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import prefill_cache, speculative_generate_step
from mlx_spec.named import load_model

ARCHS = ("qwen3_next", "mamba2")  # gated delta nets with attention every 4th layer; Mamba layers only
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

    def propose(self, context, k, probs_fn=None):
        pos = len(context) - self.start
        toks = list(self.cont[pos : pos + k])
        wrong = (self.rounds + self.shift) % (K + 1)
        if wrong < len(toks):
            toks[wrong] = (toks[wrong] + 1) % self.vocab
        self.rounds += 1
        return Draft(toks, source=self.name)


def row(model, prompt, n, drafter):
    """A row and its solo-prefilled cache (the context minus its last token)."""
    cache = new_cache(model)
    prefill_cache(model, cache, prompt[:-1], None)
    assert batch_cache.batchable(cache)
    return Row(list(prompt), drafter, None, n, "length", frozenset(), K), cache


def oracle(model, prompt, n, shift):
    return Oracle(len(prompt), solo(model, prompt, n), shift, model.args.vocab_size)


def joining_and_leaving(model, prompts):
    """Three rows of different prompt lengths (one leaves early), a fourth joining two rounds in: each row's
    tokens and its solo run's."""
    plan = [(prompts[0], 24, 0), (prompts[1], 6, 1), (prompts[2], 20, None), (prompts[3], 16, 3)]
    b, outs, rows = Batch(model, K, adaptive=False), {}, []
    for j, (p, n, shift) in enumerate(plan):
        if j == 3:
            run(b, outs, rounds=2)
        r, cache = row(model, p, n, SuffixDrafter() if shift is None else oracle(model, p, n, shift))
        b.add(r, cache)
        rows.append(r)
    run(b, outs)
    return [(outs[id(r)], solo(model, p, n)) for r, (p, n, _) in zip(rows, plan)]


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_row_equals_its_solo_greedy_run_as_rows_join_and_leave(models, arch, packing, monkeypatch):
    model, prompts = models[arch]
    if not packing:  # the place of the row that leaves runs along in every pass
        monkeypatch.setattr(BatchPlanner, "packs", lambda self, *a: False)
    drops, real = [], batch_cache.rewind
    monkeypatch.setattr(batch_cache, "rewind", lambda joint, drop: (drops.append(drop), real(joint, drop))[1])
    for got, want in joining_and_leaving(model, prompts):
        assert got == want
    assert sum(len(set(d)) > 2 for d in drops) >= 3  # rounds where rows dropped different counts
    assert any(0 in d and max(d) > 0 for d in drops)  # and where one row kept all while another dropped
    kept = {K + 1 - x for d in drops for x in d}
    assert kept - {0} == set(range(1, K + 2))  # rows kept every count from 1 to K+1
    assert (0 in kept) == (not packing)  # an empty place keeps nothing


def test_skipping_the_recurrent_replay_breaks_it(models, monkeypatch):
    """Control: restoring each row's state without replaying what it kept changes some row's tokens."""
    model, prompts = models["qwen3_next"]
    monkeypatch.setattr(recurrent, "_replay", lambda *a: None)
    assert any(got != want for got, want in joining_and_leaving(model, prompts))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_row_taken_out_continues_alone_to_its_solo_tokens(models, arch):
    model, prompts = models[arch]
    (pa, sa), (pc, sc), n = (prompts[0], 2), (prompts[2], 0), 30
    b = Batch(model, K, adaptive=False)
    a, c = [b.add(*row(model, p, n, oracle(model, p, n, s))) or b.rows[-1] for p, s in ((pa, sa), (pc, sc))]
    b.round()
    for _ in range(K + 1):  # on to a round where row c kept 3+ positions: its extracted cache can trim into it
        if len(b.round()[1]) >= 3:
            break
    else:
        pytest.fail("row c never kept 3 positions")
    cache = b.remove(a)  # cancelled, say: the session keeps the cache for the conversation's next turn
    made = a.context[len(pa):]
    rest = [s.token for s in speculative_generate_step(a.context, model, oracle(model, pa, n, 1),
                                                        prompt_cache=cache, max_tokens=n - len(made))]
    assert made + rest == solo(model, pa, n)
    # Row c, trimmed back 2 tokens into the last round (its recorded call replayed), continues alone; the batch
    # keeps it unchanged.
    back = batch_cache.extract(b.cache, b.slots.index(c), len(c.context) - 3)
    assert {x.offset for x in back} == {len(c.context) - 3}
    made = c.context[len(pc):]
    rest = [s.token for s in speculative_generate_step(c.context, model, SuffixDrafter(), prompt_cache=back,
                                                        max_tokens=n - len(made))]
    assert made + rest == solo(model, pc, n)
    run(b, {})
    assert c.context[len(pc):] == solo(model, pc, n)


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_rewound_across_several_passes_equal_solo_caches(models, arch):
    """Passes of 2, 2 and 1 positions (as a batched draft model makes), then rows dropping counts that reach back
    across passes (into one, to its start, to before them all): each row taken out gives the logits of a solo cache
    fed what it kept."""
    model, prompts = models[arch]
    prompts = prompts + [prompts[0][:5]]
    fed = [[5 * i + j for j in range(5)] for i in range(1, 6)]
    drop = [0, 2, 3, 4, 5]
    joint = None
    for p in prompts:
        cache = new_cache(model)
        prefill_cache(model, cache, p[:-1], None)
        if joint is None:
            joint = batch_cache.merge(cache)
        else:
            batch_cache.extend(joint, batch_cache.merge(cache))
    for a, b in ((0, 2), (2, 4), (4, 5)):
        model(mx.array([f[a:b] for f in fed]), cache=joint)
    batch_cache.rewind(joint, drop)
    for i, (p, f, d) in enumerate(zip(prompts, fed, drop)):
        kept = p[:-1] + f[: 5 - d]
        mine = batch_cache.extract(joint, i, len(kept))
        solo_cache = new_cache(model)
        prefill_cache(model, solo_cache, kept, None)
        assert {c.offset for c in mine} == {len(kept)}
        nxt = mx.array([[3]])
        assert mx.allclose(model(nxt, cache=mine), model(nxt, cache=solo_cache), atol=1e-4).item(), (arch, d)
