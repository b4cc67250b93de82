"""The model drafter's confidence stop: it stops after an unsure token, and proposes that token."""

import mlx.core as mx
import pytest

from mlx_spec.gen.drafters.model import ModelDrafter
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
