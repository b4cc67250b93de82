"""Request bodies of /v1/chat/completions and /v1/completions: read within a bound, checked, defaulted, turned into
generation parameters.

Unknown fields are ignored, as OpenAI clients expect (they send many). Anything malformed is a 400
naming the field, so no bad request ever reaches the scheduler. A body longer than the model's context
could need is a 413 before it is read.
"""

import json
from dataclasses import dataclass, field

from starlette.requests import Request

from .errors import ApiError, bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TEMPERATURE = 2.0  # OpenAI's range for temperature
MAX_STOPS = 4  # OpenAI's limit on stop strings
BYTES_PER_TOKEN = 128  # a token's most bytes in a body (Qwen2.5's longest: 128 spaces): every prompt that fits passes
BODY_SLACK = 64 * 1024  # bytes for the rest of the body: the model name, the options, each message's braces
UNSTATED_CONTEXT = 32_768  # tokens assumed where the model's config states no context: a common context of open models


@dataclass
class Params:
    """What one request asks the engine for."""

    max_tokens: int | None  # None: up to the end of the context (the core fills it in before submitting)
    temp: float = 0.0
    top_p: float = 0.0  # 0 or 1: off
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    draft: str | None = None  # this reply's drafter (an extension field, the pair checks it); None: the server's


def body_limit(context: int | None) -> int:
    """The most bytes a request body may have for a model with this context (None: unstated)."""
    return (context or UNSTATED_CONTEXT) * BYTES_PER_TOKEN + BODY_SLACK


async def read_body(request: Request, context: int | None) -> bytes:
    """The raw body, or a 413 once it is known to pass `body_limit`: from Content-Length before reading, else while
    reading (a chunked body)."""
    limit = body_limit(context)
    why = (
        f"the model's context is {context} tokens"
        if context
        else f"the model states no context, so {UNSTATED_CONTEXT} tokens are assumed"
    )
    too_large = ApiError(
        413,
        f"the request body is over {limit} bytes, more than any prompt can take: {why}, "
        f"of at most {BYTES_PER_TOKEN} bytes each; shorten the prompt",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return body


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
        raise bad_request(f"'{key}' must be a number in [{lo:g}, {hi:g}], got {json.dumps(v)}", param=key)
    return float(v)


def params(body: dict, default_max_tokens: int | None) -> Params:
    """Sampling, length, stop and streaming options, checked (shared by every endpoint). default_max_tokens: the
    server's length for a request that gives none (None: up to the end of the context)."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif not _is_int(max_tokens) or max_tokens <= 0:
        raise bad_request(f"'{key}' must be a positive integer, got {json.dumps(max_tokens)}", param=key)
    top_k = body.get("top_k", 0) or 0
    if not _is_int(top_k) or top_k < 0:
        raise bad_request(f"'top_k' must be a non-negative integer, got {json.dumps(top_k)}", param="top_k")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise bad_request(f"'seed' must be a non-negative integer, got {json.dumps(seed)}", param="seed")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise bad_request("only n=1 is supported (one choice per request)", param="n")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > MAX_STOPS:
        raise bad_request(f"'stop' must be a string or a list of up to {MAX_STOPS} strings", param="stop")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    return Params(
        max_tokens=max_tokens,
        temp=_number(body, "temperature", 0.0, MAX_TEMPERATURE, 0.0),
        top_p=_number(body, "top_p", 0.0, 1.0, 0.0),
        top_k=top_k,
        seed=seed,
        stop=stop,
        stream=bool(body.get("stream", False)),
        include_usage=bool(options.get("include_usage", False)),
        draft=body.get("draft"),
    )


def _content(content, where: str) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" for p in content):
            raise bad_request(f"{where}: only text content parts are supported", param=where)
        return "".join(str(p.get("text", "")) for p in content)
    raise bad_request(f"{where} must be a string or a list of text parts", param=where)


def _arguments(call, where: str) -> dict:
    """An earlier call's `function` with its JSON-text arguments as the object chat templates print."""
    f = call.get("function") if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
        raise bad_request(
            f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}", param=where
        )
    args = f.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        raise bad_request(
            f"{where}.function.arguments is not valid JSON", param=f"{where}.function.arguments"
        ) from None
    if not isinstance(args, dict):
        raise bad_request(f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments")
    return {"name": f["name"], "arguments": args}


def messages(body: dict) -> list[dict]:
    """`messages` as the chat template takes them, checked: {role, content: str}, an assistant's `tool_calls` with
    their arguments as objects, a tool result's `tool_call_id` (an earlier call's) and `name`."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects", param="messages")
    out, calls = [], {}  # calls: {id: function name} of the assistant turns so far
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object with 'role' and 'content'", param=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(
                f"messages[{i}].role: unknown role {json.dumps(role)} (one of {', '.join(ROLES)})",
                param=f"messages[{i}].role",
            )
        msg = {"role": role, "content": _content(m.get("content"), f"messages[{i}].content")}
        if role == "assistant" and m.get("tool_calls"):
            where = f"messages[{i}].tool_calls"
            if not isinstance(m["tool_calls"], list):
                raise bad_request(f"{where} must be a list of calls", param=where)
            msg["tool_calls"] = []
            for j, c in enumerate(m["tool_calls"]):
                f = _arguments(c, f"{where}[{j}]")
                cid = c.get("id")
                if not isinstance(cid, str) or not cid:
                    raise bad_request(f"{where}[{j}].id must be a non-empty string", param=f"{where}[{j}].id")
                calls[cid] = f["name"]
                msg["tool_calls"].append({"id": cid, "type": "function", "function": f})
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in calls:
                raise bad_request(
                    f"messages[{i}].tool_call_id {json.dumps(cid)} answers no earlier assistant tool call",
                    param=f"messages[{i}].tool_call_id",
                )
            msg.update(tool_call_id=cid, name=m.get("name") or calls[cid])
        out.append(msg)
    return out


def prompt(body: dict):
    """/v1/completions' `prompt`: a string, a list holding one string, or a list of token ids."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str) and p:
        return p
    if isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p):
        return p
    raise bad_request("'prompt' must be a non-empty string (or one list of token ids)", param="prompt")
