"""Statistics that cannot be impossible: a rate from a time near zero, a draft share above 100 %, a refused request
logged without its reason, a reply nobody received counted as completed."""

import json
import logging
import socket

import pytest
from conftest import REPLY, Scripted, scripted_pair, spec, wait_for
from starlette.testclient import TestClient
from test_server_load import gated

from mlx_spec.gen.drafters.self_draft import SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.load import vocab_width
from mlx_spec.server import app as server_app
from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running

CODE = "def add(a, b):\n    return a + b\n"


def self_drafter(model) -> SelfDrafter:
    """The target drafting with all its layers: every draft is accepted."""
    return SelfDrafter(model, range(len(model.model.layers)), vocab_width(model))


def test_a_reply_of_one_round_reports_no_rate_rather_than_one_from_a_time_near_zero(tiny_target):
    model, _ = tiny_target
    toks, stats = spec(model, [1, 2, 3], self_drafter(model), max_tokens=3, num_draft=2, adaptive=False)
    assert len(toks) == 3 and stats.rounds == 1 and stats.first_tokens == 3  # the whole reply came with the prompt
    assert stats.generation_tps == 0.0


def test_the_rate_counts_the_tokens_of_the_rounds_it_times(tiny_target, pass_clock):
    model, _ = tiny_target
    toks, stats = spec(model, [1, 2, 3], self_drafter(model), max_tokens=9, num_draft=2, adaptive=False)
    assert len(toks) == 9 and stats.rounds == 3 and stats.first_tokens == 3
    # the time runs from the first round's tokens to the last round's: the rate is of the 6 tokens made in it
    assert stats.generation_time > 0 and stats.generation_tps * stats.generation_time == pytest.approx(6)


def test_drafts_accepted_past_the_end_of_the_reply_count_in_no_share(tiny_target):
    """A suffix draft that repeats an earlier reply runs on past its EOS, and the target accepts that too: the share of
    the reply's tokens from drafts stays what its tokens' flags say."""
    model, tok = tiny_target
    script, eos = tok.encode(CODE), tok.eos_token_id
    target = Scripted(model, script, eos)
    prompt = (script + [eos]) * 3 + script[:1]
    toks, stats = spec(
        target, prompt, SuffixDrafter(), max_tokens=64, num_draft=32, adaptive=False, eos_token_ids=[eos]
    )
    assert toks == script[1:] + [eos] and stats.rounds == 1  # all drafted, the EOS too
    assert stats.accepted > stats.generation_tokens  # the verifier accepted drafts past the EOS
    assert stats.from_draft == len(toks) and stats.draft_share == 1.0


# ---- the server ----


def test_a_reply_cut_by_a_stop_string_counts_the_tokens_it_sent(tiny_models):
    """The suffix drafter's rounds run past the stop string: the usage and the share count the tokens sent."""
    with TestClient(build_app(scripted_pair(tiny_models), max_concurrency=1), base_url="http://localhost") as c:
        body = {"messages": [{"role": "user", "content": REPLY}], "max_tokens": 60}  # the reply to draft from
        whole = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        stop = "function"  # met in the middle of a drafted run: its round accepted three drafts beyond it
        r = c.post("/v1/chat/completions", json=body | {"stop": [stop]}).json()
        s = r["mlx_spec"]
        assert r["choices"][0]["message"]["content"] == whole[: whole.index(stop)]
        assert s["generation_tokens"] == r["usage"]["completion_tokens"] == len(s["draft_flags"])
        assert s["accepted"] > sum(s["draft_flags"]) and s["draft_share"] == sum(s["draft_flags"]) / len(
            s["draft_flags"]
        )


def test_every_route_logs_why_it_refused_a_request(served_pair, caplog):
    caplog.set_level(logging.INFO, logger="mlx_spec.server.requests")
    with TestClient(build_app(served_pair, max_concurrency=1), base_url="http://localhost") as c:
        paths = ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens")
        for path in paths:
            caplog.clear()
            assert c.post(path, json={"max_tokens": 3}).status_code == 400
            assert caplog.messages[-1].startswith(f"POST {path} 400 error="), caplog.messages
        for path in paths:
            caplog.clear()
            assert c.post(path, content=b"{}", headers={"Content-Type": "text/plain"}).status_code == 415
            assert f"POST {path} 415 error=the request body must be JSON" in caplog.messages[-1]
        caplog.clear()
        assert c.get("/v1/models", headers={"Host": "evil.example"}).status_code == 403
        assert "403 error=the Host header 'evil.example'" in caplog.messages[-1]


def test_a_reply_that_completes_after_its_client_left_counts_as_cancelled(served_pair, monkeypatch):
    """A non-streamed request whose client is gone before the reply is ready: the reply reaches nobody."""
    monkeypatch.setattr(server_app, "DISCONNECT_POLL", 600.0)  # the route would not notice on its own in time
    pair, gate = gated(served_pair)
    with Running(build_app(pair, max_concurrency=1, max_tokens=4)) as srv:
        gate.hold()
        try:
            port = int(srv.url.rsplit(":", 1)[1].strip("/"))
            body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                head = (
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                sock.sendall(head.encode() + body)
                wait_for(srv, lambda h: h["active"] == 1)
            wait_for(srv, lambda h: not srv._server.server_state.connections)  # the server saw the client go
        finally:
            gate.release()
        h = wait_for(srv, lambda h: h["active"] == 0 and h["requests"] and h["requests"][-1]["state"] != "active")
        assert (h["completed"], h["cancelled"]) == (0, 1) and h["requests"][-1]["state"] == "cancelled"
