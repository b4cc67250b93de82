"""`chat --shard tensor` over 2 ranks on this machine (MLX's ring backend over loopback): rank 0 reads the lines and
sends each to rank 1, both run it, only rank 0 prints; the conversation with a draft model equals plain sharded
decoding's, commands that change the chat run on both ranks, those that only show or save run on rank 0, and /draft
SPEC is refused in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROMPTS, make_model
from test_cluster import local_ranks

CHAT = "import sys; from mlx_spec import cli; sys.argv = ['mlx-spec', 'chat', *sys.argv[1:]]; cli.main()"
ASK = [" ".join((PROMPTS[0] + PROMPTS[1] + PROMPTS[0]).split()), " ".join(PROMPTS[2].split())]  # a line each
LINES = [ASK[0], "/k 2", "/temp 0", ASK[1], "/draft suffix", "/stats", "/save c.json"]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A 2-layer tiny qwen2 in float32, as the sharded serving tests use."""
    return make_model(tmp_path_factory.mktemp("chat") / "qwen2", "qwen2", seed=0, layers=2, scale=4.0)


def chat(target: Path, tmp: Path, draft: str, lines: list[str]) -> tuple[list[subprocess.CompletedProcess], Path]:
    """Both ranks of `mlx-spec chat --shard tensor` as `mlx.launch -n 2 --backend ring` starts them on one machine
    (`MLX_RANK`, `MLX_HOSTFILE`), each in its own folder; `lines` typed on rank 0's input only."""
    tmp.mkdir(parents=True)
    args = ["--model", str(target), "--draft", draft, "--max-tokens", "24", "--no-adaptive", "--shard", "tensor"]
    procs = []
    for r, env in enumerate(local_ranks(tmp)):
        (tmp / f"rank{r}").mkdir()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHAT, *args],
                cwd=tmp / f"rank{r}",
                stdin=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env, PYTHONPATH=os.pathsep.join(sys.path)),
            )
        )
    typed = "".join(f"{line}\n" for line in lines).encode()
    done = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(typed if r == 0 else None, timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out.decode(), err.decode()))
    return done, tmp


def replies(folder: Path) -> list[str]:
    saved = json.loads((folder / "rank0" / "c.json").read_text())
    return [m["content"] for m in saved["messages"] if m["role"] == "assistant"]


@pytest.mark.slow
def test_a_sharded_chat_equals_plain_sharded_and_only_rank_zero_prints_or_saves(target, tmp_path):
    # the target drafts for itself, loaded whole on each rank: it drafts every round (--no-adaptive)
    runs = {d: chat(target, tmp_path / name, d, LINES) for name, d in (("model", str(target)), ("none", "none"))}
    for done, folder in runs.values():
        assert [p.returncode for p in done] == [0, 0], "\n".join(p.stderr for p in done)
        out0, out1 = done[0].stdout, done[1].stdout
        assert "2 ranks (tensor-sharded)" in out0 and "K = 2" in out0 and "temperature 0" in out0
        assert "/draft suffix: not under --shard; start the chat again with --draft suffix" in out0
        assert out1 == ""  # rank 1 runs every line and prints nothing
        assert (folder / "rank0" / "c.json").is_file() and not (folder / "rank1" / "c.json").exists()
        assert len(replies(folder)) == 2 and all(replies(folder))
    assert replies(runs[str(target)][1]) == replies(runs["none"][1])
    saved = json.loads((runs[str(target)][1] / "rank0" / "c.json").read_text())["messages"]
    assert all(m["draft_tokens"] for m in saved if m["role"] == "assistant")  # its drafts were verified sharded
