"""The public API: `from mlx_spec import load, generate, stream_generate, convert, Session`, used as a user would."""

import os
import subprocess
import sys

import pytest
from conftest import make_model, plain_greedy

import mlx_spec

PROMPT = "def add(a, b):\n    return a + b\ndef add(a, b):\n"


def test_the_top_level_names_are_the_documented_functions():
    from mlx_spec.gen.session import Session
    from mlx_spec.gen.stream import generate, stream_generate
    from mlx_spec.make.resolve import convert
    from mlx_spec.named import load

    assert (mlx_spec.load, mlx_spec.generate, mlx_spec.stream_generate, mlx_spec.convert, mlx_spec.Session) == (
        load,
        generate,
        stream_generate,
        convert,
        Session,
    )
    assert {"load", "generate", "stream_generate", "convert", "Session"} <= set(mlx_spec.__all__)
    assert set(mlx_spec.__all__) <= set(dir(mlx_spec))


@pytest.mark.slow  # a fresh interpreter in a process
def test_importing_it_only_sets_up_blas_and_the_cuda_attention_setting():
    # A fresh interpreter: this one has loaded MLX and the layers already.
    code = (
        "import os, sys, mlx_spec\n"
        "print(os.environ['MLX_CUDA_USE_CUDNN_SDPA'], mlx_spec.blas.status != 'not-run',"
        " sorted(m for m in sys.modules if m == 'mlx.core' or m.startswith('mlx_spec.')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLX_CUDA_USE_CUDNN_SDPA"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split(None, 2) == ["0", "True", "['mlx_spec.backend', 'mlx_spec.blas', 'mlx_spec.version']\n"]


def test_a_user_converts_loads_and_generates_by_the_top_level_names(tmp_path):
    from mlx_spec import Session, convert, generate, load, stream_generate

    src = make_model(tmp_path / "hf", "qwen2", seed=0, layers=2, scale=4.0)
    folder = convert(str(src), tmp_path / "mlx", dtype="float32")
    assert load(str(folder))[2] is None  # no drafter asked: plain decoding

    model, tokenizer, drafter = load(str(folder), "ngram")
    ids = tokenizer.encode(PROMPT)
    expected = plain_greedy(model, ids, 16, eos=set(tokenizer.eos_token_ids))

    response = generate(model, tokenizer, PROMPT, drafter, max_tokens=16)
    assert response.tokens == expected  # lossless: the drafter changes the speed, never the tokens
    assert response.text == tokenizer.decode([t for t in expected if t not in tokenizer.eos_token_ids])

    events = list(stream_generate(model, tokenizer, PROMPT, drafter, max_tokens=16))
    assert [e.token for e in events] == expected and "".join(e.text for e in events) == response.text
    assert events[-1].finish_reason in ("stop", "length")

    session = Session(model, tokenizer, drafter)
    assert [e.token for e in session.generate(ids, max_tokens=16)] == expected
