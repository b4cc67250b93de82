"""`mlx-spec serve` over a real socket: the official openai client (streamed and not), raw HTTP for bad input, keys."""

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from conftest import one_line_error, run_cli, wait_for

from mlx_spec.device import describe
from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running
from mlx_spec.server.pair import Pair

MAX_TOKENS = 24
HI = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def server(served_pair):
    with Running(build_app(served_pair, max_concurrency=2, max_tokens=MAX_TOKENS)) as srv:
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=60)


def stream_chat(client, **kw):
    chunks = list(client.chat.completions.create(model="tiny", stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_models_lists_the_pair(client, tiny_models):
    models = client.models.list().data
    assert [m.id for m in models] == ["qwen2"]
    assert models[0].model_extra["mlx_spec"]["draft"] == str(tiny_models["qwen2_draft"])


def test_chat_non_streamed_fills_usage_and_the_stats(client):
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    s = r.model_extra["mlx_spec"]
    for key in ("drafted", "accepted", "acceptance_by_position", "tokens_per_second", "draft_flags", "rounds"):
        assert key in s
    assert len(s["draft_flags"]) == 12 and sum(s["draft_flags"]) == s["accepted"]
    assert s["rounds"] == 12 - s["accepted"]  # every round yields its accepted drafts plus one target token


def test_chat_streamed_equals_non_streamed_and_ends_with_stats_usage_and_done(client, server):
    whole = client.chat.completions.create(model="tiny", messages=HI, max_completion_tokens=16)
    chunks, text = stream_chat(client, messages=HI, max_completion_tokens=16, stream_options={"include_usage": True})
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    last, usage = chunks[-2], chunks[-1]
    assert last.choices[0].finish_reason == "length" and usage.choices == [] and usage.usage.completion_tokens == 16
    assert last.model_extra["mlx_spec"]["draft_flags"] == whole.model_extra["mlx_spec"]["draft_flags"]
    flags = [f for c in chunks[1:-2] for f in c.model_extra["mlx_spec"]["draft"]]
    assert flags == last.model_extra["mlx_spec"]["draft_flags"]
    body = {"model": "tiny", "messages": HI, "max_tokens": 4, "stream": True}
    raw = httpx.post(server.url + "v1/chat/completions", json=body, timeout=60).text
    data = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
    assert data[-1] == "[DONE]" and all(json.loads(d)["object"] == "chat.completion.chunk" for d in data[:-1])


def test_completions_raw_prompt_streamed_and_not(client):
    r = client.completions.create(model="tiny", prompt="def add(a, b):\n", max_tokens=10)
    assert r.object == "text_completion" and r.usage.completion_tokens == 10
    assert "mlx_spec" in r.model_extra
    chunks = list(client.completions.create(model="tiny", prompt="def add(a, b):\n", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length" and "draft_flags" in chunks[-1].model_extra["mlx_spec"]


def test_stop_strings_cut_the_reply_where_they_start(client):
    full = client.completions.create(model="tiny", prompt="class Point:", max_tokens=20).choices[0].text
    stop = full[6:9]
    expect = full[: full.index(stop)]
    for stream in (False, True):
        r = client.completions.create(model="tiny", prompt="class Point:", max_tokens=20, stop=[stop], stream=stream)
        chunks = list(r) if stream else [r]
        assert "".join(c.choices[0].text for c in chunks) == expect
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats_whatever_runs_beside_it(served_pair):
    # Plain decoding draws once per token; with a drafter the draws follow the (timed, adaptive) draft
    # lengths, so a seed repeats only as far as they do, as OpenAI's own seed is best effort.
    plain = Pair(served_pair.model_spec, None, served_pair.target, served_pair.tokenizer)
    with Running(build_app(plain, max_concurrency=2, max_tokens=12)) as srv:
        client = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="tiny", messages=HI, temperature=1.0, top_p=0.9)
        alone = client.chat.completions.create(seed=7, **kw).choices[0].message.content
        for _ in range(5):  # an unseeded neighbour draws from the same generator, turn by turn; one that samples EOS
            other = threading.Thread(  # at once is gone before it is seen running: then another
                target=lambda: stream_chat(client, messages=HI, temperature=1.0, max_tokens=300)
            )
            other.start()
            if wait_for(srv, lambda h, other=other: h["active"] == 1 or not other.is_alive())["active"] == 1:
                break
            other.join(60)
        beside = client.chat.completions.create(seed=7, **kw).choices[0].message.content
        other.join(60)
        assert beside == alone
        assert client.chat.completions.create(seed=8, **kw).choices[0].message.content != alone


def test_a_continuing_conversation_reuses_its_cached_prefix(client):
    turn1 = [{"role": "user", "content": "import numpy as np"}]
    r1 = client.chat.completions.create(model="tiny", messages=turn1, max_tokens=MAX_TOKENS)
    turn2 = turn1 + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "for i in range(10):"},
    ]
    r2 = client.chat.completions.create(model="tiny", messages=turn2, max_tokens=8)
    cached = r2.model_extra["mlx_spec"]["prompt_cached"]
    assert cached == r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens - 1  # at least turn 1's prompt was not prefilled again


BAD = [
    (b"{not json", "invalid_json"),
    (b'["a list"]', "invalid_json"),
    ({"model": "tiny"}, "messages"),
    ({"model": "tiny", "messages": []}, "messages"),
    ({"model": "tiny", "messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"model": "tiny", "messages": HI, "max_tokens": -5}, "max_tokens"),
    ({"model": "tiny", "messages": HI, "temperature": 9}, "temperature"),
    ({"model": "tiny", "messages": HI, "top_p": -0.5}, "top_p"),
    ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "tiny", "messages": HI, "draft": "no-such-model"}, "draft"),
    ({"model": "tiny", "messages": HI, "draft": 3}, "draft"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b): " * 200}]}, "context"),
]


def test_bad_input_gets_400s_with_openai_error_bodies_while_a_generation_runs(client, server):
    url = server.url + "v1/chat/completions"
    alone = client.chat.completions.create(model="tiny", messages=HI, max_tokens=200).choices[0].message.content
    during = {}
    t = threading.Thread(target=lambda: during.update(text=stream_chat(client, messages=HI, max_tokens=200)[1]))
    t.start()
    for body, what in BAD:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(url, timeout=30, headers={"Content-Type": "application/json"}, **kw)
        assert r.status_code == 400, (what, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert what in (err["param"] or "") or what in (err["code"] or "") or what in err["message"], err
    long = httpx.post(url, json=BAD[-1][0], timeout=30).json()["error"]
    assert long["code"] == "context_length_exceeded" and "context is 512 tokens" in long["message"]
    ok = httpx.post(
        url,
        json={
            "model": "tiny",
            "messages": HI,
            "max_tokens": 3,
            "logit_bias": {},
            "user": "u",
            "frequency_penalty": 0.5,
            "some_future_field": [1],
        },
        timeout=30,
    )
    assert ok.status_code == 200  # unknown fields are ignored
    t.join(60)
    assert during["text"] == alone  # the generation in flight never noticed
    assert httpx.get(server.url + "health").json()["failed"] == 0


def chunked(body: bytes, size: int = 64 * 1024):
    """The body as a generator, so httpx sends it chunked (no Content-Length)."""
    for i in range(0, len(body), size):
        yield body[i : i + size]


def test_a_body_past_what_the_context_can_hold_gets_a_413_at_once_and_the_server_carries_on(server, monkeypatch):
    from mlx_spec.server import params

    parse, parsed = params.parse_json, []
    monkeypatch.setattr(params, "parse_json", lambda raw: parsed.append(len(raw)) or parse(raw))
    url = server.url + "v1/chat/completions"
    huge = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b): " * 1_400_000}]})
    for content in (huge.encode(), chunked(huge.encode())):  # 21 MB, declared and chunked
        r = httpx.post(url, content=content, headers={"Content-Type": "application/json"}, timeout=120)
        assert not parsed, "the body was read whole (then parsed and tokenized) before the refusal"
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert err["code"] == "request_too_large" and "context is 512 tokens" in err["message"]
    within = {"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b): " * 6000}]}  # 90 kB
    r = httpx.post(url, json=within, timeout=30)  # read and tokenized, then refused by its token count
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    ok = json.dumps({"model": "tiny", "messages": HI, "max_tokens": 3}).encode()
    for content in (ok, chunked(ok, 7)):
        r = httpx.post(url, content=content, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert httpx.get(server.url + "health").json()["status"] == "ok"


def test_api_key_guards_v1_but_not_the_page_while_a_generation_runs(served_pair):
    with Running(build_app(served_pair, api_key="sekret", max_concurrency=1, max_tokens=4)) as srv:
        good = openai.OpenAI(base_url=srv.url + "v1", api_key="sekret", max_retries=0)
        alone = good.chat.completions.create(model="tiny", messages=HI, max_tokens=200).choices[0].message.content
        during = {}
        t = threading.Thread(target=lambda: during.update(text=stream_chat(good, messages=HI, max_tokens=200)[1]))
        t.start()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            for method, path in (("GET", "v1/models"), ("POST", "v1/chat/completions"), ("POST", "v1/completions")):
                r = httpx.request(method, srv.url + path, headers=headers, json={"messages": HI}, timeout=30)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        t.join(60)
        assert during["text"] == alone  # the refused requests never disturbed the one in flight
        assert good.chat.completions.create(model="tiny", messages=HI).usage.completion_tokens == 4
        assert httpx.get(srv.url).status_code == 200 and httpx.get(srv.url + "health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "v1", api_key="nope", max_retries=0).models.list()


def test_a_request_switches_the_drafter_for_its_reply_and_the_output_stays_the_targets(tiny_models):
    target, draft = str(tiny_models["qwen2"]), str(tiny_models["qwen2_draft"])
    pair = Pair.load(target, draft, num_draft=3)
    pair.adaptive = False  # every round drafts, so which drafter ran shows in the counts
    with Running(build_app(pair, max_concurrency=1, max_tokens=16)) as srv:
        client = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)
        info = client.models.list().data[0].model_extra["mlx_spec"]
        specs = {d["spec"]: d for d in info["drafters"]}
        assert info["switchable"] and info["drafters"][0]["spec"] == draft
        assert {"none", "ngram", "suffix", "hybrid:" + draft} <= set(specs) and specs[draft]["k"] == 3
        own = client.chat.completions.create(model="tiny", messages=HI)
        assert own.model_extra["mlx_spec"]["drafted"] > 0
        for spec in ("none", "ngram", "suffix"):
            r = client.chat.completions.create(model="tiny", messages=HI, extra_body={"draft": spec})
            assert r.choices[0].message.content == own.choices[0].message.content, spec
            if spec == "none":
                assert r.model_extra["mlx_spec"]["drafted"] == 0
        again = client.chat.completions.create(model="tiny", messages=HI)  # no "draft": the server's own again
        assert again.model_extra["mlx_spec"]["drafted"] == own.model_extra["mlx_spec"]["drafted"]
        assert again.choices[0].message.content == own.choices[0].message.content


def test_the_page_and_its_files_are_served(server):
    page = httpx.get(server.url)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    names = [
        "app.js",
        "render.js",
        "style.css",
        "vendor/marked.umd.js",
        "vendor/purify.min.js",
        "vendor/highlight.min.js",
        "vendor/hljs-github.min.css",
        "vendor/hljs-github-dark.min.css",
    ]
    for name in names:
        assert f"/static/{name}" in page.text and httpx.get(server.url + "static/" + name).status_code == 200
    for name in ("LICENSE.marked", "LICENSE.dompurify", "LICENSE.highlightjs"):
        assert httpx.get(server.url + "static/vendor/" + name).status_code == 200


@pytest.mark.slow
def test_mlx_spec_serve_prints_its_url_once_it_listens_and_stops_on_ctrl_c(tiny_models):
    """The real command: its URL on stdout once the socket accepts connections; Ctrl-C (SIGINT) ends it cleanly."""
    cmd = [
        sys.executable,
        "-m",
        "mlx_spec.cli",
        "serve",
        "--model",
        str(tiny_models["qwen2"]),
        "--draft",
        "ngram",
        "--port",
        "0",
        "--max-tokens",
        "3",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/")
        health = httpx.get(url + "health", timeout=10).json()
        assert health["status"] == "ok" and health["device"] == describe()  # e.g. "cpu (AMD EPYC, OpenBLAS)"
        client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
        assert client.chat.completions.create(model="tiny", messages=HI).usage.completion_tokens == 3
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert code in (0, 130, -signal.SIGINT), err
    assert "Traceback" not in err and f"on {describe()}: open {url}" in err


@pytest.mark.slow  # starts the CLI
@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--port", "70000", "--port must be 0..65535"),
        ("--max-concurrency", "0", "--max-concurrency must be at least 1"),
        ("--max-tokens", "0", "--max-tokens must be at least 1"),
    ],
)
def test_mlx_spec_serve_refuses_bad_options_in_one_line(tiny_models, option, value, message):
    r = run_cli("serve", "--model", str(tiny_models["qwen2"]), "--draft", "none", option, value, timeout=60)
    assert one_line_error(r) == f"error: {message}, got {value}"


@pytest.mark.slow  # starts the CLI
@pytest.mark.parametrize("where", ["env", "file"])
def test_mlx_spec_serve_takes_its_key_from_the_environment_or_a_file_and_no_adaptive_to_its_pair(
    tiny_models, tmp_path, where
):
    """The key stays off the command line, where `ps` would show it; `--no-adaptive`, as `generate` and `chat` take
    it, reaches the served pair (its planner drafts every offer), which `/v1/models` reports."""
    cmd = [sys.executable, "-m", "mlx_spec.cli", "serve", "--model", str(tiny_models["qwen2"]), "--draft", "none"]
    cmd += ["--port", "0", "--max-tokens", "2"] + (["--no-adaptive"] if where == "file" else [])
    env = dict(os.environ, MLX_SPEC_API_KEY="sekret") if where == "env" else None
    if where == "file":
        (tmp_path / "key").write_text("sekret\n")
        cmd += ["--api-key-file", str(tmp_path / "key")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().strip()
        assert "sekret" not in " ".join(cmd)
        assert httpx.get(url + "v1/models", timeout=10).status_code == 401
        ok = httpx.get(url + "v1/models", headers={"Authorization": "Bearer sekret"}, timeout=10)
        assert ok.status_code == 200
        assert ok.json()["data"][0]["mlx_spec"]["adaptive"] is (where == "env")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
