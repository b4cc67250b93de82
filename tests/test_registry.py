"""Drafter specs as the faces use them: what a spec builds and the K it drafts, one-line errors that name the
problem, and a self drafter that never changes the shared target."""

import pytest
from conftest import plain_greedy, spec

from mlx_spec.errors import GenerationError
from mlx_spec.gen import registry
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.named import NUM_DRAFT_HELP, load_model, make_drafter

# A prompt that stops inside a repeat: every kind of drafter finds something to draft.
REPEAT = "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b\ndef add(a, b):\n    return a"
SPECS = [
    "ngram",
    "ngram:3",
    "suffix",
    "suffix:shared",
    "self",
    "self:0-1,3",
    "self:importance:2",
    "quant-self:int8",
    "hybrid",
    "hybrid:quant-self:int8",
    "org/draft",
    "hybrid:org/draft",
]
# The most drafted per round by default, as docs/drafters.md promises it: 15 for model and self drafters,
# 7 for ngram, 24 for suffix and hybrid.
DOCUMENTED_K = {
    "org/draft": ("model", 15),
    "self": ("self", 15),
    "quant-self": ("quant-self", 15),
    "ngram": ("ngram", 7),
    "suffix": ("suffix", 24),
    "hybrid": ("hybrid", 24),
}


class Loaded(dict):
    """The models already in memory, by spec, noting which specs a drafter asked for."""

    def __init__(self, *args):
        super().__init__(*args)
        self.asked = []

    def __contains__(self, name):
        self.asked.append(name)
        return super().__contains__(name)


@pytest.fixture(scope="module")
def loaded(tiny_models):
    """The tiny draft model under a hub-like name, as if already loaded: no download, no resolving."""
    return {"org/draft": load_model(str(tiny_models["qwen2_draft"]))[:2]}


def build(spec_text, tiny_target, loaded=None, **kw):
    model, tok = tiny_target
    return make_drafter(spec_text, model, tok, loaded=loaded, **kw)


@pytest.mark.parametrize("text", SPECS + ["qwen2.5-coder-0.5b", "./models/draft", "hybrid:self:2"])
def test_a_spec_reads_back_as_written(text):
    """What a table or a title prints for a spec is the spec the user wrote, and it parses to the same drafter."""
    s = registry.parse(text)
    assert str(s) == text and registry.parse(str(s)) == s


@pytest.mark.parametrize("text", [None, "", "none", "off"])
def test_no_drafter_means_plain_decoding(tiny_target, text):
    assert str(registry.parse(text)) == "none" and build(text, tiny_target) is None


@pytest.mark.parametrize("text", SPECS)
def test_every_spec_builds_a_drafter_that_drafts_losslessly(tiny_target, loaded, text):
    """Each spec gives a drafter that really drafts (K fixed) and keeps plain greedy's output;
    a model spec, alone or inside a hybrid, is the model of that name."""
    model, tok = tiny_target
    names = Loaded(loaded)
    drafter = build(text, tiny_target, names)
    prompt = tok.encode(REPEAT)
    out, stats = spec(model, prompt, drafter, max_tokens=40, adaptive=False)
    assert out == plain_greedy(model, prompt, 40) and stats.proposed > 0
    assert names.asked == (["org/draft"] if "org/draft" in text else [])


@pytest.mark.parametrize("text", DOCUMENTED_K)
def test_each_kinds_default_k_reaches_the_engine(tiny_target, loaded, text):
    """Given no K, the longest round drafts the kind's documented default, the one `--num-draft`'s help names."""
    model, tok = tiny_target
    kind, k = DOCUMENTED_K[text]
    drafter = build(text, tiny_target, loaded)
    _, stats = spec(model, tok.encode(REPEAT), drafter, max_tokens=60, adaptive=False)
    assert len(stats.proposed_by_position) == k
    assert registry.default_num_draft(text) == registry.default_num_draft(drafter) == k
    assert f"{kind} {k}" in NUM_DRAFT_HELP


@pytest.mark.parametrize("text", ["ngram", "suffix", "hybrid:org/draft"])
def test_num_draft_caps_every_round(tiny_target, loaded, text):
    """--num-draft reaches the engine by one road, and bounds every round of every source."""
    model, tok = tiny_target
    drafter = build(text, tiny_target, loaded)
    _, stats = spec(model, tok.encode(REPEAT), drafter, max_tokens=40, num_draft=3, adaptive=False)
    assert len(stats.proposed_by_position) == 3


def test_hybrid_none_is_the_contexts_sources_alone(tiny_target):
    """`hybrid:none`: suffix and n-gram with no costly source, greedy-equal to plain decoding."""
    from conftest import plain_greedy

    model, tok = tiny_target
    drafter = build("hybrid:none", tiny_target, Loaded())
    assert [p.name for p in drafter.parts] == ["suffix", "ngram"]
    toks, stats = spec(model, tok.encode(REPEAT), drafter, max_tokens=24, num_draft=3)
    assert toks == plain_greedy(model, tok.encode(REPEAT), 24) and stats.proposed > 0


@pytest.mark.parametrize(
    "text,match",
    [
        ("hybrid:ngram", "fall back"),
        ("hybrid:hybrid", "fall back"),
        ("self:", "nothing after"),
        ("hybrid:off", "fall back"),
        ("ngram:1", "N must be"),
        ("ngram:x", "N must be"),
        ("ngram:", "N must be"),
        ("ngram:17", "N must be"),
        ("hybrid:ngram:3", "fall back"),
        ("quant-self:", "nothing after"),
        ("hybrid:suffix", "fall back"),
        ("suffix:x", "takes ':shared'"),
        ("suffix:", "takes ':shared'"),
    ],
)
def test_a_bad_spec_is_one_line_naming_it(tiny_target, text, match):
    """Parsing refuses it, and so does building, before any model is looked for."""
    with pytest.raises(GenerationError, match=match) as e:
        registry.parse(text)
    assert "\n" not in str(e.value) and text.split(":", 1)[1] in str(e.value)
    names = Loaded()
    with pytest.raises(GenerationError, match=match):
        build(text, tiny_target, names)
    assert names.asked == []


@pytest.mark.parametrize(
    "layers,match",
    [
        ("9", "between 1 and"),
        ("0-9", "distinct indices"),
        ("a-b", "'K', 'a-b'"),
        ("1,1", "distinct"),
        ("0", "between 1 and"),
        ("-1", "'K', 'a-b'|distinct"),
        ("importance:9", "K must be"),
    ],
)
def test_self_layers_grammar_errors(tiny_target, layers, match):
    with pytest.raises(GenerationError, match=match) as e:
        build(f"self:{layers}", tiny_target)
    assert "\n" not in str(e.value) and f"self:{layers}" in str(e.value)


def test_self_layers_grammar(tiny_target):
    """self:K keeps K blocks evenly spaced, the first and the last among them; self:LIST keeps those; self and
    a hybrid's default fallback keep half."""
    assert build("self:2", tiny_target).layers == [0, 3]
    assert build("self:0-1,3", tiny_target).layers == [0, 1, 3]
    assert build("self", tiny_target).layers == [0, 3]  # half of 4 blocks
    assert build("hybrid", tiny_target).parts[-1].layers == [0, 3]


def test_a_bad_num_draft_is_one_line(tiny_target):
    model, tok = tiny_target
    with pytest.raises(GenerationError, match="num-draft") as e:
        spec(model, tok.encode(REPEAT), build("ngram", tiny_target), num_draft=0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(top_p=1.5), "top-p"),
        (dict(top_p=-0.1), "top-p"),
        (dict(top_k=-1), "top-k"),
        (dict(max_tokens=-1), "max-tokens"),
        (dict(num_draft=-2), "num-draft"),
        (dict(temp=-1.0), "temp"),
    ],
)
def test_bad_sampling_options(tiny_target, kw, match):
    model, tok = tiny_target
    with pytest.raises(GenerationError, match=match):
        list(speculative_generate_step(tok.encode("def add"), model, None, **kw))


def test_self_drafter_never_changes_the_shared_target(tiny_target):
    """While the self drafter runs its layers, the target (another request may be running it) keeps all of its own."""
    model, tok = tiny_target
    full = list(model.model.layers)
    seen = []
    layer = full[0]
    cls = type(layer)

    class Spy(cls):
        def __call__(self, *a, **kw):
            seen.append(len(model.model.layers))
            return cls.__call__(self, *a, **kw)

    drafter = build("self:2", tiny_target)
    layer.__class__ = Spy
    try:
        steps = list(
            speculative_generate_step(
                tok.encode("def add(a, b):"), model, drafter, num_draft=3, adaptive=False, max_tokens=10
            )
        )
    finally:
        layer.__class__ = cls
    assert len(steps) == 10 and seen  # layer 0 ran, in draft and verify passes
    assert set(seen) == {len(full)}  # and at no time was the target's layer list cut
    assert list(model.model.layers) == full


def test_ngram_n_sets_the_longest_ngram(tiny_target):
    """ngram:3 keys on the last two tokens, where the default (N = 5) drafts from the longer, rarer match."""
    ctx = [1, 2, 3, 40, 9, 2, 3, 50, 9, 2, 3, 50, 0, 1, 2, 3]  # (2, 3) -> 50 twice; (1, 2, 3) -> 40 once
    assert build("ngram:3", tiny_target).propose(ctx, 1).tokens.tolist() == [50]
    assert build("ngram", tiny_target).propose(ctx, 1).tokens.tolist() == [40]


def test_quant_self_builds_from_a_spec_and_refuses_a_quantized_target(tiny_target, tiny_models, tmp_path):
    from mlx_spec.make import resolve

    d = build("hybrid:quant-self:int8", tiny_target)
    assert d.parts[-1].name == "quant-self" and d.parts[-1].format == "int8"
    q = resolve.convert(tiny_models["qwen2"], tmp_path / "q8", quantize=8, group_size=32, dtype="float32")
    with pytest.raises(GenerationError, match="already quantized"):
        build("quant-self", load_model(str(q))[:2])


def test_suffix_shared_drafts_from_the_process_memory(tiny_target):
    """A `suffix:shared` drafter drafts what another one of the process generated before; a `suffix` one only
    drafts from its own context."""
    answer = list(range(900_000, 900_012))  # ids no other test generates: the memory outlives this test
    first = build("suffix:shared", tiny_target)
    first.reset([1, 2, 3])
    first.propose([1, 2, 3] + answer, 4)  # the last round of a generation that answered `answer`
    first.reset([4, 5])  # the next generation starts: the last one's output is final
    ask = [7, 8] + answer[:4]
    assert build("suffix:shared", tiny_target).propose(ask, 4).tokens.tolist() == answer[4:8]
    assert build("suffix", tiny_target).propose(ask, 4).tokens.tolist() == []
