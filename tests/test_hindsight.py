"""Hindsight: a draft model that catches up on output it sat out judges it, and the policy learns from every token."""

import mlx.core as mx
import pytest

from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import HINDSIGHT_MIN, ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.engine import Stats, speculative_generate_step
from mlx_spec.gen.policy import Policy
from mlx_spec.named import load_model

from test_speculative import PROMPTS, plain_greedy

OUT = 12  # output tokens the drafter sat out


@pytest.fixture(scope="module")
def pair(tiny_models):
    return load_model(str(tiny_models["qwen2"]))[:2], load_model(str(tiny_models["qwen2_draft"]))[0]


def output(target, draft, tok):
    """A prompt and OUT output tokens: the draft's own greedy continuation for half (it would have drafted
    those), the target's for the rest (seldom the draft's)."""
    prompt = tok.encode(PROMPTS[0])
    mine = plain_greedy(draft, prompt, OUT // 2)
    return prompt, mine + plain_greedy(target, prompt + mine, OUT - OUT // 2)


def expected(draft, context, n):
    """Whether the draft's greedy prediction was each of the last n tokens of context."""
    best = mx.argmax(draft(mx.array([context]))[0, -n - 1 : -1], axis=-1).tolist()
    return [b == t for b, t in zip(best, context[-n:])]


def drafted(make, context, n):
    """Whether a drafter made by `make`, drafting at each of the last n positions of context, drafts that token."""
    flags = []
    for i in range(len(context) - n, len(context)):
        d = make()
        d.reset(context[:i])
        flags.append(d.propose(context[:i], 1).tokens == [context[i]])
    return flags


@pytest.mark.parametrize("ids", [None, "all", [0, 1, 2]])  # the full head; a subset head, exact; a small subset
def test_a_catch_up_judges_the_output_it_feeds_as_drafting_would(pair, ids):
    (target, tok), draft = pair
    prompt, out = output(target, draft, tok)
    v = target.args.vocab_size
    make = lambda: ModelDrafter(draft, v, min_confidence=0.0, head_ids=range(v) if ids == "all" else ids)  # noqa: E731
    d = make()
    d.reset(prompt)
    got = d.propose(prompt + out, 3).hindsight
    assert got == ("model", drafted(make, prompt + out, OUT))
    if ids != [0, 1, 2]:  # the full head decides every step: the draft's own continuation, then the target's
        assert got[1] == expected(draft, prompt + out, OUT) and all(got[1][: OUT // 2]) and not all(got[1])
    assert d.propose(prompt + out + [5], 3).hindsight is None  # caught up: nothing sat out to judge


def test_nothing_is_judged_under_sampling_or_on_a_short_catch_up(pair):
    (target, tok), draft = pair
    prompt, out = output(target, draft, tok)
    v = target.args.vocab_size
    d = ModelDrafter(draft, v, min_confidence=0.0)
    d.reset(prompt)
    assert d.propose(prompt + out, 2, probs_fn=lambda logits: mx.softmax(logits)).hindsight is None
    d = ModelDrafter(draft, v, min_confidence=0.0)
    d.reset(prompt)
    assert d.propose(prompt + out[: HINDSIGHT_MIN - 1], 2).hindsight is None  # the prompt itself is never judged


class Fixed(Drafter):
    """A free source that proposes the given tokens."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens = tokens

    def sources(self, context):
        return {self.name: len(self.tokens)}

    def propose(self, context, k, probs_fn=None, source=None):
        return Draft(self.tokens[:k])

    def free_sources(self):
        return {self.name}


def test_a_joined_draft_judges_only_verified_output(pair):
    (target, tok), draft = pair
    prompt, out = output(target, draft, tok)
    v = target.args.vocab_size
    h = HybridDrafter(NGramDrafter(), ModelDrafter(draft, v, min_confidence=0.0), [Fixed([7, 8, 9])])
    h.reset(prompt)
    got = h.propose(prompt + out, 5, source="fixed+model").hindsight
    assert got == ("model", expected(draft, prompt + out, OUT))  # not the unverified 7, 8, 9


def test_the_replay_drafts_rounds_of_k_max():
    p = Policy(3)
    p.hindsight("model", [True, True, True, True, False, True])
    s = p.stats("model")  # rounds: 3 of 3 accepted; then [T, F]: 0 of 2 (the T is the target's); then 1 of 1
    assert (s.rounds, s.proposed, s.accepted, s.judged, s.first_judged, s.first_accepted) == (3, 6, 4, 5, 3, 2)


def test_a_good_hindsight_turns_drafting_back_on_and_a_bad_one_keeps_it_off():
    def failed_early():
        p = Policy(6)
        p.update("", 0, 0, 0.5, 0.0)
        p.seed("model", 0.1, 0.005)
        for _ in range(3):  # early rejections: the draft is switched off
            p.update("model", 1, 0, 0.55, 0.1)
        p.update("", 0, 0, 0.5, 0.0)
        return p

    p = failed_early()
    assert p.choose({"model": 6}, 100, {"model": 0}) == ("", 0)
    p.hindsight("model", [True] * 30 + [False] + [True] * 30)
    src, k = p.choose({"model": 6}, 100, {"model": 0})
    assert src == "model" and k >= 4
    p = failed_early()
    p.hindsight("model", [True] + [False] * 40)  # first tokens rejected round after round
    assert p.choose({"model": 6}, 100, {"model": 0}) == ("", 0)


class PlainThenModel(Policy):
    """Plain steps for the first `wait` rounds, then drafts of 2 from the model."""

    def __init__(self, wait):
        super().__init__(2)
        self.wait, self.seen = wait, []

    def choose(self, offers, limit, lags=None):
        return ("", 0) if self.rounds < self.wait else ("model", min(2, limit))

    def hindsight(self, source, matches):
        self.seen.append((source, list(matches)))
        super().hindsight(source, matches)


def test_the_engine_hands_the_hindsight_to_the_policy_and_stays_lossless(pair):
    (target, tok), draft = pair
    prompt = tok.encode(PROMPTS[1])
    policy, stats = PlainThenModel(6), Stats(trace=[])
    d = ModelDrafter(draft, target.args.vocab_size, min_confidence=0.0)
    out = [s.token for s in speculative_generate_step(prompt, target, d, max_tokens=20, policy=policy, stats=stats)]
    assert out == plain_greedy(target, prompt, 20)
    assert [(s, len(m)) for s, m in policy.seen] == [("model", 6)]  # the 6 plain steps' tokens, judged once
    assert stats.trace[6]["hindsight"] == [sum(policy.seen[0][1]), 6]


def test_where_the_subset_is_unsure_the_full_head_judges(pair):
    """The subset lacks every position's best token: no position is sure, so each is judged on the full head,
    as the drafting step would (the subset's best would be a token the draft never drafts there)."""
    (target, tok), draft = pair
    x = mx.array([tok.encode(PROMPTS[0])])
    full = mx.argmax(draft(x)[0], axis=-1).tolist()
    v = target.args.vocab_size
    d = ModelDrafter(draft, v, head_ids=[t for t in range(v) if t not in set(full)])
    assert d._head_choice(draft.model(x)[0])[0] == full
