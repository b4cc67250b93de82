"""Speculation on hybrid and recurrent models: rewinding gated-delta-net and Mamba states is lossless."""

import mlx.core as mx
import pytest
from conftest import PROMPTS, V, check, close, make_model, plain_greedy, randomized, spec, tiny
from mlx_lm.models import mamba2
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec.errors import UnsupportedError
from mlx_spec.gen import recurrent
from mlx_spec.gen.cache import new_cache, rewind
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.self_draft import QuantSelfDrafter, SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.load import vocab_width
from mlx_spec.gen.session import Session
from mlx_spec.models.cache import commit
from mlx_spec.named import load_model

ARCHS = ("qwen3_next", "mamba2", "qwen3_5", "bailing_moe_linear")
# A prompt that stops inside a repeat, so the suffix drafter (which needs a match of 2+ tokens) drafts too.
TEXTS = PROMPTS + ["def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n    return a"]


@pytest.fixture(scope="module")
def recurrent_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("recurrent")
    out = {}
    for arch in ARCHS:
        model, tok, _ = load_model(str(make_model(root / arch, arch, seed=5, scale=4.0)))
        out[arch] = (model, tok)
    return out


@pytest.fixture(scope="module")
def attention_draft(tiny_models):
    return load_model(str(tiny_models["qwen2_draft"]))[0]


def drafters(arch, model, others, attention_draft):
    v = vocab_width(model)
    out = {
        "ngram": lambda: NGramDrafter(),
        "suffix": lambda: SuffixDrafter(),
        "model": lambda: ModelDrafter(attention_draft, v),
        "recurrent-model": lambda: ModelDrafter(others[0], v),  # its own cache is recurrent
        "hybrid": lambda: HybridDrafter([NGramDrafter()], ModelDrafter(others[0], v)),
        "quant-self-int8": lambda: QuantSelfDrafter(model, "int8", v),
    }
    if arch == "mamba2":  # no model.model.layers: the self drafters do not apply (they say so)
        del out["quant-self-int8"]
    return out


_REFERENCE = {}


def reference(arch, model, prompt, n=24):
    """mlx-lm's own greedy loop with its own (untrimmable) caches, once per prompt."""
    key = (arch, tuple(prompt), n)
    if key not in _REFERENCE:
        _REFERENCE[key] = plain_greedy(model, prompt, n)
    return _REFERENCE[key]


# One-token rounds quick on a gated-delta and a Mamba model (qwen3_5 is the first's kind; the conformance suite's quick
# tier drafts on bailing_moe_linear), long rounds (a suffix draft's length) quick on the hybrid only.
QUICK = ("qwen3_next", "mamba2")


@pytest.mark.parametrize(
    "arch,k",
    [(a, 1) if a in QUICK else pytest.param(a, 1, marks=pytest.mark.slow) for a in ARCHS]
    + [("qwen3_next", 16)]
    + [pytest.param(a, 16, marks=pytest.mark.slow) for a in ARCHS if a != "qwen3_next"],
)
def test_greedy_equals_plain_for_every_drafter(recurrent_models, attention_draft, arch, k):
    model, tok = recurrent_models[arch]
    others = [m for a, (m, _) in recurrent_models.items() if a != arch]
    for name, make in drafters(arch, model, others, attention_draft).items():
        rounds = proposed = accepted = 0
        for text in TEXTS if k == 1 else TEXTS[1::2]:  # K=16: prose (early rejections) and the repeat (long accepts)
            prompt = tok.encode(text)
            ref = reference(arch, model, prompt)
            out, stats = spec(model, prompt, make(), max_tokens=24, num_draft=k, adaptive=False)
            assert out == ref, (arch, name, k, text)
            assert stats.fallback is None, stats.fallback
            rounds, proposed, accepted = (
                rounds + stats.spec_rounds,
                proposed + stats.proposed,
                accepted + stats.accepted,
            )
        assert rounds > 0 and proposed > accepted, (arch, name)  # it drafted, and some drafts were rejected


def test_a_broken_rewind_fails_the_same_test(recurrent_models, attention_draft, monkeypatch):
    """Control: restoring the state without running the accepted tokens again changes the output."""
    model, tok = recurrent_models["qwen3_next"]
    monkeypatch.setattr("mlx_spec.models.cache._replay", lambda *a: None)
    prompt = tok.encode(PROMPTS[1])
    out, _ = spec(
        model, prompt, ModelDrafter(attention_draft, vocab_width(model)), max_tokens=24, num_draft=4, adaptive=False
    )
    assert out != reference("qwen3_next", model, prompt)


@pytest.mark.parametrize("arch", ARCHS)
def test_trim_then_regenerate_gives_the_same_tokens(recurrent_models, arch):
    model, tok = recurrent_models[arch]
    prompt = tok.encode(PROMPTS[1])
    cont = plain_greedy(model, prompt, 8)
    cache, runner = new_cache(model), recurrent.recording(model)  # the model's recurrent blocks record their calls
    runner(mx.array(prompt)[None], cache=cache)
    model(mx.array(cont[:0] + [cont[0]])[None], cache=cache)  # a pass of the model itself is not recorded ...
    if arch != "bailing_moe_linear":  # (whose mixer counts no tokens: only the recording view counts them)
        assert not rewind(cache, len(prompt))  # ... so no rewind reaches into it
    cache, runner = new_cache(model), recurrent.recording(model)
    runner(mx.array(prompt)[None], cache=cache)
    runner(mx.array(cont)[None], cache=cache)
    assert rewind(cache, len(prompt) + 3)  # keep 3 of the 8: the recurrent layers run those 3 again
    assert {c.offset for c in cache} == {len(prompt) + 3}
    again = model(mx.array(cont[3:])[None], cache=cache)
    fresh = make_prompt_cache(model)
    model(mx.array(prompt + cont[:3])[None], cache=fresh)
    ref = model(mx.array(cont[3:])[None], cache=fresh)
    assert close(again, ref)
    commit(cache)  # history gone: no rewinding into what was committed
    assert not rewind(cache, len(prompt))


def test_self_subsets_refused_full_self_allowed(recurrent_models):
    model, _ = recurrent_models["qwen3_next"]
    with pytest.raises(UnsupportedError, match="qwen3_next"):
        SelfDrafter(model, [0, 3], vocab_width(model))
    SelfDrafter(model, range(len(model.model.layers)), vocab_width(model))


@pytest.mark.parametrize("arch", ARCHS)
def test_session_turns_equal_fresh_runs(recurrent_models, arch):
    model, tok = recurrent_models[arch]
    session = Session(model, tok, HybridDrafter([NGramDrafter(), SuffixDrafter()]))
    first = tok.encode(PROMPTS[0])
    reply = [e.token for e in session.generate(first, max_tokens=12)]
    assert reply == plain_greedy(model, first, 12)
    second = first + reply + tok.encode(PROMPTS[2])
    again = [e.token for e in session.generate(second, max_tokens=12)]
    assert again == plain_greedy(model, second, 12)
    edited = first[:-3] + tok.encode(PROMPTS[1])  # diverges before the history: the session starts over
    assert [e.token for e in session.generate(edited, max_tokens=12)] == plain_greedy(model, edited, 12)


def tiny_mamba(seed, scale):
    args = mamba2.ModelArgs(
        model_type="mamba2",
        num_heads=2,
        head_dim=32,
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=1,
        layer_norm_epsilon=1e-6,
        conv_kernel=4,
        n_groups=1,
        use_bias=False,
        use_conv_bias=True,
        tie_word_embeddings=True,
        time_step_limit=(0.0, 1000.0),
        time_step_rank="auto",
    )
    return randomized(mamba2.Model, args, seed, scale)


@pytest.mark.slow  # a chi-square law
def test_sampling_on_a_recurrent_target_matches_its_law():
    """Speculative sampling with K=2 on a Mamba target (rejections rewind its state) keeps the exact law."""
    target, draft = tiny_mamba(1, 3.0), tiny(0, 1.5)
    ok, stat, crit = check(target, ModelDrafter(draft, V), dict(temp=1.0))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"
