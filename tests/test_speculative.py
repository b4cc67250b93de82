"""The invariants of speculation on tiny random models: lossless greedy output, full self-acceptance, EOS/limits."""

import mlx.core as mx
import pytest
from conftest import PROMPTS, close, plain_greedy, spec
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlx_spec.errors import GenerationError, UnsupportedError
from mlx_spec.gen.cache import rewind
from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter, ModelDrafting
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.self_draft import ImportanceSelfDrafter, QuantSelfDrafter, SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.gen.load import check_tokenizers
from mlx_spec.gen.planner import Plan, Planner
from mlx_spec.gen.stream import generate
from mlx_spec.gen.verify import shadow_judgement
from mlx_spec.named import load_model, make_drafter


class ScriptedDrafter(Drafter):
    """Proposes a known continuation, optionally corrupted: a drafter we control exactly (a free source)."""

    name = "scripted"
    free = True

    def __init__(self, script, wrong=False, vocab=None):
        self.script, self.wrong, self.vocab, self.start = script, wrong, vocab, None

    def reset(self, prompt, target_cache=None):
        self.start = len(prompt) - 1

    def propose(self, context, k, probs_fn=None):
        pos = len(context) - 1 - self.start
        toks = self.script[pos : pos + k]
        if self.wrong:
            toks = [(t + 1) % self.vocab for t in toks]
        return Draft.of(toks, source=self.name)


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
        "model-subset": lambda: ModelDrafter(draft_model[0], v, head_ids=range(0, v, 3)),
        "hybrid-model": lambda: HybridDrafter([SuffixDrafter(), NGramDrafter()], ModelDrafter(draft_model[0], v)),
        "hybrid-self": lambda: HybridDrafter([SuffixDrafter(), NGramDrafter()], SelfDrafter(model, [1], v)),
        "quant-self-int4": lambda: QuantSelfDrafter(model, "int4", v),
        "suffix": lambda: SuffixDrafter(),
        "self-importance": lambda: ImportanceSelfDrafter(model, 2, v),
        "quant-self-mxfp4": lambda: QuantSelfDrafter(model, "mxfp4", v),
    }


DRAFTERS = [
    "ngram",
    "self-half",
    "model",
    "model-subset",
    "hybrid-model",
    "hybrid-self",
    "quant-self-int4",
    "quant-self-mxfp4",
    "suffix",
    "self-importance",
]


@pytest.fixture(scope="module")
def greedy_refs(target):
    """Each prompt's 40 plain greedy tokens, decoded once for every drafter and K (a drafter that changed the shared
    target would now diverge from them)."""
    model, tok = target
    return {text: plain_greedy(model, tok.encode(text), 40) for text in PROMPTS}


@pytest.mark.parametrize("name", DRAFTERS)
# K = 16 (drafts past max_tokens, the largest verify sizes) costs the most: the full tier runs it
@pytest.mark.parametrize("k", [1, 4, pytest.param(16, marks=pytest.mark.slow)])
def test_greedy_equals_plain(target, draft_model, greedy_refs, name, k):
    model, tok = target
    for text in PROMPTS:
        prompt = tok.encode(text)
        ref = greedy_refs[text]
        out, stats = spec(
            model, prompt, drafters(target, draft_model)[name](), max_tokens=40, num_draft=k, adaptive=False
        )
        assert out == ref, f"{name} k={k} diverged on {text!r}"
        assert stats.generation_tokens == len(ref)


@pytest.mark.parametrize("name", ["model", "hybrid-model", "suffix", "self-half"])
def test_adaptive_greedy_equals_plain(target, draft_model, name):
    """The planner's own choices (plain steps queued ahead, probes, padded sizes) change no token."""
    model, tok = target
    for text in PROMPTS:
        prompt = tok.encode(text) * 3
        ref = plain_greedy(model, prompt, 60)
        assert spec(model, prompt, drafters(target, draft_model)[name](), max_tokens=60)[0] == ref


def test_ngram_drafts_on_matching_prompt(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[0]) * 3
    out, stats = spec(model, prompt, NGramDrafter(), max_tokens=40, adaptive=False)
    assert out == plain_greedy(model, prompt, 40)
    assert stats.proposed > 0


def test_self_draft_with_all_layers_accepts_everything(target):
    model, tok = target
    out, stats = spec(
        model,
        tok.encode(PROMPTS[1]),
        SelfDrafter(model, range(4), model.args.vocab_size),
        max_tokens=30,
        num_draft=4,
        adaptive=False,
    )
    assert stats.proposed > 0 and stats.accepted == stats.proposed
    assert out == plain_greedy(model, tok.encode(PROMPTS[1]), 30)


def test_same_model_as_draft_accepts_everything(target):
    model, tok = target
    out, stats = spec(
        model,
        tok.encode(PROMPTS[2]),
        ModelDrafter(model, model.args.vocab_size),
        max_tokens=30,
        num_draft=5,
        adaptive=False,
    )
    assert stats.acceptance_rate == 1.0 and stats.mean_accepted > 1
    assert all(p == 1.0 for p in stats.acceptance_by_position())


@pytest.mark.parametrize("stop_at,k", [(1, 8), (5, 8), (6, 8), (17, 24), (23, 24)])  # 24: a long suffix draft's K
def test_eos_inside_a_draft_stops_where_plain_does(target, stop_at, k):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 30)
    eos = ref[stop_at]
    expected = ref[: ref.index(eos) + 1]
    out, stats = spec(
        model,
        prompt,
        ModelDrafter(model, model.args.vocab_size),
        max_tokens=30,
        num_draft=k,
        eos_token_ids=[eos],
        adaptive=False,
    )
    assert out == expected
    assert stats.proposed > len(expected) - 1  # the EOS really was inside a draft


@pytest.mark.parametrize("max_tokens,k", [(1, 4), (2, 4), (6, 4), (9, 4), (13, 24), (25, 24)])
def test_max_tokens_inside_a_draft(target, max_tokens, k):
    model, tok = target
    prompt = tok.encode(PROMPTS[0])
    out, _ = spec(
        model, prompt, ModelDrafter(model, model.args.vocab_size), max_tokens=max_tokens, num_draft=k, adaptive=False
    )
    assert out == plain_greedy(model, prompt, max_tokens)


def test_draft_rejected_at_every_position(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 25)
    out, stats = spec(
        model,
        prompt,
        ScriptedDrafter(ref, wrong=True, vocab=model.args.vocab_size),
        max_tokens=25,
        num_draft=4,
        adaptive=False,
    )
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
        for drafter in (NGramDrafter(), ModelDrafter(model, model.args.vocab_size)):
            out, _ = spec(model, prompt, drafter, max_tokens=30, adaptive=False)
            assert out == ref, arch


def test_self_draft_rejects_index_dependent_layers(tiny_models):
    model, tok, _ = load_model(str(tiny_models["gemma3"]))
    with pytest.raises(UnsupportedError, match="gemma3"):
        SelfDrafter(model, [0], model.args.vocab_size)


@pytest.mark.parametrize("name", ["model", "hybrid-model", "self-half", "suffix"])
def test_trim_then_regenerate_gives_the_same_tokens(target, draft_model, name):
    """Our engine into a caller's cache, rewound to a point mid-reply by our own `rewind`, then continued from that
    cache: the continuation is the first run's tail, and only the tokens after the rewind point are prefilled."""
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    cache = make_prompt_cache(model)
    first, _ = spec(
        model,
        prompt,
        drafters(target, draft_model)[name](),
        prompt_cache=cache,
        max_tokens=30,
        num_draft=4,
        adaptive=False,
    )
    assert cache[0].offset == len(prompt) + len(first) - 1
    cut = 11
    assert rewind(cache, len(prompt) + cut)
    again, stats = spec(
        model,
        prompt + first[: cut + 1],
        drafters(target, draft_model)[name](),
        prompt_cache=cache,
        max_tokens=30 - cut - 1,
        num_draft=4,
        adaptive=False,
    )
    assert again == first[cut + 1 :] and stats.prefill_tokens == 1


class Padding(Planner):
    """Verifies every draft at nine dummy positions more than it needs, whatever it costs."""

    def plan(self, asks, places=None, pad=False, queued=False):
        p = super().plan(asks, places, pad, queued)
        return Plan(p.k, p.sources, p.k + 10) if p.k else p


@pytest.mark.parametrize("name", ["model", "ngram", "hybrid-model"])
def test_a_padded_verify_pass_changes_nothing(target, draft_model, name):
    model, tok = target
    for text in PROMPTS:
        prompt = tok.encode(text)
        ref = plain_greedy(model, prompt, 30)
        cache, planner, stats, out = make_prompt_cache(model), Padding(adaptive=False), Stats(trace=[]), []
        for step in speculative_generate_step(
            prompt,
            model,
            drafters(target, draft_model)[name](),
            max_tokens=30,
            num_draft=4,
            planner=planner,
            prompt_cache=cache,
            stats=stats,
        ):
            out.append(step.token)
            if not step.from_draft:  # a round's last token: the cache holds the context but it (and at most a
                held = len(prompt) + len(out) - 1  # plain step queued ahead), the dummy positions gone
                assert {c.offset for c in cache} <= {held, held + 1}
        assert out == ref and stats.spec_rounds > 0
        assert all(r["size"] == r["proposed"] + 10 for r in stats.trace if r["proposed"])


def test_no_dummy_position_goes_past_the_model_context(target):
    model, tok = target
    limit = model.args.max_position_embeddings
    prompt = (tok.encode(PROMPTS[0]) * 200)[: limit - 12]
    ref = plain_greedy(model, prompt, 12)  # the context has room for 12 more tokens
    out, stats = spec(model, prompt, NGramDrafter(), max_tokens=64, num_draft=4, planner=Padding(adaptive=False))
    assert out == ref and stats.finish_reason == "context" and stats.spec_rounds > 0
    held = len(prompt) - 1
    for r in stats.trace:  # every pass, its dummy positions included, ends within the 512-token context
        assert held + r["size"] <= limit
        held += r["accepted"] + 1
    assert max(r["size"] for r in stats.trace) > r["proposed"] + 1  # padded where it could be


class Slow(ScriptedDrafter):
    """A costly source: on the pass clock each token it drafts takes three target passes."""

    name, free = "slow", False

    def __init__(self, clock, script, **kw):
        super().__init__(script, **kw)
        self.clock = clock

    def propose(self, context, k, probs_fn=None):
        self.clock.t += 3 * self.clock.tick * k
        return super().propose(context, k, probs_fn)


def test_adaptive_switches_speculation_off_for_a_useless_drafter(target, pass_clock):
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 120)
    slow = Slow(pass_clock, ref, wrong=True, vocab=model.args.vocab_size)
    out, stats = spec(model, prompt, slow, max_tokens=120, num_draft=4)
    assert out == ref
    assert 1 <= stats.spec_rounds < 0.1 * stats.rounds, (stats.spec_rounds, stats.rounds)


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
    out, stats = spec(model, prompt, ScriptedDrafter(ref), max_tokens=40, num_draft=4)
    assert out == ref and len(stats.trace) == stats.rounds == stats.syncs
    assert sum(r["proposed"] for r in stats.trace) == stats.proposed
    assert sum(r["accepted"] for r in stats.trace) == stats.accepted
    assert stats.trace[0]["proposed"] == 0 and stats.trace[0]["source"] == ""  # the plain step measured first
    assert sum(r["accepted"] + 1 for r in stats.trace) == len(out)
    assert 0 < stats.wait_time < sum(r["seconds"] for r in stats.trace)
    assert "trace" not in Stats().as_dict() and len(stats.as_dict()["trace"]) == stats.rounds
    assert 1 in stats.costs  # the planner's measured plain step, handed back


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
    from conftest import make_model

    model, tok = target
    other = make_model(tmp_path / "other", "qwen2", seed=5, layers=1, tokenizer_size=300)
    with pytest.raises(GenerationError, match="tokenizer differs"):
        make_drafter(str(other), model, tok)


def test_generate_text_api(target, draft_model):
    model, tok = target
    hybrid = HybridDrafter([SuffixDrafter(), NGramDrafter()], ModelDrafter(draft_model[0], model.args.vocab_size))
    r = generate(model, tok, PROMPTS[0], hybrid, max_tokens=20)
    assert len(r.tokens) == len(r.from_draft) <= 20
    assert r.text == tok.decode([t for t in r.tokens if t not in tok.eos_token_ids])
    assert r.finish_reason in ("stop", "length")


@pytest.mark.parametrize("length", [45, 420])
def test_a_sliding_window_target_keeps_drafting_past_its_window(tiny_models, length):
    """gemma3's sliding layers (window 32 here) keep a round's positions beyond the window, so a prompt already past
    the window, and a generation that crosses it again and again, speculate with the target's own tokens; a long
    context's old positions are dropped (the cache stays bounded)."""
    from mlx_spec.gen.cache import new_cache
    from mlx_spec.models.window import SlidingKVCache

    model, tok, _ = load_model(str(tiny_models["gemma3"]))
    prompt = (tok.encode(PROMPTS[1]) * 100)[:length]
    assert len(prompt) == length
    ref = plain_greedy(model, prompt, 60)
    for drafter in (ModelDrafter(model, model.args.vocab_size), NGramDrafter()):
        cache = new_cache(model)
        out, stats = spec(model, prompt, drafter, max_tokens=60, adaptive=False, prompt_cache=cache)
        assert out == ref
        assert stats.fallback is None
        assert stats.accepted > 0
        sliding = [c for c in cache if isinstance(c, SlidingKVCache)]
        assert sliding and all(c.offset == len(prompt) + len(out) - 1 for c in cache)
        if length > 400:
            assert all(c.held() < 200 for c in sliding)
    assert stats.proposed > stats.accepted  # the n-gram's rejected drafts were rewound past the window


@pytest.mark.parametrize(
    "draft,produced,expected",
    [
        ([5, 6, 7], [5, 6, 9], (3, 2)),  # rejected at the third token: three judged, two accepted
        ([5, 6], [5, 6, 9], (2, 2)),  # all accepted
        ([5, 6, 7, 8], [5, 6], (2, 2)),  # the round produced two tokens: the rest were never judged
        ([4], [5], (1, 0)),
        ([], [5], (0, 0)),
    ],
)
def test_a_shadow_draft_is_judged_only_where_the_round_produced_tokens(draft, produced, expected):
    assert shadow_judgement(draft, produced) == expected


class Learning(ScriptedDrafter):
    def learn(self, proposed, accepted):
        self.learned = getattr(self, "learned", []) + [(proposed, accepted)]


def test_a_free_source_is_judged_in_rounds_it_was_not_chosen_for(target, pass_clock):
    """Even while plain decoding or another source is chosen, the free source's draft is judged against the
    round's output: its acceptance stays current and it is chosen once it pays, with no probe rounds."""
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 40)
    free, costly = Learning(ref), Slow(pass_clock, ref)
    out, stats = spec(model, prompt, HybridDrafter([free], costly), max_tokens=40, num_draft=4)
    assert out == ref
    chosen = [r["source"] for r in stats.trace]
    assert chosen[0] == "" and free.learned[0] == (1, 1)  # the first (plain) round produced one token: one judged
    assert len(free.learned) > chosen.count("scripted")  # judged in rounds it was not chosen for
    assert chosen.count("scripted") > chosen.count("slow")


class SlowModel:
    """The real tiny draft model, made slower than a target step (a quantized draft on a CPU without fast kernels):
    on the pass clock every pass through it, or through its backbone, takes `passes` target passes more."""

    def __init__(self, model, clock, passes):
        self._model, self.clock, self.passes = model, clock, passes

    def __call__(self, inputs, cache=None, **kw):
        self.clock.t += self.passes * self.clock.tick
        return self._model(inputs, cache=cache, **kw)

    def __getattr__(self, name):
        if name == "model":
            return SlowModel(self._model.model, self.clock, self.passes)
        return getattr(self._model, name)


def test_a_draft_model_is_fed_its_prompt_only_when_first_drafted(target):
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 30)
    drafter = ModelDrafter(model, model.args.vocab_size)  # the target as its own draft: every draft accepted
    drafter.reset(prompt, None)
    assert drafter.behind(prompt) == len(prompt) - 1  # deferred: all of the prompt is still to feed
    out, stats = spec(model, prompt, drafter, max_tokens=30, adaptive=False)  # drafts every round, whatever the timing
    assert out == ref and stats.draft_share > 0.5
    assert drafter.behind(prompt + out) <= 2  # fed when it drafted


def test_a_draft_model_too_slow_to_pay_is_tried_once_then_left_alone(target, draft_model, pass_clock):
    """Its own step costs more than a target step: even with every draft accepted it cannot pay, so after the
    probe that measures it the planner neither drafts with it nor probes it again."""
    model, tok = target
    prompt = tok.encode(PROMPTS[2])
    ref = plain_greedy(model, prompt, 120)
    drafter = ModelDrafter(SlowModel(draft_model[0], pass_clock, 5), model.args.vocab_size)
    out, stats = spec(model, prompt, drafter, max_tokens=120)
    assert out == ref
    assert 1 <= stats.spec_rounds <= 2 and all(r["proposed"] <= 1 for r in stats.trace)


def test_quant_self_drafts_in_the_target_cache_and_leaves_the_target_alone(target):
    model, tok = target
    before = dict(tree_flatten(model.parameters()))
    drafter = QuantSelfDrafter(model, "int8", model.args.vocab_size)
    prompt = tok.encode(PROMPTS[0])
    ref = plain_greedy(model, prompt, 30)
    cache, drafted = make_prompt_cache(model), Stats()
    out = [
        s.token
        for s in speculative_generate_step(
            prompt, model, drafter, prompt_cache=cache, max_tokens=30, adaptive=False, stats=drafted
        )
    ]
    assert out == ref
    assert drafter.cache is None  # no cache of its own: it drafted in the target's
    assert drafted.proposed > 0 and drafter.model.model.layers[0].mlp.up_proj.bits == 8
    assert not hasattr(model.model.layers[0].mlp.up_proj, "bits")  # the target stays float
    after = dict(tree_flatten(model.parameters()))
    assert before.keys() == after.keys() and all(before[k] is after[k] for k in before)
    _, stats = spec(model, tok.encode(PROMPTS[2]), drafter, max_tokens=24, adaptive=False)
    assert stats.acceptance_rate > 0.5  # int8 of the target agrees with the target


@pytest.mark.parametrize("fmt,match", [("nf4", "MLX kernel"), ("int5", "bits"), ("fp4", "--quantize")])
def test_quant_self_bad_formats(target, fmt, match):
    with pytest.raises(GenerationError, match=match):
        QuantSelfDrafter(target[0], fmt, target[0].args.vocab_size)


def test_quant_self_refuses_a_wrapped_target_rather_than_quantize_it_in_place(target):
    """A wrapper that forwards attributes (as a test's slowed target does) cannot be copied by container: quantizing
    "a copy" of it quantized the target itself."""

    class Wrapper:
        def __init__(self, model):
            self.model_ = model

        def __getattr__(self, name):
            return getattr(self.__dict__["model_"], name)

    with pytest.raises(GenerationError, match="the model itself"):
        QuantSelfDrafter(Wrapper(target[0]), "int8", target[0].args.vocab_size)
    assert not hasattr(target[0].model.layers[0].mlp.up_proj, "bits")


class Reads:
    """Counts the host's waits for the device: every `mx.eval`, and every `.item()`/`.tolist()` of an array that no
    earlier wait evaluated (reading an evaluated array waits for nothing)."""

    def __init__(self, monkeypatch):
        self.count, self.done = 0, {}  # id -> the array, kept alive so that no later array takes its id
        real_eval, real_item, real_tolist = mx.eval, mx.array.item, mx.array.tolist

        def evaluate(*arrays):
            self.count += 1
            self.done.update((id(a), a) for a in arrays if isinstance(a, mx.array))
            return real_eval(*arrays)

        def reader(real):
            def read(a):
                if id(a) not in self.done:
                    self.count += 1
                    self.done[id(a)] = a
                return real(a)

            return read

        monkeypatch.setattr(mx, "eval", evaluate)
        monkeypatch.setattr(mx.array, "item", reader(real_item))
        monkeypatch.setattr(mx.array, "tolist", reader(real_tolist))


@pytest.mark.parametrize("name", ["model", "model-subset", "self-half", "quant-self-int4", "hybrid-model", "scripted"])
@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_one_host_synchronisation_per_round(target, draft_model, monkeypatch, name, temp):
    """Counted over every call the engine and the drafter make, not by the engine's own counter: a model draft of
    K tokens and its verify pass are read at once, and so is a plain step."""
    model, tok = target
    prompt = tok.encode(PROMPTS[0])

    def reads_beyond_one_a_round(drafter):
        reads, stats = Reads(monkeypatch), Stats()
        for _ in speculative_generate_step(
            prompt, model, drafter, max_tokens=40, num_draft=6, adaptive=False, temp=temp, stats=stats
        ):
            pass
        assert stats.spec_rounds > 3 and stats.syncs == stats.rounds
        return reads.count - 1 - stats.rounds  # the prompt's prefill reads once

    make = drafters(target, draft_model).get(name, lambda: ScriptedDrafter(plain_greedy(model, prompt, 40)))
    assert reads_beyond_one_a_round(make()) == 0
    if name != "model":  # the control below, once a temperature
        return

    class ReadingDrafting(ModelDrafting):  # the counter sees drafting that reads its drafts before the verify pass
        def propose(self, *args, **kwargs):
            drafts = super().propose(*args, **kwargs)
            [d.tokens.tolist() for d in drafts]
            return drafts

    class Reading(ModelDrafter):
        def drafting(self):
            return ReadingDrafting(self)

    assert reads_beyond_one_a_round(Reading(draft_model[0], model.args.vocab_size)) > 3


@pytest.mark.parametrize("name", ["model", "hybrid-model", "self-half", "quant-self-int4", "ngram", None])
@pytest.mark.parametrize("stop_after", [1, 2, 7, 19])
def test_closing_mid_generation_leaves_the_cache_exact(target, draft_model, name, stop_after):
    """Closed after any token (a plain step queued ahead, a draft half delivered): the cache holds the prompt and
    the tokens delivered, minus the last, and its entries are those a fresh prefill of them writes."""
    model, tok = target
    prompt = tok.encode(PROMPTS[0]) * 2
    drafter = drafters(target, draft_model)[name]() if name else None
    cache = make_prompt_cache(model)
    gen = speculative_generate_step(prompt, model, drafter, prompt_cache=cache, max_tokens=30)
    out = [next(gen).token for _ in range(stop_after)]
    gen.close()
    held = len(prompt) + len(out) - 1
    assert [c.offset for c in cache] == [held] * len(cache)
    fresh = make_prompt_cache(model)
    model(mx.array((prompt + out)[:-1])[None], cache=fresh)
    for a, b in zip(cache, fresh):
        assert close(a.state[0][..., :held, :], b.state[0][..., :held, :])
    assert out == plain_greedy(model, prompt, stop_after)


class LateScript(ScriptedDrafter):
    """Knows the answer, but offers it only from the `late`-th output token on."""

    late = 5

    def propose(self, context, k, probs_fn=None):
        return super().propose(context, k if len(context) - 1 - self.start >= self.late else 0, probs_fn)


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_a_plain_step_queued_ahead_is_the_first_position_of_the_next_verify_pass(target, temp):
    """The round after a plain run drafts at once, the step queued on the last token being its first position: no
    token is decoded plainly once the drafter has a draft, and none is lost."""
    model, tok = target
    prompt = tok.encode(PROMPTS[1])
    ref = plain_greedy(model, prompt, 30)
    out, stats = spec(model, prompt, LateScript(ref), max_tokens=30, num_draft=4, temp=temp)
    if temp == 0.0:
        assert out == ref
    first = next(i for i, r in enumerate(stats.trace) if r["proposed"])
    assert first == LateScript.late and len(out) == 30


class Clock:
    """A clock that a target pass moves by one second when it is built: a round's seconds count its passes."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class Clocked:
    """The target, each call one tick of `clock`."""

    def __init__(self, model, clock: Clock):
        self._model, self._clock = model, clock

    def __call__(self, *args, **kwargs):
        self._clock.t += 1.0
        return self._model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_a_plain_step_is_timed_only_in_rounds_that_run_one(target, monkeypatch):
    """A plain round reads the step queued in the round before and queues the next; the last round of a request
    queues nothing, so it ran no pass (its step was built a round earlier) and is not a plain step's cost. Short
    requests sharing a planner, as a server's do: every plain step timed took one pass."""
    from mlx_spec.gen import engine

    clock = Clock()
    monkeypatch.setattr(engine, "time", clock)
    (model, tok), planner = target, Planner()
    for prompt in PROMPTS[:4]:
        list(speculative_generate_step(tok.encode(prompt), Clocked(model, clock), planner=planner, max_tokens=3))
    assert planner.costs.cost(1, 1) == 1.0
