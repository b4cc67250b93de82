"""`POST /v1/responses` over a real socket: the official openai client (plain, streamed, tools and their outputs,
previous_response_id), greedy output equal to chat completions', and bad input in OpenAI's error shape."""

import asyncio
import json
import threading

import httpx
import openai
import pytest
from conftest import TOOL_ANSWER, TOOL_RESULT, scripted_tool_pair

from mlx_spec.server.app import build_app
from mlx_spec.server.errors import ApiError
from mlx_spec.server.main import Running
from mlx_spec.server.pair import Pair
from mlx_spec.server.responses import ResponsesReply, Store, StoredResponse, ask
from mlx_spec.server.scheduler import Done
from mlx_spec.server.tools import ToolCall

CODE = "def add(a, b):"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


AGENTS = {  # a namespace of function tools, as Codex CLI sends its sub-agent tools
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [
        {"type": "function", "name": "spawn", "description": "Start one", "parameters": WEATHER["parameters"]},
        {"type": "custom", "name": "note", "description": "Free text"},
    ],
}
SPAWN = {"type": "function", "function": {"name": "agents__spawn", "description": "Sub-agents.\n\nStart one"}}
SPAWN["function"]["parameters"] = WEATHER["parameters"]


def chat_text(client, messages, **kw) -> str:
    return client.chat.completions.create(model="tiny", messages=messages, **kw).choices[0].message.content


# ---- the translation alone ----


def test_items_become_the_chat_conversation_with_calls_and_their_outputs():
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 9,
    }
    a = ask(body, Store())
    calls = [
        {"id": c, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        for c, city in (("c1", "Paris"), ("c2", "Lyon"))
    ]
    assert a.chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls},  # one turn: its text and both calls
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    assert a.history == a.chat["messages"][1:]  # a follow-up continues without the instructions
    fn = {k: WEATHER[k] for k in ("name", "description", "parameters")}
    assert a.chat["tools"] == [{"type": "function", "function": fn}]
    assert a.chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert a.chat["max_tokens"] == 9


def test_a_namespace_offers_its_functions_under_flat_names_and_hosted_tools_are_listed_not_offered():
    body = {
        "input": [
            {"role": "user", "content": "Go"},
            {"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": "agents", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "namespace": "agents", "output": "done"},
        ],
        "tools": [WEATHER, {"type": "web_search", "external_web_access": False}, AGENTS],
        "tool_choice": {"type": "function", "name": "spawn", "namespace": "agents"},
    }
    a = ask(body, Store())
    assert [t["function"]["name"] for t in a.chat["tools"]] == ["get_weather", "agents__spawn"]
    assert a.chat["tools"][1] == SPAWN  # the namespace's description first
    assert a.chat["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__spawn"
    assert a.chat["tool_choice"] == {"type": "function", "function": {"name": "agents__spawn"}}
    assert a.tools.left == [{"type": "web_search"}, {"type": "custom", "namespace": "agents", "name": "note"}]
    reply = ResponsesReply("resp_x", "tiny", {}, a.tools)
    events = reply.add([ToolCall("c2", "agents__spawn", "{}"), ToolCall("c3", "get_weather", "{}")])
    reply.finish(Done("stop", {"prompt_tokens": 5, "generation_tokens": 9}))
    spawned, weather = reply.final["output"]
    assert (spawned["name"], spawned["namespace"]) == ("spawn", "agents") and "namespace" not in weather
    assert [e["name"] for e in events if e["type"] == "response.function_call_arguments.done"] == [
        "spawn",
        "get_weather",
    ]
    assert reply.final["mlx_spec"]["tools_not_offered"] == a.tools.left
    assert reply.turn()["tool_calls"][0]["function"]["name"] == "agents__spawn"  # a follow-up's history, as offered


def test_previous_response_id_continues_the_kept_conversation():
    store = Store(size=2)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    store.put(
        "resp_a", StoredResponse([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}], {})
    )
    a = ask(
        {
            "previous_response_id": "resp_a",
            "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        },
        store,
    )
    assert [m["role"] for m in a.chat["messages"]] == ["user", "assistant", "tool"]
    store.put("resp_b", StoredResponse([], {}))
    store.get("resp_a")  # used: resp_b is now the least recent
    store.put("resp_c", StoredResponse([], {}))
    assert store.get("resp_b") is None and store.get("resp_a") is not None


@pytest.mark.parametrize(
    "body, says",
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "call_id"),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "web_search_call"),
        ({"input": [{"role": "robot", "content": "x"}]}, "robot"),
        ({"input": []}, "input"),
        ({"input": "x", "tools": [{"type": "robot_arm"}]}, "robot_arm"),
        ({"input": "x", "tools": ["web_search", {"type": ["x"]}]}, "tools[0]"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": ["x"]}}, "tool_choice"),
        ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "web_search"),
        ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"}, "required"),
        ({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "mcp"}]}]}, "mcp"),
        ({"input": "x", "tools": [dict(AGENTS, name="a" * 60)]}, "1-64"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "other"),
        ({"input": "x", "previous_response_id": "resp_gone"}, "resp_gone"),
        ({"input": "x", "instructions": ["a list"]}, "instructions"),
    ],
)
def test_bad_input_is_one_400_that_names_it(body, says):
    with pytest.raises(ApiError) as e:
        ask(body, Store())
    assert e.value.status == 400 and says in e.value.message


def test_parallel_calls_are_items_of_their_own_and_whitespace_between_opens_no_message():
    calls = [ToolCall("c1", "get_weather", '{"city": "Paris"}'), ToolCall("c2", "get_time", "{}")]
    reply = ResponsesReply("resp_x", "tiny", {})
    events = reply.add(["Checking.", "\n", calls[0], "\n", calls[1], "\n"])
    events += reply.finish(Done("stop", {"prompt_tokens": 5, "generation_tokens": 9, "prompt_cached": 2}))
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "message"),
        (1, "function_call"),
        (2, "function_call"),
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    out = reply.final["output"]
    assert out[0]["content"][0]["text"] == "Checking.\n" and [o["call_id"] for o in out[1:]] == ["c1", "c2"]
    assert reply.final["status"] == "completed" and reply.final["usage"]["input_tokens_details"]["cached_tokens"] == 2
    assert reply.turn() == {"role": "assistant", "content": "Checking.", "tool_calls": [c.openai() for c in calls]}


# ---- over a socket ----


@pytest.fixture(scope="module")
def server(served_pair):
    with Running(build_app(served_pair, max_concurrency=2, max_tokens=24)) as srv:
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=60)


def test_a_plain_response_is_chat_completions_reply_with_usage_and_stats(client):
    r = client.responses.create(model="tiny", input=CODE, max_output_tokens=12)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    assert r.output_text == chat_text(client, [{"role": "user", "content": CODE}], max_tokens=12)
    assert r.usage.output_tokens == 12 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 12
    s = r.model_extra["mlx_spec"]
    assert len(s["draft_flags"]) == 12 and s["prompt_cached"] == r.usage.input_tokens_details.cached_tokens
    with_instructions = client.responses.create(model="tiny", instructions="You write Python.", input=CODE)
    system = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": CODE}]
    assert with_instructions.output_text == chat_text(client, system)
    assert with_instructions.status == ("incomplete" if with_instructions.usage.output_tokens == 24 else "completed")


def test_the_stream_sends_openais_events_in_order_and_adds_up_to_the_response(client):
    whole = client.responses.create(model="tiny", input=CODE, max_output_tokens=16)
    events = list(client.responses.create(model="tiny", input=CODE, max_output_tokens=16, stream=True))
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(d.delta for d in deltas) == whole.output_text == events[-1].response.output_text
    flags = [f for d in deltas for f in d.model_extra["mlx_spec"]["draft"]]
    assert flags == events[-1].response.model_extra["mlx_spec"]["draft_flags"]
    assert events[-1].response.usage.output_tokens == 16
    with client.responses.stream(model="tiny", input=CODE, max_output_tokens=16) as s:  # the client's own accumulator
        assert s.get_final_response().output_text == whole.output_text


def test_previous_response_id_continues_the_conversation_from_its_cache(client, server):
    first = client.responses.create(model="tiny", input="import numpy as np", max_output_tokens=10)
    second = client.responses.create(
        model="tiny", previous_response_id=first.id, input="for i in range(10):", max_output_tokens=8
    )
    convo = [
        {"role": "user", "content": "import numpy as np"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "for i in range(10):"},
    ]
    assert second.output_text == chat_text(client, convo, max_tokens=8)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    kept = httpx.get(server.url + f"v1/responses/{second.id}", timeout=30).json()
    assert kept["id"] == second.id and kept["output"][0]["content"][0]["text"] == second.output_text
    unstored = client.responses.create(model="tiny", input=CODE, max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", previous_response_id=unstored.id, input="x")
    assert httpx.get(server.url + f"v1/responses/{unstored.id}", timeout=30).status_code == 404


def test_greedy_output_equals_chat_completions_under_each_drafter(tiny_models):
    pair = Pair.load(str(tiny_models["qwen2"]), str(tiny_models["qwen2_draft"]), num_draft=3)
    pair.adaptive = False  # every round drafts
    with Running(build_app(pair, max_concurrency=1, max_tokens=20)) as srv:
        client = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)
        plain = chat_text(client, [{"role": "user", "content": "class Point:"}], extra_body={"draft": "none"})
        for spec in ("none", "suffix", str(tiny_models["qwen2_draft"])):
            r = client.responses.create(model="tiny", input="class Point:", extra_body={"draft": spec})
            assert r.output_text == plain, spec
            if spec in ("none", str(tiny_models["qwen2_draft"])):  # a suffix draft needs a repeat, and may find none
                assert (r.model_extra["mlx_spec"]["drafted"] > 0) == (spec != "none"), spec


BAD = [
    (b"{not json", "invalid_json"),
    ({"model": "tiny"}, "input"),
    (
        {"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0]",
    ),
    ({"model": "tiny", "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, "call_id"),
    (
        {"model": "tiny", "input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
        "tool_choice",
    ),
    ({"model": "tiny", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "tiny", "input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"model": "tiny", "input": "def add(a, b): " * 200}, "context_length_exceeded"),
]


def test_bad_input_gets_one_openai_error_while_a_response_streams(client, server):
    alone = client.responses.create(model="tiny", input=CODE, max_output_tokens=200).output_text
    during = {}

    def streamed():
        events = client.responses.create(model="tiny", input=CODE, max_output_tokens=200, stream=True)
        during["text"] = "".join(e.delta for e in events if e.type == "response.output_text.delta")

    t = threading.Thread(target=streamed)
    t.start()
    for body, what in BAD:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(server.url + "v1/responses", timeout=30, headers={"Content-Type": "application/json"}, **kw)
        assert r.status_code == 400, (what, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert what in (err["param"] or "") or what in (err["code"] or "") or what in err["message"], err
    assert httpx.get(server.url + "v1/responses/resp_nope", timeout=30).json()["error"]["code"] == "not_found"
    t.join(60)
    assert during["text"] == alone  # the response in flight never noticed


# ---- function calls, with a target that answers a text and then a call ----


@pytest.fixture(scope="module")
def tools_client(tiny_models):
    with Running(build_app(scripted_tool_pair(tiny_models), max_concurrency=2, max_tokens=200)) as srv:
        yield openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)


def shape(output) -> list[tuple]:
    """Output items without their ids: (type, text) or (type, name, arguments)."""
    return [
        (o.type, o.content[0].text) if o.type == "message" else (o.type, o.name, json.loads(o.arguments))
        for o in output
    ]


ASKED = [{"role": "user", "content": "Weather in Paris?"}]
CALLED = [("message", "Let me check."), ("function_call", "get_weather", {"city": "Paris"})]


def test_a_call_comes_out_as_a_function_call_item_and_its_output_goes_back_in(tools_client):
    client = tools_client
    r = client.responses.create(model="tiny", input=ASKED, tools=[WEATHER])
    assert shape(r.output) == CALLED and r.status == "completed"
    call = r.output[1]
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed"
    chat_tools = [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]
    c = client.chat.completions.create(model="tiny", messages=ASKED, tools=chat_tools).choices[0]
    assert c.message.content == "Let me check." and c.message.tool_calls[0].function.name == "get_weather"
    assert (
        r.usage.input_tokens
        == client.chat.completions.create(model="tiny", messages=ASKED, tools=chat_tools).usage.prompt_tokens
    )
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    follow = client.responses.create(model="tiny", previous_response_id=r.id, input=[output], tools=[WEATHER])
    stateless = client.responses.create(
        model="tiny", input=ASKED + [o.model_dump(exclude_none=True) for o in r.output] + [output], tools=[WEATHER]
    )
    assert shape(follow.output) == shape(stateless.output) == CALLED  # the script calls again
    assert follow.usage.input_tokens == stateless.usage.input_tokens > r.usage.input_tokens
    assert (
        follow.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens
    )  # the first turn was not prefilled again
    turn2 = ASKED + [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"},
    ]
    again = client.chat.completions.create(model="tiny", messages=turn2, tools=chat_tools)
    assert again.usage.prompt_tokens == follow.usage.input_tokens  # the same conversation, the same prompt


def test_a_streamed_call_sends_its_item_and_arguments_events(tools_client):
    events = list(tools_client.responses.create(model="tiny", input=ASKED, tools=[WEATHER], stream=True))
    types = [e.type for e in events]
    text_end = types.index("response.output_item.done")
    assert types[text_end + 1 :] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
    assert events[text_end + 1].item.arguments == "" and json.loads(events[text_end + 3].arguments) == {"city": "Paris"}
    assert shape(events[-1].response.output) == CALLED
    flags = [f for e in events[:-1] for f in (e.model_extra or {}).get("mlx_spec", {}).get("draft", [])]
    every = events[-1].response.model_extra["mlx_spec"]["draft_flags"]
    assert flags == every[:-1]  # each token's on the delta with its text or call, but the EOS's (it has no text)
    with tools_client.responses.stream(model="tiny", input=ASKED, tools=[WEATHER]) as s:
        assert shape(s.get_final_response().output) == CALLED


def test_drafts_through_the_call_text_leave_the_reply_as_plain_decoding_gives_it(tools_client):
    plain = tools_client.responses.create(model="tiny", input=ASKED, tools=[WEATHER], extra_body={"draft": "none"})
    for spec in ("suffix", "ngram"):
        r = tools_client.responses.create(model="tiny", input=ASKED, tools=[WEATHER], extra_body={"draft": spec})
        assert shape(r.output) == shape(plain.output) == CALLED, spec
    assert r.model_extra["mlx_spec"]["accepted"] > 0  # the n-gram drafter copied the call back from the prompt


def test_an_agents_sdk_tool_loop_over_responses_runs_to_its_final_answer(tools_client):
    agents = pytest.importorskip("agents")
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        seen.append(city)
        return TOOL_RESULT

    def agent():  # a client per event loop
        client = openai.AsyncOpenAI(base_url=str(tools_client.base_url), api_key="unused", max_retries=0, timeout=120)
        model = agents.OpenAIResponsesModel(model="m", openai_client=client)  # the SDK's default: the Responses API
        return agents.Agent(name="weather", instructions="Answer with the tools.", tools=[get_weather], model=model)

    run = agents.RunConfig(tracing_disabled=True)
    result = agents.Runner.run_sync(agent(), "What is the weather in Paris?", run_config=run)
    assert seen == ["Paris"] and result.final_output == TOOL_ANSWER

    async def streamed():  # another question: the scripted target reads its context from its last passes, which a
        # prefix cached from the first loop would skip
        r = agents.Runner.run_streamed(agent(), "And what is the weather in Paris now?", run_config=run)
        async for _ in r.stream_events():
            pass
        return r.final_output

    assert asyncio.run(streamed()) == TOOL_ANSWER and seen == ["Paris", "Paris"]


# ---- a namespaced function and a hosted tool, as Codex CLI sends them ----

SPAWNED = '<tool_call>\n{"name": "agents__spawn", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def agents_client(tiny_models):
    pair = scripted_tool_pair(tiny_models, reply="On it." + SPAWNED)
    with Running(build_app(pair, max_concurrency=1, max_tokens=200)) as srv:
        yield openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)


def test_a_namespaced_call_comes_back_under_its_namespace_and_its_output_goes_back_in(agents_client):
    client = agents_client
    r = client.responses.create(model="tiny", input=ASKED, tools=[AGENTS])
    call = r.output[1]
    assert (call.type, call.name, call.namespace, json.loads(call.arguments)) == (
        "function_call",
        "spawn",
        "agents",
        {"city": "Paris"},
    )
    chat = client.chat.completions.create(model="tiny", messages=ASKED, tools=[SPAWN])
    assert r.usage.input_tokens == chat.usage.prompt_tokens  # the prompt shows the function under its flat name
    streamed = list(client.responses.create(model="tiny", input=ASKED, tools=[AGENTS], stream=True))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert [e.name for e in done] == ["spawn"] and streamed[-1].response.output[1].namespace == "agents"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}
    history = ASKED + [o.model_dump(exclude_none=True) for o in r.output] + [output]
    follow = client.responses.create(model="tiny", input=history, tools=[AGENTS])
    assert follow.output_text == TOOL_ANSWER  # the call and its result were in the prompt
    again = client.responses.create(model="tiny", previous_response_id=r.id, input=[output], tools=[AGENTS])
    assert again.usage.input_tokens == follow.usage.input_tokens  # kept and sent back: the same conversation


def test_a_hosted_tool_is_accepted_left_out_of_the_prompt_and_reported(tools_client):
    plain = tools_client.responses.create(model="tiny", input=ASKED, tools=[WEATHER])
    hosted = [{"type": "web_search"}, {"type": "image_generation", "output_format": "png"}]
    r = tools_client.responses.create(model="tiny", input=ASKED, tools=[WEATHER, *hosted])
    assert shape(r.output) == CALLED and r.usage.input_tokens == plain.usage.input_tokens
    assert r.model_extra["mlx_spec"]["tools_not_offered"] == [{"type": "web_search"}, {"type": "image_generation"}]
    assert "tools_not_offered" not in plain.model_extra["mlx_spec"]
    with tools_client.responses.create(model="tiny", input=ASKED, tools=hosted, stream=True) as events:
        first = next(iter(events))
    assert first.type == "response.created"
    assert first.response.model_extra["mlx_spec"]["tools_not_offered"] == [
        {"type": "web_search"},
        {"type": "image_generation"},
    ]
    with pytest.raises(openai.BadRequestError, match="web_search_preview"):
        tools_client.responses.create(
            model="tiny", input=ASKED, tools=[WEATHER, *hosted], tool_choice={"type": "web_search_preview"}
        )
