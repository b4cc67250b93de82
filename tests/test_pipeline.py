"""Draft passes launched ahead (mx.async_eval before the token is read): the same drafts, the cache left exact, the
wasted passes counted, and the measured rule that decides it."""

import mlx.core as mx
import pytest

from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.registry import head_ids
from mlx_spec.named import load_model

from test_speculative import PROMPTS, plain_greedy, spec

K = 6


@pytest.fixture(scope="module")
def models(tiny_models):
    return {k: load_model(str(tiny_models[k]))[:2] for k in ("qwen2", "qwen2_draft")}


def cache_holds_fed(d):
    return all(c.offset == len(d._fed) for c in d.cache)


def confidences(model, context):
    """The draft's probability of each of its K greedy tokens after `context` (no stop)."""
    tokens = ModelDrafter(model, model.args.vocab_size, min_confidence=0.0, pipeline=False).propose(context, K).tokens
    probs = mx.softmax(model(mx.array([context + tokens[:-1]]))[0, -K:].astype(mx.float32), axis=-1)
    return tokens, [probs[i, t].item() for i, t in enumerate(tokens)]


@pytest.mark.parametrize("subset", [False, True])
@pytest.mark.parametrize("text", PROMPTS)
def test_a_pipelined_draft_is_the_synchronous_draft(models, subset, text):
    model, tok = models["qwen2_draft"]
    v = model.args.vocab_size
    ids = head_ids(tok, len(tok.get_vocab())) if subset else None
    context = tok.encode(text)
    tokens, conf = confidences(model, context)
    # Thresholds that stop at every position in turn, and one that never stops.
    for threshold in sorted(set(conf))[1:] + [0.0]:
        sync = ModelDrafter(model, v, min_confidence=threshold, head_ids=ids, pipeline=False)
        ahead = ModelDrafter(model, v, min_confidence=threshold, head_ids=ids, pipeline=True)
        for d in (sync, ahead):
            assert d._launches() is d.pipeline
        got, want = ahead.propose(context, K).tokens, sync.propose(context, K).tokens
        assert got == want
        assert cache_holds_fed(ahead) and ahead._fed == sync._fed  # a wasted pass is rewound away
        # Launched ahead: one pass more than the synchronous loop per wasted launch, and a stop wastes one.
        assert ahead.fed_total == sync.fed_total + ahead.ahead[1] and ahead.ahead[1] >= (len(want) < K)
        assert ahead.ahead == sync.ahead
        # The next round continues from the same cache: the drafts stay equal.
        more = context + want[:1]
        assert ahead.propose(more, K).tokens == sync.propose(more, K).tokens
        assert cache_holds_fed(ahead)


def test_a_launch_on_a_guess_the_full_head_overrules_is_thrown_away(models):
    """A two-token subset is never sure: the full head decides every step, and the guess is mostly wrong."""
    model, tok = models["qwen2_draft"]
    v = model.args.vocab_size
    context = tok.encode(PROMPTS[1])
    sync = ModelDrafter(model, v, min_confidence=0.0, head_ids=[0, 1], pipeline=False)
    ahead = ModelDrafter(model, v, min_confidence=0.0, head_ids=[0, 1], pipeline=True)
    assert ahead.propose(context, K).tokens == sync.propose(context, K).tokens
    assert ahead.ahead[1] > 0  # some launch was wasted: its guess was not the token drafted
    assert ahead.fed_total == sync.fed_total + ahead.ahead[1]
    assert cache_holds_fed(ahead)


@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_with_pipelined_drafts_equals_plain(models, k):
    target, tok = models["qwen2"]
    draft = models["qwen2_draft"][0]
    v = target.args.vocab_size
    ids = head_ids(tok, len(tok.get_vocab()))
    for text in PROMPTS:
        prompt = tok.encode(text)
        ref = plain_greedy(target, prompt, 40)
        for d in (ModelDrafter(draft, v, pipeline=True), ModelDrafter(draft, v, head_ids=ids, pipeline=True),
                  HybridDrafter(NGramDrafter(), ModelDrafter(draft, v, pipeline=True))):
            out, _ = spec(target, prompt, d, max_tokens=40, num_draft=k, adaptive=False)
            assert out == ref, f"k={k} diverged on {text!r}"


def test_the_rule_launches_ahead_where_the_host_costs_more_than_the_waste(models):
    model, _ = models["qwen2_draft"]
    d = ModelDrafter(model, model.args.vocab_size)
    assert d.pipeline is None and not d._launches()  # nothing measured yet: synchronous
    d._step_s, d._host_s = 0.010, 0.003
    assert not d._launches()  # the prior: half the launches wasted
    d._recent.extend([True] * 12 + [False] * 52)  # 13/66: 2 ms wasted a step against 3 ms of host time
    assert d.waste() == 13 / 66 and d._launches()
    d._host_s = 0.0015
    assert not d._launches()
    d._host_s, d._step_s = 0.0035, 0.155  # this CPU's shape: a 0.155 s pass, the host's 3.5 ms
    d._recent.extend([False] * 61 + [True] * 3)  # a stop every ~20 steps: synchronous
    assert not d._launches()
    d._recent.extend([False] * 64)  # no stop in the last 64 steps
    assert d._launches()


def test_sure_drafting_turns_launching_ahead_on_and_early_stops_turn_it_off(models):
    model, tok = models["qwen2_draft"]
    d = ModelDrafter(model, model.args.vocab_size, min_confidence=0.0)
    context = tok.encode(PROMPTS[0])
    d.propose(context, K)
    d._host_s, d._step_s = 0.004, 0.1  # a fast device: the host's time is 4 % of a pass
    while not d._launches():  # no stop: no step is wasted, and the share (from a prior of 1/2) falls
        before = d.fed_total
        context += d.propose(context, K).tokens
        assert d.fed_total == before + K  # synchronous: one pass a drafted token
        d._host_s, d._step_s = 0.004, 0.1
    assert d.ahead == [25, 0]  # five rounds of five launch points: (0 + 1) / (25 + 2) < 0.04 <= 1 / (20 + 2)
    d.min_confidence = 1.0  # now every draft stops after its first token, and a launch ahead is wasted
    before = d.fed_total
    assert len(d.propose(context, K).tokens) == 1
    assert d.fed_total == before + 2  # the pass launched ahead ran, and was thrown away
    d._host_s, d._step_s = 0.004, 0.1
    assert d.ahead == [26, 1] and not d._launches()  # one wasted step of 26: (1 + 1) / (26 + 2) > 0.04


def test_the_drafter_measures_the_host_time_of_its_steps(models):
    model, tok = models["qwen2_draft"]
    d = ModelDrafter(model, model.args.vocab_size, min_confidence=0.0)
    d.propose(tok.encode(PROMPTS[0]), K)
    assert d._host_s is not None and 0 < d._host_s < d._step_s
    assert d.ahead == [K - 1, 0]  # five steps had a next one, and every one went on
