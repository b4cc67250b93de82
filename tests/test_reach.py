"""Every drafter reaches the model types people run: wrapped language models through their text model (one adapter,
`models.base.text_of`, checked against mlx-lm's layout), hybrid without the source a target refuses, one-line refusals
before the first token, and a target that cannot batch rows of different lengths runs each request alone."""

import functools

import mlx.core as mx
import pytest
from conftest import make_tokenizer, plain_greedy, run_cli, spec
from mlx.utils import tree_map

from mlx_spec.errors import UnsupportedError
from mlx_spec.gen import registry
from mlx_spec.models.base import text_of

V = 320  # conftest's tokenizer's vocabulary
TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=V)
# Tiny configs of each type, after mlx-lm's tests/test_models.py (test_all_models), made smaller.
CONFIGS = {
    "mistral3": {
        "model_type": "mistral3",
        "text_config": dict(TEXT, model_type="mistral", num_hidden_layers=4, rms_norm_eps=1e-5, rope_theta=1000.0),
    },
    "llama4": {
        "model_type": "llama4",
        "text_config": dict(
            TEXT,
            model_type="llama4",
            attention_bias=False,
            attention_chunk_size=8,  # crossed by the prompts: chunked attention in play
            head_dim=16,
            interleave_moe_layer_step=2,
            intermediate_size_mlp=128,
            max_position_embeddings=1000,
            num_experts_per_tok=1,
            num_hidden_layers=4,
            num_local_experts=2,
            rms_norm_eps=1e-4,
            rope_scaling=None,
            rope_theta=1000,
            use_qk_norm=True,
        ),
    },
    "gemma3n": {
        "model_type": "gemma3n",
        "vocab_size": V,
        "text_config": dict(
            TEXT,
            model_type="gemma3n",
            num_hidden_layers=4,
            head_dim=16,
            rms_norm_eps=1e-5,
            num_kv_shared_layers=2,  # the last two layers read the caches of earlier ones
            vocab_size_per_layer_input=V,
            sliding_window=64,
            max_position_embeddings=1000,
            rope_local_base_freq=1.0,
            rope_theta=1000.0,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            activation_sparsity_pattern=[0.0, 0.0, 0.0, 0.0],
            hidden_size_per_layer_input=16,
            altup_num_inputs=2,
            altup_coef_clip=1.0,
            altup_correct_scale=True,
            altup_active_idx=0,
            laurel_rank=8,
        ),
    },
    "qwen3_vl": {
        "model_type": "qwen3_vl",
        "text_config": dict(
            TEXT,
            model_type="qwen3",
            num_hidden_layers=4,
            rms_norm_eps=1e-5,
            head_dim=16,
            max_position_embeddings=1000,
            tie_word_embeddings=False,
            rope_theta=1000,
        ),
    },
    "gemma3": {
        "model_type": "gemma3",
        "vocab_size": V,
        "text_config": dict(
            TEXT,
            model_type="gemma3_text",
            num_hidden_layers=4,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=256,
            sliding_window_pattern=2,
        ),
    },
    "gemma4": {
        "model_type": "gemma4",
        "vocab_size": V,
        "text_config": dict(
            TEXT,
            model_type="gemma4_text",
            num_hidden_layers=4,
            num_key_value_heads=1,
            head_dim=16,
            global_head_dim=32,
            rms_norm_eps=1e-6,
            vocab_size_per_layer_input=V,
            num_kv_shared_layers=2,
            hidden_size_per_layer_input=16,
            sliding_window=256,
            sliding_window_pattern=2,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_theta": 10000.0},
            },
        ),
    },
    "gemma3_text": dict(
        TEXT,
        model_type="gemma3_text",
        num_hidden_layers=4,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=256,
        sliding_window_pattern=2,
    ),
    "afm7": dict(
        model_type="afm7",
        vocab_size=V,
        hidden_dim=64,
        num_layers=4,
        num_kv_reuse_layers=2,  # the last two layers read the first two's caches
        num_heads=4,
        num_kv_heads=2,
    ),
    "deepseek_v32": dict(
        TEXT,
        model_type="deepseek_v32",
        moe_intermediate_size=64,
        num_hidden_layers=2,
        n_routed_experts=4,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        n_shared_experts=1,
        kv_lora_rank=4,
        q_lora_rank=4,
        qk_rope_head_dim=16,
        v_head_dim=16,
        qk_nope_head_dim=16,
    ),
    "gpt_bigcode": dict(
        model_type="gpt_bigcode",
        n_embd=64,
        n_layer=2,
        n_inner=128,
        n_head=4,
        n_positions=1000,
        layer_norm_epsilon=1e-5,
        vocab_size=V,
    ),
}
# Where mlx-lm keeps each wrapper's blocks, embedding and final norm: the adapter must find them there.
BODY = {
    "mistral3": "language_model.model",
    "llama4": "language_model.model",
    "gemma3n": "model.language_model",
    "qwen3_vl": "language_model.model",
    "gemma3": "language_model.model",
    "gemma4": "language_model.model",
    "gemma3_text": "model",
}
WRAPPED = ("mistral3", "llama4", "gemma3n", "qwen3_vl")  # the four: every drafter failed on them
# Refusals in one line: self drafting through a subset of blocks, and why each of these types cannot.
SELF_REFUSED = {
    "llama4": "self drafting with a subset of layers is not supported for llama4: its layers depend on their index",
    "gemma3n": "self drafting is not supported for gemma3n: its layers share caches",
    "gemma3_text": "self drafting with a subset of layers is not supported for gemma3_text: its layers depend on "
    "their index",
    "afm7": "self drafting is not supported for afm7: its layers share caches",
}
PROMPT = "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n"
N = 24


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    return TokenizerWrapper(make_tokenizer(tmp_path_factory.mktemp("tok"), V))


_MODELS: dict[str, object] = {}


def model(kind: str):
    """A random model of `kind`, weights sharpened (peaked distributions, as a trained model's), made once."""
    from mlx_lm.utils import _get_classes

    if kind not in _MODELS:
        cls, args = _get_classes(CONFIGS[kind])
        mx.random.seed(0)
        m = cls(args.from_dict(CONFIGS[kind]))
        m.update(tree_map(lambda w: w * 4.0 if w.ndim > 1 else w, m.parameters()))
        mx.eval(m.parameters())
        _MODELS[kind] = m
    return _MODELS[kind]


@pytest.mark.parametrize("kind", list(BODY))
def test_the_adapter_finds_each_types_text_model_where_mlx_lm_keeps_it(kind):
    """Fails when mlx-lm moves a wrapper's blocks, embedding or output layer: the body holds the very blocks the cache
    follows, the embedding and the logits are the vocabulary's width, and the output layer maps states to logits."""
    m = model(kind)
    text = text_of(m)
    body = text.body
    assert text.path == BODY[kind] and body is functools.reduce(getattr, BODY[kind].split("."), m)
    assert [id(b) for b in text.blocks] == [id(b) for b in body.layers] == [id(b) for b in m.layers]
    x = mx.array([[5, 6, 7]])
    logits = m(x)
    assert text.vocab_size == text.embed.weight.shape[0] == logits.shape[-1] == V
    assert text.hidden_size == 64
    if kind not in ("gemma3n", "gemma4", "gemma3", "gemma3_text"):  # Gemma scales or soft-caps after the head
        assert mx.allclose(text.logits(body(x)), logits, atol=1e-4).item()


def test_a_model_whose_blocks_no_submodule_holds_has_no_body():
    """afm7's `layers` joins two lists: no submodule holds it, and what needs the body says so in one line."""
    text = text_of(model("afm7"))
    assert text.body is None and text.vocab_size == V
    with pytest.raises(
        UnsupportedError, match="^x is not supported for afm7: its blocks are not one submodule's list$"
    ):
        text.need_body("x")


def check(kind, draft, tok):
    """`draft` (a spec or a drafter) on `kind` gives plain greedy's tokens; returns the stats (a refused build raises
    before any token)."""
    m = model(kind)
    prompt = tok.encode(PROMPT)
    drafter = registry.build(draft, m, tok) if isinstance(draft, str) else draft
    out, stats = spec(m, prompt, drafter, max_tokens=N, adaptive=False)
    assert out == plain_greedy(m, prompt, N), f"{draft} on {kind}"
    return stats


@pytest.mark.parametrize("kind", WRAPPED)
@pytest.mark.parametrize("draft", ["ngram", "suffix", "hybrid", "self"])
def test_every_drafter_on_a_wrapped_language_model_equals_plain_or_is_refused_in_one_line(kind, draft, tok):
    if draft == "self" and kind in SELF_REFUSED:
        with pytest.raises(UnsupportedError) as e:
            registry.build(draft, model(kind), tok)
        assert str(e.value) == SELF_REFUSED[kind]
        return
    stats = check(kind, draft, tok)
    if kind != "gemma3n" and draft != "suffix":  # gemma3n: its window's cache (not trimmable) is the cache's story
        assert stats.proposed > 0, "it drafted nothing on a prompt that repeats itself"


@pytest.mark.parametrize("kind", ["gemma3_text", "llama4", "gemma3n", "afm7"])
def test_hybrid_runs_without_the_self_source_a_target_refuses_and_names_it(kind, tok):
    drafter = registry.build("hybrid", model(kind), tok)
    note = f"hybrid: self left out: {SELF_REFUSED[kind]}"
    assert drafter.left_out == note and [p.name for p in drafter.parts] == ["suffix", "ngram"]
    assert check(kind, drafter, tok).left_out == note  # the stats every face shows (the server's included)


def test_hybrid_keeps_a_source_the_target_serves(tok):
    drafter = registry.build("hybrid", model("mistral3"), tok)
    assert drafter.left_out is None and [p.name for p in drafter.parts] == ["suffix", "ngram", "self"]


@pytest.mark.parametrize("draft", ["self", "quant-self"])
def test_self_drafting_is_refused_in_one_line_where_caches_are_shared(draft, tok):
    with pytest.raises(UnsupportedError) as e:
        registry.build(draft, model("afm7"), tok)
    assert str(e.value) == SELF_REFUSED["afm7"].replace("self", draft, 1)


def test_self_drafts_through_a_layer_of_several_caches(tok):
    """deepseek_v32's layers keep two caches each (mlx-lm's CacheList): they report what they hold and rewind."""
    drafter = registry.build("hybrid", model("deepseek_v32"), tok)
    assert drafter.left_out is None and [p.name for p in drafter.parts] == ["suffix", "ngram", "self"]
    check("deepseek_v32", registry.build("self", model("deepseek_v32"), tok), tok)


@pytest.mark.slow  # the real command in a process
def test_the_cli_names_what_hybrid_left_out_before_generating(tiny_models):
    res = run_cli(
        "generate", "--model", str(tiny_models["gemma3"]), "--draft", "hybrid", "--max-tokens", "8", "--verbose"
    )
    assert res.returncode == 0, res.stderr
    note = "hybrid: self left out: " + SELF_REFUSED["gemma3_text"]
    assert f"[mlx-spec] {note}\n" in res.stderr and f"note:       {note}\n" in res.stderr


def test_a_target_that_reads_the_cache_offset_as_one_number_runs_each_request_alone():
    """gpt_bigcode's mlx-lm code cannot take rows of different lengths, afm7's gives a row beside another other logits
    (it reads a position from the cache's width), llama4's chunked caches do not join: the probe says so in one line;
    targets that can (qwen3_vl's text model, gemma3n's window) get None."""
    from mlx_spec.gen.apart import apart

    why = apart(model("gpt_bigcode"))
    assert why is not None and why.startswith("gpt_bigcode cannot run requests of different lengths in one pass (")
    assert "\n" not in why
    assert apart(model("qwen3_vl")) is None and apart(model("gemma3n")) is None
    assert "do not join" in apart(model("llama4"))
    assert apart(model("afm7")).endswith("(a row's logits beside another differ from its own)")


def test_the_server_runs_a_target_alone_that_cannot_batch_and_its_requests_equal_plain(tok, caplog):
    from mlx_spec.server.batching import Batcher
    from mlx_spec.server.pair import Pair
    from mlx_spec.server.params import Params

    m = model("gpt_bigcode")
    pair = Pair("gpt_bigcode", registry.parse("hybrid"), m, tok)
    batcher = Batcher(pair, chunk=8)

    class Job:  # what the batcher reads of the scheduler's jobs
        def __init__(self, text):
            self.ids, self.params, self.session = tok.encode(text), Params(max_tokens=12), pair.new_session()

    jobs = [Job(PROMPT), Job("class Point:\n    def __init__(self, x, y):\n")]
    with caplog.at_level("WARNING", logger="mlx_spec.server"):
        assert [batcher.join(j) for j in jobs] == [False, False]
    assert [r.getMessage() for r in caplog.records] == [f"every request runs alone: {batcher.apart}"]
    out: dict = {0: [], 1: []}
    while len(batcher):
        assert not batcher.step_joins()
        for job, ev in [x for e in batcher.engines for x in batcher.round(e)]:
            out[jobs.index(job)].append(ev.token)
            if ev.finish_reason:
                batcher.leave(job)
    for i, job in enumerate(jobs):
        assert out[i] == plain_greedy(m, job.ids, 12, eos=tok.eos_token_ids)
