"""Every `mlx-spec` command the README and docs/ show: each parses as the CLI reads it (an unknown option, a missing
argument or a bad value fails), and each one a tiny model can run, runs, with `random:tiny` for the real models named.

Commands come from the shell blocks (any line running `mlx-spec`, `.venv/bin/mlx-spec` included) and from inline code
that starts with `mlx-spec `. The lab notebook is left out: it records what ran at its revision.
"""

import functools
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import typer.main
from conftest import run_main

from mlx_spec.cli import app
from mlx_spec.make import recipes
from mlx_spec.named import DEFAULT_DRAFT

REPO = Path(__file__).resolve().parents[1]
HISTORY = {"notebook.md"}  # the lab's record of what ran, each command at its own revision
TINY = "random:tiny"
SHELLS = {"", "sh", "bash", "shell", "console", "zsh"}  # the fenced blocks whose lines are commands
PLACEHOLDERS = {  # the docs' names for what the reader supplies, as values the CLI parses
    "M": TINY,
    "T": TINY,
    "SRC": TINY,
    "NAME": TINY,
    "D": "suffix",
    "K": "2",
    "N": "8",
}
OUTPUTS = {"convert": 1}  # the positional argument a command writes to: a fresh folder per run


@dataclass(frozen=True)
class Shown:
    """A command as a doc shows it: the file, its line and its words after `mlx-spec`."""

    doc: str
    line: int
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: mlx-spec {shlex.join(self.args)}"


def _docs() -> list[Path]:
    return [REPO / "README.md", *(p for p in sorted((REPO / "docs").glob("*.md")) if p.name not in HISTORY)]


def _words(text: str) -> list[tuple[str, ...]]:
    """The argument lists `text` stands for: shell words up to a pipe, `&&`, `;` or a redirect; `[--opt X]` as
    given; `<what>` as one word; `a|b` alternatives (a table's `a\\|b`) expanded into one list each."""
    text = re.sub(r"<[^>]*>", "PLACEHOLDER", text.replace("\\|", "|")).replace("[", " ").replace("]", " ")
    words = []
    for w in shlex.split(text, comments=True):
        if w in ("|", "||", "&&", ";", ">", ">>", "2>", "&"):
            break
        words.append(w.split("|") if re.fullmatch(r"[\w.-]+(\|[\w.-]+)+", w) else [w])
    return [tuple(c) for c in itertools.product(*words)]


def shown_commands() -> list[Shown]:
    """Every command the docs show, in order."""
    out = []
    for doc in _docs():
        fence = None
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if m := re.match(r"\s*```(\w*)", line):
                fence = None if fence is not None else m.group(1)
                continue
            if fence is not None:
                texts = (
                    [m.group(1) for m in re.finditer(r"(?:^|[\s/])mlx-spec\s+(.*)", line)] if fence in SHELLS else []
                )
            else:
                texts = re.findall(r"`mlx-spec ([^`]*)`", line)
            out += [Shown(doc.name, n, args) for t in texts for args in _words(t) if args]
    return out


SHOWN = shown_commands()


@functools.cache
def _root():
    """The CLI's click tree with every command's body replaced by nothing: what remains is the parsing."""
    root = typer.main.get_command(app)

    def hollow(cmd):
        cmd.callback = lambda *a, **k: None
        for sub in getattr(cmd, "commands", {}).values():
            hollow(sub)

    hollow(root)
    return root


def parses(args: tuple[str, ...]) -> None:
    """Parse `args` as `mlx-spec` would (a usage error raises); a group named alone is a mention, not a call."""
    root = _root()
    if len(args) == 1 and getattr(root.commands.get(args[0]), "commands", None):
        return
    root.main(list(args), prog_name="mlx-spec", standalone_mode=False)


@functools.cache
def _recipe_names() -> frozenset[str]:
    return frozenset(r.name for r in recipes.all_recipes())


def _real(word: str) -> bool:
    """A model the reader would fetch: a recipe, a hub id, a .gguf file or a model folder named in the docs."""
    return (
        word in _recipe_names()
        or word.endswith(".gguf")
        or word.startswith("./")
        or (bool(re.fullmatch(r"[A-Za-z][\w.-]*/[\w.-]+", word)) and not word.startswith(("out/", "heads/", "runs/")))
    )


def tiny(args: tuple[str, ...], tmp: Path) -> list[str]:
    """`args` with placeholders given values, real models replaced by random:tiny and outputs under `tmp`."""
    words = [PLACEHOLDERS.get(w, w) for w in args]
    words = [TINY if _real(w) else re.sub(r"(?<=:)[\w.-]+$", lambda m: TINY if _real(m[0]) else m[0], w) for w in words]
    if words[0] in OUTPUTS:
        positional = [
            i for i, w in enumerate(words) if i and not w.startswith("-") and not words[i - 1].startswith("-")
        ]
        words[positional[OUTPUTS[words[0]]]] = str(tmp / "out")
    return words


def runnable(words: list[str]) -> bool:
    """What random:tiny can run in a test: listing and fetching, and generating, converting or serving on one machine
    with the drafters and layer counts a 4-layer model without heads has. The rest (chat, the bench's suites,
    train-head, draft-search, a sharded target) needs a terminal, runs for minutes or needs a cluster: parsed only."""
    if words[0] in ("models", "fetch"):
        return True
    if words[0] not in ("generate", "convert", "serve") or "--shard" in words:
        return False
    opts = dict(zip(words, words[1:]))
    if opts.get("--draft", "").startswith(("eagle3", "mtp", "dflash")):
        return False
    layers = [int(x) for o in ("--keep-layers", "--layers") for x in re.findall(r"\d+", opts.get(o, ""))]
    return all(n < 4 for n in layers)


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds what the docs show: the README's main command, and every top-level command somewhere."""
    assert any(s.doc == "README.md" and s.args[:1] == ("generate",) for s in SHOWN)
    top = {s.args[0] for s in SHOWN}
    assert {"generate", "chat", "serve", "convert", "models", "fetch", "bench", "train-head", "draft-search"} <= top


@pytest.mark.parametrize("shown", SHOWN, ids=str)
def test_every_command_shown_parses(shown, tmp_path):
    parses(tuple(tiny(shown.args, tmp_path)))


def test_a_wrong_option_does_not_parse():
    """What a doc with a misspelt option, a missing argument or a bad value would meet."""
    for args in (("generate", "--modle", TINY), ("convert", TINY), ("convert", "a", "b", "--keep-layers", "K")):
        with pytest.raises(Exception, match="No such option|Missing|valid integer"):
            parses(args)


def _distinct_runnable() -> list[Shown]:
    """The runnable commands, each once (the README and a doc often show the same one)."""
    seen, out = set(), []
    for s in SHOWN:
        words = tuple(tiny(s.args, Path("out")))
        if runnable(list(words)) and words not in seen:
            seen.add(words)
            out.append(s)
    return out


RUN = _distinct_runnable()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One cache for the module's runs: random:tiny is written once."""
    return tmp_path_factory.mktemp("home")


@pytest.mark.slow  # each runs the command: `mlx-spec`'s main in this process, a server in a process of its own
@pytest.mark.parametrize("shown", RUN, ids=str)
def test_every_command_a_tiny_model_can_run_runs(shown, tmp_path, home, monkeypatch):
    words = tiny(shown.args, tmp_path)
    if words[0] in ("generate", "serve"):  # the defaults name real models; a reply of a few tokens is enough
        words += [] if "--model" in words else ["--model", TINY]
        words += (
            [] if "--draft" in words or words[0] == "generate" else ["--draft", tiny((DEFAULT_DRAFT,), tmp_path)[0]]
        )
        words += [] if "--max-tokens" in words else ["--max-tokens", "8"]
    if words[0] == "serve":
        _serves(words, home, tmp_path / "serve.log")
        return
    monkeypatch.setenv("MLX_SPEC_HOME", str(home))
    res = run_main(*words)
    assert res.returncode == 0, f"{shown}\n{res.stderr}"


def _serves(words: list[str], home: Path, log: Path) -> None:
    """`mlx-spec serve ...` on a free port prints its URL first, answers a chat completion, and stops on Ctrl-C."""
    opts = dict(zip(words, words[1:]))
    words = [w for i, w in enumerate(words) if w != "--port" and (i == 0 or words[i - 1] != "--port")]
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlx_spec.cli", *words, "--port", "0"],
            env=dict(os.environ, MLX_SPEC_HOME=str(home)),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once the socket listens: the first line on stdout
        assert url.startswith("http://"), f"stdout began {url!r}\n{log.read_text()}"
        ask = {"model": opts.get("--model", TINY), "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(url + "v1/chat/completions", json=ask, timeout=120)
        assert reply.status_code == 200, reply.text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
