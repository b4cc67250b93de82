"""The vocabulary-subset draft head: the same logits on its rows, drafts only of its tokens, lossless drafts."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import PROMPTS, close, plain_greedy, spec

from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.registry import build, head_ids
from mlx_spec.models.head import SubsetHead
from mlx_spec.named import load_model


@pytest.fixture(scope="module")
def models(tiny_models):
    return {k: load_model(str(tiny_models[k]))[:2] for k in ("qwen2", "qwen2_draft", "llama")}


@pytest.mark.parametrize("name", ["qwen2", "llama"])  # a tied head and an lm_head
@pytest.mark.parametrize("quantized", [False, True])
def test_subset_rows_equal_the_full_head(models, name, quantized):
    model, _ = models[name]
    if quantized:
        import copy

        model = copy.deepcopy(model)
        nn.quantize(model, group_size=32, bits=8)
    assert SubsetHead.supports(model)
    head = SubsetHead(model, [5, 1, 200, 7])
    head.add([9, 5, 3])
    assert head.size == 6
    h = model.model(mx.array([[3, 4, 5]]))[0, -1]
    full = model(mx.array([[3, 4, 5]]))[0, -1]
    assert close(head.subset(h), full[head.ids()])
    assert close(head.full(h), full)


def test_a_model_whose_output_is_not_its_head_keeps_the_full_head(models):
    model, _ = models["qwen2"]

    class Scaled(type(model)):  # a soft-capped or scaled output, like some architectures have
        def __call__(self, inputs, cache=None, **kw):
            return 2.0 * super().__call__(inputs, cache=cache, **kw)

    scaled = Scaled(model.args)
    scaled.update(model.parameters())
    assert not SubsetHead.supports(scaled)
    assert ModelDrafter(scaled, model.args.vocab_size, head_ids=[1, 2]).head is None


@pytest.mark.parametrize("ids", [range(320), [0, 1, 2]])  # every token (never unsure of a missing one), and few
def test_greedy_drafts_with_a_subset_head_are_lossless(models, ids):
    model, tok = models["qwen2"]
    v = model.args.vocab_size
    for make in (
        lambda: ModelDrafter(models["qwen2_draft"][0], v, head_ids=ids),
        lambda: SelfDrafter(model, [0, 3], v, head_ids=ids),
    ):
        for text in PROMPTS:
            prompt = tok.encode(text)
            d = make()
            out, stats = spec(model, prompt, d, max_tokens=30, num_draft=4, adaptive=False)
            assert out == plain_greedy(model, prompt, 30)
            assert stats.proposed > 0 and d.subset


def test_a_full_subset_drafts_what_the_full_head_drafts(models):
    model, tok = models["qwen2"]
    v = model.args.vocab_size
    prompt = tok.encode(PROMPTS[0])
    drafts = []
    for ids in (None, range(v)):
        d = ModelDrafter(models["qwen2_draft"][0], v, head_ids=ids)
        d.reset(prompt)
        drafts.append(d.propose(prompt, 6).tokens.tolist())
    assert drafts[0] == drafts[1] and len(drafts[0]) == 6


def test_a_tiny_subset_drafts_only_its_own_and_the_contexts_tokens(models):
    model, tok = models["qwen2"]
    v = model.args.vocab_size
    prompt = tok.encode(PROMPTS[1])
    d = ModelDrafter(models["qwen2_draft"][0], v, head_ids=[0, 1])
    d.reset(prompt)
    full = ModelDrafter(models["qwen2_draft"][0], v)
    full.reset(prompt)
    drafted, unrestricted = d.propose(prompt, 6).tokens.tolist(), full.propose(prompt, 6).tokens.tolist()
    assert set(drafted) <= {0, 1} | set(prompt) and not set(unrestricted) <= {0, 1} | set(prompt)


def test_registry_gives_model_and_self_drafters_the_calibration_subset(models):
    model, tok = models["qwen2"]
    ids = head_ids(tok, len(tok.get_vocab()))
    assert len(ids) > 50 and all(0 <= i < len(tok.get_vocab()) for i in ids)
    assert build("self", model, tok).head.size >= len(ids) and build("self", model, tok).subset
    assert not build("self", model, tok, subset_head=False).subset
    assert build("hybrid", model, tok).parts[-1].subset
