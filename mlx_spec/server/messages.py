"""The Anthropic Messages API: content blocks to chat messages, the reply to content blocks and Anthropic's streamed
events, `count_tokens`, and errors in Anthropic's shape.

A request becomes the /v1/chat/completions body of the same conversation (`system` as the system message, `tool_use`
blocks as an assistant turn's `tool_calls`, `tool_result` blocks as `tool` messages), so it runs through the same
checks, chat template, engine, sessions and prefix cache as chat completions does.
"""

import hmac
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import ERROR, ApiError, bad_request
from .scheduler import Done
from .tools import ToolCall
from .wire import EXTRA, final_stats, joined

ROLES = ("user", "assistant")
SKIPPED = ("thinking", "redacted_thinking")  # an earlier turn's reasoning: Anthropic drops it from the context too
ERROR_TYPES = {  # HTTP status to Anthropic's error type
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "context": "max_tokens", "stop_string": "stop_sequence"}


def error_body(e: ApiError) -> dict:
    """An ApiError in Anthropic's shape."""
    kind = ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def _unsupported(where: str, kind) -> ApiError:
    return bad_request(f"{where}: {json.dumps(kind)} blocks are not supported: this server reads text and tools")


def _blocks_text(content, where: str) -> str:
    """A string, or the text of a list of text blocks (system prompts, tool results)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text blocks")
    out = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _unsupported(f"{where}[{j}]", kind)
        out.append(block["text"])
    return "".join(out)


def _turn(role: str, content, where: str, calls: set[str]) -> list[dict]:
    """One Anthropic message as chat messages: a user turn's tool results first (as `tool` messages), then its text;
    an assistant turn's text with its tool uses as `tool_calls`."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content blocks")
    text, results, uses = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            id, name, input = block.get("id"), block.get("name"), block.get("input", {})
            if not (isinstance(id, str) and id and isinstance(name, str) and name and isinstance(input, dict)):
                raise bad_request(f"{at}: a tool_use block needs a string 'id' and 'name' and an object 'input'")
            calls.add(id)
            uses.append({"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(input)}})
        elif kind == "tool_result" and role == "user":
            id = block.get("tool_use_id")
            if id not in calls:
                raise bad_request(f"{at}: no tool_use with id {json.dumps(id)} comes before this tool_result")
            result = _blocks_text(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):
                result = f"Error: {result}"
            results.append({"role": "tool", "tool_call_id": id, "content": result})
        elif kind not in SKIPPED:
            raise _unsupported(at, kind)
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(text) or None, **({"tool_calls": uses} if uses else {})}]
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])


def conversation(body: dict) -> list[dict]:
    """`system` and `messages` as chat messages."""
    system = body.get("system")
    out = [{"role": "system", "content": _blocks_text(system, "system")}] if system else []
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects")
    calls: set[str] = set()
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise bad_request(f"{where}.role: unknown role {json.dumps(role)} (one of user, assistant)")
        out += _turn(m["role"], m.get("content"), where, calls)
    return out


def tools(body: dict) -> list[dict] | None:
    """Anthropic's tools ({name, description, input_schema}) as chat completions' function tools."""
    given = body.get("tools")
    if not given:
        return None
    if not isinstance(given, list):
        raise bad_request("'tools' must be a list of {name, description, input_schema} objects")
    out = []
    for i, t in enumerate(given):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else t
            raise bad_request(f"{at}: only custom tools with an input_schema are supported, not {json.dumps(kind)}")
        if not isinstance(t.get("name"), str) or not t["name"] or not isinstance(t.get("input_schema"), dict):
            raise bad_request(f"{at} needs a string 'name' and an object 'input_schema'")
        described = {"description": t["description"]} if t.get("description") is not None else {}
        out.append({"type": "function", "function": {"name": t["name"], **described, "parameters": t["input_schema"]}})
    return out


def tool_choice(body: dict, chat_tools: list[dict] | None):
    """Anthropic's tool_choice ({type: auto|any|tool|none}) as chat completions'."""
    choice = body.get("tool_choice")
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        names = [t["function"]["name"] for t in chat_tools or []]
        if choice.get("name") not in names:
            raise bad_request(
                f"tool_choice names the tool {json.dumps(choice.get('name'))}, which is not among 'tools' "
                f"({', '.join(names) or 'none given'})"
            )
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request('tool_choice must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}')


def chat_body(body: dict) -> dict:
    """The /v1/chat/completions body of the same request."""
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise bad_request(f"max_tokens: a positive integer is required, got {json.dumps(max_tokens)}")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop_sequences must be a list of strings")
    chat_tools = tools(body)
    chat = {"messages": conversation(body), "max_tokens": max_tokens, "stop": stops}
    if chat_tools:
        chat["tools"] = chat_tools
    choice = tool_choice(body, chat_tools)
    if choice is not None:
        chat["tool_choice"] = choice
    for key in ("temperature", "top_p", "top_k", "seed", "stream", "draft"):  # seed and draft: extensions
        if body.get(key) is not None:
            chat[key] = body[key]
    return chat


def usage(stats: dict) -> dict:
    """Anthropic's `usage`: `input_tokens` counts the prompt tokens not read from the cache, as Anthropic's does."""
    prompt, cached = stats.get("prompt_tokens", 0), stats.get("prompt_cached", 0)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": stats.get("generation_tokens", 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def stop(done: Done, called: bool) -> tuple[str, str | None]:
    """`stop_reason` and `stop_sequence`: tool_use for a reply that called tools and ended by itself, else from the
    engine's finish reason."""
    reason = done.stats.get("finish_reason", "stop")
    if called and reason == "stop":
        return "tool_use", None
    return STOP_REASONS.get(reason, "end_turn"), done.stats.get("stop_sequence") if reason == "stop_string" else None


def tool_use(call: ToolCall) -> dict:
    """A parsed call as a tool_use block; arguments that are not a JSON object go under "input"."""
    try:
        args = json.loads(call.arguments)
    except ValueError:
        args = call.arguments
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": args if isinstance(args, dict) else {"input": args},
    }


class MessagesReply:
    """One reply's message object and its stream's events in order, each an (event name, data) pair: a text block
    opens at the first text since the start or a call, and closes before the next call."""

    def __init__(self, id: str, model: str, prompt_tokens: int = 0):
        self.id, self.model, self.prompt_tokens = id, model, prompt_tokens
        self.content: list[dict] = []
        self.text_open = False
        self.blank = ""  # whitespace outside a text block: it opens none unless text follows
        self.held: dict | None = None  # the draft stats of tokens not yet sent
        self.called = False
        self.final: dict = {}  # the finished message, once it is

    def message(self, done: Done | None = None) -> dict:
        """The message object, as it stands (no stop reason before the end)."""
        m: dict = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.content}
        m.update(stop_reason=None, stop_sequence=None, usage={"input_tokens": 0, "output_tokens": 0})
        if done is not None:
            reason, sequence = stop(done, self.called)
            m.update(stop_reason=reason, stop_sequence=sequence, usage=usage(done.stats))
            m[EXTRA] = final_stats(done.stats)
        return m

    def start(self) -> list[tuple[str, dict]]:
        """message_start (the prompt's length known, the cache's share not yet) and a ping, as Anthropic opens."""
        m = dict(self.message(), content=[], usage={"input_tokens": self.prompt_tokens, "output_tokens": 0})
        return [("message_start", {"type": "message_start", "message": m}), ("ping", {"type": "ping"})]

    def add(self, parts: list[str | ToolCall], live: dict | None = None) -> list[tuple[str, dict]]:
        """The reply's next content and calls, in order, as events. `live` (the draft stats of the tokens they came
        from) rides on the next delta sent."""
        self.held = joined(self.held, live) if live else self.held
        return [e for p in parts for e in (self._text(p) if isinstance(p, str) else self._call(p))]

    def _delta(self, index: int, delta: dict) -> tuple[str, dict]:
        e = {"type": "content_block_delta", "index": index, "delta": delta}
        held, self.held = self.held, None
        return "content_block_delta", dict(e, **{EXTRA: held}) if held else e

    def _text(self, delta: str) -> list[tuple[str, dict]]:
        if not self.text_open and not delta.strip():
            self.blank += delta
            return []
        delta, self.blank, out = self.blank + delta, "", []
        if not self.text_open:
            self.text_open = True
            self.content.append({"type": "text", "text": ""})
            start = {"type": "content_block_start", "index": len(self.content) - 1}
            out.append(("content_block_start", dict(start, content_block={"type": "text", "text": ""})))
        self.content[-1]["text"] += delta
        return out + [self._delta(len(self.content) - 1, {"type": "text_delta", "text": delta})]

    def _close(self) -> list[tuple[str, dict]]:
        if not self.text_open:
            return []
        self.text_open = False
        return [("content_block_stop", {"type": "content_block_stop", "index": len(self.content) - 1})]

    def _call(self, call: ToolCall) -> list[tuple[str, dict]]:
        """A parsed call: its tool_use block with the whole input in one input_json_delta."""
        out = self._close()
        block = tool_use(call)
        self.content.append(block)
        self.called, i = True, len(self.content) - 1
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        return out + [
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": dict(block, input={})},
            ),
            self._delta(i, delta),
            ("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]

    def finish(self, done: Done) -> list[tuple[str, dict]]:
        """The last events (the open block closed, message_delta with the stop reason, usage and stats,
        message_stop); the finished message kept in `final`."""
        out = self._text(self.blank) if self.blank and not self.content else []  # a reply of whitespace alone
        out += self._close()
        self.final = m = self.message(done)
        delta = {"stop_reason": m["stop_reason"], "stop_sequence": m["stop_sequence"]}
        last = {"type": "message_delta", "delta": delta, "usage": m["usage"], EXTRA: m[EXTRA]}
        return out + [("message_delta", last), ("message_stop", {"type": "message_stop"})]

    def sse(self, event: tuple[str, dict]) -> dict:
        """An (event name, data) pair as SSE."""
        return {"event": event[0], "data": json.dumps(event[1])}

    def error(self, e: ApiError) -> dict:
        """A failure mid-stream: Anthropic's `error` event."""
        return self.sse(("error", error_body(e)))


def authorize(api, request: Request) -> None:
    """401 unless `x-api-key` (Anthropic's header) or a bearer key matches, when the server has a key."""
    if api.api_key is None:
        return
    key = request.headers.get("x-api-key")
    if key is None:
        return api.authorize(request)
    if not hmac.compare_digest(key.strip().encode(), api.api_key.encode()):
        raise ApiError(401, "wrong API key: send 'x-api-key: <key>'", code="invalid_api_key")


def anthropic_errors(route):
    """A route whose ApiErrors answer in Anthropic's shape."""

    async def handle(request: Request) -> Response:
        try:
            return await route(request)
        except ApiError as e:
            request.scope[ERROR] = e  # the log line tells why
            return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)

    return handle


def routes(api) -> list[Route]:
    """POST /v1/messages and /v1/messages/count_tokens over the app's core (`app.Api`), and Anthropic-shaped 404s and
    405s for anything else under /v1/messages."""

    async def create(request: Request) -> Response:
        if request.method != "POST":
            raise ApiError(405, f"Method Not Allowed ({request.method} {request.url.path})")
        authorize(api, request)
        chat = chat_body(await api.body(request))
        stops = chat.pop("stop")  # Anthropic sets no small limit on stop_sequences, as OpenAI's 4
        prompt = api.chat_prompt(chat)
        prompt.params.stop = stops
        run = await api.start(request, prompt.ids, prompt.params, "msg")
        reply = MessagesReply(run.id.replace("-", "_", 1), api.pair.name, len(prompt.ids))

        def finished() -> None:
            run.finish = "tool_use" if reply.called else None

        return await api.reply(run, prompt, reply, finished)

    async def count_tokens(request: Request) -> Response:
        if request.method != "POST":
            raise ApiError(405, f"Method Not Allowed ({request.method} {request.url.path})")
        authorize(api, request)
        chat = chat_body({**(await api.body(request)), "max_tokens": 1})  # count_tokens takes no max_tokens
        chat.pop("stop")
        return JSONResponse({"input_tokens": len(api.chat_prompt(chat).ids)})

    async def unknown(request: Request) -> Response:
        raise ApiError(404, f"Not Found ({request.method} {request.url.path})")

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return [
        Route("/v1/messages", anthropic_errors(create), methods=methods),
        Route("/v1/messages/count_tokens", anthropic_errors(count_tokens), methods=methods),
        Route("/v1/messages/{rest:path}", anthropic_errors(unknown), methods=methods),
    ]
