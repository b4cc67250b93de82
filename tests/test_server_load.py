"""The scheduler under load over loopback: 8 concurrent clients get their lone outputs, a full queue gets 429s,
and a client that leaves mid-stream stops its generation within one round."""

import json
import threading
import time

import httpx
import openai
import pytest
from conftest import health, wait_for

from mlx_spec.gen.costs import Costs
from mlx_spec.gen.engine import Engine
from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running
from mlx_spec.server.pair import Pair
from mlx_spec.server.pool import IDLE_EXTRA

CLIENTS = 8
PROMPTS = [
    f"{head} #{i}"
    for i, head in enumerate(
        [
            "def add(a, b):",
            "for i in range(10):",
            "import numpy as np",
            "class Point:",
            "The quick brown fox",
            "def sub(a, b):",
            "x = np.zeros((3, 4))",
            "print(i)",
        ]
    )
]


class Slow:
    """The target with a pause before each forward pass, so a generation lasts long enough to watch, and a gate:
    while it is shut (`hold`) no pass runs, so the requests sent meanwhile wait in the queue and are all there when it
    opens (`release`): no test counts on the clock for requests to overlap."""

    def __init__(self, model, pause: float = 0.0):
        self._model, self._pause, self._open = model, pause, threading.Event()
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def __call__(self, *args, **kw):
        assert self._open.wait(120), "the gate was never opened"
        time.sleep(self._pause)
        return self._model(*args, **kw)

    def __getattr__(self, name):
        if name == "_model":  # a copy made without __init__
            raise AttributeError(name)
        return getattr(self._model, name)


def slow_pair(pair, draft, pause=0.02):
    """The same target, slowed, with a drafter that has no weights of its own to slow down."""
    return Pair(pair.model_spec, draft, Slow(pair.target, pause), pair.tokenizer)


def gated(pair):
    """The same pair (its drafter, its loaded draft model), its target behind a gate (`Slow`): (pair, gate)."""
    gate = Slow(pair.target)
    return Pair(pair.model_spec, pair.draft_spec, gate, pair.tokenizer, pair.loaded, pair.num_draft), gate


def together(srv, gate, threads, n=None):
    """Start `threads` (clients) behind the shut gate, open it once their `n` requests are all in, join them."""
    gate.hold()
    try:
        for t in threads:
            t.start()
        wait_for(srv, lambda h: h["active"] + h["queued"] == (n or len(threads)))  # one holds, the rest wait
    finally:
        gate.release()
    for t in threads:
        t.join(90)


def ask(url, prompt, stream, max_tokens=24, stats=False):
    """One client's request, greedy; its text (stats: with the reply's speculative statistics)."""
    client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": prompt}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=max_tokens, temperature=0, stream=stream)
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        extra = next((c.model_extra["mlx_spec"] for c in reversed(chunks) if "mlx_spec" in (c.model_extra or {})), None)
    else:
        text, extra = r.choices[0].message.content, r.model_extra["mlx_spec"]
    return (text, extra) if stats else text


@pytest.fixture
def always_batch(monkeypatch):
    """Requests join the batch whatever round costs this machine measures (the tests are about batched outputs)."""
    monkeypatch.setattr(Costs, "pays", lambda self, rows: True)


def test_eight_concurrent_clients_each_get_their_lone_output(served_pair, always_batch):
    pair, gate = gated(served_pair)
    with Running(build_app(pair, max_concurrency=4, max_tokens=24)) as srv:
        alone = [ask(srv.url, p, stream=False) for p in PROMPTS]
        results, errors = {}, []

        def client(i):
            try:
                results[i] = ask(srv.url, PROMPTS[i], stream=i % 2 == 0)
            except Exception as e:  # noqa: BLE001  (reported below, with the others)
                errors.append((i, repr(e)))

        together(srv, gate, [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)])
        assert not errors and sorted(results) == list(range(CLIENTS))
        assert [results[i] for i in range(CLIENTS)] == alone
        h = wait_for(srv, lambda h: h["active"] == 0)
        assert h["status"] == "ok" and h["queued"] == 0 and h["failed"] == 0 and h["rejected"] == 0
        assert h["completed"] == 2 * CLIENTS
        assert 1 < h["sessions"]["total"] <= 4 + IDLE_EXTRA  # they ran side by side, each with its own session
        assert any(r["batched"] for r in h["requests"]) and h["batched"] == 0  # some shared batched rounds
        assert ask(srv.url, PROMPTS[0], stream=True) == alone[0]  # still healthy afterwards


def test_concurrent_clients_share_rounds_where_the_measured_costs_say_batching_pays(served_pair, monkeypatch):
    """Whether requests batch is the planner's call from the costs it measures: where a pass costs the same at any
    width (patched in: what a GPU measures for a small model), two waves of concurrent requests share rounds, the
    first request into an empty batch opening it (the rule, not a fixture forcing the batch)."""
    monkeypatch.setattr(Costs, "cost", lambda self, places, size, optimistic=False: 0.01)
    pair, gate = gated(served_pair)
    with Running(build_app(pair, max_concurrency=4, max_tokens=24)) as srv:
        for wave in range(2):
            together(srv, gate, [threading.Thread(target=ask, args=(srv.url, PROMPTS[i], False)) for i in range(4)])
            h = wait_for(srv, lambda h: h["active"] == 0)
            assert h["completed"] == 4 * (wave + 1) and h["failed"] == 0
            assert sum(q["batched"] > 0 for q in h["requests"][-4:]) >= 2, wave  # they shared rounds


def test_a_seeded_request_gives_the_same_tokens_alone_and_beside_three_others(served_pair, always_batch):
    """Sampling with a seed: the reply is fixed by the seed, whatever runs beside it; without one, a fresh draw."""

    def seeded(url, i, seed):
        client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=24, temperature=1.0, seed=seed
        )
        return r.choices[0].message.content, r.model_extra["mlx_spec"]

    pair = slow_pair(served_pair, "suffix", pause=0.0)
    gate = pair.target
    with Running(build_app(pair, max_concurrency=4, max_tokens=24)) as srv:
        alone = seeded(srv.url, 0, 11)[0]
        results = {}
        seeds = [11, None, 5, None]
        threads = [
            threading.Thread(target=lambda i=i: results.update({i: seeded(srv.url, i, seeds[i])})) for i in range(4)
        ]
        together(srv, gate, threads)
        text, stats = results[0]
        assert text == alone and stats["widest"] > 1  # the same tokens, in rounds beside other rows
        assert seeded(srv.url, 0, 12)[0] != alone  # another seed, another reply


def test_a_full_queue_answers_429_and_the_running_requests_finish(served_pair):
    pair = slow_pair(served_pair, None, pause=0.0)
    gate = pair.target
    with Running(build_app(pair, max_concurrency=1, max_queue=1, max_tokens=40)) as srv:
        done = {}
        first = threading.Thread(target=lambda: done.update(a=ask(srv.url, PROMPTS[0], False, 40)))
        second = threading.Thread(target=lambda: done.update(b=ask(srv.url, PROMPTS[1], False, 5)))
        gate.hold()  # the first generates (held at its first pass) until the refusal is seen
        try:
            first.start()
            wait_for(srv, lambda h: h["active"] == 1)
            second.start()
            wait_for(srv, lambda h: h["queued"] == 1)
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(srv.url + "v1/chat/completions", json=body, timeout=30)
        finally:
            gate.release()
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert (
            err["code"] == "queue_full"
            and "busy" in err["message"]
            and set(err) == {"message", "type", "param", "code"}
        )
        first.join(60)
        second.join(60)
        assert set(done) == {"a", "b"}
        h = health(srv)
        assert (h["completed"], h["rejected"], h["active"], h["queued"]) == (2, 1, 0, 0)


def test_a_client_that_disconnects_stops_its_generation_within_one_round_and_frees_its_caches(served_pair):
    with Running(build_app(slow_pair(served_pair, "ngram"), max_concurrency=2, max_tokens=400)) as srv:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": PROMPTS[2]}],
            "stream": True,
            "max_tokens": 400,
        }
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", srv.url + "v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data:"))
                job_id = json.loads(first[5:])["id"]
                got = sum(1 for _, line in zip(range(6), (x for x in lines if x.startswith("data:"))))
                assert got == 6
        # The connection is closed now; the scheduler closes the job at its next turn.
        h = wait_for(srv, lambda h: any(q["id"] == job_id and q["state"] == "cancelled" for q in h["requests"]))
        job = next(q for q in h["requests"] if q["id"] == job_id)
        assert job["rounds_after_cancel"] <= 1
        assert job["tokens"] < 100  # of 400 asked for
        assert h["cancelled"] == 1 and h["active"] == 0
        time.sleep(0.3)
        later = health(srv)
        assert next(q for q in later["requests"] if q["id"] == job_id)["rounds"] == job["rounds"]
        assert later["rounds"] == h["rounds"]  # nothing runs any more
        assert later["sessions"] == {"total": 0, "idle": 0, "idle_bytes": 0}  # its session and caches were freed


@pytest.mark.slow  # a server of six clients and five drafters (the batch's own tests: test_batch.py)
def test_four_batched_requests_of_other_lengths_drafters_and_finishes_each_equal_their_solo_run(
    tiny_models, always_batch, monkeypatch
):
    target, draft = str(tiny_models["qwen2"]), str(tiny_models["qwen2_draft"])
    pair = Pair.load(target, draft, num_draft=3)
    pair = Pair(pair.model_spec, draft, Slow(pair.target, 0.01), pair.tokenizer, pair.loaded, num_draft=3)
    pair.adaptive = False  # the batch drafts every round what its rows offer, the draft model included
    asks = [  # (endpoint, body): chat and raw completions, five drafters, a stop string, sampling aside
        ("chat", dict(messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=40)),  # the draft model
        ("chat", dict(messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=12, draft="ngram")),
        ("text", dict(prompt="def add(a, b):\n    return a + b\ndef add(a, b):\n", max_tokens=30, draft="none")),
        ("text", dict(prompt=PROMPTS[3], max_tokens=25, draft="hybrid")),  # its stop string is set below
        ("chat", dict(messages=[{"role": "user", "content": PROMPTS[5]}], max_tokens=16, draft="suffix")),
        ("chat", dict(messages=[{"role": "user", "content": PROMPTS[4]}], max_tokens=20, temperature=0.8)),
    ]

    def post(url, kind, body):
        path = "v1/chat/completions" if kind == "chat" else "v1/completions"
        r = httpx.post(url + path, json=dict(body, model="tiny"), timeout=60).json()
        c = r["choices"][0]
        return (c["message"]["content"] if kind == "chat" else c["text"]), c["finish_reason"], r["mlx_spec"]

    with Running(build_app(pair, max_concurrency=8, max_tokens=40)) as srv:
        asks[3][1]["stop"] = [post(srv.url, *asks[3])[0][10:13]]  # a piece of its own reply: it ends there
        alone = [post(srv.url, k, b) for k, b in asks[:5]]  # one at a time: each alone in its rounds
        assert not any(q["batched"] for q in health(srv)["requests"])
        results, threads = {}, []
        for i, (kind, body) in enumerate(asks):
            ask_one = lambda i=i, k=kind, b=body: results.update({i: post(srv.url, k, b)})  # noqa: E731
            threads.append(threading.Thread(target=ask_one))
        all_in(srv, pair.target, threads)
        for t in threads:
            t.join(90)
        h = wait_for(srv, lambda h: h["active"] == 0)
        assert all(q["batched"] for q in h["requests"][-6:]) and h["failed"] == 0  # each shared rounds with others
        for i in range(5):
            assert results[i][:2] == alone[i][:2], i  # text and finish reason
        assert {r[1] for r in alone} == {"length", "stop"}
        assert results[5][2]["generation_tokens"] > 0  # a sampling row beside them
        assert results[0][2]["drafted_together"] >= 2  # the draft model drafted for several rows in one pass


@pytest.mark.slow  # a server of three clients (a lone client's disconnect: quick above)
def test_a_batched_client_that_disconnects_leaves_the_batch_and_the_others_finish_as_alone(served_pair, always_batch):
    with Running(build_app(slow_pair(served_pair, "suffix"), max_concurrency=4, max_tokens=60)) as srv:
        alone = {i: ask(srv.url, PROMPTS[i], stream=False, max_tokens=40) for i in (1, 2)}
        done = {}
        threads = [
            threading.Thread(target=lambda i=i: done.update({i: ask(srv.url, PROMPTS[i], True, 40)})) for i in (1, 2)
        ]
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": PROMPTS[0]}],
            "stream": True,
            "max_tokens": 400,
        }
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", srv.url + "v1/chat/completions", json=body) as r:
                lines = (x for x in r.iter_lines() if x.startswith("data:"))
                job_id = json.loads(next(lines)[5:])["id"]
                for t in threads:
                    t.start()
                wait_for(srv, lambda h: h["batched"] == 3)  # the others joined the streaming one's rounds
                assert sum(1 for _, _ in zip(range(4), lines)) == 4
        h = wait_for(srv, lambda h: any(q["id"] == job_id and q["state"] == "cancelled" for q in h["requests"]))
        assert next(q for q in h["requests"] if q["id"] == job_id)["rounds_after_cancel"] <= 1
        for t in threads:
            t.join(60)
        assert done == alone  # the rows beside it never noticed
        h = wait_for(srv, lambda h: h["active"] == 0)
        assert h["batched"] == 0 and h["failed"] == 0 and h["sessions"]["total"] == 2  # its session was freed


def all_in(srv, gate: Slow, threads) -> None:
    """Start the threads' requests behind the shut gate and open it once the server holds every one of them (active
    or queued): they overlap whatever the machine's speed."""
    gate.hold()
    for t in threads:
        t.start()
    wait_for(srv, lambda h: h["active"] + h["queued"] == len(threads))
    gate.release()


def alone_then_together(srv, n, gate: Slow | None = None, stats=False):
    """The first n prompts one at a time, then all at once (gate: let in together through it; the second streamed),
    30 tokens each: (their replies alone, together, the health once idle); stats: each reply with its statistics."""
    alone = [ask(srv.url, p, stream=False, max_tokens=30, stats=stats) for p in PROMPTS[:n]]
    results = {}
    threads = [
        threading.Thread(target=lambda i=i: results.update({i: ask(srv.url, PROMPTS[i], i == 1, 30, stats)}))
        for i in range(n)
    ]
    if gate is not None:
        all_in(srv, gate, threads)
    for t in threads:
        if gate is None:
            t.start()
    for t in threads:
        t.join(60)
    return alone, [results.get(i) for i in range(n)], wait_for(srv, lambda h: h["active"] == 0)


def test_requests_on_a_hybrid_recurrent_model_batch_and_each_equal_their_solo_run(tmp_path, always_batch):
    from conftest import make_model

    folder = str(make_model(tmp_path / "qwen3_next", "qwen3_next", seed=5, scale=4.0))
    pair, gate = gated(Pair.load(folder, "suffix", num_draft=3))
    with Running(build_app(pair, max_concurrency=4, max_tokens=30)) as srv:
        alone, together, h = alone_then_together(srv, 3, gate)
        assert sum(q["batched"] for q in h["requests"][-3:]) >= 2 and h["failed"] == 0
        assert together == alone


@pytest.mark.parametrize("draft", ["self:0-1", pytest.param("quant-self:int4", marks=pytest.mark.slow)])
def test_requests_drafting_with_a_view_of_the_target_draft_together_and_each_equal_their_solo_run(
    tiny_models, always_batch, monkeypatch, draft
):
    pair, gate = Pair.load(str(tiny_models["qwen2"]), draft, num_draft=3), Slow(lambda: None)
    real_round = Engine.round  # the gate before each round: a view drafts from the target itself, never a wrapper
    monkeypatch.setattr(Engine, "round", lambda self: gate() or real_round(self))
    pair.adaptive = False  # every round drafts what its rows offer
    with Running(build_app(pair, max_concurrency=4, max_tokens=30)) as srv:
        alone, together, h = alone_then_together(srv, 4, gate, stats=True)
        assert [t[0] for t in together] == [a[0] for a in alone] and h["failed"] == 0
        assert sum(q["batched"] for q in h["requests"][-4:]) >= 2
        assert max(t[1]["drafted_together"] for t in together) >= 2  # the view drafted for rows together
