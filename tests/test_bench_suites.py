"""`mlx-spec bench list|run|compare`: declarative suites, a versioned result file written as it goes, resume. Every
test that runs a suite is `slow` (a research instrument's); the parts they read stay in the quick subset."""

import errno
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import long_context, one_line_error, run_cli, run_main

from mlx_spec.bench import rounds, runner
from mlx_spec.bench import suite as suites
from mlx_spec.bench.results import SCHEMA, ResultError, ResultFile


def cli(*args, timeout=300):
    return run_cli("bench", *args, timeout=timeout)


def bench(*args):
    """`mlx-spec bench ARGS` in this process: a command whose start a test of its own already proves."""
    return run_main("bench", *args)


def suite_file(path: Path, target, drafts=("ngram",), **fields) -> Path:
    top = {
        "kind": "table",
        "max_tokens": 6,
        "repeats": 2,
        "prompts": {"humaneval": 1, "edit": 0, "prose": 2},
        "description": "test",
    } | fields
    lines = []
    for k, v in top.items():
        if isinstance(v, dict):
            lines.append(f"{k} = {{ " + ", ".join(f"{a} = {b}" for a, b in v.items()) + " }")
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    lines += ["", "[[targets]]", f"model = {json.dumps(str(target))}", f"drafts = {json.dumps(list(drafts))}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def target(tiny_models, tmp_path):
    return long_context(tiny_models["qwen2"], tmp_path / "target")


@pytest.mark.slow
def test_bench_list_shows_every_builtin_suite_and_each_loads():
    r = cli("list", timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("quick", "m3max", "roofline", "ngram", "compression", "quant-quality", "engine2"):
        assert any(line.split()[:1] == [name] for line in r.stdout.splitlines())
        assert suites.load(name).targets  # a built-in suite is valid as shipped
    m3 = suites.load("m3max")
    assert [str(t.model) for t in m3.targets][:2] == ["qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b@int8"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, field",
    [
        ('kind = "table"\nmax_tokns = 5\n[[targets]]\nmodel = "m"\n', "'max_tokns'"),
        ('kind = "tabel"\n[[targets]]\nmodel = "m"\n', "'kind'"),
        ('kind = "table"\nmax_tokens = 0\n[[targets]]\nmodel = "m"\n', "'max_tokens'"),
        ('kind = "table"\nprompts = { humaneval = 1, prosa = 1 }\n[[targets]]\nmodel = "m"\n', "'prosa'"),
        ('kind = "table"\n[[targets]]\nmodel = "m@int5"\n', "'int5'"),
        ('kind = "table"\n[[targets]]\nmodel = "m"\ndrafs = ["ngram"]\n', "'drafs'"),
        ('kind = "table"\n', "[[targets]]"),
        ('kind = "table"\ntop_p = 1.5\n[[targets]]\nmodel = "m"\n', "'top_p'"),
        ('kind = "table"\n[[targets]\n', "suite file"),
        ('kind = "ngram"\n[[targets]]\nmodel = "m"\n', "[[sweeps]]"),
        ('kind = "ngram"\n[[targets]]\nmodel = "m"\n[[sweeps]]\nk = [1]\nn = [1]\n', "'n'"),
        ('kind = "ngram"\n[[targets]]\nmodel = "m"\ndrafts = ["ngram"]\n[[sweeps]]\nk = [1]\nn = [2]\n', "'drafts'"),
        ('kind = "table"\nadaptive = "no"\n[[targets]]\nmodel = "m"\n', "'adaptive'"),
        ('kind = "compression"\nk = [5]\nmethods = ["int5"]\n[[targets]]\nmodel = "m"\n', "'int5'"),
        ('kind = "compression"\n[[targets]]\nmodel = "m"\n', "'k'"),
        ('kind = "table"\nprompts = { prose = 33 }\n[[targets]]\nmodel = "m"\n', "'prose'"),
        ('kind = "table"\ntemps = [0.5]\n[[targets]]\nmodel = "m"\n', "'temps' belongs to quality suites"),
        ('kind = "table"\nbandwidth_gb = 0.1\n[[targets]]\nmodel = "m"\n', "'bandwidth_gb' belongs to roofline"),
        ('kind = "roofline"\nbandwidth_gb = 0\n[[targets]]\nmodel = "m"\n', "'bandwidth_gb'"),
        ('kind = "quality"\ntemps = [0.5]\ntop_ks = [0]\n[[targets]]\nmodel = "m"\n', "'top_ks'"),
        ('kind = "table"\ntemp = 0.5\n[[targets]]\nmodel = "m"\ndrafts = ["mlx-lm-spec:d"]\n', "'mlx-lm-spec:d'"),
    ],
)
def test_a_suite_file_with_a_mistake_is_one_line_naming_the_file_and_field(tmp_path, text, field):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    line = one_line_error(bench("run", path, "--out", tmp_path / "runs"))
    assert str(path) in line and field in line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())  # nothing started


@pytest.mark.slow
def test_an_unknown_suite_is_one_line_naming_the_builtin_ones(tmp_path):
    line = one_line_error(cli("run", "quik", "--out", str(tmp_path), timeout=120))
    assert "unknown suite 'quik'" in line and "quick" in line


@pytest.mark.slow
def test_a_table_suite_runs_every_row_and_marks_an_unavailable_model(target, tiny_models, tmp_path):
    path = suite_file(
        tmp_path / "t.toml",
        target,
        drafts=["ngram", str(tiny_models["qwen2_draft"]), "no-such-model-anywhere", "self:1"],
    )
    r = cli("run", str(path), "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    files = list((tmp_path / "runs").glob("t-*.json"))
    data = json.loads(files[0].read_text())
    assert data["schema"] == SCHEMA and data["complete"] and data["suite"]["name"] == "t"
    assert {"cpu", "memory_gb", "mlx", "blas_status", "git_rev"} <= set(data["machine"])
    assert len(data["models"][str(target)]["sha256"]) == 64
    assert all(
        isinstance(r["loadavg"], float) and r["loadavg"] >= 0 for r in data["records"]
    )  # others' load, per record
    rows = {e["draft"]: e for e in data["summary"]}
    assert rows["no-such-model-anywhere"]["status"] == "unavailable" and rows["no-such-model-anywhere"]["reason"]
    for d in ("none", "ngram", str(tiny_models["qwen2_draft"]), "self:1"):
        e = rows[d]
        assert e["status"] == "ok" and e["measurements"] == 2 * 3  # repeats x prompts
        if d != "none":
            assert e["identical"] == e["compared"] == 6  # greedy: every output is the target's own
            assert e["speedup"] > 0 and e["speedup_min"] <= e["speedup_median"] <= e["speedup_max"]
    assert rows[str(tiny_models["qwen2_draft"])]["draft_quant"] == "float32"
    assert rows["ngram"]["draft_quant"] == "N/A"
    md = files[0].with_suffix(".md").read_text()
    assert (
        "| Target" in md
        and "| Relative Improvement |"
        in md.splitlines()[md.splitlines().index(next(x for x in md.splitlines() if x.startswith("| Target")))]
    )
    assert "unavailable: " in md and md in r.stdout
    table = [x for x in md.splitlines() if x.startswith("| ") and "Token/s" not in x and "Speed-up" not in x]
    assert table[0].split("|")[2].strip() == "N/A"  # the target alone first, as in the paper's tables


@pytest.mark.slow
def test_mlx_lm_speculative_decoding_is_a_row_with_its_acceptance(target, tiny_models, tmp_path):
    """The baseline the engine must beat: mlx-lm's speculative_generate_step with the same draft, in the same run."""
    draft = str(tiny_models["qwen2_draft"])
    path = suite_file(tmp_path / "m.toml", target, drafts=[f"mlx-lm-spec:{draft}", draft], repeats=1)
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    rows = {e["draft"]: e for e in data["summary"]}
    mlx = rows[f"mlx-lm-spec:{draft}"]
    assert mlx["status"] == "ok" and mlx["identical"] == mlx["compared"] == 3
    assert mlx["proposed"] > 0 and 0 <= mlx["accepted"] <= mlx["proposed"]
    assert mlx["draft_quant"] == "float32" and rows[draft]["status"] == "ok"
    # Each draft against that baseline, per prompt set, on the same prompts: tokens/s over tokens/s.
    vs = rows[draft]["vs_reference"]
    assert vs["draft"] == f"mlx-lm-spec:{draft}" and set(vs["by_set"]) == {"humaneval", "prose"}

    def tps(row, name):
        of = [r for r in data["records"] if r["row"] == row and r["set"] == name]
        return sum(r["n_tokens"] for r in of) / sum(r["total"] for r in of)

    for name in ("humaneval", "prose"):
        assert vs["by_set"][name]["speedup"] == pytest.approx(tps(rows[draft]["key"], name) / tps(mlx["key"], name))
        assert vs["by_set"][name]["compared"] == {"humaneval": 1, "prose": 2}[name]
    md = result.md_path.read_text()
    assert "prose: over mlx-lm-spec" in md and "(reference)" in md


@pytest.mark.slow
def test_a_row_whose_outputs_differ_is_flagged_in_the_main_table(target, tiny_models, tmp_path):
    """A lossless break must show where people look (the M3 Max table), not only in the detail table."""
    from mlx_spec.bench import table

    path = suite_file(tmp_path / "f.toml", target, drafts=["ngram"], repeats=1)
    runner.run_suite(str(path), str(tmp_path / "runs"))
    [file] = list((tmp_path / "runs").glob("f-*.json"))
    data = json.loads(file.read_text())
    ngram = next(r for r in data["records"] if r["row"].endswith("|ngram"))
    ngram["tokens"] = [t + 1 for t in ngram["tokens"]]  # as if the drafter had changed the output
    data["summary"] = table.summarize(data)
    row = next(x for x in table.markdown(data).splitlines() if x.startswith("|") and "ngram" in x)
    assert "differs from the target alone on 1/3" in row
    data["records"] = json.loads(file.read_text())["records"]
    data["summary"] = table.summarize(data)
    assert "differs" not in table.markdown(data)


@pytest.mark.slow
def test_an_interrupted_run_resumes_without_redoing_a_measurement(target, tmp_path, monkeypatch):
    path = suite_file(tmp_path / "r.toml", target, drafts=["ngram"])
    real_add = ResultFile.add
    calls = {"n": 0}

    def add_then_stop(self, record):
        real_add(self, record)
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # as Ctrl-C between two measurements

    monkeypatch.setattr(ResultFile, "add", add_then_stop)
    with pytest.raises(KeyboardInterrupt):
        runner.run_suite(str(path), str(tmp_path / "runs"))
    monkeypatch.setattr(ResultFile, "add", real_add)
    [file] = list((tmp_path / "runs").glob("r-*.json"))
    first = json.loads(file.read_text())
    assert not first["complete"] and len(first["records"]) == 5
    assert "Incomplete run" in file.with_suffix(".md").read_text()

    r = bench("run", path, "--resume", file)
    assert r.returncode == 0, r.stderr
    done = json.loads(file.read_text())
    assert done["complete"] and len(done["records"]) == 2 * 2 * 3  # rows x repeats x prompts, each once
    assert done["records"][:5] == first["records"]  # the finished ones were kept, not redone
    assert len({x["key"] for x in done["records"]}) == 12 and len(done["resumed"]) == 1
    assert done["resumed"][0]["git_rev"] == first["machine"]["git_rev"]  # the code that ran the rest, recorded


@pytest.mark.slow
def test_kill_ends_a_run_of_mlx_spec_bench_with_its_results_kept(target, tmp_path):
    """SIGTERM (`kill`, a closing terminal) stops `mlx-spec bench run` like Ctrl-C: results stay, marked incomplete."""
    import signal
    import time

    path = suite_file(tmp_path / "k.toml", target, drafts=["ngram", "self"], max_tokens=40, repeats=20)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_spec.cli", "bench", "run", str(path), "--out", str(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        files = list(runs.glob("k-*.json"))
        if files and json.loads(files[0].read_text() or "{}").get("records"):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = json.loads(files[0].read_text())
    assert data["records"] and not data["complete"]
    assert "Incomplete run" in files[0].with_suffix(".md").read_text()


@pytest.mark.slow
def test_resume_refuses_another_suite_and_a_file_that_is_not_a_result(target, tmp_path):
    a = suite_file(tmp_path / "a.toml", target, drafts=["ngram"], repeats=1, max_tokens=3)
    file = runner.run_suite(str(a), str(tmp_path / "runs")).path
    suite_file(a, target, drafts=["ngram"], repeats=1, max_tokens=4)  # edited since
    line = one_line_error(bench("run", a, "--resume", file))
    assert "different suite" in line and "max_tokens" in line
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    assert "not a result file" in one_line_error(bench("run", a, "--resume", junk))


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_results_so_far_are_kept(target, tmp_path, monkeypatch):
    path = suite_file(tmp_path / "d.toml", target, drafts=["ngram"], repeats=1)
    real_write = Path.write_text
    writes = {"n": 0}

    def write_until_full(self, text, *a, **k):
        if self.name.startswith(".d-") and self.suffix == ".tmp":
            writes["n"] += 1
            if writes["n"] > 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_until_full)
    with pytest.raises(ResultError, match="the disk is full; the results written before are kept"):
        runner.run_suite(str(path), str(tmp_path / "runs"))
    monkeypatch.setattr(Path, "write_text", real_write)
    [file] = list((tmp_path / "runs").glob("d-*.json"))
    kept = json.loads(file.read_text())  # the last complete version, still valid JSON
    assert kept["schema"] == SCHEMA and not kept["complete"] and len(kept["records"]) >= 1
    assert not list((tmp_path / "runs").glob(".*.tmp"))


@pytest.mark.slow
def test_compare_prints_the_change_per_row_and_refuses_what_it_cannot_compare(target, tmp_path):
    path = suite_file(tmp_path / "c.toml", target, drafts=["ngram"], repeats=1)
    a, b = (runner.run_suite(str(path), str(tmp_path / out)).path for out in ("a", "b"))
    r = bench("compare", a, b)
    assert r.returncode == 0, r.stderr
    rows = [x for x in r.stdout.splitlines() if x.startswith("| ") and str(target) in x]
    assert len(rows) == 2 and all("%" in x for x in rows)
    A, B = json.loads(a.read_text()), json.loads(b.read_text())
    ta, tb = A["summary"][0]["tokens_per_second"], B["summary"][0]["tokens_per_second"]
    assert f"{100 * (tb / ta - 1):+.1f}%" in rows[0]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(A, schema="mlx-spec.bench/0")))
    assert "same schema" in one_line_error(bench("compare", a, other))
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": 1}')
    assert "not a result file" in one_line_error(bench("compare", a, notes))
    assert "no result file" in one_line_error(bench("compare", a, tmp_path / "nope.json"))


@pytest.mark.slow
def test_report_renders_a_result_again_from_its_records(target, tmp_path, monkeypatch):
    """`bench report` rebuilds the tables from the records alone: the same markdown the run wrote."""
    load = itertools.count(1.0, 0.25)  # a machine whose load average changes between any two reads
    monkeypatch.setattr(os, "getloadavg", lambda: (next(load), 0.0, 0.0))
    result = runner.run_suite(str(suite_file(tmp_path / "r.toml", target, repeats=1)), str(tmp_path / "runs"))
    written = result.md_path.read_text()
    data = json.loads(result.path.read_text())
    data["summary"] = []  # as a run in progress, or one an older version summarized, may have it
    result.path.write_text(json.dumps(data))
    r = bench("report", result.path)
    assert r.returncode == 0, r.stderr
    # The same page, figures included (the load average it shows is the one the record keeps: a page rendered
    # before the record's last write showed the load of the write before, 2.99 against 2.91 on a busy machine)
    assert r.stdout.strip() == written.strip()
    assert "humaneval: over the target alone" in r.stdout
    for rec in data["records"]:  # `--rounds` reads the traces as the run writes them: the last round reaches the end
        made = [x.tokens for x in rounds.trace_rounds(rec)]  # (an EOS or max_tokens may cut it short)
        assert sum(made[:-1]) < rec["n_tokens"] <= sum(made), rec["stats"]["trace"]
    assert "| ngram |" in rounds.report(data)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(dict(data, schema="mlx-spec.bench/0")))
    assert "this mlx-spec reads" in one_line_error(bench("report", old))
    assert "no result file" in one_line_error(bench("report", tmp_path / "nope.json"))


@pytest.mark.slow
def test_a_sampling_suite_reports_no_identity_claim(target, tmp_path):
    path = suite_file(tmp_path / "s.toml", target, drafts=["ngram"], repeats=1, temp=0.8, top_p=0.9)
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    md = result.md_path.read_text()
    assert "temp 0.8, top_p 0.9" in md and "n/a (sampling)" in md


@pytest.mark.slow
def test_roofline_reports_each_model_as_a_share_of_the_measured_bandwidth(target, tmp_path):
    # 64 MB per pass of the bandwidth measurement, not the default GB: the test checks the arithmetic, not the number
    path = suite_file(tmp_path / "roof.toml", target, drafts=[], kind="roofline", repeats=1, bandwidth_gb=0.064)
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    bw = data["bandwidth"]
    assert data["suite"]["bandwidth_gb"] == 0.064 and bw["bytes"] <= 0.064e9 * 1.5
    assert bw["gbs"] == max(bw["gemv_gbs"], bw["sum_gbs"], *bw["shapes"].values()) > 0
    [row] = data["summary"]
    assert row["roofline_tps"] == pytest.approx(bw["gbs"] / row["read_gb"])
    assert row["roofline_share"] == pytest.approx(row["decode_tps"] / row["roofline_tps"])
    assert "Roofline tok/s" in result.md_path.read_text()


def test_results_read_refuses_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("not json")
    with pytest.raises(ResultError, match="not a result file"):
        ResultFile.resume(p, {})


@pytest.mark.slow
def test_the_ngram_sweep_measures_each_k_and_n_with_the_anpd_bound(target, tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(
        f'kind = "ngram"\nadaptive = false\nmax_tokens = 8\nprompts = {{ humaneval = 1, edit = 1 }}\n'
        f'[[targets]]\nmodel = "{target}"\n[[sweeps]]\nk = [1, 3]\nn = [2]\n[[sweeps]]\nk = [3]\nn = [2, 4]\n'
    )
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    rows = {(e["draft"], e["k"]): e for e in data["summary"] if e["draft"] != "none"}
    assert set(rows) == {("ngram:2", 1), ("ngram:2", 3), ("ngram:4", 3)}  # the union of the sweeps, once each
    for (_, k), e in rows.items():
        assert e["identical"] == e["compared"] == 2
        assert set(e["by_set"]) == {"humaneval", "edit"}
        if e["proposed"]:
            assert e["bound"] == pytest.approx(e["acceptance_rate"] * k + 1)
        for r in data["records"]:
            if r["row"] == e["key"]:
                assert len(r["stats"]["proposed_by_position"]) <= k  # fixed K: no round drafts more than K
                trace = r["stats"]["trace"]  # every round, as the planner chose it and what it cost
                assert len(trace) == r["stats"]["rounds"] and all(len(t) in (6, 8) and t[1] <= k for t in trace)
                assert sum(t[1] for t in trace) == r["stats"]["proposed"]
                assert sum(t[2] for t in trace) == r["stats"]["accepted"]
    md = result.md_path.read_text()
    assert "K=1" in md and "K=3" in md
    assert "humaneval**" in md and "edit**" in md and "N=4" in md


@pytest.mark.slow
def test_the_compression_suite_takes_its_methods_from_the_converter(target, tmp_path, monkeypatch):
    from mlx_spec.make import convert

    methods = convert.draft_methods()
    assert {"float16", "int8", "int4", "layers-half"} <= set(methods)
    path = tmp_path / "comp.toml"
    path.write_text(
        f'kind = "compression"\nadaptive = false\nk = [2, 4]\nmax_tokens = 8\nprompts = {{ prefix = 2 }}\n'
        f'[[targets]]\nmodel = "{target}"\n'
    )
    shown = dict(list(methods.items())[:1] + [("int8", methods["int8"]), ("layers-half", methods["layers-half"])])
    monkeypatch.setattr(convert, "draft_methods", lambda: shown)  # fewer methods: a shorter test, same code path
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    rows = {e["draft"].rpartition("@")[2] + f" K={e['k']}": e for e in data["summary"] if e["draft"] != "none"}
    assert set(rows) == {f"{m} K={k}" for m in shown for k in (2, 4)}
    assert rows["int8 K=2"]["draft_quant"] == "int8"
    for e in rows.values():
        assert e["status"] == "ok" and e["identical"] == e["compared"] == 2
    half = data["models"][f"{target}@layers-half"]
    assert half["weights_gb"] < data["models"][str(target)]["weights_gb"]
    md = result.md_path.read_text()
    assert "K=2: accepted · speed-up" in md and "layers-half" in md and " of 4 · " in md


def test_duplicate_content_words_ignores_stop_words():
    from mlx_spec.bench.quality import duplicate_content_words

    assert duplicate_content_words("London bridge, London tower; the bridge in London.") == 3
    assert duplicate_content_words("the the the of of and") == 0  # stop words only
    assert duplicate_content_words("") == 0


@pytest.mark.slow
def test_the_quality_suite_samples_a_temperature_by_top_k_grid_per_model(target, tmp_path):
    path = tmp_path / "q.toml"
    path.write_text(
        f'kind = "quality"\nmax_tokens = 12\ntemps = [0.5, 1.0]\ntop_ks = [2, 50]\n'
        f'prompts = {{ ptq = 2 }}\n[[targets]]\nmodel = "{target}"\n[[targets]]\nmodel = "{target}@int8"\n'
        f'[[targets]]\nmodel = "not-a-model-here"\n'
    )
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    assert data["complete"]
    rows = [e for e in data["summary"] if e["target"] == str(target)]
    assert {(e["temp"], e["top_k"]) for e in rows} == {(0.5, 2), (0.5, 50), (1.0, 2), (1.0, 50)}
    for e in rows:
        assert e["measurements"] == 2 and e["tps_min"] <= e["tps_max"] and e["duplicates_mean"] >= 0
    recs = [r for r in data["records"] if r["row"] == rows[0]["key"]]
    assert all(r["prompt"].startswith("ptq/") and isinstance(r["text"], str) for r in recs)
    assert data["models"][f"{target}@int8"]["quantization"] == "int8"
    md = result.md_path.read_text()
    assert "Duplicate content words" in md and "top-k 50" in md and "unavailable:" in md


def test_bytes_read_per_token_leave_out_an_untied_embedding_table():
    """Decoding reads one row of an untied embedding table, but the whole of a tied one (it is the output head)."""
    from mlx_lm.models import qwen2

    from mlx_spec.bench.roofline import bytes_per_token

    def model(tied):
        return qwen2.Model(
            qwen2.ModelArgs(
                model_type="qwen2",
                hidden_size=32,
                num_hidden_layers=1,
                intermediate_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-6,
                vocab_size=1000,
                tie_word_embeddings=tied,
            )
        )

    tied, untied = model(True), model(False)
    table = 1000 * 32 * 4  # float32 bytes of the embedding table
    assert bytes_per_token(untied) == bytes_per_token(tied)  # the untied head replaces the table that is read whole
    assert params_total(untied) - params_total(tied) == table


def params_total(m):
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(m.parameters()))


@pytest.mark.slow
def test_the_overhead_rows_on_a_random_model_with_mlx_lm_and_the_rounds_table(tmp_path):
    """`random:tiny` is built into the cache once; mlx-lm's plain loop is a row; every row of ours reports what its
    rounds cost, one read of the device a round, and a prediction from its rounds beside the measured speed-up."""
    path = suite_file(
        tmp_path / "ov.toml", "random:tiny", drafts=("mlx-lm", "suffix", "self"), max_tokens=12, repeats=1
    )
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    rows = {e["draft"]: e for e in data["summary"]}
    assert rows["mlx-lm"]["identical"] == rows["mlx-lm"]["compared"] == 3 and not rows["mlx-lm"].get("rounds")
    for draft in ("none", "suffix", "self"):
        r = rows[draft]["rounds"]
        assert r["syncs_per_round"] == 1.0 and 0 < r["host_ms_per_round"] <= r["ms_per_round"]
    assert rows["suffix"]["predicted_speedup"] > 0 and rows["suffix"]["decode_speedup"] > 0
    md = result.md_path.read_text()
    assert "host ms/round" in md and "| random:tiny float32 | mlx-lm" in md
    again = runner.run_suite(str(path), str(tmp_path / "runs2"), model="random:tiny")  # --model: the same rows
    assert {e["draft"] for e in json.loads(again.path.read_text())["summary"]} == set(rows)


@pytest.mark.slow
def test_a_row_may_fix_k_and_a_bad_k_is_one_line(tmp_path, target):
    path = suite_file(tmp_path / "k.toml", target, drafts=("ngram K=3", "suffix"))
    s = suites.load(str(path))
    assert s.rows(s.targets[0]) == [{"draft": "ngram", "k": 3}, {"draft": "suffix"}]
    bad = suite_file(tmp_path / "bad.toml", target, drafts=("ngram K=0",))
    with pytest.raises(suites.SuiteError, match="K must be an integer >= 1"):
        suites.load(str(bad))


@pytest.mark.slow
def test_a_row_may_run_its_k_fixed_or_on_and_off_beside_the_planner(tmp_path, target):
    """An ablation's rows: 'K=n fixed' (always n, no planner), 'K=n onoff' (n or nothing), the planner's own."""
    path = suite_file(tmp_path / "a.toml", target, drafts=("suffix", "suffix K=2 fixed", "suffix K=2 onoff"))
    s = suites.load(str(path))
    assert s.rows(s.targets[0]) == [
        {"draft": "suffix"},
        {"draft": "suffix", "k": 2, "planner": "fixed"},
        {"draft": "suffix", "k": 2, "planner": "onoff"},
    ]
    with pytest.raises(suites.SuiteError, match="'fixed' or 'onoff'"):
        suites.load(str(suite_file(tmp_path / "bad.toml", target, drafts=("suffix K=2 always",))))


@pytest.mark.slow
def test_predict_measures_the_pair_and_predicts_each_target(tmp_path, target):
    """The pair's acceptance by position, its costs and its speed-up at the predicted best K (and with the planner
    choosing); every other target's costs; a table that says which rows are predictions only."""
    path = tmp_path / "predict.toml"
    path.write_text(
        'description = "t"\nkind = "predict"\nmax_tokens = 12\nrepeats = 1\nprompts = { humaneval = 1, edit = 1 }\n'
        '[[targets]]\nmodel = "random:tiny"\ndrafts = ["random:tiny"]\n'
        f'[[targets]]\nmodel = "{target}"\n'  # a float folder: a random shape's int8 passes take ~40 s on a CPU
    )
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    d = json.loads(result.path.read_text())["predict"]
    assert d["acceptance"][:3] == [1.0, 1.0, 1.0]  # the target drafting for itself
    assert set(d["targets"]) == {str(target), "random:tiny"} and d["pair"]["best_k"] >= 1
    assert d["pair"]["measured_speedup"] > 0 and d["pair"]["planner_speedup"] > 0
    md = result.md_path.read_text()
    assert "predicted only" in md and f"at K = {d['pair']['best_k']}" in md


def test_random_shapes_are_one_line_errors_where_unknown_and_only_small_ones_are_folders():
    import mlx.core as mx

    from mlx_spec.errors import SourceError
    from mlx_spec.make import random

    assert random.shape("qwen2.5-coder-0.5b") is None and random.shape("random:qwen2.5-7b") == "qwen2.5-7b"
    with pytest.raises(SourceError, match="unknown random shape 'nope'"):
        random.shape("random:nope")
    with pytest.raises(SourceError, match="bench run predict"):
        random.folder("qwen2.5-7b")
    up = random.build("tiny", quantize="int8").layers[0].mlp.up_proj  # a shape at the precision asked
    assert (up.bits, up.weight.dtype) == (8, mx.uint32)
