"""Every drafter reaches the model types people run: wrapped language models through their text model (one adapter,
`models.base.text_of`, checked against mlx-lm's layout), hybrid without the source a target refuses, one-line refusals
before the first token, and a target that cannot batch rows of different lengths runs each request alone."""

import functools

import mlx.core as mx
import pytest
from conformance import model as tiny
from conformance_models import CONFIGS
from conftest import close, make_tokenizer, plain_greedy, run_cli, spec

from mlx_spec.errors import UnsupportedError
from mlx_spec.gen import registry
from mlx_spec.models.base import text_of

V = 320  # conftest's tokenizer's vocabulary: the conformance suite's models are made with it
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


@functools.cache
def model(kind: str):
    """The conformance suite's tiny model of `kind` (tests/conformance_models.py), with the tokenizer's vocabulary."""
    return tiny(kind, vocab_size=V)


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
    assert text.hidden_size == CONFIGS[kind].get("text_config", CONFIGS[kind])["hidden_size"]
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


BESIDE = ("falcon_h1", "baichuan_m1")  # a recurrent state beside attention in each layer's one CacheList


@pytest.mark.parametrize("broken", [False, True], ids=["rewound", "broken-kv-only"])
@pytest.mark.parametrize("kind", BESIDE)
def test_a_recurrent_state_beside_attention_rewinds_with_it(kind, broken, monkeypatch):
    """falcon_h1's Mamba state and baichuan_m1's convolution state share a CacheList with a KV cache: a rewind keeps 3
    of 8 tokens in both, so the next pass gives a fresh cache's logits; a rewind that trims the KV cache and leaves
    the recurrent state unreplayed (broken) does not."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_spec.gen import recurrent
    from mlx_spec.gen.cache import new_cache, rewind
    from mlx_spec.models.cache import RewindableCache

    if broken:  # the recurrent member says it trimmed, its state left where the 8 tokens took it

        def kv_only(self, n):
            self.offset -= n
            return n

        monkeypatch.setattr(RewindableCache, "trim", kv_only)
    m, prompt, cont = model(kind), list(range(3, 23)), [7, 9, 11, 13, 15, 17, 19, 21]
    cache, run = new_cache(m), recurrent.recording(m)  # the submodule writing the recurrent state records its calls
    run(mx.array(prompt)[None], cache=cache)
    run(mx.array(cont)[None], cache=cache)
    assert rewind(cache, len(prompt) + 3) and {c.offset for c in cache} == {len(prompt) + 3}
    again = m(mx.array(cont[3:])[None], cache=cache)
    fresh = make_prompt_cache(m)
    m(mx.array(prompt + cont[:3])[None], cache=fresh)
    ref = m(mx.array(cont[3:])[None], cache=fresh)
    assert close(again, ref) != broken


@pytest.mark.parametrize("kind", BESIDE)
def test_every_drafter_runs_where_a_recurrent_state_sits_beside_attention(kind, tok):
    """Nothing refused: hybrid keeps its self source, and self and ngram equal plain greedy, drafting and rejecting
    (so rewinding both members of each layer)."""
    drafter = registry.build("hybrid", model(kind), tok)
    assert drafter.left_out is None and [p.name for p in drafter.parts] == ["suffix", "ngram", "self"]
    for draft in ("self", "ngram"):
        stats = check(kind, draft, tok)
        assert stats.proposed > stats.accepted, draft


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
    (it reads a position from the cache's width): the probe says so in one line; targets that can (qwen3_vl's text
    model, gemma3n's window, llama4's chunks) get None."""
    from mlx_spec.gen.apart import apart

    why = apart(model("gpt_bigcode"))
    assert why is not None and why.startswith("gpt_bigcode cannot run requests of different lengths in one pass (")
    assert "\n" not in why
    assert apart(model("qwen3_vl")) is None and apart(model("gemma3n")) is None
    assert apart(model("llama4")) is None
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
