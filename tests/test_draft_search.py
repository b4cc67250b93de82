"""`mlx-spec draft-search` on tiny models: it ranks by measurement, keeps its budget, reuses its drafts, saves a recipe.
Every search here times on a clock that counts forward passes (`PassClock`): its budget and its ranking are the same on
any machine, busy or not. A test that runs a whole search is `slow` (a research instrument's)."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import one_line_error, run_main

from mlx_spec.bench import draft_search as ds
from mlx_spec.make.recipes import write_user_recipe
from mlx_spec.make.resolve import recipe_path


@pytest.fixture(autouse=True)
def counted(pass_clock, monkeypatch):
    monkeypatch.setattr(ds, "time", pass_clock)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def plant(name, folder):
    """A cached user recipe whose folder is `folder`."""
    write_user_recipe(name, "planted", {"dtype": "float32"}, source=str(folder))
    shutil.copytree(folder, recipe_path(name))


@pytest.mark.slow
def test_a_planted_good_draft_ranks_above_a_planted_bad_one(tiny_models, home, monkeypatch):
    from mlx_spec.gen import registry

    # Draft heads over the whole (tiny) vocabulary: the target drafting for itself drafts its own tokens exactly.
    monkeypatch.setattr(registry, "head_ids", lambda tokenizer, real: list(range(real)))
    plant("good", tiny_models["qwen2"])  # the target itself: every draft token accepted
    plant("bad", tiny_models["qwen2_draft"])  # random weights, same tokenizer: almost nothing accepted
    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=2, max_tokens=12, methods=[])
    search.load()
    result = search.search()
    rows = {c.name: c for c in result.candidates}
    good, bad = rows["good"], rows["bad"]
    assert good.accepted == pytest.approx(ds.K) and bad.accepted < 1.0
    assert good.estimate > bad.estimate
    measured = [c for c in result.candidates if c.speedup is not None]
    assert measured and all(c.identical for c in measured)  # lossless, every candidate
    ranked = sorted((c for c in result.candidates if c.estimate is not None), key=lambda c: -c.estimate)
    assert ranked.index(good) < ranked.index(bad)
    assert {"ngram", "suffix", "quant-self:int4", "self:importance"} <= set(rows)
    assert "good" in result.table() and "avg accepted (K=5)" in result.table()


def planted_full(order, planted):
    """A stand-in for Search.full: records the order and plants each candidate's speed-up (default 0.8)."""

    def full(self, c):
        order.append(c.name)
        c.speedup, c.identical, c.status = planted.get(c.name, 0.8), True, "measured"

    return full


@pytest.mark.slow
def test_the_hybrid_of_the_first_paying_draft_is_measured_next(tiny_models, home, monkeypatch):
    """The hybrid must not wait behind weaker candidates that use up the budget: the order is asserted with
    the measurements' outcomes planted (their real timing on tiny models is noise)."""
    plant("good", tiny_models["qwen2"])
    plant("bad", tiny_models["qwen2_draft"])
    order, planted = [], {"good": 1.5, "hybrid:good": 1.7}
    monkeypatch.setattr(ds.Search, "full", planted_full(order, planted))
    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=1, max_tokens=6, methods=[])
    search.load()
    result = search.search()
    assert order.count("hybrid:good") == 1 and order.index("hybrid:good") == order.index("good") + 1
    assert "hybrid:bad" not in order and result.recommended == "hybrid:good"


@pytest.mark.slow
def test_a_paying_draft_model_gets_its_hybrid_where_a_context_drafter_beats_it(tiny_models, home, monkeypatch):
    """On code the suffix drafter alone beats the draft model; the hybrid (suffix + n-gram + model) is still measured,
    right after the model, and recommended when it is the fastest."""
    plant("good", tiny_models["qwen2"])
    order, planted = [], {"suffix": 3.0, "good": 1.5, "hybrid:good": 3.3}
    monkeypatch.setattr(ds.Search, "full", planted_full(order, planted))
    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=1, max_tokens=6, methods=[])
    search.load()
    result = search.search()
    assert order.index("hybrid:good") == order.index("good") + 1 and order.count("hybrid:good") == 1
    assert result.recommended == "hybrid:good"


@pytest.mark.slow
def test_estimates_leave_time_for_several_full_measurements(tiny_models, home, monkeypatch):
    """On a planted clock: a full measurement takes 100 s, an estimate 50 s (a draft to build), the budget 600 s.
    Estimating stops at the reserve (min(4 full, half the budget) = 300 s), so 3 candidates get measured in
    full, not the 1 that a reserve of a single measurement left."""
    clock = {"left": 600.0}
    monkeypatch.setattr(ds, "minimum_seconds", lambda *a: 100.0)
    monkeypatch.setattr(ds.Search, "left", lambda self: clock["left"])
    monkeypatch.setattr(ds.Search, "cost_of", lambda self, c, full: 100.0 if full else 50.0)
    quick, full = [], []

    def fake_quick(self, c):
        clock["left"] -= 50
        c.estimate, c.status = 2.0 - len(quick) / 100, "estimated"
        quick.append(c.name)

    def fake_full(self, c):
        clock["left"] -= 100
        c.speedup, c.identical, c.status, c.by_set = 1.5, True, "measured", {}
        full.append(c.name)

    monkeypatch.setattr(ds.Search, "quick", fake_quick)
    monkeypatch.setattr(ds.Search, "full", fake_full)
    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=1, max_tokens=4, methods=ds.DEFAULT_LADDER)
    search.load()
    result = search.search()
    assert len(quick) == 6 and full == quick[:3]  # the best estimates, in order
    assert sum(c.status == "skipped: budget" for c in result.candidates) == len(result.candidates) - 6


@pytest.mark.slow
def test_a_rerun_reuses_the_drafts_it_built(tiny_models, home):
    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=1, max_tokens=6, methods=["layers-half"])
    search.load()
    first = {c.name: c for c in search.search().candidates}["layers-half"]
    folder = next((home / "bench" / "variants").iterdir())
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert search.cost_of(ds.Candidate("layers-half", "variant", method="layers-half"), full=False) < 1.0  # cached
    again = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=1, max_tokens=6, methods=["layers-half"])
    again.load()
    second = {c.name: c for c in again.search().candidates}["layers-half"]
    assert (folder / "config.json").stat().st_mtime_ns == stamp and first.spec == second.spec


@pytest.mark.slow
def test_the_recommendation_is_saved_as_a_recipe_that_draft_accepts(tiny_models, home):
    from mlx_spec.named import load_model, make_drafter

    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=10, prompts=1, max_tokens=6, methods=["int8"])
    search.load()
    result = search.search()
    int8 = next(c for c in result.candidates if c.name == "int8")
    result.recommended = "int8"  # whatever won on this machine, saving works the same way
    saved = ds.save(search, result, name="tiny-draft")
    assert saved == "tiny-draft" and (recipe_path("tiny-draft") / "config.json").is_file()
    assert json.loads((recipe_path("tiny-draft") / "config.json").read_text())["quantization"]["bits"] == 8
    target, tok, _ = load_model(str(tiny_models["qwen2"]))
    assert make_drafter("tiny-draft", target, tok).model is not None
    assert int8.size_gb > 0


def test_a_budget_too_small_for_one_candidate_names_the_minimum(tiny_models, home):
    search = ds.Search(str(tiny_models["qwen2"]), budget_minutes=1e-5, prompts=2, max_tokens=32, methods=[])
    with pytest.raises(ds.DraftSearchError, match=r"too small: one candidate needs about [\d.]+ minutes"):
        search.load()


@pytest.mark.parametrize("content,match", [(b"", "empty"), (b"\x00\x00", "not text")])
def test_bad_calibration_file(tiny_models, home, tmp_path, content, match):
    cal = tmp_path / "cal.txt"
    cal.write_bytes(content)
    with pytest.raises(Exception, match=match):
        ds.Search(str(tiny_models["qwen2"]), calibration=cal)


def test_bad_options_and_target(tiny_models, home, tmp_path):
    with pytest.raises(ds.DraftSearchError, match="unknown method"):
        ds.Search(str(tiny_models["qwen2"]), methods=["int5"])
    with pytest.raises(ds.DraftSearchError, match="budget-minutes"):
        ds.Search(str(tiny_models["qwen2"]), budget_minutes=0)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    with pytest.raises(ds.DraftSearchError, match="cannot load the target"):
        ds.Search(str(tmp_path / "broken")).load()


def test_prompt_sets_stand_in_for_the_calibration_text(tiny_models, home, tmp_path):
    search = ds.Search(
        str(tiny_models["qwen2"]),
        prompt_sets=["humaneval", "prose"],
        budget_minutes=10,
        prompts=2,
        max_tokens=4,
        methods=[],
    )
    search.load()
    assert search.prompt_names == ["HumanEval/0", "prose/0"]  # one of each set in turn
    assert len(search.prompts) == 2 and all(len(p) > 20 for p in search.prompts)
    tight = ds.Search(str(tiny_models["qwen2"]), prompt_sets=["edit"], prompts=1, max_tokens=4, methods=[])
    with pytest.raises(ds.DraftSearchError, match=r"prompt HumanEval/0:type-hints has \d+ tokens: .* context of 512"):
        tight.load()  # the tiny model's context is 512 tokens
    with pytest.raises(ds.DraftSearchError, match="unknown prompt set poetry"):
        ds.Search(str(tiny_models["qwen2"]), prompt_sets=["humaneval", "poetry"])
    with pytest.raises(ds.DraftSearchError, match="not both"):
        ds.Search(str(tiny_models["qwen2"]), prompt_sets=["edit"], calibration=tmp_path / "cal.txt")


@pytest.mark.slow
def test_speed_ups_are_reported_per_prompt_set(tiny_models, home):
    plant("good", tiny_models["qwen2"])
    search = ds.Search(
        str(tiny_models["qwen2"]),
        prompt_sets=["humaneval", "prose"],
        budget_minutes=10,
        prompts=2,
        max_tokens=6,
        methods=[],
    )
    search.load()
    result = search.search()
    assert result.sets == ["humaneval", "prose"]
    measured = [c for c in result.candidates if c.speedup is not None]
    assert measured
    for c in measured:  # one prompt of each set: its mean is that prompt's ratio
        assert c.by_set == {"humaneval": c.spread[0], "prose": c.spread[1]}
    head = result.table().splitlines()[0]
    assert "humaneval speed-up" in head and "prose speed-up" in head


def test_margins_judge_the_recommendation_against_the_best_other_single_drafter():
    C = ds.Candidate
    cands = [
        C("hybrid:x", "hybrid", by_set={"humaneval": 3.0, "edit": 2.2}, identical=True),
        C("suffix", "drafter", by_set={"humaneval": 2.5, "edit": 2.0}, identical=True),
        C("x", "recipe", by_set={"humaneval": 1.5, "edit": 2.1}, identical=True),
        C("hybrid:y", "hybrid", by_set={"humaneval": 2.9, "edit": 2.9}, identical=True),  # not a single drafter
        C("wrong", "drafter", by_set={"humaneval": 9.0, "edit": 9.0}, identical=False),
    ]  # not lossless
    result = ds.SearchResult("t", cands, 1.0, "hybrid:x", sets=["humaneval", "edit", "humaneval"])
    m = result.margins()
    assert m["humaneval"] == (pytest.approx(0.2), "suffix") and m["edit"] == (pytest.approx(2.2 / 2.1 - 1), "x")
    assert ds.SearchResult("t", cands, 1.0, None, sets=["edit"]).margins() == {}


@pytest.mark.slow
def test_cli(tiny_models, home, tmp_path):
    env = {"MLX_SPEC_HOME": str(home), "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_spec.cli",
            "draft-search",
            "--target",
            str(tiny_models["qwen2"]),
            "--prompts",
            "1",
            "--max-tokens",
            "6",
            "--methods",
            "",
            "--budget-minutes",
            "5",
            "--prompt-set",
            "humaneval",
            "--out",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "| method |" in res.stdout and "ngram" in res.stdout and "measured on HumanEval/0\n" in res.stdout
    data = json.loads(next((tmp_path / "runs").glob("draft-search-*.json")).read_text())
    assert data["kind"] == "draft-search" and data["candidates"] and data["prompts"] == ["HumanEval/0"]
    one_line_error(run_main("draft-search", "--target", "/no/such/model"))


@pytest.mark.slow
def test_a_head_is_trained_as_a_candidate_when_asked_and_found_by_the_next_search(tiny_models, home):
    """Without a stored head the search says how to train one; asked to, it trains one (for a few steps, as
    --train-minutes does for minutes) into the heads folder and measures it (lossless) and its hybrid; the next search
    finds that head without training."""
    from mlx_spec.train.job import heads_for

    target = str(tiny_models["qwen2"])
    search = ds.Search(target, budget_minutes=10, prompts=1, max_tokens=6, methods=[])
    search.load()
    result = search.search()
    assert not any(c.kind == "learned" for c in result.candidates)
    assert any("train-head --target" in n for n in result.notes)
    search = ds.Search(target, budget_minutes=10, prompts=1, max_tokens=6, methods=[], train_steps=4)
    search.load()
    rows = {c.name: c for c in search.search().candidates}
    trained = rows[f"eagle3:{ds.TRAIN}"]
    assert trained.status in ("estimated", "measured") and trained.spec.startswith("eagle3:")
    assert heads_for(target) and str(heads_for(target)[0]) in trained.spec
    if trained.speedup is not None:
        assert trained.identical
    again = ds.Search(target, budget_minutes=10, prompts=1, max_tokens=6, methods=[], train_minutes=0.25)
    again.load()
    names = [c.name for c in again.candidates()]
    assert f"eagle3:{heads_for(target)[0].name}" in names and f"eagle3:{ds.TRAIN}" not in names
    with pytest.raises(ds.DraftSearchError, match="half the budget"):
        ds.Search(target, budget_minutes=10, train_minutes=6)
