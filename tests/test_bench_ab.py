"""`bench ab`: two checkouts timed in one run, each side's worker on its own code."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import run_main

from mlx_spec.bench.ab import AbSettings, checkout, firsts, render, run_ab
from mlx_spec.errors import MlxSpecError

REPO = Path(__file__).resolve().parents[1]


def _copy(dst: Path) -> Path:
    """A second checkout: this one's package (its recipes inside it)."""
    shutil.copytree(REPO / "mlx_spec", dst / "mlx_spec", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.mark.slow  # starts two worker processes
def test_each_side_runs_its_own_checkout_interleaved(tiny_models, tmp_path):
    """The old side is a copy whose greedy pick is argmin: its worker must run that (its tokens differ from the new
    side's on every measurement, and still equal its own plain decoding's), the new side the working tree's, the side
    going first alternating."""
    old = _copy(tmp_path / "old")
    for name in ("sampling.py", "ahead.py"):  # the two places a greedy token is picked
        f = old / "mlx_spec" / "gen" / name
        assert "mx.argmax(logits, axis=-1)" in f.read_text()
        f.write_text(f.read_text().replace("mx.argmax(logits, axis=-1)", "mx.argmin(logits, axis=-1)"))
    s = AbSettings(
        old=str(old), target=str(tiny_models["qwen2"]), drafts=("suffix",), humaneval=1, edit=0, prose=1, max_tokens=12
    )
    run = run_ab(s, str(tmp_path / "out"))
    data = json.loads(run.json_path.read_text())
    assert data["complete"] and not [r for r in data["records"] if "error" in r]
    assert Path(data["sides"]["old"]["imported"]).is_relative_to(old.resolve())
    assert Path(data["sides"]["new"]["imported"]).is_relative_to(REPO)
    recs = data["records"]
    assert len(recs) == 2 * 2 * 2  # sides x prompts x rows
    firsts = [recs[i]["side"] for i in range(0, len(recs), 2)]
    assert firsts == ["old", "new", "old", "new"]
    assert all(a["tokens"] != b["tokens"] for a, b in zip(recs[::2], recs[1::2]))  # each pair: both sides
    plain = {(r["side"], r["prompt"]): r["tokens"] for r in recs if r["draft"] == "none"}
    assert all(r["tokens"] == plain[(r["side"], r["prompt"])] for r in recs)
    page = run.md_path.read_text()
    assert page == render(data)
    assert "| suffix | all |" in page and "2/2, 2/2 | 0/2 |" in page
    packed = run.json_path.with_suffix(".json.gz")  # as the repository keeps records
    packed.write_bytes(gzip.compress(run.json_path.read_bytes()))
    assert run_main("bench", "report", packed).stdout == page + "\n"


@pytest.mark.parametrize("rows", [2, 3, 4])
@pytest.mark.parametrize("repeats", [1, 2])
def test_every_row_of_every_set_has_each_side_first_about_as_often(rows, repeats):
    """5 HumanEval tasks and their 5 edits take turns, as `build` gives them: each row's prompts of each set have the
    old side first as often as the new, give or take one. Alternating over the run put one side first on every
    prompt of a set for a row (3 rows), or of all sets (2 rows); the hybrid's first side was the faster on 8 of
    its 10 prompts of an A/B (notebooks/NOTEBOOK.md §44)."""
    sets = ["humaneval", "edit"] * 5
    count: dict[tuple[str, int], list[int]] = {}
    for rep in range(repeats):
        for name, first in zip(sets, firsts(sets, rows, rep)):
            for d, f in enumerate(first):
                count.setdefault((name, d), [0, 0])[f] += 1
    assert all(abs(old - new) <= 1 for old, new in count.values()), count


def test_a_side_that_is_neither_a_checkout_nor_a_revision_is_refused(tmp_path):
    with pytest.raises(MlxSpecError, match="neither a folder holding mlx_spec/ nor a git revision"):
        checkout("old", str(tmp_path / "nothing-here"), tmp_path)
