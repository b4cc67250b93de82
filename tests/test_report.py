"""The page of current results: docs/results.md is what `bench report` makes of the records, gzip-compressed or not."""

import gzip
import json
from pathlib import Path

from typer.testing import CliRunner

from mlx_spec.bench import results
from mlx_spec.bench.cli import app
from mlx_spec.bench.report import results_page

ROOT = Path(__file__).parent.parent


def record(name: str, started: str, speedup: float, complete: bool = True) -> dict:
    """A suite record of the current schema with one drafter row on two prompts (one from its draft)."""
    rows = [("t|none", "none", 1.0), ("t|ngram", "ngram", speedup)]
    return {
        "schema": results.SCHEMA,
        "suite": {
            "name": name,
            "kind": "table",
            "description": "a test",
            "max_tokens": 8,
            "temp": 0.0,
            "prompts": {"humaneval": 1, "edit": 1, "prose": 0},
        },
        "started": started,
        "complete": complete,
        "machine": {
            "cpu": "CPU",
            "cpu_count": 2,
            "machine": "x86_64",
            "blas_status": "openblas",
            "mlx": "0",
            "git_rev": "abc1234",
        },
        "summary": [
            {
                "key": key,
                "target": "t",
                "draft": draft,
                "status": "ok",
                "speedup": s,
                "compared": 2,
                "identical": 2,
                "by_set": {"humaneval": {"speedup": s}, "edit": {"speedup": s}},
            }
            for key, draft, s in rows
        ],
        "records": [
            {"row": key, "n_tokens": 4, "n_from_draft": 0 if draft == "none" else 2 * i}
            for key, draft, _ in rows
            for i in range(2)
        ],
    }


def write_gz(path: Path, data: dict) -> Path:
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def test_the_committed_results_page_is_what_bench_report_makes_of_the_records(monkeypatch):
    monkeypatch.chdir(ROOT)  # the page names the folder and links its records as the README's command does
    page = results_page("notebooks/runs", "docs/results.md")
    assert "](../notebooks/runs/" in page and ".json.gz)" in page  # it read the repository's compressed records
    assert "| ngram K=7 fixed |" in page and "| ngram K=7 onoff |" in page  # an ablation's rows tell their rule
    assert Path("docs/results.md").read_text() == page, (
        "docs/results.md is stale: `mlx-spec bench report notebooks/runs --out docs/results.md`"
    )


def test_a_compressed_record_reads_as_the_record_itself(tmp_path):
    data = record("s", "2026-01-01T00:00:00+0000", 1.5)
    (tmp_path / "s.json").write_text(json.dumps(data))
    assert results.read(write_gz(tmp_path / "s.json.gz", data)) == results.read(tmp_path / "s.json") == data


def test_the_page_shows_the_newest_record_of_each_suite_and_skips_other_files(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_gz(runs / "s-old.json.gz", record("s", "2026-01-01T00:00:00+0000", 1.25))
    (runs / "s-new.json").write_text(json.dumps(record("s", "2026-01-02T00:00:00+0000", 2.5, complete=False)))
    write_gz(runs / "u.json.gz", record("u", "2026-01-01T00:00:00+0000", 0.75))
    write_gz(runs / "ab.json.gz", {"rows": []})  # a one-off record of another format
    (runs / "notes.json").write_text("not json")
    page = results_page(runs, tmp_path / "docs" / "results.md")
    assert "## s" in page and "## u" in page and "ab.json.gz" not in page
    assert "| t | ngram | 2.50x | 2.50x | 2.50x | 25.0% | 2/2 |" in page  # the newest of s; 2 of 8 tokens drafted
    assert "1.25x" not in page and "0.75x" in page
    assert "](../runs/s-new.json)" in page and "incomplete" in page
    assert page.index("## s") < page.index("## u")  # newest first


def test_bench_report_writes_the_page_of_a_folder(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_gz(runs / "s.json.gz", record("s", "2026-01-01T00:00:00+0000", 1.5))
    out = tmp_path / "results.md"
    r = CliRunner().invoke(app, ["report", str(runs), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text() == results_page(runs, out)
    quick = ROOT / "notebooks/runs/quick-20261123-052806-10470.json.gz"  # a repository record: its tables again
    r = CliRunner().invoke(app, ["report", str(quick)])
    assert r.exit_code == 0 and "| ngram " in r.output, r.output
