"""The simulated slow link (`mlx_spec/cluster/link.py`) and the `cluster` bench suite: a wait after every collective
a pass makes, replies unchanged by it, each round split into compute and communication, and the predicted table.

The fast tests shard the tiny target over a group of one: mlx-lm's sharded layers and the round's agreement still
call `mx.distributed`'s collectives (each a no-op), so they are counted as over 2 ranks. The slow one runs the suite
over 2 ranks under `mlx.launch`."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import PROMPTS, make_model, one_line_error, run_cli, run_main

from mlx_spec.bench import cluster as bench
from mlx_spec.bench.common import machine_info
from mlx_spec.bench.suite import Suite, SuiteError
from mlx_spec.bench.suite import load as load_suite
from mlx_spec.cluster import Cluster
from mlx_spec.cluster.link import LINKS_US, Link
from mlx_spec.gen.registry import parse
from mlx_spec.gen.stream import generate
from mlx_spec.named import make_drafter

LAYERS = 2  # the target's blocks: each ends its attention and its MLP in an all_sum
LATENCY = 0.001  # seconds a simulated link waits after each collective
LAUNCH = Path(sys.executable).with_name("mlx.launch")


class Clock:
    """A clock that only a wait moves: the link's timings become the waits it made."""

    def __init__(self):
        self.now, self.waits = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.waits.append(s)
        self.now += s


def fake_link(latency: float = LATENCY) -> tuple[Link, Clock]:
    c = Clock()
    return Link(latency, sleep=c.sleep, clock=c.clock), c


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("link") / "qwen2", "qwen2", seed=0, layers=LAYERS, scale=4.0)


@pytest.fixture(scope="module")
def sharded(target):
    cluster = Cluster.join("tensor")
    model, tok = cluster.load(target)
    return cluster, model, tok


def suite(**kw) -> Suite:
    return Suite(name="cluster", path=Path("cluster.toml"), kind="cluster", max_tokens=12, **kw)


def prompt(tok) -> list[int]:
    return tok.encode(PROMPTS[0] + PROMPTS[1] + PROMPTS[0])  # n-gram bait


def test_the_link_waits_once_after_every_collective_and_is_taken_out_after(sharded):
    cluster, model, _ = sharded
    link, clock = fake_link()
    sizes, shares = (1, 3, 5), 2
    all_sum = mx.distributed.all_sum
    with link.installed():
        for n in sizes:
            mx.eval(model(mx.array([[1] * n])))
        for _ in range(shares):
            cluster.share([7], 1)
    collectives = 2 * LAYERS * len(sizes) + shares  # 2 all_sums a block a pass, and 1 an agreement
    assert clock.waits == [LATENCY] * collectives
    assert link.tally.collectives == collectives and link.tally.waited == pytest.approx(LATENCY * collectives)
    assert link.tally.measured == 0.0  # the fake clock moves only by waits
    assert mx.distributed.all_sum is all_sum
    mx.eval(model(mx.array([[1]])))
    assert link.tally.collectives == collectives  # outside it, nothing is counted or delayed


@pytest.mark.parametrize(  # quick: the model draft (passes over the link in drafting too); the full tier the rest
    "draft", [pytest.param("none", marks=pytest.mark.slow), pytest.param("ngram", marks=pytest.mark.slow), "model"]
)
def test_replies_through_a_slow_link_equal_plain_sharded_decoding(sharded, target, draft):
    cluster, model, tok = sharded
    spec = str(target) if draft == "model" else draft  # the target drafting for itself, loaded whole
    drafter = make_drafter(parse(spec), model, tok) if draft != "none" else None
    ids = prompt(tok)
    plain = generate(model, tok, ids, None, max_tokens=12, eos_token_ids=()).tokens
    s = suite()
    for link in (fake_link()[0], Link(200e-6), Link(0.0)):  # a real wait, too: the link only delays
        rec = bench.measure(s, cluster, model, drafter, ids, link, ())
        assert rec["tokens"] == plain, (draft, link.latency)
    if draft == "model":
        assert rec["stats"]["proposed"] > 0


def test_the_record_splits_every_round_into_compute_and_communication_and_says_simulated(sharded, target):
    cluster, model, tok = sharded
    drafter = make_drafter(parse(str(target)), model, tok)
    link, clock = fake_link()
    rec = bench.measure(suite(), cluster, model, drafter, prompt(tok), link, ())
    rounds, trace = rec["link"]["rounds"], rec["stats"]["trace"]
    assert rec["link"]["simulated"] is True and rec["link"]["latency_us"] == 1000
    assert len(rounds) == rec["stats"]["rounds"] == len(trace) and rec["stats"]["spec_rounds"] > 0
    for collectives, measured, waited in rounds:
        # the round's agreement and whole passes of 2 all_sums a block, each followed by one wait
        assert collectives >= 1 and (collectives - 1) % (2 * LAYERS) == 0, rounds
        assert waited == pytest.approx(LATENCY * collectives) and measured == 0.0
    assert rec["comm_s"] == pytest.approx(sum(m + w for _, m, w in rounds))
    assert rec["compute_s"] + rec["comm_s"] == pytest.approx(sum(t[3] for t in trace))
    assert sum(clock.waits) == pytest.approx(rec["link"]["waited_s"])


@pytest.mark.slow  # the instrument's run: four measured replies and its page
def test_the_predicted_table_renders_and_prices_a_slower_link_higher(sharded, target):
    cluster, model, tok = sharded
    drafter = make_drafter(parse(str(target)), model, tok)
    records = []
    for lat in (0.0, 300.0):
        for name, d in (("none", None), ("D", drafter)):
            rec = bench.measure(suite(), cluster, model, d, prompt(tok), Link(lat * 1e-6, sleep=lambda _s: None), ())
            rec.update(row=f"{lat:g}us|{name}", draft=name, prompt="prose/0", set="prose", repeat=0)
            records.append(rec)
    data = {
        "suite": suite(latencies_us=(0.0, 300.0)).as_dict(),
        "command": ["mlx-spec", "bench", "run", "cluster"],
        "machine": machine_info(),
        "cluster": {"ranks": 1, "latencies_us": [0, 300], "published_links_us": LINKS_US, "draft_gb": {"D": 0.001}},
        "records": records,
    }
    md = bench.render(data)
    assert "**simulated**" in md and "Predicted (not measured)" in md
    assert all(name in md for name, _ in bench.SETUPS)
    table = bench.predicted(data, data["summary"])
    assert len(table) == len(bench.SETUPS) * len(LINKS_US) and all(r[-1].endswith("×") for r in table)
    plain = [float(r[3]) for r in table[: len(LINKS_US)]]  # one setup, its links from fastest to slowest
    assert plain == sorted(plain, reverse=True) and plain[0] > plain[-1]
    assert {s["identical"] for s in data["summary"]} == {1}
    # the link, not this machine's collectives (ranks waiting for each other on shared cores), prices a collective:
    # 70B dense on 2 ranks over RDMA, 24 ms of roofline and 161 collectives of 50 µs and 16 kB at 10 GB/s
    for rec in records:
        rec["link"]["measured_s"] += 0.0025 * rec["link"]["collectives"]
    assert bench.predicted(data, data["summary"]) == table
    assert float(table[0][3]) == pytest.approx(1 / (70.6e9 * 4.5 / 8 / 2 / 819e9 + 161 * (50e-6 + 16384 / 10e9)), 0.01)


@pytest.mark.slow  # the real command in a process
def test_generate_says_its_link_is_simulated_and_needs_a_shard(target):
    args = ["generate", "--model", str(target), "--no-chat", "--max-tokens", "4", "--link-latency-us", "100"]
    res = run_cli(*args, "--shard", "tensor")
    assert res.returncode == 0, res.stderr
    assert "link:       simulated, 100 µs waited after each of" in res.stderr
    assert one_line_error(run_main(*args)) == (
        "error: --link-latency-us simulates the link between ranks: it needs --shard"
    )


def test_the_cluster_suite_file_is_checked_before_anything_loads(tmp_path):
    s = load_suite("cluster")
    assert s.kind == "cluster" and len(s.latencies_us) == 3 and s.prompts["prose"] and s.prompts["edit"]
    assert s.targets[0].drafts == ("hybrid:qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b", "suffix")
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "cluster"\n[[targets]]\nmodel = "m"\n')
    with pytest.raises(SuiteError, match="'latencies_us' must be a list of latencies >= 0"):
        load_suite(str(bad))
    bad.write_text('kind = "table"\nlatencies_us = [50]\n[[targets]]\nmodel = "m"\n')
    with pytest.raises(SuiteError, match="'latencies_us' belongs to cluster suites, not table"):
        load_suite(str(bad))


SUITE = """
description = "tiny"
kind = "cluster"
max_tokens = 8
latencies_us = [0, 100, 1000]
prompts = {{ prose = 2 }}

[[targets]]
model = "{target}"
drafts = ["hybrid:{target}", "{target}", "suffix"]
"""


@pytest.mark.slow
def test_the_cluster_suite_over_two_ranks_records_every_drafter_equal_to_plain_at_every_latency(target, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(SUITE.format(target=target))
    out = tmp_path / "out"
    cmd = [sys.executable, str(LAUNCH), "-n", "2", "--backend", "ring", "--", sys.executable, "-m", "mlx_spec.cli"]
    res = subprocess.run(
        cmd + ["bench", "run", str(path), "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0, res.stderr
    (lead,) = out.glob("tiny-*.json")
    assert len(list(out.glob("rank-1/tiny-*.json"))) == 1
    data = json.loads(lead.read_text())
    assert data["complete"] and data["cluster"]["simulated"] and data["cluster"]["ranks"] == 2
    summary = {s["row"]: s for s in bench.summarize(data)}
    assert len(summary) == 3 * 4  # 3 latencies x (plain and 3 drafters)
    for s in summary.values():
        assert s["identical"] == s["compared"] == 2, s  # greedy: every reply equals plain sharded decoding's
        assert s["comm_ms_per_round"] > 0 and s["collectives_per_round"] >= 2 * LAYERS + 1
    assert all(summary[f"{lat}us|{target}"]["drafted_per_round"] > 0 for lat in (0, 100, 1000))
    md = lead.with_suffix(".md").read_text()
    assert "simulated" in md and "Predicted (not measured)" in md
