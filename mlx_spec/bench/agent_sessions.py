"""The agent bench's sessions: multi-turn conversations over standard-library files, in the formats agents send.

- `aider-whole`, `aider-diff`: aider's messages (`aider_prompts`): its system prompt and examples, the conversation
  so far, the file as it stands, the request with aider's reminder; each assistant turn is the recorded edit (the
  whole file, or one SEARCH/REPLACE block) and aider's "I updated the files." after it.
- `tools`: OpenAI chat-completions tools (`read_file`, `edit_file`), one system prompt and the same schemas for
  every session; each task is three turns: the request, the file read (the recorded `read_file` call and its
  result), the edit applied (the recorded `edit_file` call and its result).

The model's own reply to a turn is measured and recorded; the next turn carries the recorded one, so every
configuration sees the same prompts. Each task adds a comment line above one top-level function of the file.

A session's `context` pads its prompt with other standard-library source the way agents carry it, so one task runs
at ~1k and ~16k tokens of context: aider's read-only files (`/read`), or a tool loop's earlier `read_file` calls and
their results; either is part of every turn's shared prefix.
"""

import json
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError
from . import aider_prompts as aider

FORMATS = ("aider-whole", "aider-diff", "tools")

TOOLS_SYSTEM = """You are a coding agent working in the user's repository. You read and change files only through \
the tools you are given: read a file before you edit it, change it with edit_file (old_string must match the file \
exactly, once), and keep every change as small as the request allows. Do not guess a file's contents. When the \
change is made, say in one or two sentences what you changed."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the repository and return its contents.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "The file's path in the repository"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace one exact occurrence of old_string in a file with new_string.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file's path in the repository"},
                    "old_string": {"type": "string", "description": "Text to replace; must occur exactly once"},
                    "new_string": {"type": "string", "description": "The replacement text"},
                },
                "required": ["path", "old_string", "new_string"],
            },
        },
    },
]


@dataclass(frozen=True)
class SessionSpec:
    """One session of a suite: its format, the standard-library module it edits, its turns (`lines`: only the
    module's first lines, for tiny test models; 0: all of it), and about how many tokens of other modules' source
    pad its prompt (`context`; 0: none)."""

    format: str
    file: str
    turns: int
    lines: int = 0
    context: int = 0

    @property
    def name(self) -> str:
        """`aider-whole:colorsys`, `tools:fnmatch:30` (its first 30 lines), `aider-whole:colorsys:ctx15000`."""
        return (
            f"{self.format}:{self.file}"
            + (f":{self.lines}" if self.lines else "")
            + (f":ctx{self.context}" if self.context else "")
        )


@dataclass(frozen=True)
class Turn:
    """One request of a session: the messages (and tools) sent, and the turn's kind (its session's format)."""

    session: str
    index: int
    kind: str
    messages: list[dict]
    tools: list[dict] | None = None

    @property
    def id(self) -> str:
        return f"{self.session}/{self.index}"


def stdlib_source(module: str, lines: int = 0) -> tuple[str, str]:
    """(path as the session names it, text) of a standard-library module: `textwrap`, `json/decoder`."""
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{module.replace('.', '/')}.py"
    if not path.is_file():
        raise MlxSpecError(f"no standard-library module '{module}' at {path}")
    text = path.read_text()
    if lines:
        text = "".join(text.splitlines(keepends=True)[:lines])
    return f"lib/{module.replace('.', '/')}.py", text


# The modules that pad a session's context, taken in this order (the session's own module left out) until the
# padding reaches `context` tokens: the same suite sends the same bytes every run (on one Python).
CONTEXT_MODULES = (
    "functools",
    "contextlib",
    "dataclasses",
    "pprint",
    "statistics",
    "fractions",
    "enum",
    "argparse",
    "difflib",
    "typing",
)
# The padding's size is an estimate in characters (Python source with Qwen2.5's tokenizer: about 3.2 characters a
# token); a record's `prompt_tokens` is the count the server measured.
CHARS_PER_TOKEN = 3.2


def _cut(text: str, room: int) -> str:
    """The first lines of text whose length is closest to `room` characters."""
    out = 0
    for line in text.splitlines(keepends=True):
        if out + len(line) > room:
            return text[: out + len(line)] if out + len(line) - room < room - out else text[:out]
        out += len(line)
    return text


def context_sources(spec: SessionSpec, fixed: int, per_file: Callable[[str], int]) -> list[tuple[str, str]]:
    """(path, text) of the modules that pad a session to about `spec.context` tokens, the last cut at a line:
    `fixed` characters the padding adds once, `per_file(path)` those it adds around each file's text."""
    budget = round(spec.context * CHARS_PER_TOKEN) - fixed
    out: list[tuple[str, str]] = []
    own = spec.file.replace(".", "/")
    for module in CONTEXT_MODULES:
        if budget <= 0:
            return out
        if module == own:
            continue
        path, full = stdlib_source(module)
        room = budget - per_file(path)
        if room <= 0:
            return out
        text = _cut(full, room)
        out.append((path, text))
        budget -= per_file(path) + len(text)
        if len(text) < len(full):
            return out  # cut: as close to the estimate as a line allows
    if budget > 0:
        raise MlxSpecError(
            f"session {spec.name}: a context of {spec.context} tokens is more than the modules that pad it hold "
            f"(about {(round(spec.context * CHARS_PER_TOKEN) - budget) / CHARS_PER_TOKEN:.0f})"
        )
    return out


DEF = re.compile(r"^def (\w+)\(", re.MULTILINE)


def tasks(text: str, n: int) -> list[str]:
    """The first n top-level functions of a module: each task comments one."""
    names = list(dict.fromkeys(DEF.findall(text)))
    if len(names) < n:
        raise MlxSpecError(f"the module has {len(names)} top-level functions, the session needs {n}")
    return names[:n]


def comment_edit(text: str, name: str) -> tuple[str, str, str]:
    """(new text, old lines, new lines): a comment line added above `def name(`."""
    m = re.search(rf"^def {name}\(.*$", text, re.MULTILINE)
    assert m is not None  # `tasks` found it
    old = m.group(0)
    new = f"# {name}: part of the module's public interface.\n{old}"
    return text[: m.start()] + new + text[m.end() :], old, new


def request(name: str, path: str) -> str:
    return f"In {path}, add a comment line right above `def {name}` saying it is part of the module's public interface."


def aider_turns(spec: SessionSpec, path: str, text: str) -> list[Turn]:
    """aider's requests (`base_coder.format_chat_chunks`): system, examples, read-only files, done, the file, the
    request."""
    system, examples, reminder = aider.FORMATS[spec.format]
    head = [{"role": "system", "content": system + "\n" + reminder}, *examples, *aider.SWITCHED]
    block = lambda p, t: f"\n{p}\n{aider.FENCE[0]}\n{t}{aider.FENCE[1]}\n"  # noqa: E731  (a file as aider sends it)
    fixed = len(aider.READ_ONLY_PREFIX) + len(aider.READ_ONLY_REPLY)
    read_only = context_sources(spec, fixed, lambda p: len(block(p, "")))
    if read_only:
        head += [
            {"role": "user", "content": aider.READ_ONLY_PREFIX + "".join(block(p, t) for p, t in read_only)},
            {"role": "assistant", "content": aider.READ_ONLY_REPLY},
        ]
    done: list[dict] = []
    out = []
    for i, name in enumerate(tasks(text, spec.turns)):
        files = aider.FILES_PREFIX + block(path, text)
        ask = request(name, path)
        messages = [
            *head,
            *done,
            {"role": "user", "content": files},
            {"role": "assistant", "content": aider.FILES_REPLY},
            {"role": "user", "content": ask + "\n\n" + reminder},
        ]
        out.append(Turn(spec.name, i, spec.format, messages))
        text, old, new = comment_edit(text, name)
        if spec.format == "aider-whole":
            reply = f"Ok, I will add the comment above `{name}`.\n\n{path}\n{aider.FENCE[0]}\n{text}{aider.FENCE[1]}\n"
        else:
            reply = (
                f"To add the comment we need to modify `{path}`:\n\n{path}\n{aider.FENCE[0]}python\n"
                f"<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n{aider.FENCE[1]}\n"
            )
        done += [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": aider.EDITS_APPLIED},
            {"role": "assistant", "content": "Ok."},
        ]
    return out


def _call(session: int, n: int | str, name: str, arguments: dict) -> dict:
    return {
        "id": f"call_{session}_{n}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def tool_turns(spec: SessionSpec, path: str, text: str, number: int) -> list[Turn]:
    """A tool loop: the files already read (`spec.context`), then per task the request, the read's result, the
    edit's; `spec.turns` of them."""
    messages: list[dict] = [{"role": "system", "content": TOOLS_SYSTEM}]
    out: list[Turn] = []
    calls = 0
    for k, (p, t) in enumerate(context_sources(spec, 0, lambda p: len(json.dumps({"path": p})))):
        call = _call(number, f"ctx{k}", "read_file", {"path": p})  # the task's calls keep their ids
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "name": "read_file", "content": t},
        ]
    for name in tasks(text, (spec.turns + 2) // 3):
        messages.append({"role": "user", "content": request(name, path)})
        new_text, old, new = comment_edit(text, name)
        steps: list[tuple[str | None, dict, str]] = [
            ("read_file", {"path": path}, text),
            ("edit_file", {"path": path, "old_string": old, "new_string": new}, f"Edited {path}: 1 replacement."),
            (None, {}, ""),  # the task's last turn: the model answers in words
        ]
        for fn, arguments, result in steps:
            if len(out) == spec.turns:
                return out
            out.append(Turn(spec.name, len(out), spec.format, list(messages), TOOLS))
            if fn is None:
                messages.append({"role": "assistant", "content": f"I added a comment line above `{name}`."})
                break
            call = _call(number, calls, fn, arguments)
            calls += 1
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "name": fn, "content": result},
            ]
        text = new_text
    return out


def build(specs: list[SessionSpec]) -> list[list[Turn]]:
    """Every session's turns, in suite order."""
    sessions = []
    for number, spec in enumerate(specs):
        path, text = stdlib_source(spec.file, spec.lines)
        if spec.format == "tools":
            sessions.append(tool_turns(spec, path, text, number))
        else:
            sessions.append(aider_turns(spec, path, text))
    return sessions
