"""aider (a real coding agent: whole-file edits, no tools) edits a file through `mlx-spec serve` (`slow`, `real`).

Runs where MLX_SPEC_AIDER names an aider executable, or the virtual environment it is installed in
(`python3 -m venv /opt/agents/aider && /opt/agents/aider/bin/pip install aider-chat`), and the real pair is present
(MLX_SPEC_REAL=1 or its chunk packages). A tiny random model cannot edit, so this is the real one or nothing.
"""

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real]

REAL_HOME = os.environ.get("MLX_SPEC_HOME")  # read before the per-test isolation fixture changes it
TARGET, DRAFT = "qwen2.5-coder-0.5b", "hybrid:none"  # the smallest real target: a 2-core CPU answers in minutes
TIMEOUT_S = 1800  # a ~700-token prompt takes minutes on a busy 2-core CPU; litellm's own default gives up at 600 s
SOURCE = 'def greet(name):\n    return "Hello " + name\n'


def aider_path() -> Path | None:
    """The aider executable MLX_SPEC_AIDER names (itself, or a venv holding bin/aider), if it exists."""
    given = os.environ.get("MLX_SPEC_AIDER")
    if not given:
        return None
    path = Path(given)
    path = path / "bin" / "aider" if path.is_dir() else path
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def server():
    from mlx_spec.server.app import build_app
    from mlx_spec.server.main import Running
    from mlx_spec.server.pair import Pair

    if aider_path() is None:
        pytest.skip("aider not found: set MLX_SPEC_AIDER to its executable or its virtual environment")
    mp = pytest.MonkeyPatch()
    if REAL_HOME:
        mp.setenv("MLX_SPEC_HOME", REAL_HOME)
    else:
        mp.delenv("MLX_SPEC_HOME", raising=False)
    pair = Pair.load(TARGET, DRAFT)
    mp.undo()
    with Running(build_app(pair, max_concurrency=1)) as srv:  # no max_tokens: up to the end of the context
        yield srv


def test_aider_whole_file_edit_lands(server, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "greet.py").write_text(SOURCE)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "greet.py"], ["commit", "-qm", "0"]):
        subprocess.run([*git, *args], cwd=repo, check=True)
    run = subprocess.run(
        [str(aider_path()), "--model", f"openai/{TARGET}", "--openai-api-base", server.url + "v1",
         "--openai-api-key", "unused", "--edit-format", "whole", "--yes", "--no-auto-commits", "--no-check-update",
         "--no-analytics", "--no-pretty", "--no-stream", "--map-tokens", "0", "--timeout", str(TIMEOUT_S),
         "--message", "Rename the function greet to welcome. Change nothing else.", "greet.py"],
        cwd=repo, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "token limit" not in out, out  # the server no longer cuts a reply without max_tokens short
    edited = (repo / "greet.py").read_text()
    assert "def welcome(name):" in edited and "def greet" not in edited, out
