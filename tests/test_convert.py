"""`convert`: dtype, quantization, layer-drop, provenance, atomic writes, and clear errors on bad input."""

import json
import shutil

import mlx.core as mx
import pytest
from conftest import close, provenance
from mlx_lm.utils import load

from mlx_spec.errors import ConvertError, SourceError, UnsupportedError
from mlx_spec.make import layers
from mlx_spec.make import resolve as conv


def logits(folder, tokens=(1, 2, 3, 4)):
    model, _ = load(str(folder))
    return model(mx.array(tokens)[None])[0, -1]


def test_float32_round_trip(tiny_models, tmp_path):
    out = conv.convert(tiny_models["qwen2"], tmp_path / "f32", dtype="float32")
    assert close(logits(out), logits(tiny_models["qwen2"]), 1e-5)
    prov = provenance(out)
    assert prov["operations"] == [{"op": "dtype", "dtype": "float32"}]
    assert len(prov["source_sha256"]) == 64 and prov["version"]


@pytest.mark.parametrize("device, dtype", [("gpu", "bfloat16"), ("cpu", "float32")])
def test_auto_dtype_follows_the_device(tiny_models, tmp_path, monkeypatch, device, dtype):
    """--dtype auto: bfloat16 where MLX runs on a GPU (Metal or CUDA), float32 on the CPU backend."""
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(getattr(mx, device)))
    out = conv.convert(tiny_models["qwen2"], tmp_path / device)
    assert provenance(out)["operations"] == [{"op": "dtype", "dtype": dtype}]
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == dtype
    model, _ = load(str(out))
    assert model.model.embed_tokens.weight.dtype == getattr(mx, dtype)


def test_quantize_all_bits(tiny_models, tmp_path):
    ref = logits(tiny_models["qwen2"])
    errs = {}
    for bits in (2, 3, 4, 6, 8):
        out = conv.convert(tiny_models["qwen2"], tmp_path / f"q{bits}", dtype="float32", quantize=bits, group_size=32)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["quantization"]["bits"] == bits and cfg["quantization"]["group_size"] == 32
        model, _ = load(str(out))
        assert model.model.layers[0].mlp.up_proj.bits == bits
        errs[bits] = mx.abs(logits(out) - ref).max().item()
    # more bits, closer to the float model; int8 within 5 % of the logit range
    assert errs[8] < errs[6] < errs[4] < errs[2], errs
    assert errs[8] < 0.05 * (ref.max() - ref.min()).item(), errs


def test_int8_is_close_and_head_bits_keep_float_head(tiny_models, tmp_path):
    out = conv.convert(tiny_models["llama"], tmp_path / "q8", quantize=8, head_bits=16, dtype="float32")
    model, _ = load(str(out))
    assert not hasattr(model.model.embed_tokens, "bits") and not hasattr(model.lm_head, "bits")
    assert model.model.layers[0].self_attn.q_proj.bits == 8
    assert provenance(out)["operations"][-1]["head_bits"] == 16


def test_keep_layers_rule():
    assert layers.keep_layer_indices(12, 3) == [0, 6, 11]  # the seed's example, last block kept
    assert layers.keep_layer_indices(4, 2) == [0, 3]
    assert layers.keep_layer_indices(24, 24) == list(range(24))
    assert layers.keep_layer_indices(28, 7) == [0, 5, 9, 14, 18, 23, 27]  # 4.5 k, half up
    for bad in (0, 13):
        with pytest.raises(ConvertError, match="between 1 and"):
            layers.keep_layer_indices(12, bad)


def test_keep_layers_and_explicit_layers(tiny_models, tmp_path):
    out = conv.convert(tiny_models["qwen2"], tmp_path / "k2", dtype="float32", keep_layers=2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    assert provenance(out)["operations"][0] == {"op": "layer_drop", "kept": [0, 3], "of": 4, "pick": "even"}
    model, _ = load(str(out))
    src, _ = load(str(tiny_models["qwen2"]))
    assert mx.array_equal(model.model.layers[1].mlp.up_proj.weight, src.model.layers[3].mlp.up_proj.weight).item()
    out2 = conv.convert(tiny_models["qwen2"], tmp_path / "l", dtype="float32", layers=[1, 2])
    assert provenance(out2)["operations"][0]["kept"] == [1, 2]
    # a draft converted from a draft keeps the whole history
    out3 = conv.convert(out, tmp_path / "k2q4", quantize=4, dtype="float32")
    assert [o["op"] for o in provenance(out3)["operations"]] == ["layer_drop", "dtype", "dtype", "quantize"]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_other_architectures(tiny_models, tmp_path, arch):
    out = conv.convert(tiny_models[arch], tmp_path / arch, dtype="float32")
    assert close(logits(out), logits(tiny_models[arch]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(quantize=5), "bits"),
        (dict(quantize=4, group_size=48), "group-size"),
        (dict(dtype="float8"), "dtype"),
        (dict(keep_layers=0), "keep-layers"),
        (dict(keep_layers=5), "keep-layers"),
        (dict(layers=[0, 9]), "layers"),
        (dict(layers=[1, 1]), "layers"),
        (dict(keep_layers=2, layers=[0]), "either"),
        (dict(head_bits=8), "needs --quantize"),
    ],
)
def test_bad_options(tiny_models, tmp_path, kwargs, match):
    with pytest.raises(ConvertError, match=match):
        conv.convert(tiny_models["qwen2"], tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_existing_output_needs_force(tiny_models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError, match="already exists"):
        conv.convert(tiny_models["qwen2"], out)
    assert (out / "keep.txt").read_text() == "mine"
    conv.convert(tiny_models["qwen2"], out, force=True, dtype="float32")
    assert (out / "config.json").is_file() and not (out / "keep.txt").exists()


def test_interrupted_convert_leaves_nothing(tiny_models, tmp_path, monkeypatch):
    import mlx_lm.utils

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(mlx_lm.utils, "save_config", boom)
    with pytest.raises(KeyboardInterrupt):
        conv.convert(tiny_models["qwen2"], tmp_path / "out", dtype="float32")
    assert list(tmp_path.iterdir()) == []


def test_no_disk_space(tiny_models, tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(ConvertError, match="disk space"):
        conv.convert(tiny_models["qwen2"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_safetensors(tiny_models, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_models["qwen2"], bad)
    (bad / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(SourceError, match="cannot load"):
        conv.convert(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_weights_and_unsupported_architecture(tiny_models, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(SourceError, match="no .safetensors"):
        conv.convert(empty, tmp_path / "out")
    alien = tmp_path / "alien"
    shutil.copytree(tiny_models["qwen2"], alien)
    cfg = json.loads((alien / "config.json").read_text())
    cfg["model_type"] = "not_a_model"
    (alien / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="not_a_model"):
        conv.convert(alien, tmp_path / "out")


def test_an_atomically_written_file_has_the_usual_permissions(tmp_path):
    import os
    import stat

    from mlx_spec.make.paths import atomic_file

    old = os.umask(0o022)
    try:
        tmp = atomic_file(tmp_path / "result.json")
        tmp.write_text("{}")
        tmp.replace(tmp_path / "result.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == 0o644  # not mkstemp's 0600
