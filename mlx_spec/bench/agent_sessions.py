"""The agent bench's sessions: multi-turn conversations over standard-library files, in the formats agents send.

- `aider-whole`, `aider-diff`: aider's messages (`aider_prompts`): its system prompt and examples, the conversation
  so far, the file as it stands, the request with aider's reminder; each assistant turn is the recorded edit (the
  whole file, or one SEARCH/REPLACE block) and aider's "I updated the files." after it.
- `tools`: OpenAI chat-completions tools (`read_file`, `edit_file`), one system prompt and the same schemas for
  every session; each task is three turns: the request, the file read (the recorded `read_file` call and its
  result), the edit applied (the recorded `edit_file` call and its result).

The model's own reply to a turn is measured and recorded; the next turn carries the recorded one, so every
configuration sees the same prompts. Each task adds a comment line above one top-level function of the file.
"""

import hashlib
import json
import re
import sysconfig
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
    module's first lines, for tiny test models; 0: all of it)."""

    format: str
    file: str
    turns: int
    lines: int = 0

    @property
    def name(self) -> str:
        return f"{self.format}:{self.file}" + (f":{self.lines}" if self.lines else "")


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


def fingerprint(text: str) -> str:
    """A short sha256 of a source text: which version of a module a run replayed."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    """aider's requests (`base_coder.format_chat_chunks`): system, examples, done, the file, the request."""
    system, examples, reminder = aider.FORMATS[spec.format]
    head = [{"role": "system", "content": system + "\n" + reminder}, *examples, *aider.SWITCHED]
    done: list[dict] = []
    out = []
    for i, name in enumerate(tasks(text, spec.turns)):
        files = aider.FILES_PREFIX + f"\n{path}\n{aider.FENCE[0]}\n{text}{aider.FENCE[1]}\n"
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


def _call(session: int, n: int, name: str, arguments: dict) -> dict:
    return {
        "id": f"call_{session}_{n}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def tool_turns(spec: SessionSpec, path: str, text: str, number: int) -> list[Turn]:
    """A tool loop: per task the request, then the read's result, then the edit's; `spec.turns` of them."""
    messages: list[dict] = [{"role": "system", "content": TOOLS_SYSTEM}]
    out: list[Turn] = []
    calls = 0
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
