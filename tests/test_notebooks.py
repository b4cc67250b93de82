"""Every notebook in notebooks/ runs headless (nbclient) on result files of real tiny suite runs, so none can rot."""

from pathlib import Path

import nbformat
import pytest
from conftest import long_context
from nbclient import NotebookClient

from mlx_spec.bench import runner

pytestmark = pytest.mark.slow

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def runs(tiny_models, tmp_path_factory):
    """A result of every suite kind, from real runs of small suites on the tiny models."""
    root = tmp_path_factory.mktemp("nb")
    target = long_context(tiny_models["qwen2"], root / "target")
    prompts = "prompts = { humaneval = 0, edit = 0, prose = 2 }\nmax_tokens = 6\n"
    (root / "t.toml").write_text(
        f'kind = "table"\n{prompts}[[targets]]\nmodel = "{target}"\n'
        f'drafts = ["ngram", "{tiny_models["qwen2_draft"]}"]\n'
    )
    (root / "r.toml").write_text(
        f'kind = "roofline"\nbandwidth_gb = 0.064\n{prompts}[[targets]]\nmodel = "{target}"\n'
        f'[[targets]]\nmodel = "{tiny_models["qwen2_draft"]}"\n'
    )
    (root / "n.toml").write_text(
        f'kind = "ngram"\nadaptive = false\n{prompts}[[targets]]\nmodel = "{target}"\n'
        f"[[sweeps]]\nk = [1, 2]\nn = [2, 3]\n"
    )
    (root / "q.toml").write_text(
        f'kind = "quality"\nmax_tokens = 6\ntemps = [0.5, 1.0]\ntop_ks = [2, 20]\n'
        f'prompts = {{ ptq = 2 }}\n[[targets]]\nmodel = "{target}"\n'
    )
    (root / "c.toml").write_text(
        f'kind = "compression"\nadaptive = false\nk = [2, 4]\nmax_tokens = 6\n'
        f'methods = ["float32", "int8"]\nprompts = {{ prefix = 2 }}\n'
        f'[[targets]]\nmodel = "{target}"\n'
    )
    for name in ("t", "r", "n", "q", "c"):
        runner.run_suite(str(root / f"{name}.toml"), str(root / "runs"))
    (root / "h.toml").write_text(
        f'kind = "table"\n{prompts}[[targets]]\nmodel = "{target}"\ndrafts = ["eagle3:HEAD", "hybrid:eagle3:HEAD"]\n'
    )
    runner.run_suite(str(root / "h.toml"), str(root / "runs"), model=str(target), head=str(trained_head(target, root)))
    return root


def trained_head(target, root):
    """A head trained a few steps for the tiny target, with checkpoints enough for a curve."""
    from conftest import CORPUS

    from mlx_spec.named import load_model
    from mlx_spec.train import data as td
    from mlx_spec.train.head import TrainingPlan, train

    model, tok, _ = load_model(str(target))
    plan = TrainingPlan("tiny", [1, 2, 3], 96, 48, minutes=5, lr=3e-3, warmup=1, max_steps=30)
    return train(model, plan, root / "head", td.sequences(tok, CORPUS * 10, 48), checkpoint_minutes=0.0)


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {
        "m3max_table.ipynb",
        "roofline.ipynb",
        "ngram_sweep.ipynb",
        "quant_quality.ipynb",
        "compression.ipynb",
        "head_curve.ipynb",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_saves_its_plots(path, runs, monkeypatch):
    plots = runs / "plots" / path.stem
    monkeypatch.setenv("MLX_SPEC_RUNS", str(runs / "runs"))
    monkeypatch.setenv("MLX_SPEC_PLOTS", str(plots))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    pngs = list(plots.glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert images  # the plots show in the notebook too
