"""`POST /v1/messages` over a real socket: the official anthropic client (plain, streamed, a tool and its result,
count_tokens, its key header), greedy output equal to chat completions', and bad input in Anthropic's error shape."""

import json
import threading

import anthropic
import httpx
import openai
import pytest
from conftest import TOOL_CALL, scripted_tool_pair

from mlx_spec.server.app import build_app
from mlx_spec.server.errors import ApiError
from mlx_spec.server.main import Running
from mlx_spec.server.messages import MessagesReply, chat_body
from mlx_spec.server.scheduler import Done
from mlx_spec.server.tools import ToolCall

CODE = "def add(a, b):"
JSON = {"Content-Type": "application/json"}
HI = [{"role": "user", "content": CODE}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER["input_schema"]},
}


# ---- the translation alone ----


def test_blocks_become_the_chat_conversation_with_tool_uses_and_results():
    body = {
        "max_tokens": 7,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Use tools."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu1",
                        "content": [{"type": "text", "text": "no network"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Try again?"},
                ],
            },
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["\n\n"],
        "top_k": 5,
    }
    chat = chat_body(body)
    call = {"id": "tu1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief. Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},  # the thinking block is dropped
        {"role": "tool", "tool_call_id": "tu1", "content": "Error: no network"},  # results come before the text
        {"role": "user", "content": "Try again?"},
    ]
    assert chat["tools"] == [CHAT_WEATHER] and chat["tool_choice"] == "required"
    assert (chat["max_tokens"], chat["stop"], chat["top_k"]) == (7, ["\n\n"], 5)
    named = chat_body(dict(body, tool_choice={"type": "tool", "name": "get_weather"}))["tool_choice"]
    assert named == {"type": "function", "function": {"name": "get_weather"}}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
ORPHAN = {"type": "tool_result", "tool_use_id": "tu9", "content": "x"}
BAD = [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),
    ({"max_tokens": 5}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [IMAGE]}]}, '"image"'),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [ORPHAN]}]}, "tu9"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 5, "messages": HI, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 5, "messages": HI, "tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
    ({"max_tokens": 5, "messages": HI, "tools": [{"name": "f"}]}, "input_schema"),
    ({"max_tokens": 5, "messages": HI, "stop_sequences": "x"}, "stop_sequences"),
]


@pytest.mark.parametrize("body, says", BAD)
def test_bad_input_is_one_400_that_names_it(body, says):
    with pytest.raises(ApiError) as e:
        chat_body(body)
    assert e.value.status == 400 and says in e.value.message


def test_parallel_calls_are_blocks_of_their_own_and_the_usage_splits_off_the_cache():
    calls = [ToolCall("c1", "get_weather", '{"city": "Paris"}'), ToolCall("c2", "get_time", "not json")]
    reply = MessagesReply("msg_x", "tiny")
    events = reply.add(["\n", calls[0], "\n", calls[1]])
    stats = {"prompt_tokens": 50, "prompt_cached": 40, "generation_tokens": 9, "finish_reason": "stop"}
    events += reply.finish(Done("stop", stats))
    starts = [e for name, e in events if name == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [(0, "tool_use"), (1, "tool_use")]
    assert [b["input"] for b in reply.final["content"]] == [{"city": "Paris"}, {"input": "not json"}]
    assert reply.final["stop_reason"] == "tool_use" and events[-1][0] == "message_stop"
    assert reply.final["usage"] == {
        "input_tokens": 10,
        "output_tokens": 9,
        "cache_read_input_tokens": 40,
        "cache_creation_input_tokens": 0,
    }
    cut = MessagesReply("msg_y", "tiny")
    cut.add(["So", calls[0]])
    cut.finish(Done("length", dict(stats, finish_reason="length")))
    assert cut.final["stop_reason"] == "max_tokens"  # a call, then the length ran out: not a finished tool turn


# ---- over a socket ----


@pytest.fixture(scope="module")
def server(served_pair):
    with Running(build_app(served_pair, max_concurrency=2, max_tokens=24)) as srv:
        yield srv


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def chat(server):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=60)


def test_a_plain_message_is_chat_completions_reply_with_usage_and_stats(client, chat):
    m = client.messages.create(model="tiny", max_tokens=12, messages=HI)
    c = chat.chat.completions.create(model="tiny", messages=HI, max_tokens=12)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == c.choices[0].message.content
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 12
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == c.usage.prompt_tokens  # the cached part apart
    assert m.usage.cache_read_input_tokens == m.model_extra["mlx_spec"]["prompt_cached"]
    assert len(m.model_extra["mlx_spec"]["draft_flags"]) == 12
    system = client.messages.create(model="tiny", max_tokens=12, system="You write Python.", messages=HI)
    with_system = [{"role": "system", "content": "You write Python."}, *HI]
    assert (
        system.content[0].text
        == chat.chat.completions.create(model="tiny", messages=with_system, max_tokens=12).choices[0].message.content
    )
    counted = client.messages.count_tokens(model="tiny", system="You write Python.", messages=HI)
    assert counted.input_tokens == system.usage.input_tokens + system.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_message_and_is_named(client):
    full = client.messages.create(model="tiny", max_tokens=20, messages=HI).content[0].text
    stop = full[6:9]
    for m in (
        client.messages.create(model="tiny", max_tokens=20, messages=HI, stop_sequences=["\x00never", stop]),
        client.messages.stream(model="tiny", max_tokens=20, messages=HI, stop_sequences=[stop])
        .__enter__()
        .get_final_message(),
    ):
        assert m.content[0].text == full[: full.index(stop)]
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop


def test_the_stream_sends_anthropics_events_and_adds_up_to_the_message(client, server):
    whole = client.messages.create(model="tiny", max_tokens=16, messages=HI)
    with client.messages.stream(model="tiny", max_tokens=16, messages=HI) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 16
    raw = httpx.post(
        server.url + "v1/messages", json={"model": "t", "max_tokens": 16, "messages": HI, "stream": True}, timeout=60
    )
    names = [line[6:].strip() for line in raw.text.splitlines() if line.startswith("event:")]
    data = [json.loads(line[5:]) for line in raw.text.splitlines() if line.startswith("data:")]
    assert [d["type"] for d in data] == names
    flags = [f for d in data if d["type"] == "content_block_delta" for f in d.get("mlx_spec", {}).get("draft", [])]
    assert flags == data[-2]["mlx_spec"]["draft_flags"] and len(flags) == 16  # every token's, on the deltas
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_greedy_output_equals_chat_completions_under_each_drafter(client, chat):
    plain = (
        chat.chat.completions.create(model="tiny", messages=HI, extra_body={"draft": "none"}).choices[0].message.content
    )
    for spec in ("none", "suffix", "ngram", None):  # None: the server's own, the tiny draft model
        m = client.messages.create(
            model="tiny", max_tokens=24, messages=HI, extra_body={"draft": spec} if spec else None
        )
        assert m.content[0].text == plain, spec


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


def test_bad_input_gets_one_anthropic_error_while_a_message_streams(client, server):
    url = server.url + "v1/messages"
    alone = client.messages.create(model="tiny", max_tokens=200, messages=HI).content[0].text
    during = {}

    def streamed():
        with client.messages.stream(model="tiny", max_tokens=200, messages=HI) as s:
            during["text"] = "".join(s.text_stream)

    t = threading.Thread(target=streamed)
    t.start()
    for body, says in BAD + [
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "def add(a, b): " * 200}]}, "context")
    ]:
        assert says in anthropic_error(httpx.post(url, json=body, timeout=30), 400, "invalid_request_error")
    anthropic_error(httpx.post(url, content=b"{not json", headers=JSON, timeout=30), 400, "invalid_request_error")
    huge = {"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 200_000}]}
    anthropic_error(httpx.post(url, json=huge, timeout=30), 413, "request_too_large")
    anthropic_error(httpx.post(url + "/batches", json={}, timeout=30), 404, "not_found_error")
    anthropic_error(httpx.get(url, timeout=30), 405, "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny", max_tokens=5, messages=[{"role": "user", "content": [IMAGE]}])
    t.join(60)
    assert during["text"] == alone  # the message in flight never noticed


def test_the_key_travels_in_anthropics_header(served_pair):
    with Running(build_app(served_pair, api_key="sekret", max_concurrency=1, max_tokens=4)) as srv:
        good = anthropic.Anthropic(base_url=srv.url, api_key="sekret", max_retries=0, timeout=60)
        assert good.messages.create(model="tiny", max_tokens=3, messages=HI).usage.output_tokens == 3
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
                model="t", max_tokens=3, messages=HI
            )
        anthropic_error(
            httpx.post(srv.url + "v1/messages", json={"max_tokens": 3, "messages": HI}), 401, "authentication_error"
        )


# ---- a tool, with a target that answers a text and then a call ----


@pytest.fixture(scope="module")
def tools_client(tiny_models):
    with Running(build_app(scripted_tool_pair(tiny_models), max_concurrency=2, max_tokens=200)) as srv:
        yield anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60), srv


ASKED = [{"role": "user", "content": "Weather in Paris?"}]


def blocks(content) -> list[tuple]:
    return [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in content]


CALLED = [("text", "Let me check."), ("tool_use", "get_weather", {"city": "Paris"})]


def test_a_call_comes_out_as_a_tool_use_block_and_its_result_goes_back_in(tools_client):
    client, srv = tools_client
    m = client.messages.create(model="tiny", max_tokens=200, messages=ASKED, tools=[WEATHER])
    assert blocks(m.content) == CALLED and m.stop_reason == "tool_use"
    use = m.content[1]
    result = [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]
    turn2 = ASKED + [{"role": "assistant", "content": m.content}, {"role": "user", "content": result}]
    again = client.messages.create(model="tiny", max_tokens=200, messages=turn2, tools=[WEATHER])
    assert blocks(again.content) == CALLED  # the script calls again
    assert again.usage.cache_read_input_tokens >= m.usage.input_tokens + m.usage.cache_read_input_tokens - 1
    chat = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)
    call = {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    same = ASKED + [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": use.id, "content": "sunny, 21 C"},
    ]
    prompt = chat.chat.completions.create(
        model="tiny", messages=same, tools=[CHAT_WEATHER], max_tokens=1
    ).usage.prompt_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == prompt  # the same conversation


def test_a_forced_tool_choice_opens_the_call_in_the_prompt(tiny_models):
    with Running(build_app(scripted_tool_pair(tiny_models, TOOL_CALL), max_concurrency=1, max_tokens=200)) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
        for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
            m = client.messages.create(model="t", max_tokens=200, messages=ASKED, tools=[WEATHER], tool_choice=choice)
            assert blocks(m.content) == CALLED[1:] and m.stop_reason == "tool_use", choice


def test_a_streamed_call_sends_its_tool_use_block_and_input_json(tools_client):
    client, _ = tools_client
    events = []
    with client.messages.stream(model="tiny", max_tokens=200, messages=ASKED, tools=[WEATHER]) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert blocks(final.content) == CALLED and final.stop_reason == "tool_use"
    assert "input_json" in events and events[-1] == "message_stop"
    for spec in ("suffix", "ngram"):  # drafts through the call text leave the reply as plain decoding gives it
        m = client.messages.create(
            model="tiny", max_tokens=200, messages=ASKED, tools=[WEATHER], extra_body={"draft": spec}
        )
        assert blocks(m.content) == CALLED, spec
    assert m.model_extra["mlx_spec"]["accepted"] > 0
