"""The invariants of speculation on tiny random models: lossless greedy output, full self-acceptance, EOS/limits."""

import time

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.quant_self import QuantSelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.drafters.self_draft import ImportanceSelfDrafter, SelfDrafter
from mlx_spec.errors import GenerationError, UnsupportedError
from mlx_spec.gen.engine import Stats, shadow_judgement, speculative_generate_step
from mlx_spec.gen.policy import Policy
from mlx_spec.gen.stream import generate
from mlx_spec.gen.load import check_tokenizers
from mlx_spec.named import load_model, make_drafter

PROMPTS = [
    "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n",  # n-gram bait
    "The quick brown fox",
    "class Point:\n    def __init__(self, x, y):\n",
]


def plain_greedy(model, prompt, max_tokens, eos=()):
    """Reference greedy decoding with mlx-lm's own generate_step (independent of our engine)."""
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        out.append(int(tok))
        if int(tok) in eos:
            break
    return out


def spec(model, prompt, drafter, **kw):
    stats = Stats()
    toks = [s.token for s in speculative_generate_step(prompt, model, drafter, stats=stats, **kw)]
    return toks, stats


class ScriptedDrafter(Drafter):
    """Proposes a known continuation, optionally corrupted: a drafter we control exactly."""

    def __init__(self, script, wrong=False, vocab=None):
        self.script, self.wrong, self.vocab, self.start = script, wrong, vocab, None

    def reset(self, prompt, target_cache=None):
        self.start = len(prompt) - 1

    def propose(self, context, k, probs_fn=None, source=None):
        pos = len(context) - 1 - self.start
        toks = self.script[pos : pos + k]
        if self.wrong:
            toks = [(t + 1) % self.vocab for t in toks]
        return Draft(toks)


@pytest.fixture(scope="module")
def target(tiny_models):
    model, tok, _ = load_model(str(tiny_models["qwen2"]))
    return model, tok


@pytest.fixture(scope="module")
def draft_model(tiny_models):
    model, tok, _ = load_model(str(tiny_models["qwen2_draft"]))
    return model, tok


def drafters(target, draft_model):
    model, tok = target
    v = model.args.vocab_size
    return {
        "ngram": lambda: NGramDrafter(),
        "self-half": lambda: SelfDrafter(model, [0, 3], v),
        "model": lambda: ModelDrafter(draft_model[0], v),
        "hybrid-model": lambda: HybridDrafter(NGramDrafter(), ModelDrafter(draft_model[0], v)),
        "hybrid-self": lambda: HybridDrafter(NGramDrafter(), SelfDrafter(model, [1], v)),
        "quant-self-int4": lambda: QuantSelfDrafter(model, "int4", v),
        "suffix": lambda: SuffixDrafter(),
        "self-importance": lambda: ImportanceSelfDrafter(model, 2, v),
        "quant-self-mxfp4": lambda: QuantSelfDrafter(model, "mxfp4", v),
    }


@pytest.mark.parametrize("name", ["ngram", "self-half", "model", "hybrid-model", "hybrid-self", "quant-self-int4",
                                  "quant-self-mxfp4", "suffix", "self-importance"])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_equals_plain(target, draft_model, name, k):
    model, tok = target
    for text in PROMPTS:
        prompt = tok.encode(text)
        ref = plain_greedy(model, prompt, 40)
        out, stats = spec(model, prompt, drafters(target, draft_model)[name](), max_tokens=40, num_draft=k, adaptive=False)
        assert out == ref, f"{name} k={k} diverged on {text!r}"
        assert stats.generation_tokens == len(ref)


def test_ngram_drafts_on_matching_prompt(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[0]) * 3
    out, stats = spec(model, prompt, NGramDrafter(), max_tokens=40, adaptive=False)
    assert out == plain_greedy(model, prompt, 40)
    assert stats.proposed > 0


def test_self_draft_with_all_layers_accepts_everything(target):
    model, tok = target
    out, stats = spec(model, tok.encode(PROMPTS[1]), SelfDrafter(model, range(4), model.args.vocab_size),
                      max_tokens=30, num_draft=4, adaptive=False)
    assert stats.proposed > 0 and stats.accepted == stats.proposed
    assert out == plain_greedy(model, tok.encode(PROMPTS[1]), 30)


def test_same_model_as_draft_accepts_everything(target):
    model, tok = target
    out, stats = spec(model, tok.encode(PROMPTS[2]), ModelDrafter(model, model.args.vocab_size, min_confidence=0.0),
                      max_tokens=30, num_draft=5, adaptive=False)
    assert stats.acceptance_rate == 1.0 and stats.mean_accepted > 1
    assert all(p == 1.0 for p in stats.acceptance_by_position())


@pytest.mark.parametrize("stop_at,k", [(1, 8), (5, 8), (6, 8), (17, 24), (23, 24)])  # 24: a long suffix draft's K
def test_eos_inside_a_draft_stops_where_plain_does(target, stop_at, k):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 30)
    eos = ref[stop_at]
    expected = ref[: ref.index(eos) + 1]
    out, stats = spec(model, prompt, ModelDrafter(model, model.args.vocab_size, min_confidence=0.0), max_tokens=30,
                      num_draft=k, eos_token_ids=[eos], adaptive=False)
    assert out == expected
    assert stats.proposed > len(expected) - 1  # the EOS really was inside a draft


@pytest.mark.parametrize("max_tokens,k", [(1, 4), (2, 4), (6, 4), (9, 4), (13, 24), (25, 24)])
def test_max_tokens_inside_a_draft(target, max_tokens, k):
    model, tok = target
    prompt = tok.encode(PROMPTS[0])
    out, _ = spec(model, prompt, ModelDrafter(model, model.args.vocab_size, min_confidence=0.0), max_tokens=max_tokens,
                  num_draft=k, adaptive=False)
    assert out == plain_greedy(model, prompt, max_tokens)


def test_draft_rejected_at_every_position(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 25)
    out, stats = spec(model, prompt, ScriptedDrafter(ref, wrong=True, vocab=model.args.vocab_size),
                      max_tokens=25, num_draft=4, adaptive=False)
    assert out == ref
    assert stats.proposed > 0 and stats.accepted == 0


def test_scripted_correct_draft_is_fully_accepted(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 25)
    out, stats = spec(model, prompt, ScriptedDrafter(ref), max_tokens=25, num_draft=4, adaptive=False)
    assert out == ref and stats.accepted == stats.proposed > 0


def test_padded_draft_vocabulary(tiny_models, target):
    """A draft whose embedding has 64 padding rows drafts for the unpadded target."""
    model, tok = target
    draft, dtok, _ = load_model(str(tiny_models["qwen2_padded"]))
    assert draft.args.vocab_size == model.args.vocab_size + 64
    real = check_tokenizers(tok, dtok)
    prompt = tok.encode(PROMPTS[0])
    out, stats = spec(model, prompt, ModelDrafter(draft, model.args.vocab_size, real), max_tokens=30, adaptive=False)
    assert out == plain_greedy(model, prompt, 30) and stats.proposed > 0


def test_other_architectures(tiny_models):
    for arch in ("llama", "gemma3"):
        model, tok, _ = load_model(str(tiny_models[arch]))
        prompt = tok.encode(PROMPTS[0])
        ref = plain_greedy(model, prompt, 30)
        for drafter in (NGramDrafter(), ModelDrafter(model, model.args.vocab_size, min_confidence=0.0)):
            out, _ = spec(model, prompt, drafter, max_tokens=30, adaptive=False)
            assert out == ref, arch


def test_self_draft_rejects_index_dependent_layers(tiny_models):
    model, tok, _ = load_model(str(tiny_models["gemma3"]))
    with pytest.raises(UnsupportedError, match="gemma3"):
        SelfDrafter(model, [0], model.args.vocab_size)


def test_trim_then_regenerate_gives_the_same_tokens(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    cache = make_prompt_cache(model)
    first = model(mx.array(prompt)[None], cache=cache)
    cont = plain_greedy(model, prompt, 8)
    model(mx.array(cont)[None], cache=cache)
    trim_prompt_cache(cache, len(cont))
    assert cache[0].offset == len(prompt)
    again = model(mx.array(cont)[None], cache=cache)
    fresh = make_prompt_cache(model)
    model(mx.array(prompt)[None], cache=fresh)
    ref = model(mx.array(cont)[None], cache=fresh)
    assert mx.allclose(again, ref, atol=1e-5).item()
    assert mx.argmax(first[0, -1]).item() == cont[0]


class Padding(Policy):
    """Pads every verify pass with nine dummy positions, whatever it costs."""

    def padded(self, k):
        return k + 9 if k and self.pad else k


@pytest.mark.parametrize("name", ["model", "ngram", "hybrid-model"])
def test_a_padded_verify_pass_changes_nothing(target, draft_model, name):
    model, tok = target
    for text in PROMPTS:
        prompt = tok.encode(text)
        ref = plain_greedy(model, prompt, 30)
        cache, policy, stats, out = make_prompt_cache(model), Padding(4, adaptive=False), Stats(), []
        for step in speculative_generate_step(prompt, model, drafters(target, draft_model)[name](), max_tokens=30,
                                              policy=policy, prompt_cache=cache, stats=stats):
            out.append(step.token)
            if not step.from_draft:  # a round's last token: the cache holds the context but it, dummies gone
                assert [c.offset for c in cache] == [len(prompt) + len(out) - 1] * len(cache)
        assert out == ref and policy.pad and stats.spec_rounds > 0
        assert min(k for k in policy.verify if k) >= 10  # every draft was verified padded


def test_no_dummy_position_goes_past_the_model_context(target):
    model, tok = target
    limit = model.args.max_position_embeddings
    prompt = (tok.encode(PROMPTS[0]) * 200)[: limit - 12]
    ref = plain_greedy(model, prompt, 12)  # the context has room for 12 more tokens
    policy = Padding(4, adaptive=False)
    out, stats = spec(model, prompt, NGramDrafter(), max_tokens=64, policy=policy)
    assert out == ref and stats.finish_reason == "context" and stats.spec_rounds > 0
    assert max(policy.verify) <= 12  # the first round: 499 cached + 13 fed = the 512-token context


def test_adaptive_switches_speculation_off_for_a_useless_drafter(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 120)

    class Slow(ScriptedDrafter):
        def propose(self, context, k, probs_fn=None, source=None):
            time.sleep(0.01 * k)  # drafting costs far more than a verify here, and never pays
            return super().propose(context, k, probs_fn)

    out, stats = spec(model, prompt, Slow(ref, wrong=True, vocab=model.args.vocab_size), max_tokens=120, num_draft=4)
    assert out == ref
    assert stats.spec_rounds < 0.2 * stats.rounds, (stats.spec_rounds, stats.rounds)
    assert stats.spec_rounds >= 1  # it did try (how often it probes back is tests/test_policy.py's job)


def test_adaptive_keeps_a_perfect_drafter(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 60)
    out, stats = spec(model, prompt, ScriptedDrafter(ref), max_tokens=60, num_draft=4)
    assert out == ref
    assert stats.draft_share > 0.6


def test_a_trace_records_every_round_as_the_stats_count_it(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 40)
    stats = Stats(trace=[])
    out = [s.token for s in speculative_generate_step(prompt, model, ScriptedDrafter(ref), max_tokens=40, num_draft=4,
                                                      stats=stats)]
    assert out == ref and len(stats.trace) == stats.rounds
    assert sum(r["proposed"] for r in stats.trace) == stats.proposed
    assert sum(r["accepted"] for r in stats.trace) == stats.accepted
    assert stats.trace[0]["proposed"] == 0 and stats.trace[0]["source"] == ""  # the plain step measured first
    assert sum(r["verify_s"] for r in stats.trace) == pytest.approx(stats.verify_time)
    assert "trace" not in Stats().as_dict() and len(stats.as_dict()["trace"]) == stats.rounds


def test_bad_input(tiny_models, target):
    model, tok = target
    prompt = tok.encode(PROMPTS[0])
    with pytest.raises(GenerationError, match="num-draft"):
        spec(model, prompt, NGramDrafter(), num_draft=0)
    with pytest.raises(GenerationError, match="temp"):
        spec(model, prompt, NGramDrafter(), temp=-0.5)
    with pytest.raises(GenerationError, match="context"):
        spec(model, prompt * 100, None, max_tokens=4)  # > max_position_embeddings (512)
    with pytest.raises(GenerationError, match="empty"):
        spec(model, [], None)


def test_tokenizer_mismatch_is_an_error(tmp_path, target):
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from conftest import make_model

    model, tok = target
    other = make_model(tmp_path / "other", "qwen2", seed=5, layers=1, tokenizer_size=300)
    with pytest.raises(GenerationError, match="tokenizer differs"):
        make_drafter(str(other), model, tok)


def test_generate_text_api(target, draft_model):
    model, tok = target
    r = generate(model, tok, PROMPTS[0], HybridDrafter(NGramDrafter(), ModelDrafter(draft_model[0], model.args.vocab_size)),
                 max_tokens=20)
    assert len(r.tokens) == len(r.from_draft) <= 20
    assert r.text == tok.decode([t for t in r.tokens if t not in tok.eos_token_ids])
    assert r.finish_reason in ("stop", "length")


def test_untrimmable_sliding_window_cache_falls_back_to_plain(tiny_models):
    """gemma3's sliding-window caches stop being trimmable past the window (32 here): the target
    falls back to plain decoding (documented in Stats.fallback), the draft rebuilds its cache."""
    model, tok, _ = load_model(str(tiny_models["gemma3"]))
    prompt = tok.encode(PROMPTS[1])
    assert len(prompt) < 32  # starts inside the window, so it speculates before the fallback
    ref = plain_greedy(model, prompt, 60)
    out, stats = spec(model, prompt, ModelDrafter(model, model.args.vocab_size, min_confidence=0.0), max_tokens=60, adaptive=False)
    assert out == ref
    assert stats.fallback and "not trimmable" in stats.fallback
    assert stats.proposed > 0  # it speculated while it could


@pytest.mark.parametrize("draft,produced,expected", [
    ([5, 6, 7], [5, 6, 9], (3, 2)),  # rejected at the third token: three judged, two accepted
    ([5, 6], [5, 6, 9], (2, 2)),  # all accepted
    ([5, 6, 7, 8], [5, 6], (2, 2)),  # the round produced two tokens: the rest were never judged
    ([4], [5], (1, 0)),
    ([], [5], (0, 0)),
])
def test_a_shadow_draft_is_judged_only_where_the_round_produced_tokens(draft, produced, expected):
    assert shadow_judgement(draft, produced) == expected


class FreeScript(ScriptedDrafter):
    """A free source (like the n-gram) that always knows the answer, offered beside a costly one."""

    name = "free"

    def sources(self, context):
        return {"free": 4, "costly": 1 << 30}

    def free_sources(self):
        return {"free"}

    def propose(self, context, k, probs_fn=None, source=None):
        if source == "costly":
            time.sleep(0.02 * k)
        return super().propose(context, k, probs_fn)

    def feedback(self, source, proposed, accepted):
        self.fed_back = getattr(self, "fed_back", []) + [(source, proposed, accepted)]


def test_a_free_source_is_judged_in_rounds_it_was_not_chosen_for(target):
    """Even while plain decoding or another source is chosen, the free source's draft is judged against the
    round's output: its acceptance stays current and it is chosen once it pays, with no probe rounds."""
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 40)
    chosen = []

    class Recording(Policy):
        def update(self, source, *args, **kw):
            chosen.append(source)
            super().update(source, *args, **kw)

    policy = Recording(4)
    drafter = FreeScript(ref)
    out = [s.token for s in speculative_generate_step(prompt, model, drafter, policy=policy, max_tokens=40)]
    assert out == ref
    judged = [f for f in drafter.fed_back if f[0] == "free"]
    assert chosen[0] == "" and judged[0] == ("free", 1, 1)  # the first (plain) round produced one token: one judged
    assert len(judged) > chosen.count("free")  # judged in rounds it was not chosen for
    assert policy.sources["free"].accept > 0.9 and chosen.count("free") > chosen.count("costly")


class SlowModel:
    """The real tiny draft model, made slower than a target step (a quantized draft on a CPU without fast kernels)."""

    def __init__(self, model, delay):
        self._model, self.delay = model, delay

    def __call__(self, inputs, cache=None, **kw):
        time.sleep(self.delay)
        return self._model(inputs, cache=cache, **kw)

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_a_draft_model_fed_its_prompt_only_when_the_policy_first_drafts(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 30)
    drafter = ModelDrafter(model, model.args.vocab_size)  # the target as its own draft: every draft accepted
    drafter.reset(prompt, None)
    assert drafter.fed_total == 0 and drafter.lag("model", prompt) == len(prompt) - 1  # deferred
    assert all(c is not None and c > 0 for c in drafter.step_cost("model"))  # timed on a scratch cache
    out, stats = spec(model, prompt, drafter, max_tokens=30, adaptive=False)  # drafts every round, whatever the timing
    assert out == ref and stats.draft_share > 0.5
    assert drafter.fed_total >= len(prompt) - 1 and drafter.lag("model", prompt + out) <= 2


def test_a_draft_model_too_slow_to_pay_is_never_fed_nor_probed(target, draft_model):
    """Its own step costs more than a target step: even with every draft accepted it cannot pay."""
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 60)
    drafter = ModelDrafter(SlowModel(draft_model[0], 0.05), model.args.vocab_size)
    out, stats = spec(model, prompt, drafter, max_tokens=60)
    assert out == ref
    assert stats.spec_rounds == 0 and drafter.fed_total == 0
    fast = ModelDrafter(draft_model[0], model.args.vocab_size)  # control: the same draft at its own speed is tried
    out, stats = spec(model, prompt, fast, max_tokens=60)
    assert out == ref and stats.spec_rounds >= 1 and fast.fed_total >= len(prompt) - 1


def test_quant_self_drafts_in_the_target_cache_and_leaves_the_target_alone(target):
    model, tok = target
    before = dict(tree_flatten(model.parameters()))
    drafter = QuantSelfDrafter(model, "int8", model.args.vocab_size)
    prompt = tok.encode(PROMPTS[0])
    ref = plain_greedy(model, prompt, 30)
    cache = make_prompt_cache(model)
    out = [s.token for s in speculative_generate_step(prompt, model, drafter, prompt_cache=cache, max_tokens=30,
                                                      adaptive=False)]
    assert out == ref
    assert all(a is b for a, b in zip(drafter.cache, cache)) and len(drafter.cache) == len(cache)  # no cache of its own
    assert drafter.fed_total > 0 and drafter.model.model.layers[0].mlp.up_proj.bits == 8
    assert not hasattr(model.model.layers[0].mlp.up_proj, "bits")  # the target stays float
    after = dict(tree_flatten(model.parameters()))
    assert before.keys() == after.keys() and all(before[k] is after[k] for k in before)
    assert stats_accept(model, tok, drafter) > 0.5  # int8 of the target agrees with the target


def stats_accept(model, tok, drafter):
    _, stats = spec(model, tok.encode(PROMPTS[2]), drafter, max_tokens=24, adaptive=False)
    return stats.acceptance_rate


@pytest.mark.parametrize("fmt,match", [("nf4", "MLX kernel"), ("int5", "bits"), ("fp4", "--quantize")])
def test_quant_self_bad_formats(target, fmt, match):
    with pytest.raises(GenerationError, match=match):
        QuantSelfDrafter(target[0], fmt, target[0].args.vocab_size)
