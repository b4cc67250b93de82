"""A server no web page can drive: JSON-only API bodies, the Host check, CORS only where asked, drafters only as
loaded or allowed, and the API key kept off the command line."""

import json

import pytest
from starlette.testclient import TestClient

from mlx_spec.errors import MlxSpecError
from mlx_spec.server.app import build_app
from mlx_spec.server.guard import host_name
from mlx_spec.server.main import api_key_from
from mlx_spec.server.pair import Pair

HI = [{"role": "user", "content": "def add(a, b):"}]
BODIES = {  # every route that takes a body, with one it would run
    "/v1/chat/completions": {"messages": HI, "max_tokens": 2},
    "/v1/completions": {"prompt": "def add(a, b):", "max_tokens": 2},
    "/v1/responses": {"input": "def add(a, b):", "max_output_tokens": 2},
    "/v1/messages": {"messages": HI, "max_tokens": 2},
    "/v1/messages/count_tokens": {"messages": HI},
}
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def client(served_pair):
    with TestClient(build_app(served_pair, max_concurrency=1, max_tokens=4), base_url="http://localhost:8080") as c:
        yield c


def runs(client) -> int:
    """The requests the server has taken (waiting, generating or finished)."""
    h = client.get("/health").json()
    return h["active"] + h["queued"] + len(h["requests"])


def error_message(r) -> str:
    """The message of an OpenAI- or Anthropic-shaped error."""
    return r.json()["error"]["message"]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]
)
def test_a_body_a_page_could_send_without_asking_is_refused_with_a_415_and_runs_nothing(client, path, content_type):
    before = runs(client)
    headers = {"Origin": EVIL} | ({"Content-Type": content_type} if content_type else {})
    r = client.post(path, content=json.dumps(BODIES[path]), headers=headers)
    assert r.status_code == 415 and "application/json" in error_message(r)
    assert "access-control-allow-origin" not in r.headers
    assert runs(client) == before  # nothing was queued or ran


def test_json_with_a_charset_is_json(client):
    r = client.post("/v1/messages/count_tokens", json=BODIES["/v1/messages/count_tokens"])
    assert r.status_code == 200
    r = client.post(
        "/v1/chat/completions",
        content=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}',
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("path", ["/", "/health", "/v1/models", "/static/app.js", *BODIES])
def test_a_host_the_server_does_not_answer_to_gets_a_403_and_runs_nothing(client, path):
    before = runs(client)
    for host in ("evil.example", "evil.example:8080"):
        if path in BODIES:
            r = client.post(path, json=BODIES[path], headers={"Host": host})
        else:
            r = client.get(path, headers={"Host": host})
        assert r.status_code == 403 and "evil.example" in error_message(r)
    assert runs(client) == before  # nothing was queued or ran


def test_loopback_names_pass_with_or_without_a_port_and_others_only_when_allowed(served_pair):
    assert host_name("[::1]:8080") == "::1" and host_name("LocalHost") == "localhost" and host_name("a.b:1") == "a.b"
    app = build_app(served_pair, max_concurrency=1, allowed_hosts=["mac.local"], host="10.0.0.5")
    with TestClient(app) as c:
        for host in ("localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "[::1]", "mac.local:8080", "10.0.0.5"):
            assert c.get("/v1/models", headers={"Host": host}).status_code == 200, host
        for host in ("testserver", "evil.example", "localhost.evil.example", "127.0.0.1.evil.example", ""):
            assert c.get("/v1/models", headers={"Host": host}).status_code == 403, host
    with TestClient(build_app(served_pair, max_concurrency=1, allowed_hosts=["*"])) as c:
        assert c.get("/v1/models", headers={"Host": "anything.example"}).status_code == 200


def test_no_cors_headers_unless_an_origin_is_given_and_then_only_for_it(client, served_pair):
    r = client.get("/v1/models", headers={"Origin": EVIL})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    preflight = {
        "Origin": EVIL,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    r = client.options("/v1/chat/completions", headers=preflight)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    ours = "http://localhost:3000"
    with TestClient(build_app(served_pair, max_concurrency=1, cors_origin=ours), base_url="http://localhost") as c:
        r = c.options("/v1/chat/completions", headers=preflight | {"Origin": ours})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ours
        assert "POST" in r.headers["access-control-allow-methods"]
        r = c.get("/v1/models", headers={"Origin": ours})
        assert r.headers["access-control-allow-origin"] == ours
        r = c.get("/v1/models", headers={"Origin": EVIL})
        assert "access-control-allow-origin" not in r.headers


def test_a_request_cannot_pick_a_drafter_that_would_build_a_model(client):
    before = runs(client)
    for path, body in (
        ("/v1/chat/completions", BODIES["/v1/chat/completions"]),
        ("/v1/messages", BODIES["/v1/messages"]),
    ):
        for spec in ("quant-self", "quant-self:int4", "hybrid:quant-self", "some/other-model"):
            r = client.post(path, json=body | {"draft": spec})
            assert r.status_code == 400 and "--allow-draft" in error_message(r), (path, spec)
    r = client.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"] | {"draft": "quant-self"})
    assert r.json()["error"]["param"] == "draft"
    drafters = {d["spec"] for d in client.get("/v1/models").json()["data"][0]["mlx_spec"]["drafters"]}
    assert not any("quant-self" in d for d in drafters)
    assert runs(client) == before  # nothing was queued or ran


def test_a_drafter_the_server_allows_is_built_at_start_and_requests_may_pick_it(tiny_models):
    pair = Pair.load(str(tiny_models["qwen2"]), "suffix", allow=["quant-self:int4"])
    with TestClient(build_app(pair, max_concurrency=1, max_tokens=3), base_url="http://localhost") as c:
        r = c.post("/v1/chat/completions", json={"messages": HI, "draft": "quant-self:int4"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        r = c.post("/v1/chat/completions", json={"messages": HI, "draft": "quant-self"})  # another format: not allowed
        assert r.status_code == 400
    with pytest.raises(MlxSpecError, match="--fixed-draft"):
        Pair.load(str(tiny_models["qwen2"]), "suffix", fixed=True, allow=["quant-self"])


def test_the_api_key_comes_from_a_file_stripped_or_as_given(tmp_path):
    f = tmp_path / "key"
    f.write_text("  sekret\n")
    assert api_key_from(None, f) == "sekret" and api_key_from("given", None) == "given"
    assert api_key_from(None, None) is None
    with pytest.raises(MlxSpecError, match="once"):
        api_key_from("given", f)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(MlxSpecError, match="empty"):
        api_key_from(None, tmp_path / "empty")
    with pytest.raises(MlxSpecError, match="cannot read"):
        api_key_from(None, tmp_path / "missing")
