"""Sessions: later turns prefill only what is new, give the same tokens as a fresh run, and survive cancellation."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlx_spec.errors import GenerationError
from mlx_spec.gen import registry
from mlx_spec.gen.cache import cache_tokens
from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.gen.session import Session
from mlx_spec.gen.verify import common_prefix
from mlx_spec.named import load_model

DRAFTERS = ["none", "ngram", "self:2", "MODEL", "hybrid:MODEL", "hybrid"]
TURNS = ["def add(a, b):\n    return a + b\n", "Now write sub.", "And a class Point with x and y."]


class Counting:
    """A model proxy that counts the tokens fed through it (everything else is the real model)."""

    def __init__(self, model):
        self._model, self.fed = model, 0

    def __call__(self, inputs, cache=None, **kw):
        self.fed += inputs.shape[-1]
        return self._model(inputs, cache=cache, **kw)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.fixture(scope="module")
def models(tiny_models):
    target, tok, _ = load_model(str(tiny_models["qwen2"]))
    draft, _, _ = load_model(str(tiny_models["qwen2_draft"]))
    return target, tok, draft, str(tiny_models["qwen2_draft"])


def build(spec, target, tok, draft):
    counting_draft = Counting(draft)
    d = registry.build(spec.replace("MODEL", "draft"), target, tok, load=lambda _name: (counting_draft, tok))
    return d, counting_draft


def conversation(tok, turns, replies):
    msgs = []
    for i, t in enumerate(turns):
        msgs.append({"role": "user", "content": t})
        if i < len(replies):
            msgs.append({"role": "assistant", "content": replies[i]})
    return tok.apply_chat_template(msgs, add_generation_prompt=True)


def plain(model, ids, n):
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


@pytest.mark.parametrize("spec", DRAFTERS)
def test_later_turns_prefill_only_new_tokens_and_match_a_fresh_run(models, spec):
    target, tok, draft = models[:3]
    counted = Counting(target)
    drafter, counted_draft = build(spec, target, tok, draft)
    session = Session(counted, tok, drafter, num_draft=4)
    replies, held, prev_ids = [], [], []
    for turn in range(len(TURNS)):
        ids = conversation(tok, TURNS[: turn + 1], replies)
        before, before_draft = counted.fed, counted_draft.fed
        events = list(session.generate(ids, max_tokens=12, eos_token_ids=[], stats=Stats(trace=[])))
        out = [e.token for e in events]
        stats = events[-1].stats
        assert out == plain(target, ids, 12), f"turn {turn}: session output differs from a fresh plain run"
        # Reused: the longest common prefix of what the cache held and the new conversation; at least
        # the whole previous prompt (the reply may re-tokenize differently, so maybe not all of it).
        assert stats.prompt_cached == min(common_prefix(held, ids), len(ids) - 1) >= len(prev_ids) - 1
        # The target was fed: the new prompt tokens, then one pass per round (1 + drafted tokens, and the dummy
        # positions of a padded verify pass).
        assert stats.rounds + stats.proposed <= sum(r["size"] for r in stats.trace)
        assert counted.fed - before == (len(ids) - 1 - stats.prompt_cached) + sum(r["size"] for r in stats.trace)
        if spec.endswith("MODEL") and turn:
            # The draft model's prefill covered only what its cache did not hold; never the whole conversation.
            assert counted_draft.fed - before_draft < len(ids) - 1
        replies.append(tok.decode(out))
        held, prev_ids = list(session.tokens), ids
        assert cache_tokens(session.cache) == len(session.tokens) == len(ids) + len(out) - 1
        assert session.tokens == (ids + out)[:-1]


def test_turn_two_reuses_the_cache(models):
    target, tok = models[:2]
    counted = Counting(target)
    session = Session(counted, tok, None)
    ids1 = conversation(tok, TURNS[:1], [])
    out1 = [e.token for e in session.generate(ids1, max_tokens=8, eos_token_ids=[])]
    ids2 = conversation(tok, TURNS[:2], [tok.decode(out1)])
    before = counted.fed
    events = list(session.generate(ids2, max_tokens=8, eos_token_ids=[]))
    new = len(ids2) - 1 - events[-1].stats.prompt_cached
    assert events[-1].stats.prompt_cached > len(ids1) // 2  # most of turn 1 came from the cache
    assert counted.fed - before == new + 8  # new prompt tokens + one token per plain step


def test_planner_measurements_carry_over(models):
    """Turn 2 starts with turn 1's measurements: its first round needs no plain step to measure a baseline."""
    target, tok, draft = models[:3]
    drafter, _ = build("MODEL", target, tok, draft)
    session = Session(target, tok, drafter, num_draft=4)
    first = Stats(trace=[])
    list(session.generate(conversation(tok, TURNS[:1], []), max_tokens=10, eos_token_ids=[], stats=first))
    assert first.trace[0]["proposed"] == 0 and session.planner.costs.plain_step() is not None
    second = Stats(trace=[])
    list(session.generate(conversation(tok, TURNS[:2], ["x"]), max_tokens=10, eos_token_ids=[], stats=second))
    fresh = Stats(trace=[])
    list(
        Session(target, tok, build("MODEL", target, tok, draft)[0], num_draft=4).generate(
            conversation(tok, TURNS[:2], ["x"]), max_tokens=10, eos_token_ids=[], stats=fresh
        )
    )
    assert fresh.trace[0]["proposed"] == 0 and set(second.costs) >= set(first.costs)


@pytest.mark.parametrize("spec", ["MODEL", "self:2", "hybrid:MODEL", "ngram"])
@pytest.mark.parametrize("stop_after", [1, 2, 3, 5])
def test_closing_mid_round_leaves_caches_consistent(models, spec, stop_after):
    """A client disconnects (the generator is closed) after a few tokens, possibly inside a round of
    accepted drafts: no rejected or undelivered entries stay, and the next turn is still exact."""
    target, tok, _ = models[:3]
    drafter = registry.build(
        spec.replace("MODEL", "draft"), target, tok, load=lambda _n: (target, tok)
    )  # the target drafting for itself: long accepted rounds
    session = Session(target, tok, drafter, num_draft=6, adaptive=False)
    ids = conversation(tok, TURNS[:1], [])
    gen = session.generate(ids, max_tokens=30, eos_token_ids=[])
    got = [next(gen).token for _ in range(stop_after)]
    gen.close()
    assert session.tokens == (ids + got)[:-1]
    assert cache_tokens(session.cache) == len(ids) + len(got) - 1
    # The conversation continues from what the user saw.
    ids2 = conversation(tok, TURNS[:2], [tok.decode(got)])
    out = [e.token for e in session.generate(ids2, max_tokens=10, eos_token_ids=[])]
    assert out == plain(target, ids2, 10)


def test_closing_inside_an_accepted_round_trims_undelivered_tokens(models):
    target, tok = models[:2]
    drafter = registry.build("draft", target, tok, load=lambda _n: (target, tok))
    cache = __import__("mlx_lm.models.cache", fromlist=["x"]).make_prompt_cache(target)
    ids = tok.encode(TURNS[0])
    stats = Stats()
    gen = speculative_generate_step(
        ids, target, drafter, prompt_cache=cache, num_draft=6, adaptive=False, max_tokens=20, stats=stats
    )
    next(gen)
    assert stats.accepted >= 3  # the first round accepted several drafts, and only one was delivered
    gen.close()
    assert cache_tokens(cache) == len(ids)  # prompt + the delivered token - 1


@pytest.mark.parametrize("boom_on", [1, 2])
def test_interrupt_during_a_forward_pass_rewinds_every_layer(models, boom_on):
    """Ctrl-C lands inside a forward pass (1: the prefill, 2: a verify round), after some layers have
    written their cache entries: every layer is rewound and the conversation is kept."""
    target, tok = models[:2]
    session = Session(target, tok, None)
    ids = conversation(tok, TURNS[:1], [])
    list(session.generate(ids, max_tokens=4, eos_token_ids=[]))
    layer = target.model.layers[2]
    calls = {"n": 0}
    original = type(layer).__call__

    class Boom(type(layer)):
        def __call__(self, *a, **kw):
            calls["n"] += 1
            if calls["n"] == boom_on:
                raise KeyboardInterrupt
            return original(self, *a, **kw)

    layer.__class__ = Boom
    try:
        with pytest.raises(KeyboardInterrupt):
            list(session.generate(ids + [5, 6], max_tokens=4, eos_token_ids=[]))
    finally:
        layer.__class__ = type(layer).__mro__[1]
    assert calls["n"] == boom_on and original is type(layer).__call__
    assert cache_tokens(session.cache) == len(session.tokens)  # every layer at the same offset again
    assert len(session.tokens) >= len(ids)  # ... and the conversation was not thrown away
    ids2 = ids + [5, 6]
    out = [e.token for e in session.generate(ids2, max_tokens=6, eos_token_ids=[])]
    assert out == plain(target, ids2, 6)


def test_finish_reasons_and_detokenizer(models):
    target, tok = models[:2]
    ids = tok.encode(TURNS[0])
    limit = target.args.max_position_embeddings
    steps = list(speculative_generate_step(ids, target, None, max_tokens=5))
    assert [s.finish_reason for s in steps] == [None] * 4 + ["length"]
    near = (ids * (limit // len(ids) + 1))[: limit - 3]
    steps = list(speculative_generate_step(near, target, None, max_tokens=50))
    assert len(steps) == 3 and steps[-1].finish_reason == "context"
    ref = plain(target, ids, 10)
    steps = list(speculative_generate_step(ids, target, None, max_tokens=50, eos_token_ids=[ref[6]]))
    assert steps[-1].finish_reason == "stop" and len(steps) == ref.index(ref[6]) + 1


def test_stream_finalizes_text_on_every_finish(models):
    from mlx_spec.gen.stream import generate

    target, tok = models[:2]
    limit = target.args.max_position_embeddings
    ids = tok.encode(TURNS[0])
    near = (ids * (limit // len(ids) + 1))[: limit - 4]
    r = generate(target, tok, near, None, max_tokens=100, eos_token_ids=[])
    assert r.finish_reason == "context" and len(r.tokens) == 4
    assert r.text == tok.decode(r.tokens)


def test_peak_memory_is_not_reset(models):
    target, tok = models[:2]
    big = mx.zeros((4_000_000,))  # 16 MB: a process-wide peak from before the generation
    mx.eval(big)
    del big
    peak = mx.get_peak_memory()
    stats = Stats()
    list(speculative_generate_step(tok.encode(TURNS[0]), target, None, max_tokens=4, stats=stats))
    assert mx.get_peak_memory() >= peak  # the caller's peak is still there
    assert 0 <= stats.peak_memory_gb < peak / 1e9


def test_cache_must_hold_a_prefix(models):
    target, tok = models[:2]
    session = Session(target, tok, None)
    ids = tok.encode(TURNS[0])
    list(session.generate(ids, max_tokens=4))
    with pytest.raises(GenerationError, match="prompt cache"):
        list(speculative_generate_step(ids[:3], target, None, prompt_cache=session.cache))
