"""A first-L self draft hands its first blocks' work to the verify pass: lossless, and only where it applies."""

import mlx.core as mx
import pytest

from mlx_spec.gen.cache import cache_tokens, new_cache
from mlx_spec.gen.drafters.base import Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.engine import speculative_generate_step

from conftest import PROMPTS, V, check, plain_greedy, spec, tiny
from test_hybrid import REPEAT, Joined


def reset_on(model, drafter, prompt):
    cache = new_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    drafter.reset(prompt, cache)
    return cache


def test_reuse_only_for_the_first_blocks(tiny_target):
    model, tok = tiny_target
    prompt = tok.encode(PROMPTS[0])
    v = model.args.vocab_size
    for layers, n in (([0, 1], 2), ([0], 1), ([0, 3], 0), ([1, 2], 0), ([0, 1, 2, 3], 0)):
        d = SelfDrafter(model, layers, v)
        reset_on(model, d, prompt)
        assert d.reuse_n == n, layers


@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_with_reuse_equals_plain(tiny_target, k):
    model, tok = tiny_target
    for text in PROMPTS + [REPEAT]:
        prompt = tok.encode(text)
        d = SelfDrafter(model, [0, 1], model.args.vocab_size, min_confidence=0.0)
        gen = speculative_generate_step(prompt, model, d, max_tokens=40, num_draft=k, adaptive=False)
        out = [s.token for s in gen]
        assert out == plain_greedy(model, prompt, 40), text
        assert d.reused > 0


def test_a_draft_that_drops_the_handover_is_still_lossless(tiny_target):
    """The engine rewinds entries a drafter left in the target cache without a verify pass to use them."""
    model, tok = tiny_target

    class Strip(Drafter):
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def reset(self, prompt, target_cache=None):
            self.inner.reset(prompt, target_cache)

        def propose(self, context, k, probs_fn=None, source=None):
            draft = self.inner.propose(context, k, probs_fn)
            draft.verify = None
            return draft

    prompt = tok.encode(PROMPTS[0])
    d = SelfDrafter(model, [0, 1], model.args.vocab_size, min_confidence=0.0)
    out, _ = spec(model, prompt, Strip(d), max_tokens=30, num_draft=4, adaptive=False)
    assert out == plain_greedy(model, prompt, 30) and d.reused > 0


def test_joined_suffix_then_first_blocks_is_lossless(tiny_target):
    model, tok = tiny_target
    Joined.chosen = 0
    prompt = tok.encode(REPEAT)
    self_d = SelfDrafter(model, [0, 1], model.args.vocab_size, min_confidence=0.0)
    d = HybridDrafter(NGramDrafter(), self_d, [SuffixDrafter()], fallback_k=3)
    out, _ = spec(model, prompt, d, max_tokens=40, policy=Joined(8, adaptive=False))
    assert out == plain_greedy(model, prompt, 40) and Joined.chosen > 0 and self_d.reused > 0


def test_the_cache_is_consistent_after_each_generation(tiny_target):
    model, tok = tiny_target
    prompt = tok.encode(PROMPTS[2])
    cache = new_cache(model)
    d = SelfDrafter(model, [0, 1], model.args.vocab_size, min_confidence=0.0)
    out = [s.token for s in speculative_generate_step(prompt, model, d, prompt_cache=cache, max_tokens=17,
                                                      num_draft=5, adaptive=False)]
    assert cache_tokens(cache) == len(prompt) + len(out) - 1


def test_sampling_with_reuse_keeps_the_target_law():
    target = tiny(1, 3.0, layers=2)
    ok, stat, crit = check(target, SelfDrafter(target, [0], V, min_confidence=0.0), dict(temp=1.0))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_a_model_that_does_not_split_keeps_the_plain_verify(tiny_target):
    """A model whose inner forward transforms its input embeddings (as Gemma scales them) cannot be split."""
    import copy

    model, tok = tiny_target

    class Doubling(type(model.model)):
        def __call__(self, inputs, cache=None, input_embeddings=None):
            h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
            return super().__call__(inputs, cache, input_embeddings=2.0 * h)

    odd = copy.copy(model)
    odd.model = copy.copy(model.model)
    odd.model.__class__ = Doubling
    d = SelfDrafter(odd, [0, 1], model.args.vocab_size)
    reset_on(odd, d, tok.encode(PROMPTS[1]))
    assert d.reuse_n == 0
    d = SelfDrafter(model, [0, 1], model.args.vocab_size)
    reset_on(model, d, tok.encode(PROMPTS[1]))
    assert d.reuse_n == 2
