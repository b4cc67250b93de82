"""Bench helpers: mlx-lm's acceptance rebuilt from its from_draft flags, the prompt sets, and rounds priced."""

import pytest

from mlx_spec.bench import rounds
from mlx_spec.bench.common import first_mismatch, rounds_from_flags
from mlx_spec.bench.prompts import PROSE_QUESTIONS, build
from mlx_spec.bench.results import SCHEMA, read_current

T, F = True, False


def test_rounds_from_flags_rebuilds_each_round():
    # k=3: [T T F] two accepted + correction; [F] none accepted; [T T T F] all three + bonus.
    r = rounds_from_flags([T, T, F, F, T, T, T, F], k=3, max_tokens=100)
    assert (r["rounds"], r["proposed"], r["accepted"]) == (3, 9, 5)
    assert r["proposed_by_position"] == [3, 3, 3] and r["accepted_by_position"] == [2, 2, 1]
    assert r["mean_accepted"] == 5 / 3 and r["draft_share"] == 5 / 8


def test_rounds_from_flags_near_max_tokens_and_at_eos():
    # max_tokens=4, k=3: round 1 proposes 3 (T T F: 3 tokens), round 2 may propose only 1 more token.
    r = rounds_from_flags([T, T, F, F], k=3, max_tokens=4)
    assert r["proposed_by_position"] == [2, 1, 1] and r["accepted_by_position"] == [1, 1, 0]
    # A run cut at an EOS inside the drafts: the unseen drafts of that round count as rejected.
    r = rounds_from_flags([T, T], k=3, max_tokens=100)
    assert (r["rounds"], r["proposed"], r["accepted"]) == (1, 3, 2)


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


class _Tok:
    chat_template = None

    def encode(self, text):
        return [ord(c) % 50 for c in text[:20]]


def test_prompt_sets_are_interleaved():
    """One prompt of each set in turn, each set in its own order, so noise falls on all sets; a longer set's
    rest comes last."""
    prompts = build(_Tok(), 3, 2, n_prose=3, n_ptq=1)
    assert [p.id for p in prompts] == [
        "HumanEval/0",
        "HumanEval/0:type-hints",
        "prose/0",
        "ptq/0",
        "HumanEval/1",
        "HumanEval/1:rename",
        "prose/1",
        "HumanEval/2",
        "prose/2",
    ]
    assert [p.set for p in prompts[:4]] == ["humaneval", "edit", "prose", "ptq"]
    assert prompts[2].text == PROSE_QUESTIONS[0] and "def has_close_elements" in prompts[1].text


@pytest.mark.slow  # a benchmark run: every drafter kind
def test_the_spec_benchmark_runs_every_drafter_kind_on_tiny_models(tiny_models, tmp_path):
    """Each config of `bench spec` (but mlx-lm's and the quantized drafts, which need the real pair) on a tiny
    target: every output token-identical to plain decoding, every ratio computed."""
    import json

    from mlx_spec.bench.spec import SpecSettings, run_spec

    draft = str(tiny_models["qwen2_draft"])
    s = SpecSettings(
        target=str(tiny_models["qwen2"]),
        drafts={"f32": draft, "int8": draft, "int4": draft},
        configs=["plain", "model-f32", "ngram", "suffix", "self", "quant-self", "hybrid"],
        humaneval=1,
        edit=0,
        prose=1,
        max_tokens=12,
    )  # the edits outgrow the tiny context
    run = run_spec(s, str(tmp_path))
    data = json.loads(run.json_path.read_text())
    assert data["complete"] and not data["errors"]
    configs = {r["config"] for r in data["records"]}
    assert configs == set(s.configs)
    assert all(r["identical"] for r in data["records"] if r["config"] != "plain")


def _result(tmp_path):
    """A result file of one target with a plain row, a hybrid row and mlx-lm's row (no trace) on two prompts."""
    import json

    rows = [{"key": f"t|{d}", "target": "t", "draft": d} for d in ("none", "hybrid:d", "mlx-lm-spec:d")]
    plain = [["", 0, 0, s, 0.0, 0.0, 0] for s in (0.3, 0.5, 1.0)]  # median 0.5 (the mean would be 0.6)
    drafted = [["suffix", 4, 3, 0.7, 0.1, 0.0, 0], ["", 0, 0, 0.5, 0.0, 0.0, 0], ["model", 3, 0, 0.6, 0.3, 0.0, 0]]
    records = [
        {"row": f"t|{d}", "prompt": p, "set": s, "stats": {"trace": trace}}
        for p, s in (("HumanEval/0", "humaneval"), ("prose/0", "prose"))
        for d, trace in (("none", plain), ("hybrid:d", drafted), ("mlx-lm-spec:d", None))
    ]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": SCHEMA, "rows": rows, "records": records}))
    return path


def test_rounds_are_priced_against_the_median_plain_step(tmp_path):
    """A drafted round saves (accepted + 1) plain steps less its verify and drafting time; a plain round one step."""
    data = read_current(_result(tmp_path))
    out = rounds.report(data)
    want = "model 1r/1t -0.4s  plain 1r/1t +0.0s  suffix 1r/4t +1.2s"  # 0.5 - 0.9; 0.5 - 0.5; 4 * 0.5 - 0.8
    assert f"| HumanEval/0 | hybrid:d | 0.500 | {want} |" in out and f"| prose/0 | hybrid:d | 0.500 | {want} |" in out
    assert "| hybrid:d | model 2r/2t -0.8s  plain 2r/2t +0.0s  suffix 2r/8t +2.4s |" in out  # the row's totals
    assert "mlx-lm-spec" not in out and "| none |" not in out  # no trace to price; the baseline itself
    assert "prose/0" not in rounds.report(data, prompt_set="humaneval")
    assert "hybrid:d" not in rounds.report(data, rows=["ngram"])


def test_bench_report_rounds_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from mlx_spec.bench import app
    from mlx_spec.errors import MlxSpecError

    path = str(_result(tmp_path))
    r = CliRunner().invoke(app, ["report", path, "--rounds", "--rows", "hybrid:d", "--set", "prose"])
    assert r.exit_code == 0 and "| prose/0 | hybrid:d |" in r.stdout and "HumanEval/0" not in r.stdout
    r = CliRunner().invoke(app, ["report", path, "--set", "prose"])
    assert isinstance(r.exception, MlxSpecError) and "add --rounds" in str(r.exception)
