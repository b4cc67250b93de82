"""The hybrid's suffix source, its suffix draft continued by the model in the same round, and the suffix memory."""

import mlx.core as mx
import pytest

from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter, SuffixMemory
from mlx_spec.gen.engine import speculative_generate_step
from mlx_spec.gen.policy import Policy
from mlx_spec.gen.registry import DEFAULT_K, build
from mlx_spec.gen.sampling import make_probs_fn
from mlx_spec.named import load_model

from test_sampling import PROMPT, SAMPLES, V, chi_square_pvalue_ok, exact_joint, sample_pairs, tiny
from test_speculative import plain_greedy, spec

REPEAT = "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n    return a"


@pytest.fixture(scope="module")
def pair(tiny_models):
    return load_model(str(tiny_models["qwen2"]))[:2], load_model(str(tiny_models["qwen2_draft"]))[0]


class Joined(Policy):
    """A policy that always takes a joined source (cheap draft + model) when one is offered."""

    chosen = 0

    def choose(self, offers, limit, lags=None):
        joined = [s for s in offers if "+" in s]
        if joined and min(limit, self.k_max) > 0:
            Joined.chosen += 1
            return joined[0], min(offers[joined[0]], limit, self.k_max)
        return super().choose(offers, limit, lags)


def hybrid(model, draft, fallback_k=3):
    v = model.args.vocab_size
    return HybridDrafter(NGramDrafter(), ModelDrafter(draft, v, min_confidence=0.0), [SuffixDrafter()],
                         fallback_k=fallback_k)


def test_sources_include_the_suffix_and_the_joined_draft(pair):
    (model, tok), draft = pair
    context = tok.encode(REPEAT)
    d = hybrid(model, draft)
    d.reset(context)
    offers = d.sources(context)
    suffix_n = SuffixDrafter().sources(context)["suffix"]
    assert offers["suffix"] == suffix_n and offers["model"] == 3 and offers["suffix+model"] == suffix_n + 3


def test_the_ngram_is_offered_only_where_the_suffix_has_no_match(pair):
    (model, tok), draft = pair
    d = hybrid(model, draft)
    copying = tok.encode(REPEAT)
    d.reset(copying)
    assert "suffix" in d.sources(copying) and "ngram" not in d.sources(copying)
    assert NGramDrafter().sources(copying)  # the n-gram alone would have offered
    short = [5, 6, 7, 8, 5]  # only the last token was seen before: a match of 1, too short for the suffix
    d.reset(short)
    assert set(d.sources(short)) == {"ngram", "model"}
    free = HybridDrafter(NGramDrafter(), ModelDrafter(draft, model.args.vocab_size))  # no suffix: the n-gram always
    free.reset(copying)
    assert "ngram" in free.sources(copying)


def test_a_joined_draft_is_the_suffix_draft_then_the_model_continuing_it(pair):
    (model, tok), draft = pair
    context = tok.encode(REPEAT)
    d = hybrid(model, draft)
    d.reset(context)
    head = SuffixDrafter().propose(context, 24).tokens
    joined = d.propose(context, len(head) + 3, None, "suffix+model").tokens
    alone = ModelDrafter(draft, model.args.vocab_size, min_confidence=0.0)
    alone.reset(context)
    assert joined == head + alone.propose(context + head, 3).tokens and len(joined) == len(head) + 3
    d.feedback("suffix+model", len(joined), len(head) + 1)  # split: suffix all accepted, model 1 of 3


def test_joined_rounds_are_lossless(pair):
    (model, tok), draft = pair
    Joined.chosen = 0
    for text in (REPEAT, REPEAT + " + b\ndef mul(a, b):\n"):
        prompt = tok.encode(text)
        d = hybrid(model, draft)
        out, stats = spec(model, prompt, d, max_tokens=40, policy=Joined(8, adaptive=False))
        assert out == plain_greedy(model, prompt, 40)
    assert Joined.chosen > 0


@pytest.mark.parametrize("stop_at", [2, 9, 17])
def test_eos_and_max_tokens_inside_long_joined_drafts(pair, stop_at):
    (model, tok), draft = pair
    prompt = tok.encode(REPEAT)
    ref = plain_greedy(model, prompt, 40)
    eos = ref[stop_at]
    out, _ = spec(model, prompt, hybrid(model, draft), max_tokens=40, eos_token_ids=[eos],
                  policy=Joined(24, adaptive=False))
    assert out == ref[: ref.index(eos) + 1]
    out, _ = spec(model, prompt, hybrid(model, draft), max_tokens=stop_at, policy=Joined(24, adaptive=False))
    assert out == ref[:stop_at]


def test_registry_hybrid_has_the_suffix_source_and_caps_the_model(pair):
    (model, tok), _ = pair
    d = build("hybrid", model, tok)
    cap = DEFAULT_K["self"]
    assert [x.name for x in d.extra] == ["suffix"] and d.fallback_k == cap
    offers = d.sources(tok.encode(REPEAT))
    assert offers["self"] == cap and offers["suffix+self"] == offers["suffix"] + cap


class OneToken(Drafter):
    """A cheap source that always proposes token 0, once."""

    name = "one"

    def sources(self, context):
        return {self.name: 1}

    def propose(self, context, k, probs_fn=None, source=None):
        return Draft([0][:k])

    def free_sources(self):
        return {self.name}


def test_joined_sampling_keeps_the_target_law():
    """K=2 from 'one+model': a deterministic token, then a sampled draft-model token, under speculative sampling."""
    target, draft = tiny(1, 3.0), tiny(0, 1.5)
    kw = dict(temp=1.0)
    joint = exact_joint(target, make_probs_fn(**kw))
    lengths = []

    def run():
        d = HybridDrafter(NGramDrafter(), ModelDrafter(draft, V, min_confidence=0.0), [OneToken()])
        policy = Joined(2, adaptive=False)
        out = []
        for s in speculative_generate_step(PROMPT, target, d, max_tokens=3, policy=policy, **kw):
            out.append(s.token)
        lengths.append(d._split)
        return out

    counts = sample_pairs(run, SAMPLES)
    assert set(lengths) == {1}
    ok, stat, crit = chi_square_pvalue_ok(counts, joint, SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_memory_drafts_from_an_earlier_output():
    memory = SuffixMemory()
    earlier = [5, 6, 7, 8, 9, 10, 11]
    d = SuffixDrafter(memory=memory)
    d.reset([1, 2, 3])
    d.propose([1, 2, 3] + earlier, 4)  # the index grows with the context
    d.reset([4, 4])  # the next request: the last output joins the memory
    assert memory.index.tokens == earlier + [-1]
    assert d.propose([4, 4, 6, 7], 3).tokens == [8, 9, 10]
    assert SuffixDrafter().propose([4, 4, 6, 7], 3).tokens == []  # without a memory, nothing to copy
    assert d.propose([4, 4, 10, 11], 3).tokens == []  # never across the separator


def test_memory_keeps_its_newer_half():
    memory = SuffixMemory(max_tokens=20)
    for start in range(0, 40, 5):
        memory.add(list(range(100 + start, 105 + start)))
    assert len(memory.index.tokens) <= 20 and memory.index.tokens[-6:] == list(range(135, 140)) + [-1]
