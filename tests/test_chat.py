"""`mlx-spec chat` as a person uses it: the real command in a tmux terminal, typed at and read off the screen."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import long_context, one_line_error, run_cli

from mlx_spec.device import describe

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed"), pytest.mark.slow]

PROMPT = ">>>"


class Terminal:
    """One tmux pane on a private server: type keys, read the screen (scrollback included)."""

    def __init__(self, tmp: Path, command: str, env: dict):
        self.socket = f"mlxspec-chat-{os.getpid()}-{id(self)}"
        conf = tmp / "tmux.conf"
        conf.write_text("set -g history-limit 100000\n")
        self.base = ["tmux", "-L", self.socket, "-f", str(conf)]
        envs = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        # The shell reports the exit status and keeps the pane open so the test can read it.
        shell = f'{command}; echo "[exit $?]"; sleep 600'
        subprocess.run(
            self.base + ["new-session", "-d", "-s", "chat", "-x", "160", "-y", "50", *envs, shell], check=True, cwd=tmp
        )

    def keys(self, *keys: str, literal: bool = False) -> None:
        subprocess.run(self.base + ["send-keys", "-t", "chat", *(["-l"] if literal else []), *keys], check=True)

    def type(self, text: str) -> None:
        self.keys(text, literal=True)
        self.keys("Enter")

    def screen(self) -> str:
        return subprocess.run(
            self.base + ["capture-pane", "-p", "-J", "-S", "-", "-t", "chat"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def wait(self, ok, timeout: float = 60.0, what: str = "") -> str:
        end = time.monotonic() + timeout
        while True:
            text = self.screen()
            if ok(text):
                return text
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{text[-3000:]}")
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run(self.base + ["kill-server"], capture_output=True)


def prompts(text: str) -> int:
    return sum(line.startswith(PROMPT) for line in text.splitlines())


def stats_lines(text: str):
    return [line for line in text.splitlines() if line.startswith("[") and "tok/s" in line]


def after(text: str, marker: str) -> str:
    return text[text.rindex(marker) + len(marker) :] if marker in text else ""


def test_chat_in_a_terminal(tiny_models, tmp_path):
    target = long_context(tiny_models["qwen2"], tmp_path / "target")
    draft = long_context(tiny_models["qwen2_draft"], tmp_path / "draft")
    cmd = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable,
            "-m",
            "mlx_spec.cli",
            "chat",
            "--model",
            str(target),
            "--draft",
            f"hybrid:{draft}",
            "--max-tokens",
            "1000",
            "--system",
            "You write Python.",
        ]
    )
    env = {k: os.environ[k] for k in ("MLX_SPEC_HOME", "HF_HUB_OFFLINE", "PATH") if k in os.environ}
    term = Terminal(tmp_path, cmd, env)
    try:
        s = term.wait(lambda s: "Ctrl-D exits" in s and prompts(s) == 1, what="the banner and the first prompt")
        assert f" on {describe()}, drafter hybrid:" in s, s  # which device runs the chat

        # Turn 1, stopped by Ctrl-C as soon as the reply shows on screen.
        term.type("def add(a, b):")
        term.wait(lambda s: after(s, "def add(a, b):").strip(), what="the reply to start")
        term.keys("C-c")
        s = term.wait(lambda s: len(stats_lines(s)) == 1 and prompts(s) == 2, what="the stopped reply's stats")
        assert "[stopped: the partial reply stays in the conversation]" in s
        line = stats_lines(s)[0]
        assert "tok/s" in line and "acceptance" in line and "mean accepted" in line and "est." in line, line

        # Turn 2 still works, to its end, and reuses the conversation's cache.
        term.type("Now subtract.")
        s = term.wait(lambda s: len(stats_lines(s)) == 2 and prompts(s) == 3, what="the second reply")
        assert after(s, "Now subtract.").count("[stopped") == 0

        term.type("/stats")
        s = term.wait(lambda s: prompts(s) == 4, what="/stats")
        assert "acceptance by draft position" in s and "waiting on the device" in after(s, "/stats")
        new, total = map(int, re.search(r"\((\d+) new of (\d+) tokens\)", after(s, "/stats")).groups())
        assert new < total, "the second turn prefilled the whole conversation again"

        term.type("/compare")
        s = term.wait(lambda s: prompts(s) == 5, timeout=90, what="/compare")
        table = [line for line in after(s, "/compare").splitlines() if line.startswith("|")]
        assert [c.strip() for c in table[0].strip("|").split("|")] == [
            "Target",
            "Draft",
            "Quantization",
            "Token/s",
            "Relative Improvement",
        ]
        assert "N/A" in table[2] and "hybrid:draft" in table[3] and "float32" in table[3], table
        assert "greedy: the two replies are token-identical" in s

        # Ctrl-C at the prompt clears the line (nothing is sent); Ctrl-D exits cleanly.
        term.keys("not sent", literal=True)
        term.keys("C-c")
        term.wait(lambda s: prompts(s) == 6, what="a fresh prompt after Ctrl-C")
        term.keys("C-d")
        s = term.wait(lambda s: "[exit " in s, what="the exit")
        assert "[exit 0]" in s and len(stats_lines(s)) == 2
        assert "Traceback" not in s
    finally:
        term.close()


def test_offline_recipe_draft_is_one_line(tiny_models):
    """`--draft tinyllama-int4` offline fails before loading anything: one line, why, and a pair that works."""
    res = run_cli(
        "chat",
        "--model",
        str(tiny_models["qwen2"]),
        "--draft",
        "tinyllama-int4",
        stdin=subprocess.DEVNULL,
        env={"HF_HUB_OFFLINE": "1"},
        timeout=60,
    )
    line = one_line_error(res)
    assert line.startswith("error: --draft tinyllama-int4:") and "HF_HUB_OFFLINE" in line
    assert f"a local pair that works: --model {tiny_models['qwen2']} --draft ngram" in line
    assert res.stdout == ""


def test_piped_input_needs_no_terminal(tiny_models):
    """Without a terminal the chat reads plain lines (no line editor) and ends at end of input."""
    cmd = [
        sys.executable,
        "-m",
        "mlx_spec.cli",
        "chat",
        "--model",
        str(tiny_models["qwen2"]),
        "--draft",
        "ngram",
        "--max-tokens",
        "8",
    ]
    res = subprocess.run(cmd, input="def add(a, b):\n/stats\n", capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(stats_lines(res.stdout.replace(PROMPT + " ", "\n"))) == 1
    assert "acceptance by draft position" in res.stdout and "Traceback" not in res.stderr
