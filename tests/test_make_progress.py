"""Progress: one bar per long making step on a terminal, nothing at all when stderr is not a terminal."""

import sys

import pytest
from conftest import TtyStderr
from test_gguf import write_tiny_gguf

from mlx_spec.make.gguf_weights import gguf_to_hf
from mlx_spec.make.resolve import convert


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "qwen2.gguf"
    write_tiny_gguf(path, "qwen2")
    return path


def test_conversion_is_silent_off_a_terminal_and_shows_one_bar_on_one(tiny_models, tmp_path, capfd, monkeypatch):
    convert(str(tiny_models["qwen2"]), tmp_path / "quiet", dtype="float32", quantize=4, keep_layers=2)
    err = capfd.readouterr().err
    assert "converting" not in err and "step" not in err, err
    monkeypatch.setattr(sys, "stderr", TtyStderr())
    convert(str(tiny_models["qwen2"]), tmp_path / "shown", dtype="float32", quantize=4, keep_layers=2)
    shown = sys.stderr.getvalue()
    assert "converting qwen2" in shown and "4/4" in shown, shown


def test_dequantization_is_silent_off_a_terminal_and_shows_one_bar_on_one(tiny_gguf, tmp_path, capfd, monkeypatch):
    (tmp_path / "quiet").mkdir()
    gguf_to_hf(tiny_gguf, tmp_path / "quiet")
    err = capfd.readouterr().err
    assert "dequantizing" not in err and "tensor" not in err, err
    monkeypatch.setattr(sys, "stderr", TtyStderr())
    (tmp_path / "shown").mkdir()
    gguf_to_hf(tiny_gguf, tmp_path / "shown")
    shown = sys.stderr.getvalue()
    assert "dequantizing qwen2.gguf" in shown and "tensor" in shown, shown
