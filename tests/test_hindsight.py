"""Hindsight: a draft model that catches up on output it sat out judges it, and the planner learns from every token."""

import mlx.core as mx
import pytest
from test_speculative import PROMPTS, plain_greedy

from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.gen.planner import PLAIN, Plan, Planner
from mlx_spec.gen.sampling import Sampler
from mlx_spec.gen.tunables import HINDSIGHT_MIN
from mlx_spec.named import load_model

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
        flags.append(d.propose(context[:i], 1).tokens.tolist() == [context[i]])
    return flags


def judged(draft):
    """The hindsight of a Draft, read: whether each judged token was the drafter's prediction, or None."""
    if draft.hindsight is None:
        return None
    predictions, tokens = draft.hindsight
    return [p == t for p, t in zip(predictions.tolist(), tokens)]


@pytest.mark.parametrize("ids", [None, "all", [0, 1, 2]])  # the full head; a subset head, exact; a small subset
def test_a_catch_up_judges_the_output_it_feeds_as_drafting_would(pair, ids):
    (target, tok), draft = pair
    prompt, out = output(target, draft, tok)
    v = target.args.vocab_size
    make = lambda: ModelDrafter(draft, v, head_ids=range(v) if ids == "all" else ids)  # noqa: E731
    d = make()
    d.reset(prompt)
    got = judged(d.propose(prompt + out, 3))
    if ids != [0, 1, 2]:  # the full head decides every step: the draft's own continuation, then the target's
        assert got == drafted(make, prompt + out, OUT)
        assert got == expected(draft, prompt + out, OUT) and all(got[: OUT // 2]) and not all(got)
    else:  # judged on the subset it had before the catch-up: the output it feeds never credits itself
        known = {0, 1, 2} | set(prompt)
        assert any(t not in known for t in out)
        assert all(t in known for t, ok in zip(out, got) if ok)
    assert d.propose(prompt + out + [5], 3).hindsight is None  # caught up: nothing sat out to judge


def test_nothing_is_judged_under_sampling_or_on_a_short_catch_up(pair):
    (target, tok), draft = pair
    prompt, out = output(target, draft, tok)
    v = target.args.vocab_size
    d = ModelDrafter(draft, v)
    d.reset(prompt)
    assert d.propose(prompt + out, 2, Sampler(temp=1.0)).hindsight is None
    d = ModelDrafter(draft, v)
    d.reset(prompt)
    assert d.propose(prompt + out[: HINDSIGHT_MIN - 1], 2).hindsight is None  # the prompt itself is never judged


class PlainThenModel(Planner):
    """Plain steps for the first `wait` rounds, then drafts of 2 from the model; keeps the hindsight it is told."""

    def __init__(self, wait):
        super().__init__()
        self.wait, self.rounds, self.seen = wait, 0, []

    def plan(self, asks, places=None, pad=False, queued=False):
        self.rounds += 1
        k = min(2, asks[0].cap)
        return PLAIN if self.rounds <= self.wait or not k else Plan(k, ("model",), k + 1)

    def record(self, plan, places, seconds, outcomes, warm=True, asks=()):
        self.seen += [(o.source, list(o.hindsight[0])) for o in outcomes if o.hindsight is not None]
        super().record(plan, places, seconds, outcomes, warm, asks)


def test_the_engine_hands_the_hindsight_to_the_planner_and_stays_lossless(pair):
    (target, tok), draft = pair
    prompt = tok.encode(PROMPTS[1])
    planner, stats = PlainThenModel(6), Stats(trace=[])
    d = ModelDrafter(draft, target.args.vocab_size)
    out = [s.token for s in speculative_generate_step(prompt, target, d, max_tokens=20, planner=planner, stats=stats)]
    assert out == plain_greedy(target, prompt, 20)
    # The output of the 6 plain rounds before, judged once, in the round whose catch-up fed it with the prompt (the
    # plain step queued ahead of it became that round's first position).
    first = next(i for i, r in enumerate(stats.trace) if r["proposed"])
    assert [(s, len(m)) for s, m in planner.seen] == [("model", first)] and first == 6
    assert stats.trace[first]["hindsight"] == [sum(planner.seen[0][1]), first]
    assert stats.trace[first]["behind"] == len(prompt) - 1 + first
