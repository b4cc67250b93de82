"""Tool calls: a request's `tools` and `tool_choice` checked, and the model's tool-call text split from its content
and parsed into calls (whole, or as it streams) by mlx-lm's parser for the model's family."""

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .errors import bad_request

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CHOICES = ("auto", "none", "required")


@dataclass
class Tools:
    """A request's function tools (OpenAI's chat shape, as chat templates read them) and its `tool_choice`."""

    specs: list[dict]
    choice: str = "auto"  # auto, none, required, or the name of the one function to call

    @property
    def shown(self) -> list[dict] | None:
        """The tools the prompt shows: none for "none", only the named one for a named choice."""
        if self.choice == "none":
            return None
        if self.choice in CHOICES:
            return self.specs
        return [t for t in self.specs if t["function"]["name"] == self.choice]

    @property
    def forced(self) -> bool:
        """The reply must be a tool call ("required" or a named function): its prompt opens one."""
        return self.choice not in ("auto", "none")


def _function(tool, i: int) -> dict:
    where = f"tools[{i}]"
    if (
        not isinstance(tool, dict)
        or tool.get("type", "function") != "function"
        or not isinstance(tool.get("function"), dict)
    ):
        raise bad_request(f"{where} must be {{'type': 'function', 'function': {{'name': ...}}}}", param=where)
    f = tool["function"]
    name = f.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request(
            f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {json.dumps(name)}",
            param=f"{where}.function.name",
        )
    if not isinstance(f.get("description", ""), str):
        raise bad_request(f"{where}.function.description must be a string", param=f"{where}.function.description")
    if not isinstance(f.get("parameters", {}), dict):
        raise bad_request(
            f"{where}.function.parameters must be a JSON Schema object", param=f"{where}.function.parameters"
        )
    return {"type": "function", "function": f}


def parse_tools(body: dict) -> Tools | None:
    """`tools` and `tool_choice` of a chat request, checked (None: no tools), or a 400 naming the field."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' names a tool, but the request has no 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools", param="tools")
    specs = [_function(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in specs]
    if len(set(names)) < len(names):
        raise bad_request("'tools' names a function twice", param="tools")
    if choice is None:
        return Tools(specs)
    if isinstance(choice, str) and choice in CHOICES:
        return Tools(specs, choice)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if name not in names:
        raise bad_request(
            f"'tool_choice' names {name!r}, which is not in 'tools' ({', '.join(names)})", param="tool_choice"
        )
    return Tools(specs, name)


@dataclass
class ToolCall:
    """One parsed call: `arguments` is JSON text, as the OpenAI API carries it."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict:
        """The call as a chat message's `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Syntax:
    """A model family's tool-call markers and parser (mlx-lm's, from its TokenizerWrapper). `end` may be empty: the
    call runs to the end of the reply."""

    start: str
    end: str
    parse: Callable  # (call text, tools) -> {name, arguments[, id]} or a list of them; raises on text it cannot read


def syntax(tokenizer) -> Syntax | None:
    """The tokenizer's tool-call syntax, or None where mlx-lm knows none for this model's template."""
    if not getattr(tokenizer, "has_tool_calling", False):
        return None
    return Syntax(tokenizer.tool_call_start, tokenizer.tool_call_end or "", tokenizer.tool_parser)


def _calls(parsed) -> list[ToolCall]:
    """mlx-lm's parser output as calls; a ValueError when it is not a call."""
    out = []
    for c in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            raise ValueError(f"not a tool call: {c!r}")
        args = c.get("arguments", {})
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        out.append(ToolCall(c["id"] if isinstance(c.get("id"), str) else new_call_id(), c["name"], args))
    return out


OPENINGS = ('```json{"name"', '{"name"')  # a bare call's opening, whitespace taken out


def _bare(text: str, tools: list[dict] | None) -> tuple[list[ToolCall] | None, bool]:
    """A reply that is one JSON call and nothing else, bare or in a ```json block, naming one of `tools` (Qwen2.5-Coder
    writes its calls so, without the template's markers): (its calls or None, whether more text could still make it
    one)."""
    s = text.strip()
    compact = re.sub(r"\s+", "", s[:40])
    if not any(o.startswith(compact) or compact.startswith(o) for o in OPENINGS):
        return None, False
    body = s.removeprefix("```json").strip()
    try:
        obj, n = json.JSONDecoder().raw_decode(body)
    except ValueError:
        return None, True  # not complete yet
    names = {t["function"]["name"] for t in tools or []}
    if not isinstance(obj, dict) or obj.get("name") not in names or body[n:].strip() not in ("", "`", "``", "```"):
        return None, False
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None, False
    return [ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))], True


class ToolText:
    """Generated text in, content text and parsed calls out, as it arrives: text that may begin a call marker waits,
    and a call whose text does not parse comes out as content, markers and all (nothing is dropped). A reply that
    opens like a bare JSON call (`_bare`) waits until it is one, or cannot be.

    inside: the prompt opened a call already (a forced `tool_choice`), so the reply starts within one."""

    def __init__(self, syntax: Syntax, tools: list[dict] | None, inside: bool = False):
        self.syntax, self.tools, self.inside = syntax, tools, inside
        self.opened = inside  # the call's start marker came from the prompt, not from the reply
        self.buf = ""
        self.bare = not inside  # the reply may yet be a bare call: nothing is released meanwhile
        self.called = False  # some call parsed

    def feed(self, text: str) -> list[str | ToolCall]:
        """The content and calls that `text` completes, in order."""
        self.buf += text
        if self.bare:
            self.bare = _bare(self.buf, self.tools)[1]
            if self.bare:
                return []
        out: list[str | ToolCall] = []
        start, end = self.syntax.start, self.syntax.end
        while True:
            if not self.inside:
                i = self.buf.find(start)
                if i < 0:
                    hold = max((k for k in range(1, len(start)) if self.buf.endswith(start[:k])), default=0)
                    out.append(self.buf[: len(self.buf) - hold])
                    self.buf = self.buf[len(self.buf) - hold :]
                    break
                out.append(self.buf[:i])
                self.buf, self.inside, self.opened = self.buf[i + len(start) :], True, False
                continue
            j = self.buf.find(end) if end else -1
            if j < 0:
                break
            out += self._close(self.buf[:j], end)
            self.buf = self.buf[j + len(end) :]
        return [x for x in out if x != ""]

    def end(self) -> list[str | ToolCall]:
        """At the end of the reply: an unterminated call is parsed as it stands, the rest is content."""
        calls = _bare(self.buf, self.tools)[0] if self.bare else None
        if calls:
            self.called, self.buf = True, ""
            return list(calls)
        out = self._close(self.buf, "") if self.inside else [self.buf]
        self.buf = ""
        return [x for x in out if x != ""]

    def _close(self, body: str, end: str) -> list[str | ToolCall]:
        self.inside = False
        try:
            calls = _calls(self.syntax.parse(body, self.tools))
        except Exception:  # any parser's failure: the text goes out as the model wrote it
            return [("" if self.opened else self.syntax.start) + body + end]
        self.called = self.called or bool(calls)
        return list(calls)


def split(syntax: Syntax, text: str, tools: list[dict] | None, inside: bool = False) -> tuple[str, list[ToolCall]]:
    """A whole reply as (content, calls)."""
    t = ToolText(syntax, tools, inside)
    parts = t.feed(text) + t.end()
    return "".join(p for p in parts if isinstance(p, str)), [p for p in parts if isinstance(p, ToolCall)]
