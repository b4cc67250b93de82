"""`mlx-spec bench serve`: concurrent clients against two real servers (drafter on and off), ratios from one run."""

import json

import pytest
from conftest import long_context, one_line_error, run_main

from mlx_spec.bench.served import ThroughputSettings, run_throughput
from mlx_spec.server.bench_cli import Server


@pytest.mark.slow  # the throughput bench: two servers, every client count
def test_served_throughput_reports_every_cell_and_mode_and_identical_replies(tiny_models, tmp_path):
    target = long_context(tiny_models["qwen2"], tmp_path / "target")
    s = ThroughputSettings(model=str(target), draft="ngram", clients=[1, 2], max_tokens=8, repeats=2)
    run = run_throughput(Server(), s, str(tmp_path / "runs"))
    data = json.loads(run.json_path.read_text())
    assert data["complete"] and len(data["cells"]) == 2 * 2 * 4  # repeats x client counts x modes
    modes = [c["mode"] for c in data["cells"]]
    assert modes[:4] == ["off", "turns", "on", "mlx-lm"] and modes[8:12] == ["turns", "on", "mlx-lm", "off"]
    prompts = [tuple(c["prompts"]) for c in data["cells"] if c["mode"] == "on"]
    assert len(set(prompts)) == len(prompts)  # fresh prompts in every cell: no cache reuse flatters a mode
    for c in data["cells"]:
        assert len(c["texts"]) == len(c["latencies_s"]) == c["clients"] and c["wall_s"] > 0
        assert 0 < c["tokens"] <= 8 * c["clients"]
    assert data["identical"] == [8, 8]  # lossless under concurrency: greedy replies match plain decoding
    plain = {(c["clients"], c["repeat"]): c["texts"] for c in data["cells"] if c["mode"] == "off"}
    ours = {(c["clients"], c["repeat"]): c["texts"] for c in data["cells"] if c["mode"] == "mlx-lm"}
    assert ours == plain  # mlx-lm's batch generator answers the same prompts the same way
    rows = {(r["clients"], r["mode"]): r for r in data["summary"]}
    assert set(rows) == {(c, m) for c in (1, 2) for m in ("off", "turns", "on", "mlx-lm")}
    on = sorted(
        (c["repeat"], c["tokens"] / c["wall_s"]) for c in data["cells"] if c["mode"] == "on" and c["clients"] == 2
    )
    turns = sorted(
        (c["repeat"], c["tokens"] / c["wall_s"]) for c in data["cells"] if c["mode"] == "turns" and c["clients"] == 2
    )
    assert rows[(2, "on")]["vs_turns_range"] == sorted(a / b for (_, a), (_, b) in zip(on, turns))
    assert rows[(1, "off")]["vs_first_clients"] == 1.0 and rows[(2, "turns")]["vs_turns"] is None
    md = run.md_path.read_text()
    assert "| Clients | Mode |" in md and "drafter, batched" in md and "mlx-lm BatchGenerator" in md


@pytest.mark.slow  # the throughput bench: two servers, every client count
def test_clients_that_send_their_next_request_when_a_reply_ends_get_every_prompt_answered(tiny_models, tmp_path):
    target = long_context(tiny_models["qwen2"], tmp_path / "target")
    s = ThroughputSettings(model=str(target), draft="ngram", clients=[2], max_tokens=6, repeats=1, requests=3)
    data = json.loads(run_throughput(Server(), s, str(tmp_path / "runs")).json_path.read_text())
    for c in data["cells"]:
        assert c["clients"] == 2 and len(c["prompts"]) == len(c["texts"]) == 6 and all(c["latencies_s"])
        assert max(c["latencies_s"]) < c["wall_s"] or c["mode"] == "mlx-lm"  # three replies in turn per client
    assert data["identical"] == [2, 2]
    assert "3 request(s) per client" in run_md(tmp_path)


def run_md(tmp_path) -> str:
    return next((tmp_path / "runs").glob("*.md")).read_text()


@pytest.mark.slow
def test_bench_serve_refuses_a_run_without_a_drafter_in_one_line(tiny_models):
    r = run_main("bench", "serve", "--model", tiny_models["qwen2"], "--draft", "none")
    assert one_line_error(r) == "error: --draft must name a drafter: the run compares it against none"


def test_bench_serve_is_mounted_under_the_bench_with_its_options():
    """mlx_spec/server/bench_cli.py mounts the command on the bench; `mlx-spec bench` lists it."""
    from typer.testing import CliRunner

    from mlx_spec.cli import app

    r = CliRunner().invoke(app, ["bench", "serve", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for option in (
        "--model",
        "--draft",
        "--clients",
        "--max-tokens",
        "--repeats",
        "--num-draft",
        "--requests",
        "--out",
    ):
        assert option in r.stdout
    assert "Served throughput" in CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).stdout


def test_every_client_count_sends_the_same_mix_of_prompt_kinds(tiny_models):
    """Over 3 repeats, 1, 2 and 4 clients send HumanEval, edit and prose prompts in equal shares, all distinct."""
    from mlx_lm import load

    from mlx_spec.bench.served import KINDS, plan_prompts

    _model, tokenizer = load(str(tiny_models["qwen2"]))
    plan = plan_prompts(tokenizer, [1, 2, 4], 3)
    for c in (1, 2, 4):
        kinds = [p.set for r in range(3) for p in plan[(c, r)]]
        assert len(kinds) == 3 * c and all(kinds.count(k) == c for k in KINDS)
    ids = [p.id for cell in plan.values() for p in cell]
    assert len(ids) == len(set(ids)) == 21
