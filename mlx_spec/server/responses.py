"""The OpenAI Responses API: input items to chat messages, the reply to output items and streamed events, and the kept
responses that `previous_response_id` continues.

A request becomes the /v1/chat/completions body of the same conversation (instructions as the system message,
`function_call` items as an assistant turn's `tool_calls`, `function_call_output` items as `tool` messages), so it runs
through the same checks, chat template, engine, sessions and prefix cache as chat completions does.
"""

import copy
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import ApiError, bad_request
from .scheduler import Done
from .tools import NAME, ToolCall
from .wire import EXTRA, final_stats, joined

KEPT = 256  # responses kept for previous_response_id and GET: a few agents' recent turns; each holds its conversation
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")  # text parts as clients send them back (history or fresh input)
SKIPPED = ("reasoning",)  # an earlier turn's hidden reasoning: this server writes none, and templates drop it anyway
NOT_OFFERED = frozenset(  # OpenAI's other tool types (openai-python 3.57's `responses.Tool`): tools it hosts, which
    # this server cannot run, and client tools whose calls are not function calls. Accepted, left out, and reported.
    "web_search web_search_2025_08_26 web_search_preview web_search_preview_2025_03_11 file_search code_interpreter "
    "image_generation mcp computer computer_use computer_use_preview tool_search programmatic_tool_calling custom "
    "local_shell shell apply_patch".split()
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class StoredResponse:
    """A finished response as `previous_response_id` and GET see it."""

    history: list[dict]  # its conversation in chat messages, without instructions, its own reply last
    response: dict  # the response object as sent


class Store:
    """The server's kept responses: at most `size`, the least recently used dropped first."""

    def __init__(self, size: int = KEPT):
        self.size = size
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, id: str, kept: StoredResponse) -> None:
        self._kept[id] = kept
        self._kept.move_to_end(id)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def get(self, id: str) -> StoredResponse | None:
        kept = self._kept.get(id)
        if kept is not None:
            self._kept.move_to_end(id)
        return kept


def _unsupported(where: str, kind) -> ApiError:
    return bad_request(f"{where}: {json.dumps(kind)} is not supported: this server reads text and function calls")


def _text(content, where: str) -> str:
    """A message's or an output's text: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of input_text parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal":
            out.append(str(part.get("refusal", "")))
        elif kind in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:
            raise _unsupported(f"{where}[{j}]", kind)
    return "".join(out)


def _string(item: dict, key: str, where: str, empty: bool = False) -> str:
    v = item.get(key)
    if not isinstance(v, str) or not (v or empty):
        raise bad_request(f"{where}.{key} must be a {'' if empty else 'non-empty '}string", param=f"{where}.{key}")
    return v


def items(input, calls: set[str], where: str = "input") -> list[dict]:
    """`input` (a string or a list of items) as chat messages; `calls` holds the call ids seen so far (grows)."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    if not isinstance(input, list) or not input:
        raise bad_request(f"'{where}' must be a string or a non-empty list of items", param=where)
    out: list[dict] = []
    for i, item in enumerate(input):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{at} must be an object", param=at)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad_request(f"{at}.role: unknown role {json.dumps(role)} (one of {', '.join(ROLES)})", param=at)
            role = "system" if role == "developer" else role  # OpenAI's newer name; templates know "system"
            out.append({"role": role, "content": _text(item.get("content"), f"{at}.content")})
        elif kind == "function_call":
            call_id, name = _string(item, "call_id", at), _string(item, "name", at)
            if item.get("namespace") is not None:
                name = flat(_string(item, "namespace", at), name)
            function = {"name": name, "arguments": _string(item, "arguments", at, empty=True)}
            call = {"id": call_id, "type": "function", "function": function}
            calls.add(call_id)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the calls of one turn: one assistant message
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", at)
            if call_id not in calls:
                raise bad_request(
                    f"{at}: no function_call with call_id {json.dumps(call_id)} comes before this output",
                    param=f"{at}.call_id",
                )
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{at}.output")})
        elif kind not in SKIPPED:
            raise _unsupported(f"{at}.type", kind)
    return out


def flat(namespace: str, name: str) -> str:
    """A namespaced function's name as the model sees it and calls it: `namespace__name`, as vLLM names it."""
    return f"{namespace}__{name}"


@dataclass
class Offered:
    """A request's `tools` as the model is offered them."""

    chat: list[dict] = field(default_factory=list)  # chat completions' function tools, a namespace's under flat names
    spaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat name -> (namespace, name) for the client
    left: list[dict] = field(default_factory=list)  # the tools not offered, as {type[, namespace][, name]}


def _function(t: dict, at: str, namespace: dict | None = None) -> dict:
    """A function tool ({type, name, description, parameters}) in chat completions' shape; in a namespace, under its
    flat name, the namespace's description before its own."""
    name, description = _string(t, "name", at), t.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{at}.description must be a string", param=f"{at}.description")
    if namespace is not None:
        name = flat(namespace["name"], name)
        description = "\n\n".join(d for d in (namespace.get("description"), description) if isinstance(d, str) and d)
    if not NAME.fullmatch(name):
        raise bad_request(f"{at}: the name {json.dumps(name)} must be 1-64 letters, digits, '_' or '-'", param=at)
    fn: dict = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _kind(x) -> str | None:
    """An object's `type`, where it has a string one."""
    kind = x.get("type") if isinstance(x, dict) else None
    return kind if isinstance(kind, str) else None


def _namespace(t: dict, at: str, out: Offered) -> None:
    """A namespace's function tools into `out` under their flat names; its custom tools into `out.left`."""
    space, inner = _string(t, "name", at), t.get("tools")
    if not isinstance(inner, list) or not inner:
        raise bad_request(f"{at}.tools must be a non-empty list of function tools", param=f"{at}.tools")
    for j, u in enumerate(inner):
        where = f"{at}.tools[{j}]"
        if _kind(u) == "function":
            out.chat.append(_function(u, where, t))
            out.spaced[out.chat[-1]["function"]["name"]] = (space, u["name"])
        elif _kind(u) == "custom":
            out.left.append({"type": "custom", "namespace": space, "name": u.get("name")})
        else:
            raise bad_request(f"{where}: a namespace holds function tools, not {json.dumps(_kind(u))}", param=where)


def tools(body: dict) -> Offered:
    """Responses' tools as chat completions' function tools: flat function tools, and those of a `namespace` under
    their flat names; the other known types (NOT_OFFERED) are left out and listed."""
    given, out = body.get("tools"), Offered()
    if given is None or given == []:
        return out
    if not isinstance(given, list):
        raise bad_request("'tools' must be a list of tools", param="tools")
    for i, t in enumerate(given):
        at, kind = f"tools[{i}]", _kind(t)
        if kind == "function":
            out.chat.append(_function(t, at))
        elif kind == "namespace":
            _namespace(t, at, out)
        elif kind in NOT_OFFERED:
            out.left.append({"type": kind, **({"name": t["name"]} if isinstance(t.get("name"), str) else {})})
        else:
            raise bad_request(f"{at}: unknown tool type {json.dumps(kind)}", param=at)
    return out


def tool_choice(body: dict, offered: Offered):
    """Responses' `tool_choice` as chat completions': a mode, or {type: function, name[, namespace]} named. A choice
    that forces a tool the model is not offered is a 400."""
    choice = body.get("tool_choice")
    names = [t["function"]["name"] for t in offered.chat]
    if choice == "required" and not names and offered.left:
        raise bad_request(
            "'tool_choice' is \"required\", but none of 'tools' is a function tool this server can offer the model",
            param="tool_choice",
        )
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    kind = _kind(choice)
    if kind == "function" and isinstance(choice.get("name"), str):
        name = choice["name"]
        if choice.get("namespace") is not None:
            name = flat(_string(choice, "namespace", "tool_choice"), name)
        if name not in names:
            raise bad_request(
                f"'tool_choice' names the function {json.dumps(name)}, which is not among 'tools' "
                f"({', '.join(names) or 'none given'})",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": name}}
    if kind in NOT_OFFERED:
        raise bad_request(
            f"'tool_choice' forces the {json.dumps(kind)} tool, which this server does not offer the model: it runs "
            "function tools only",
            param="tool_choice",
        )
    raise bad_request(
        '\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "name": ...}',
        param="tool_choice",
    )


@dataclass
class ChatForm:
    """A Responses request as chat completions sees it."""

    chat: dict  # the /v1/chat/completions body of the same conversation, tools and options
    history: list[dict]  # the conversation without the instructions: what a follow-up continues
    echo: dict = field(default_factory=dict)  # the request's fields the response object repeats
    tools: Offered = field(default_factory=Offered)  # the tools as offered: flat names and the ones left out


def ask(body: dict, store: Store) -> ChatForm:
    """The request in chat completions' terms, continuing `previous_response_id` from `store`."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", param="instructions")
    history, calls = [], set()
    previous = body.get("previous_response_id")
    if previous is not None:
        kept = store.get(previous) if isinstance(previous, str) else None
        if kept is None:
            raise bad_request(
                f"no kept response with id {json.dumps(previous)}: this server keeps its last {store.size} stored "
                "responses in memory (not across restarts)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = list(kept.history)
        calls = {c["id"] for m in history for c in m.get("tool_calls") or ()}
    history += items(body.get("input"), calls)
    length = body.get("max_output_tokens")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length <= 0):
        raise bad_request(
            f"'max_output_tokens' must be a positive integer, got {json.dumps(length)}", param="max_output_tokens"
        )
    offered = tools(body)
    chat = {
        "messages": ([{"role": "system", "content": instructions}] if instructions else []) + history,
        "max_tokens": length,
    }
    if offered.chat:
        chat["tools"] = offered.chat
    choice = tool_choice(body, offered)
    if choice is not None:
        chat["tool_choice"] = choice
    for key in ("temperature", "top_p", "top_k", "seed", "stream", "draft", "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": previous,
        "store": body.get("store", True) is not False,
        "metadata": body.get("metadata") or {},
    }
    return ChatForm(chat, history, echo, offered)


def usage(stats: dict) -> dict:
    """Responses' `usage`, with the cached prompt tokens."""
    prompt, output = stats.get("prompt_tokens", 0), stats.get("generation_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": stats.get("prompt_cached", 0)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


class ResponsesReply:
    """One response's objects: the response, its output items as they grow, and its stream's events in order (each
    with its sequence number). Events carry copies: the items go on growing after an event is made. `tools`: the
    request's as offered, to name namespaced calls as the client does and to report the tools left out."""

    def __init__(self, id: str, model: str, echo: dict, tools: Offered | None = None):
        self.id, self.model, self.echo, self.created = id, model, echo, int(time.time())
        self.tools = tools or Offered()
        self.seq = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the message item that text goes to
        self.blank = ""  # whitespace outside a message: it opens none unless text follows
        self.held: dict | None = None  # the draft stats of tokens not yet sent
        self.text = ""  # what the reply said: its text and its calls
        self.calls: list[ToolCall] = []
        self.final: dict = {}  # the finished response, once it is

    def response(self, status: str, done: Done | None = None) -> dict:
        """The response object, as it stands."""
        r = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model, "status": status}
        r.update(error=None, incomplete_details=None, output=copy.deepcopy(self.output), usage=None, **self.echo)
        r.update(text={"format": {"type": "text"}}, truncation="disabled", reasoning=None, user=None)
        extra = {"tools_not_offered": self.tools.left} if self.tools.left else {}
        if done is not None:
            if status == "incomplete":
                r["incomplete_details"] = {"reason": "max_output_tokens"}
            r["usage"] = usage(done.stats)
            extra.update(final_stats(done.stats))
        return dict(r, **{EXTRA: extra}) if extra else r

    def event(self, type: str, **fields) -> dict:
        """The stream's next event."""
        self.seq += 1
        return {"type": type, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        """response.created and response.in_progress."""
        return [
            self.event(t, response=self.response("in_progress")) for t in ("response.created", "response.in_progress")
        ]

    def add(self, parts: list[str | ToolCall], live: dict | None = None) -> list[dict]:
        """The reply's next content and calls, in order, as events. `live` (the draft stats of the tokens they came
        from) rides on the next text delta or call arguments sent."""
        self.held = joined(self.held, live) if live else self.held
        return [e for p in parts for e in (self._text(p) if isinstance(p, str) else self._call(p))]

    def _stats(self, event: dict) -> dict:
        held, self.held = self.held, None
        return dict(event, **{EXTRA: held}) if held else event

    def _item(self, item: dict) -> dict:
        self.output.append(item)
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=copy.deepcopy(item))

    def _text(self, delta: str, empty: bool = False) -> list[dict]:
        """Text: into the open message item, or a new one. empty: open one even for no text (an empty reply)."""
        if self.open is None and not delta.strip() and not empty:
            self.blank += delta
            return []
        delta, self.blank, out = self.blank + delta, "", []
        if self.open is None:
            self.open = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress"}
            self.open["content"] = []
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._item(self.open))
            self.open["content"].append(part)
            at = {"item_id": self.open["id"], "output_index": len(self.output) - 1, "content_index": 0}
            out.append(self.event("response.content_part.added", **at, part=dict(part)))
        if delta:
            self.text += delta
            self.open["content"][0]["text"] += delta
            at = {"item_id": self.open["id"], "output_index": self.output.index(self.open), "content_index": 0}
            out.append(self._stats(self.event("response.output_text.delta", **at, delta=delta, logprobs=[])))
        return out

    def _close(self, status: str) -> list[dict]:
        """The open message item's done events."""
        if self.open is None:
            return []
        item, self.open = self.open, None
        item["status"] = status
        part, at = item["content"][0], {"item_id": item["id"], "output_index": self.output.index(item)}
        return [
            self.event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]),
            self.event("response.content_part.done", **at, content_index=0, part=dict(part)),
            self.event("response.output_item.done", output_index=at["output_index"], item=copy.deepcopy(item)),
        ]

    def _call(self, call: ToolCall) -> list[dict]:
        """A parsed function call: its item (a namespaced function's under its own name and namespace), its arguments
        in one delta, and its done events."""
        self.calls.append(call)
        out = self._close("completed")
        space, name = self.tools.spaced.get(call.name, (None, call.name))
        item = {"id": new_id("fc"), "type": "function_call", "call_id": call.id, "name": name, "arguments": ""}
        item.update(({"namespace": space} if space else {}), status="in_progress")
        out.append(self._item(item))
        item.update(arguments=call.arguments, status="completed")
        at = {"item_id": item["id"], "output_index": len(self.output) - 1}
        return out + [
            self._stats(self.event("response.function_call_arguments.delta", **at, delta=call.arguments)),
            self.event("response.function_call_arguments.done", **at, name=name, arguments=call.arguments),
            self.event("response.output_item.done", output_index=at["output_index"], item=copy.deepcopy(item)),
        ]

    def finish(self, done: Done) -> list[dict]:
        """The last events, the finished response kept in `final`: incomplete when it ran out of tokens."""
        status = "incomplete" if done.finish_reason == "length" else "completed"
        out = self._text("", empty=True) if not self.output else []  # an empty reply is an empty message
        out += self._close(status)
        self.final = self.response(status, done)
        return out + [self.event("response.completed", response=self.final)]

    def sse(self, event: dict) -> dict:
        """An event as SSE, named by its type as OpenAI names it."""
        return {"event": event["type"], "data": json.dumps(event)}

    def error(self, e: ApiError) -> dict:
        """A failure mid-stream: OpenAI's `error` event."""
        return self.sse(self.event("error", code=e.code, message=e.message, param=e.param))

    def turn(self) -> dict:
        """The reply as the chat message that a follow-up's conversation holds (as chat completions answers it)."""
        if not self.calls:
            return {"role": "assistant", "content": self.text}
        return {
            "role": "assistant",
            "content": self.text.strip() or None,
            "tool_calls": [c.openai() for c in self.calls],
        }


def routes(api) -> list[Route]:
    """POST /v1/responses and GET /v1/responses/{id} over the app's core (`app.Api`), with their own kept responses."""
    store = Store()

    async def create(request: Request) -> Response:
        api.authorize(request)
        a = ask(await api.body(request), store)
        prompt = api.chat_prompt(a.chat)
        run = await api.start(request, prompt.ids, prompt.params, "resp", param="input")
        reply = ResponsesReply(run.id.replace("-", "_", 1), api.pair.name, a.echo, a.tools)

        def finished() -> None:
            run.finish = "tool_calls" if reply.calls else None
            if a.echo["store"]:
                store.put(reply.id, StoredResponse(a.history + [reply.turn()], reply.final))

        return await api.reply(run, prompt, reply, finished)

    async def retrieve(request: Request) -> Response:
        api.authorize(request)
        kept = store.get(request.path_params["id"])
        if kept is None:
            raise ApiError(404, f"no kept response with id {json.dumps(request.path_params['id'])}", code="not_found")
        return JSONResponse(kept.response)

    return [Route("/v1/responses", create, methods=["POST"]), Route("/v1/responses/{id}", retrieve, methods=["GET"])]
