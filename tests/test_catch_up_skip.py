"""A draft model that sat out a long copy reads only its last tokens when it catches up, and stays consistent."""

import pytest

from mlx_spec.gen.drafters.model import CATCH_UP_WINDOW, ModelDrafter
from mlx_spec.named import load_model

from test_speculative import PROMPTS, plain_greedy

K = 4


@pytest.fixture(scope="module")
def pair(tiny_models):
    return load_model(str(tiny_models["qwen2"]))[:2], load_model(str(tiny_models["qwen2_draft"]))[0]


def greedy(model, seq, k):
    """The model's k greedy tokens after reading exactly `seq` (no cache tricks): the reference."""
    return plain_greedy(model, list(seq), k)


def copy_reply(tok):
    """A prompt and a reply whose first 60 tokens copy the prompt (as the suffix source drafts a docstring), then 3
    tokens of its own."""
    prompt = tok.encode(" ".join(PROMPTS[:4]))
    assert len(prompt) > 70
    return prompt, prompt[5:65] + [7, 8, 9]


def test_a_long_copy_it_sat_out_is_left_out_but_its_last_tokens(pair):
    (_, tok), draft = pair
    prompt, reply = copy_reply(tok)
    d = ModelDrafter(draft, draft.args.vocab_size, min_confidence=0.0)
    d.reset(prompt)
    context = prompt + reply
    lag = d.lag("model", context)
    got = d.propose(context, K)
    fed = len(prompt) + CATCH_UP_WINDOW + 1  # all but the context's last token: the prompt, then the window
    assert lag == fed - 1 and got.catch_up_tokens == lag  # the policy is told what it will feed, not the copy
    assert d.fed_total == fed - 1 + K  # the window and its drafts; the copy's other 46 tokens are never read
    # what it drafts is the draft model's greedy continuation of what it read: the prompt, then the window
    seen = prompt + context[len(context) - 1 - CATCH_UP_WINDOW:]
    assert got.tokens == greedy(draft, seen, K)
    assert d.cache[0].offset == len(seen) + K - 1  # the cache holds what it read, and the drafts but the last


def test_output_that_does_not_repeat_the_context_is_read_whole(pair):
    (_, tok), draft = pair
    prompt, _ = copy_reply(tok)
    new = [(7 * i + 3) % 300 + 10 for i in range(60)]  # not a repeat of the prompt
    d = ModelDrafter(draft, draft.args.vocab_size, min_confidence=0.0)
    d.reset(prompt)
    got = d.propose(prompt + new, K)
    assert got.catch_up_tokens == len(prompt) + len(new) - 1
    assert got.tokens == greedy(draft, prompt + new, K)


@pytest.mark.parametrize("cut", [20, 55, 5])  # inside the gap, after it (a rejected draft), inside the prompt
def test_rewinding_into_around_or_before_a_gap_keeps_the_cache_what_it_read(pair, cut):
    (_, tok), draft = pair
    prompt, reply = copy_reply(tok)
    d = ModelDrafter(draft, draft.args.vocab_size, min_confidence=0.0)
    d.reset(prompt)
    context = prompt + reply
    d.propose(context, K)
    a, b = len(prompt), len(context) - 1 - CATCH_UP_WINDOW  # the gap it left
    at = cut if cut == 5 else len(prompt) + cut  # where a new context (a new turn, or the verified output) departs
    other = context[:at] + [11, 12, 13]
    got = d.propose(other, K)
    held = other[: min(at, a)] + (other[b:at] if at > b else [])  # the cache keeps what it read before `at`
    seen = held + other[at:]
    assert got.tokens == greedy(draft, seen, K)


def test_copies_and_rejections_in_turn_keep_every_draft_the_greedy_continuation_of_what_it_read(pair):
    (_, tok), draft = pair
    prompt, _ = copy_reply(tok)
    d = ModelDrafter(draft, draft.args.vocab_size, min_confidence=0.0)
    d.reset(prompt)
    c1 = prompt + [7]
    d1 = d.propose(c1, K).tokens
    assert d1 == greedy(draft, c1, K)
    # two drafts accepted, a bonus token, then a 51-token copy of the prompt it sits out
    c2 = c1 + d1[:2] + [9] + prompt[5:56]
    b2 = len(c2) - 1 - CATCH_UP_WINDOW
    read = c1 + d1[:2] + c2[b2:]
    d2 = d.propose(c2, K).tokens
    assert d2 == greedy(draft, read, K)
    # the verifier rejects in the window: the last 3 context tokens replaced by 2 others
    c3 = c2[:-3] + [11, 12]
    read = read[:-3] + [11, 12]
    d3 = d.propose(c3, K).tokens
    assert d3 == greedy(draft, read, K)
    # a second copy, of another part of the prompt
    c4 = c3 + prompt[10:60]
    read = read + c4[len(c4) - 1 - CATCH_UP_WINDOW:]
    assert d.propose(c4, K).tokens == greedy(draft, read, K)
    assert len(d._gaps) == 2 and d.cache[0].offset == d._held(len(d._fed))
