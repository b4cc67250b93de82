"""The server's OpenAPI schema (GET /openapi.json): every route and the request bodies it reads, as clients and
fuzzers see them. Fields the server ignores are allowed, as OpenAI clients send many."""

from typing import Any

OPENAPI = "3.0.3"
ERROR = {"$ref": "#/components/schemas/Error"}

TEXT_PARTS = {
    "type": "array",
    "items": {"type": "object", "properties": {"type": {"type": "string"}, "text": {"type": "string"}}},
}
STRING_OR_PARTS = {"oneOf": [{"type": "string"}, TEXT_PARTS], "nullable": True}
TOOL = {
    "type": "object",
    "description": "OpenAI's {type: function, function: {name, description, parameters}}",
    "properties": {"type": {"type": "string"}, "function": {"type": "object"}},
}
SAMPLING = {  # the options every generating route reads
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "seed": {"type": "integer", "minimum": 0},
    "stream": {"type": "boolean"},
    "draft": {"type": "string", "description": "this reply's drafter: one of /v1/models' mlx_spec.drafters"},
}
OPENAI = {  # chat completions' and completions' own
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "enum": [1]},
    "stop": {
        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}],
        "nullable": True,
    },
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    **SAMPLING,
}
CHAT_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": STRING_OR_PARTS,
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "name": {"type": "string"},
    },
}
CHAT = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "items": CHAT_MESSAGE},
        "tools": {"type": "array", "items": TOOL},
        "tool_choice": {"oneOf": [{"type": "string"}, {"type": "object"}]},
        **OPENAI,
    },
}
COMPLETION = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            ]
        },
        **OPENAI,
    },
}
RESPONSE = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": {"type": "string"},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": {"type": "string", "nullable": True},
        "previous_response_id": {"type": "string", "nullable": True},
        "max_output_tokens": {"type": "integer", "minimum": 1, "nullable": True},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"oneOf": [{"type": "string"}, {"type": "object"}]},
        "store": {"type": "boolean"},
        "metadata": {"type": "object"},
        **SAMPLING,
    },
}
ANTHROPIC_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    },
}
ANTHROPIC_COMMON = {
    "model": {"type": "string"},
    "messages": {"type": "array", "minItems": 1, "items": ANTHROPIC_MESSAGE},
    "system": {"oneOf": [{"type": "string"}, TEXT_PARTS]},
    "tools": {"type": "array", "items": {"type": "object"}},
    "tool_choice": {"type": "object"},
}
MESSAGES = {
    "type": "object",
    "required": ["max_tokens", "messages"],
    "properties": {
        **ANTHROPIC_COMMON,
        "max_tokens": {"type": "integer", "minimum": 1},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        **SAMPLING,
    },
}
COUNT = {"type": "object", "required": ["messages"], "properties": ANTHROPIC_COMMON}


def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict:
    """The error replies a route may give, each a JSON error body."""
    return {str(c): {"description": "an error", **_json(ERROR)} for c in codes}


def _post(summary: str, body: dict, streams: bool = True) -> dict:
    ok = {"description": "the reply", **_json({"type": "object"})}
    if streams:
        ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, **_json(body)},
            "responses": {"200": ok, **_errors(400, 401, 403, 413, 415, 429)},
        }
    }


def _get(summary: str, media: str = "application/json", **extra: Any) -> dict:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": {"description": summary, "content": {media: {"schema": {}}}}, **_errors(401, 403)},
            **extra,
        }
    }


def schema() -> dict:
    """The OpenAPI document of every route."""
    return {
        "openapi": OPENAPI,
        "info": {"title": "mlx-spec serve", "version": "1", "description": "OpenAI- and Anthropic-compatible API"},
        "paths": {
            "/": _get("the web chat", "text/html"),
            "/health": _get("the scheduler's counters"),
            "/openapi.json": _get("this document"),
            "/v1/models": _get("the served model and its drafters"),
            "/v1/chat/completions": _post("a chat completion", CHAT),
            "/v1/completions": _post("a text completion", COMPLETION),
            "/v1/responses": _post("a response (OpenAI's Responses API)", RESPONSE),
            "/v1/responses/{id}": _get(
                "a stored response",
                parameters=[{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
            ),
            "/v1/messages": _post("a message (Anthropic's Messages API)", MESSAGES),
            "/v1/messages/count_tokens": _post("a prompt's token count", COUNT, streams=False),
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "object"}},
                }
            }
        },
    }
