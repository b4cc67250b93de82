"""The CLI end to end: one-line errors with a non-zero exit, and the happy paths on tiny models. Each command runs in a
process of its own, but the table of bad inputs, which runs the same `main` in this one (a real process's one-line
errors of convert and generate: the tests after the table)."""

import json

import pytest
from conftest import make_model, one_line_error, run_cli, run_main

from mlx_spec.device import describe

pytestmark = pytest.mark.slow  # the real command in a process


def test_generate_plain_and_speculative_agree(tiny_models):
    outs = {}
    for draft in (None, str(tiny_models["qwen2_draft"]), "hybrid"):  # every drafter's equality: test_speculative
        args = ["generate", "--model", str(tiny_models["qwen2"]), "--prompt", "def add(a, b):", "--max-tokens", "24"]
        res = run_cli(*args, *(["--draft", draft, "--verbose"] if draft else []))
        assert res.returncode == 0, res.stderr
        outs[draft] = res.stdout
        if draft:
            assert "accepted" in res.stderr and "tokens/s" in res.stderr
            assert f"device:     {describe()}\n" in res.stderr  # which device ran: "cpu (AMD EPYC, OpenBLAS)"
    assert len(set(outs.values())) == 1, outs


def test_generate_takes_the_prompt_as_its_argument(tiny_models):
    """`mlx-spec generate --model M "prompt"`, as `ollama run` takes it: the reply --prompt gives, not the default's."""
    common = ["generate", "--model", str(tiny_models["qwen2"]), "--max-tokens", "12", "--no-chat"]
    given = run_cli(*common, "def add(a, b):")
    assert given.returncode == 0, given.stderr
    assert given.stdout == run_main(*common, "--prompt", "def add(a, b):").stdout
    assert given.stdout != run_main(*common).stdout  # the argument was read, not the default prompt


def test_convert_cli_and_generate_from_result(tiny_models, tmp_path):
    out = tmp_path / "draft"
    res = run_cli(
        "convert", str(tiny_models["qwen2"]), str(out), "--quantize", "int4", "--keep-layers", "2", "--group-size", "32"
    )
    assert res.returncode == 0, res.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["quantization"]["bits"] == 4
    assert run_cli("generate", "--model", str(out), "--prompt", "x", "--max-tokens", "4").returncode == 0
    assert "already exists" in one_line_error(run_cli("convert", str(tiny_models["qwen2"]), str(out)))


def test_convert_cli_composes_the_draft_lab_methods(tiny_models, tmp_path):
    out = tmp_path / "lab"
    res = run_cli(
        "convert",
        str(tiny_models["qwen2"]),
        str(out),
        "-q",
        "mxfp4",
        "--prune",
        "2:4",
        "--keep-layers",
        "2",
        "--layer-pick",
        "importance",
        "--dtype",
        "float32",
    )
    assert res.returncode == 0, res.stderr
    ops = json.loads((out / "config.json").read_text())["mlx_spec"]["operations"]
    assert [o["op"] for o in ops] == ["layer_drop", "dtype", "prune", "quantize"]
    assert ops[0]["pick"] == "importance" and ops[3]["mode"] == "mxfp4"
    assert run_cli("generate", "--model", str(out), "--prompt", "x", "--max-tokens", "4").returncode == 0
    res = run_cli("convert", str(tiny_models["qwen2"]), str(tmp_path / "gptq"), "-q", "gptq-int4", "--group-size", "32")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / "gptq")  # mlx-lm's prints and bars stay out of pipes and logs
    assert "Quantizing" not in res.stderr and "Hessians" not in res.stderr


@pytest.mark.parametrize(
    "args,match",
    [
        (["convert", "SRC", "OUT", "--quantize", "int5"], "bits"),
        (["convert", "SRC", "OUT", "--quantize", "fp4"], "--quantize"),
        (["convert", "SRC", "OUT", "--keep-layers", "0"], "keep-layers"),
        (["convert", "SRC", "OUT", "--prune", "5:4"], "--prune"),
        (["convert", "SRC", "OUT", "--layer-pick", "importance"], "needs --keep-layers"),
        (
            [
                "convert",
                "SRC",
                "OUT",
                "--keep-layers",
                "2",
                "--layer-pick",
                "importance",
                "--calibration",
                "/no/such.txt",
            ],
            "calibration file",
        ),
        (["convert", "SRC", "OUT", "--keep-layers", "99"], "keep-layers"),
        (["convert", "no-such-recipe", "OUT"], "unknown model"),
        (["fetch", "tinyllama-int4"], "HF_HUB_OFFLINE"),
        (["generate", "--model", "MODEL", "--draft", "ngram", "--num-draft", "0"], "num-draft"),
        (["generate", "--model", "MODEL", "--temp", "-1"], "temp"),
        (["generate", "--model", "MODEL", "--draft", "OTHER"], "tokenizer differs"),
        (["generate", "--model", "/nonexistent/model.gguf"], "not found"),
        (["generate", "--model", "MODEL", "--prompt", "a", "b"], "not both"),
    ],
)
def test_bad_input_is_one_line(tiny_models, tmp_path, args, match):
    subs = {"SRC": str(tiny_models["qwen2"]), "OUT": str(tmp_path / "out"), "MODEL": str(tiny_models["qwen2"])}
    if "OTHER" in args:
        subs["OTHER"] = str(make_model(tmp_path / "other", "qwen2", seed=9, layers=1, tokenizer_size=300))
    assert match in one_line_error(run_main(*[subs.get(a, a) for a in args]))
    assert not (tmp_path / "out").exists()


def test_prompt_longer_than_context(tiny_models):
    res = run_cli("generate", "--model", str(tiny_models["qwen2"]), "--prompt", "def add(a, b): " * 400, "--no-chat")
    assert "context" in one_line_error(res)


def test_models_lists_recipes():
    res = run_cli("models")
    assert res.returncode == 0
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m", "tinyllama-int4", "llama-2-7b-int8"):
        assert name in res.stdout
    assert "MLX_SPEC_HOME" in res.stdout
