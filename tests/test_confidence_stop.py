"""The model drafter's stops: after an unsure token (which it proposes), and where one more token would not pay."""

import mlx.core as mx
import pytest

from mlx_spec.gen.drafters.model import ModelDrafter, pays_to_go_on
from mlx_spec.gen.engine import speculative_generate_step
from mlx_spec.gen.policy import Policy
from mlx_spec.named import load_model

from test_speculative import PROMPTS

K = 6


@pytest.fixture(scope="module")
def draft(tiny_models):
    return load_model(str(tiny_models["qwen2_draft"]))[:2]


def reference(model, context):
    """The K greedy draft tokens after `context` and the draft's probability of each (no stop)."""
    tokens = ModelDrafter(model, model.args.vocab_size, min_confidence=0.0).propose(context, K).tokens
    assert len(tokens) == K
    probs = mx.softmax(model(mx.array([context + tokens[:-1]]))[0, -K:].astype(mx.float32), axis=-1)
    assert mx.argmax(probs, axis=-1).tolist() == tokens  # greedy drafts are the draft's argmax
    return tokens, [probs[i, t].item() for i, t in enumerate(tokens)]


@pytest.mark.parametrize("text", PROMPTS[:3])
def test_the_draft_ends_with_the_first_unsure_token(draft, text):
    model, tok = draft
    context = tok.encode(text)
    tokens, conf = reference(model, context)
    order = sorted(conf)
    j = conf.index(order[0])  # the only token below the threshold
    threshold = (order[0] + order[1]) / 2
    d = ModelDrafter(model, model.args.vocab_size, min_confidence=threshold)
    # An older rule dropped the unsure token (tokens[:j]) and never stopped at the first one.
    assert d.propose(context, K).tokens == tokens[: j + 1]
    assert d.fed_total == len(context) + j  # one pass per proposed token: the unsure one's pass is not wasted


def test_a_sure_only_drafter_proposes_one_token_for_one_pass(draft):
    model, tok = draft
    context = tok.encode(PROMPTS[0])
    tokens, _ = reference(model, context)
    d = ModelDrafter(model, model.args.vocab_size, min_confidence=1.0)  # nothing is that sure
    assert d.propose(context, K).tokens == tokens[:1]
    assert d.fed_total == len(context)  # no second pass whose token is thrown away


def test_a_priced_draft_ends_where_one_more_token_would_not_pay(draft):
    model, tok = draft
    context = tok.encode(PROMPTS[1])
    tokens, conf = reference(model, context)
    m = 3
    # Verifying up to m drafts costs so much that the draft steps hardly count; a larger pass costs a million
    # times more: the round's rate only falls at the (m+1)-th token, whatever the confidences and the step time.
    reach = 1.0
    for c in conf[:m]:
        reach *= c
    big = 1e3 / reach
    d = ModelDrafter(model, model.args.vocab_size, min_confidence=0.0)
    d.price(lambda k: big if k <= m else big * 1e6)
    assert d.propose(context, K).tokens == tokens[:m]  # unpriced (the code before): all K
    d.price(None)  # fixed-K decoding: not cut
    assert d.propose(context, K).tokens == tokens


def test_the_cost_rule_drafts_longer_where_a_draft_step_is_cheap():
    flat = lambda k: 0.7  # noqa: E731  (a verify pass padded to one size)
    # Four drafts at 0.8 each: the fifth, as sure as the fourth, pays for a step at a tenth of a target step...
    reach, expected = 0.8 ** 4, 1 + sum(0.8 ** i for i in range(1, 5))
    assert pays_to_go_on(4, 0.8, reach, expected, flat, step=0.05)
    # ... but not for one at a third of a target step (the 0.5B's on this CPU)
    assert not pays_to_go_on(4, 0.8, reach, expected, flat, step=0.17)
    # and a sure draft goes on there too, while verify costs unknown never cut a draft
    assert pays_to_go_on(4, 0.999, 0.996, 4.99, flat, step=0.17)
    assert pays_to_go_on(4, 0.1, 1e-4, 1.1, lambda k: None, step=0.17)


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_engine_prices_a_drafter_only_when_it_adapts(draft, tiny_models, adaptive):
    model, tok = draft
    target = load_model(str(tiny_models["qwen2"]))[0]
    d = ModelDrafter(model, model.args.vocab_size)
    policy = Policy(K, adaptive=adaptive)
    list(speculative_generate_step(tok.encode(PROMPTS[0]), target, d, max_tokens=4, policy=policy))
    if adaptive:  # the policy's measured verify seconds (a plain step is timed first)
        assert d.verify_cost == policy.verify_seconds and d.verify_cost(0) == policy.verify[0]
    else:  # fixed K: mlx-lm's rule, drafts are not cut to cost
        assert d.verify_cost is None
