"""The draft lab's compression methods in `convert`: pruning patterns, FP and NF4 formats, layer picks."""

import json
import shutil

import mlx.core as mx
import pytest
from conftest import provenance
from mlx.utils import tree_flatten
from mlx_lm.utils import load

from mlx_spec.errors import ConvertError
from mlx_spec.make import importance
from mlx_spec.make import resolve as conv
from mlx_spec.make.convert import draft_methods
from mlx_spec.make.prune import block_mask, nm_mask, parse_prune, unstructured_mask
from mlx_spec.make.quant import FP_MODES, nf4_codebook, nf4_roundtrip, parse_quantize


def block_weights(model):
    """Every 2-D linear weight inside the blocks, by path."""
    return {
        f"{i}.{k}": v
        for i, layer in enumerate(model.model.layers)
        for k, v in tree_flatten(layer.parameters())
        if k.endswith(".weight") and v.ndim == 2
    }


# ---- pruning patterns -------------------------------------------------------------------------------


def test_unstructured_prunes_exactly_the_smallest_weights():
    w = mx.random.normal((32, 48), key=mx.random.key(0))
    keep = unstructured_mask(w, 0.25)
    assert (~keep).sum().item() == round(0.25 * w.size)
    mags = mx.abs(w)
    assert mx.where(keep, -mx.inf, mags).max().item() <= mx.where(keep, mags, mx.inf).min().item()


def test_block_pruning_zeroes_whole_blocks_by_their_l1_norm():
    w = mx.random.normal((32, 64), key=mx.random.key(1))
    keep = block_mask(w, 8, 0.5)
    blocks = keep.reshape(4, 8, 8, 8).transpose(0, 2, 1, 3).reshape(32, 64)  # one row per 8x8 block
    per_block = blocks.sum(axis=1)
    assert set(per_block.tolist()) <= {0, 64}  # each block all kept or all zeroed
    assert (per_block == 0).sum().item() == 16  # exactly half of the 32 blocks
    norms = mx.abs(w).reshape(4, 8, 8, 8).sum(axis=(1, 3)).reshape(-1)
    dropped = per_block == 0
    assert mx.where(dropped, norms, -mx.inf).max().item() <= mx.where(dropped, mx.inf, norms).min().item()


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (1, 4)])
def test_n_m_keeps_exactly_n_of_every_m(n, m):
    w = mx.random.normal((16, 64), key=mx.random.key(2))
    keep = nm_mask(w, n, m)
    groups, mags = keep.reshape(16, 64 // m, m), mx.abs(w).reshape(16, 64 // m, m)
    assert (groups.sum(axis=-1) == n).all().item()
    kept_min = mx.where(groups, mags, mx.inf).min(axis=-1)
    dropped_max = mx.where(groups, -mx.inf, mags).max(axis=-1)
    assert (dropped_max <= kept_min).all().item()


@pytest.mark.parametrize(
    "spec,check",
    [
        ("unstructured:0.5", lambda w: (w == 0).sum().item() == w.size // 2),
        ("block:16:0.25", lambda w: (w == 0).sum().item() == w.size // 4),
        ("2:4", lambda w: ((w != 0).reshape(w.shape[0], -1, 4).sum(-1) <= 2).all().item()),
    ],
)
def test_convert_prunes_every_block_matrix_and_nothing_else(tiny_models, tmp_path, spec, check):
    out = conv.convert(tiny_models["qwen2"], tmp_path / "p", dtype="float32", prune=spec)
    model, _ = load(str(out))
    src, _ = load(str(tiny_models["qwen2"]))
    weights = block_weights(model)
    assert weights and all(check(w) for w in weights.values())
    assert mx.array_equal(model.model.embed_tokens.weight, src.model.embed_tokens.weight).item()
    assert mx.array_equal(model.model.norm.weight, src.model.norm.weight).item()
    op = provenance(out)["operations"][-1]
    assert op["op"] == "prune" and op["matrices"] == len(weights)
    assert op["measured_sparsity"] == pytest.approx(parse_prune(spec).sparsity, abs=0.01)
    assert model(mx.array([[1, 2, 3]])).shape[-1] == src.args.vocab_size  # it runs


def test_pruning_composes_with_quantization(tiny_models, tmp_path):
    out = conv.convert(tiny_models["qwen2"], tmp_path / "p", dtype="float32", prune="2:4", quantize=8, group_size=32)
    assert [o["op"] for o in provenance(out)["operations"]] == ["dtype", "prune", "quantize"]
    model, _ = load(str(out))
    assert model.model.layers[0].mlp.up_proj.bits == 8


# ---- formats ----------------------------------------------------------------------------------------


def test_nf4_codebook_and_round_trip():
    code = nf4_codebook()
    assert code.shape == (16,) and code[0].item() == -1.0 and code[-1].item() == 1.0 and 0.0 in code.tolist()
    w = mx.random.normal((8, 128), key=mx.random.key(3))
    r = nf4_roundtrip(w)
    scale = mx.abs(w).reshape(-1, 64).max(axis=1, keepdims=True)
    on_code = (r.reshape(-1, 64) / scale)[..., None] - code
    assert (mx.abs(on_code).min(axis=-1) < 1e-5).all().item()  # every value is a codebook value times its scale
    half_gap = (code[1:] - code[:-1]).max().item() / 2
    assert (mx.abs(r - w).reshape(-1, 64) <= half_gap * scale + 1e-6).all().item()


def test_nf4_convert_is_simulated_and_loads(tiny_models, tmp_path):
    out = conv.convert(tiny_models["qwen2"], tmp_path / "nf4", dtype="float32", quantize=4, quant_mode="nf4")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization" not in cfg  # no MLX kernel: stored as float
    model, _ = load(str(out))
    w = model.model.layers[0].mlp.up_proj.weight
    assert w.dtype == mx.float32 and mx.array_equal(w, nf4_roundtrip(w)).item()  # already on the NF4 grid
    assert provenance(out)["operations"][-1]["mode"] == "nf4"


@pytest.mark.parametrize("mode,bound", [("mxfp4", 0.26), ("nvfp4", 0.26), ("mxfp8", 0.13)])
def test_fp_modes_round_trip_within_their_format_and_convert(tiny_models, tmp_path, mode, bound):
    group, bits = FP_MODES[mode]
    w = mx.random.normal((16, 128), key=mx.random.key(4))
    r = mx.dequantize(*mx.quantize(w, group, bits, mode=mode), group_size=group, bits=bits, mode=mode)
    absmax = mx.abs(w).reshape(-1, group).max(axis=1, keepdims=True)
    err = mx.abs(r - w).reshape(-1, group)
    assert (err <= bound * absmax).all().item() and err.mean().item() < 0.1 * absmax.mean().item()
    out = conv.convert(tiny_models["qwen2"], tmp_path / mode, dtype="float32", quantize=bits, quant_mode=mode)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["mode"] == mode and cfg["quantization"]["group_size"] == group
    model, _ = load(str(out))
    assert model.model.layers[0].mlp.up_proj.mode == mode
    assert model(mx.array([[1, 2, 3]])).shape[-1] == model.args.vocab_size


def test_parse_quantize():
    assert parse_quantize("int4") == (4, "affine") and parse_quantize("8") == (8, "affine")
    assert parse_quantize("mxfp4") == (4, "mxfp4") and parse_quantize("NF4") == (4, "nf4")
    for bad in ("fp4", "int5", "x"):
        with pytest.raises(ConvertError, match="--quantize"):
            parse_quantize(bad)


# ---- layer picks ------------------------------------------------------------------------------------


def test_first_layers_keeps_exactly_the_first_k(tiny_models, tmp_path):
    out = conv.convert(tiny_models["qwen2"], tmp_path / "first", dtype="float32", keep_layers=3, layer_pick="first")
    assert provenance(out)["operations"][0]["kept"] == [0, 1, 2]
    model, _ = load(str(out))
    src, _ = load(str(tiny_models["qwen2"]))
    for i in range(3):
        assert mx.array_equal(model.model.layers[i].mlp.up_proj.weight, src.model.layers[i].mlp.up_proj.weight).item()


@pytest.fixture
def planted(tiny_models, tmp_path):
    """The tiny qwen2 with blocks 0, 1 and 3 made pass-through (their attention and MLP outputs zeroed): block 2
    alone changes the hidden state."""
    folder = tmp_path / "planted"
    shutil.copytree(tiny_models["qwen2"], folder)
    path = next(folder.glob("*.safetensors"))
    weights = mx.load(str(path))
    for i in (0, 1, 3):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            key = f"model.layers.{i}.{name}"
            weights[key] = mx.zeros_like(weights[key])
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})
    return folder


def test_importance_keeps_a_planted_important_block(planted, tmp_path):
    out = conv.convert(planted, tmp_path / "imp", dtype="float32", keep_layers=1, layer_pick="importance")
    op = provenance(out)["operations"][0]
    assert op["kept"] == [2] and op["pick"] == "importance"
    assert min(range(4), key=lambda i: op["similarity"][i]) == 2
    assert all(op["similarity"][i] > 0.999 for i in (0, 1, 3))
    load(str(out))


def test_importance_self_drafting_skips_the_pass_through_blocks_of_each_prompt(planted):
    from mlx_spec.gen import registry
    from mlx_spec.gen.generate import speculative_generate_step

    model, tok = load(str(planted))
    drafter = registry.build("self:importance:1", model, tok)
    prompt = tok.encode("def add(a, b):\n    return a + b\n")
    out = [s.token for s in speculative_generate_step(prompt, model, drafter, max_tokens=8)]
    assert drafter.layers == [2] and len(out) == 8  # block 2 alone changes the hidden state
    assert len(model.model.layers) == 4  # the shared target keeps every block
    with pytest.raises(Exception, match="K must be"):
        registry.build("self:importance:9", model, tok)


def test_importance_ranking_leaves_the_model_unchanged(tiny_models):
    model, tok = load(str(tiny_models["qwen2"]))
    layers = list(model.model.layers)
    sims = importance.block_similarity(model, [tok.encode("def add(a, b):\n    return a + b\n")])
    assert len(sims) == 4 and all(-1.0 <= s <= 1.0 for s in sims)
    assert list(model.model.layers) == layers


# ---- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(prune="3:2"), "0 < N < M"),
        (dict(prune="unstructured:1.5"), "sparsity"),
        (dict(prune="block:7:0.5"), "7x7 blocks"),
        (dict(prune="half"), "--prune must be"),
        (dict(layer_pick="first"), "needs --keep-layers"),
        (dict(keep_layers=2, layer_pick="random"), "--layer-pick"),
        (dict(quantize=4, quant_mode="mxfp4", group_size=128), "group-size"),
        (dict(quantize=4, quant_mode="nf4", head_bits=8), "head-bits"),
        (dict(quant_mode="mxfp4"), "needs --quantize"),
        (dict(keep_layers=5, layer_pick="first"), "between 1 and"),
    ],
)
def test_bad_method_options(tiny_models, tmp_path, kwargs, match):
    with pytest.raises(ConvertError, match=match):
        conv.convert(tiny_models["qwen2"], tmp_path / "out", dtype="float32", **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content,match",
    [(b"", "empty"), (b"\x00\x01\x02", "not text"), (b"\xff\xfe\xfa", "not UTF-8"), (None, "No such file")],
)
def test_bad_calibration_file(tiny_models, tmp_path, content, match):
    cal = tmp_path / "cal.txt"
    if content is not None:
        cal.write_bytes(content)
    with pytest.raises(ConvertError, match=match):
        conv.convert(tiny_models["qwen2"], tmp_path / "out", keep_layers=2, layer_pick="importance", calibration=cal)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a conversion per draft method: the draft search's ladder
def test_every_draft_method_writes_a_folder_that_loads_and_generates(tiny_models, tmp_path):
    from mlx_lm import generate

    for name, options in draft_methods().items():
        options = dict(options)
        fraction = options.pop("keep_fraction", None)
        if fraction is not None:
            options["keep_layers"] = max(1, round(4 * fraction))
        out = conv.convert(tiny_models["qwen2"], tmp_path / name.replace(":", "-"), **options)
        model, tok = load(str(out))
        assert generate(model, tok, "def add(a, b):", max_tokens=4), name


# ---- calibrated quantization (mlx-lm's GPTQ, AWQ, DWQ) --------------------------------------------------


def _output_error(folder, ref_model, tokens):
    model, _ = load(str(folder))
    x = mx.array(tokens)[None]
    return mx.abs(model(x) - ref_model(x)).mean().item()


SEARCHING = pytest.mark.slow  # AWQ searches its scales and DWQ distils: minutes on 2 cores, where GPTQ takes seconds


@pytest.mark.parametrize("method", ["gptq", pytest.param("awq", marks=SEARCHING), pytest.param("dwq", marks=SEARCHING)])
def test_calibrated_quantization_through_mlx_lm(tiny_models, tmp_path, method):
    out = conv.convert(
        tiny_models["qwen2"], tmp_path / method, dtype="float32", quantize=4, group_size=32, quant_mode=method
    )
    op = provenance(out)["operations"][-1]
    assert op["method"] == method and op["format"] == f"{method}-int4" and op["calibration_tokens"] > 0
    model, tok = load(str(out))
    assert model.model.layers[0].mlp.up_proj.bits == 4
    ref, _ = load(str(tiny_models["qwen2"]))
    rtn = conv.convert(tiny_models["qwen2"], tmp_path / "rtn", dtype="float32", quantize=4, group_size=32, force=True)
    tokens = tok.encode(importance.calibration_texts()[0])[:64]
    err, err_rtn = _output_error(out, ref, tokens), _output_error(rtn, ref, tokens)
    assert err < 2 * err_rtn, (err, err_rtn)  # a working quantizer: same order as round-to-nearest


def test_dwq_needs_enough_calibration_text(tiny_models, tmp_path):
    cal = tmp_path / "short.txt"
    cal.write_text("def f(x):\n    return x\n")
    with pytest.raises(ConvertError, match="at least"):
        conv.convert(
            tiny_models["qwen2"],
            tmp_path / "out",
            dtype="float32",
            quantize=4,
            group_size=32,
            quant_mode="dwq",
            calibration=cal,
        )
    assert not (tmp_path / "out").exists()
