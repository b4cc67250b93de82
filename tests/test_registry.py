"""Drafter specs: parsing, defaults defined once, clear errors, and a self drafter that never changes the shared target."""

import pytest

from mlx_spec.errors import GenerationError
from mlx_spec.gen import registry
from mlx_spec.gen.drafters import model as model_drafter, ngram, suffix
from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.engine import speculative_generate_step
from mlx_spec.named import load_model


@pytest.fixture(scope="module")
def target(tiny_models):
    model, tok, _ = load_model(str(tiny_models["qwen2"]))
    return model, tok


@pytest.mark.parametrize("spec,kind,arg", [
    (None, "none", ""), ("", "none", ""), ("none", "none", ""), ("ngram", "ngram", ""), ("ngram:3", "ngram", "3"), ("self", "self", ""),
    ("self:14", "self", "14"), ("self:0-3,7", "self", "0-3,7"), ("hybrid", "hybrid", ""),
    ("hybrid:qwen2.5-coder-0.5b", "hybrid", "qwen2.5-coder-0.5b"), ("hybrid:self:2", "hybrid", "self:2"),
    ("./models/draft", "model", "./models/draft"), ("org/name", "model", "org/name"),
    ("quant-self", "quant-self", ""), ("quant-self:mxfp4", "quant-self", "mxfp4"), ("suffix", "suffix", ""),
    ("hybrid:quant-self:int8", "hybrid", "quant-self:int8"), ("suffix:shared", "suffix", "shared"),
])
def test_parse(spec, kind, arg):
    s = registry.parse(spec)
    assert (s.kind, s.arg) == (kind, arg)


@pytest.mark.parametrize("spec,match", [("hybrid:ngram", "fall back"), ("hybrid:hybrid", "fall back"),
                                        ("self:", "nothing after"), ("hybrid:none", "fall back"),
                                        ("ngram:1", "N must be"), ("ngram:x", "N must be"), ("ngram:", "N must be"),
                                        ("ngram:17", "N must be"), ("hybrid:ngram:3", "fall back"),
                                        ("quant-self:", "nothing after"), ("hybrid:suffix", "fall back"),
                                        ("suffix:x", "takes ':shared'"), ("suffix:", "takes ':shared'")])
def test_parse_errors(spec, match):
    with pytest.raises(GenerationError, match=match):
        registry.parse(spec)


def test_default_k_lives_in_one_place():
    assert registry.DEFAULT_K == {"model": model_drafter.DEFAULT_K, "self": model_drafter.DEFAULT_K,
                                  "quant-self": model_drafter.DEFAULT_K, "ngram": ngram.DEFAULT_K,
                                  "suffix": suffix.DEFAULT_K, "hybrid": suffix.DEFAULT_K}
    for spec, kind in (("ngram", "ngram"), ("hybrid:x", "hybrid"), ("self:3", "self"), ("some/model", "model"),
                       ("quant-self:int8", "quant-self")):
        assert registry.default_num_draft(spec) == registry.DEFAULT_K[kind]


@pytest.mark.parametrize("layers,match", [("9", "between 1 and"), ("0-9", "distinct indices"), ("a-b", "'K', 'a-b'"),
                                          ("1,1", "distinct"), ("0", "between 1 and"), ("-1", "'K', 'a-b'|distinct")])
def test_self_layers_grammar_errors(target, layers, match):
    model, tok = target
    with pytest.raises(GenerationError, match=match) as e:
        registry.build(f"self:{layers}", model, tok)
    assert str(e.value).startswith(f"self:{layers}")


def test_self_layers_grammar(target):
    model, tok = target
    assert registry.build("self:2", model, tok).layers == [0, 3]
    assert registry.build("self:0-1,3", model, tok).layers == [0, 1, 3]
    assert registry.build("self", model, tok).layers == [0, 3]  # half of 4 layers, evenly spaced
    assert registry.build("hybrid", model, tok).fallback.layers == [0, 3]


@pytest.mark.parametrize("kw,match", [(dict(num_draft=0), "num-draft"), (dict(min_confidence=1.5), "min-confidence")])
def test_build_option_errors(target, kw, match):
    model, tok = target
    with pytest.raises(GenerationError, match=match):
        registry.build("ngram", model, tok, **kw)


@pytest.mark.parametrize("kw,match", [(dict(top_p=1.5), "top-p"), (dict(top_p=-0.1), "top-p"), (dict(top_k=-1), "top-k"),
                                      (dict(max_tokens=-1), "max-tokens"), (dict(num_draft=-2), "num-draft"),
                                      (dict(temp=-1.0), "temp")])
def test_bad_sampling_options(target, kw, match):
    model, tok = target
    with pytest.raises(GenerationError, match=match):
        list(speculative_generate_step(tok.encode("def add"), model, None, **kw))


def test_self_drafter_never_changes_the_shared_target(target):
    """While the self drafter runs its layers, the target (which another request may be running) keeps all of its own."""
    model, tok = target
    full = list(model.model.layers)
    seen = []
    layer = full[0]
    cls = type(layer)

    class Spy(cls):
        def __call__(self, *a, **kw):
            seen.append(len(model.model.layers))
            return cls.__call__(self, *a, **kw)

    drafter = SelfDrafter(model, [0, 3], model.args.vocab_size, min_confidence=0.0)
    layer.__class__ = Spy
    try:
        steps = list(speculative_generate_step(tok.encode("def add(a, b):"), model, drafter, num_draft=3,
                                               adaptive=False, max_tokens=10))
    finally:
        layer.__class__ = cls
    assert len(steps) == 10 and seen  # layer 0 ran, in draft and verify passes
    assert set(seen) == {len(full)}  # and at no time was the target's layer list cut
    assert list(model.model.layers) == full and len(drafter.model.layers) == 2


def test_ngram_n_sets_the_longest_ngram(target):
    model, tok = target
    d = registry.build("ngram:3", model, tok, num_draft=4)
    assert (d.n, d.k, d.min_n) == (3, 4, 2)
    assert registry.build("ngram", model, tok).n == ngram.DEFAULT_N


def test_quant_self_builds_from_a_spec_and_refuses_a_quantized_target(target, tiny_models, tmp_path):
    from mlx_spec.make import resolve

    model, tok = target
    d = registry.build("hybrid:quant-self:int8", model, tok)
    assert d.fallback.name == "quant-self" and d.fallback.format == "int8"
    q = resolve.convert(tiny_models["qwen2"], tmp_path / "q8", quantize=8, group_size=32, dtype="float32")
    qmodel, qtok, _ = load_model(str(q))
    with pytest.raises(GenerationError, match="already quantized"):
        registry.build("quant-self", qmodel, qtok)


def test_suffix_shared_uses_the_process_memory(target):
    from mlx_spec.gen.drafters.suffix import PROCESS_MEMORY

    model, tok = target
    assert registry.build("suffix:shared", model, tok).memory is PROCESS_MEMORY
    assert registry.build("suffix", model, tok).memory is None
