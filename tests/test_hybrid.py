"""The hybrid: its context sources in order (a suffix match before an n-gram), its model source, the registry's
build, and the suffix memory."""

import pytest
from test_speculative import plain_greedy, spec

from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter, SuffixMemory
from mlx_spec.gen.registry import build
from mlx_spec.named import load_model

REPEAT = "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n    return a"


@pytest.fixture(scope="module")
def pair(tiny_models):
    return load_model(str(tiny_models["qwen2"]))[:2], load_model(str(tiny_models["qwen2_draft"]))[0]


def hybrid(model, draft):
    return HybridDrafter([SuffixDrafter(), NGramDrafter()], ModelDrafter(draft, model.args.vocab_size))


def test_the_suffix_offers_before_the_ngram_and_the_ngram_where_the_suffix_has_no_match(pair):
    """In the engine the first context source with a draft offers it: where the context repeats a long stretch the
    suffix drafts and the n-gram is never asked (so it is judged only where it could be chosen)."""
    (model, tok), draft = pair
    prompt = tok.encode(REPEAT) * 2
    out, stats = spec(model, prompt, hybrid(model, draft), max_tokens=30, num_draft=8, adaptive=False)
    assert out == plain_greedy(model, prompt, 30)
    sources = [r["source"] for r in stats.trace if r["proposed"]]
    assert sources[0] == "suffix" and "model" not in sources[: sources.index("suffix") + 1]
    short = [5, 6, 7, 8, 5, 6]  # a match of 2 for the n-gram's bigram and the suffix alike; 5, 6 -> 7
    d = hybrid(model, draft)
    assert d.parts[0].propose(short, 4).tokens.tolist() and d.parts[1].propose(short, 4).tokens.tolist()
    unseen = [5, 6, 7, 8, 5]  # the suffix needs a match of 2; the n-gram's bigram key (5,) has one
    assert not d.parts[0].propose(unseen, 4).tokens.tolist() and d.parts[1].propose(unseen, 4).tokens.tolist() == [
        6,
        7,
        8,
        5,
    ]


def test_where_no_context_source_drafts_the_model_does(pair):
    (model, tok), draft = pair
    prompt = tok.encode("The quick brown fox")
    d = hybrid(model, draft)
    out, stats = spec(model, prompt, d, max_tokens=12, num_draft=3, adaptive=False)
    assert out == plain_greedy(model, prompt, 12)
    assert {r["source"] for r in stats.trace if r["proposed"]} >= {"model"}
    assert d.propose(prompt, 3).source == "model"  # outside the engine: the first part with a draft


@pytest.mark.parametrize("stop_at", [2, 9, 17])
def test_eos_and_max_tokens_inside_long_suffix_drafts(pair, stop_at):
    (model, tok), draft = pair
    prompt = tok.encode(REPEAT) * 2
    ref = plain_greedy(model, prompt, 40)
    eos = ref[stop_at]
    out, _ = spec(model, prompt, hybrid(model, draft), max_tokens=40, eos_token_ids=[eos], num_draft=24, adaptive=False)
    assert out == ref[: ref.index(eos) + 1]
    out, _ = spec(model, prompt, hybrid(model, draft), max_tokens=stop_at, num_draft=24, adaptive=False)
    assert out == ref[:stop_at]


def test_registry_hybrid_is_suffix_then_ngram_then_its_fallback(pair):
    (model, tok), _ = pair
    d = build("hybrid", model, tok)
    assert [type(x) for x in d.parts] == [SuffixDrafter, NGramDrafter, SelfDrafter]
    assert [x.free for x in d.parts] == [True, True, False]


def test_memory_drafts_from_an_earlier_output():
    memory = SuffixMemory()
    earlier = [5, 6, 7, 8, 9, 10, 11]
    d = SuffixDrafter(memory=memory)
    d.reset([1, 2, 3])
    d.propose([1, 2, 3] + earlier, 4)  # the index grows with the context
    d.reset([4, 4])  # the next request: the last output joins the memory
    assert memory.index.tokens == earlier + [-1]
    assert d.propose([4, 4, 6, 7], 3).tokens.tolist() == [8, 9, 10]
    assert SuffixDrafter().propose([4, 4, 6, 7], 3).tokens.tolist() == []  # without a memory, nothing to copy
    assert d.propose([4, 4, 10, 11], 3).tokens.tolist() == []  # never across the separator


def test_memory_keeps_its_newer_half():
    memory = SuffixMemory(max_tokens=20)
    for start in range(0, 40, 5):
        memory.add(list(range(100 + start, 105 + start)))
    assert len(memory.index.tokens) <= 20 and memory.index.tokens[-6:] == list(range(135, 140)) + [-1]


def test_the_engine_expects_a_costly_source_s_step_at_its_weights_share_of_the_target_s(pair):
    """A draft model's step, and a layer view's, are expected to cost the share of the target's weights they read a
    token (the planner's prior for them until timed); lookups read no weights and get none."""
    from mlx_spec.gen.planner import Planner
    from mlx_spec.models.base import params_bytes as nbytes

    class Told(Planner):  # keeps the shares its rows' asks carried (a lookup's carries none)
        def __init__(self):
            super().__init__()
            self.shares = {}

        def plan(self, asks, *args):
            self.shares.update({a.costly: a.share for a in asks if a.costly})
            return super().plan(asks, *args)

    (model, tok), draft = pair
    for drafter, share in (
        (hybrid(model, draft), nbytes(draft) / nbytes(model)),
        (SelfDrafter(model, [0, 1], model.args.vocab_size), None),
    ):
        p = Told()
        spec(model, tok.encode("The quick brown fox"), drafter, max_tokens=4, planner=p)
        if share is None:  # two of the target's four blocks, with its embedding and head
            assert set(p.shares) == {"self"} and 0.5 < p.shares["self"] < 1
        else:
            assert p.shares == {"model": pytest.approx(share)} and share < 1
