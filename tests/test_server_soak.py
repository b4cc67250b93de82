"""A soak over loopback: chat, Responses and Messages requests, streamed and not, seeded, from clients that sometimes
leave mid-reply, against a server with a short queue and a small prefix cache. Nothing is lost, every reply equals
its solo run, the bounds hold, MLX's memory comes back to what the kept caches account for, and no request's objects
outlive it."""

import asyncio
import gc
import json
import random
import threading

import httpx
import pytest
from conftest import health, wait_for
from mlx.utils import tree_flatten

from mlx_spec.gen.rows import Row
from mlx_spec.gen.session import Session
from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running
from mlx_spec.server.pair import Pair
from mlx_spec.server.scheduler import Job

pytestmark = pytest.mark.slow  # a few hundred requests

CLIENTS = 4
REQUESTS = 12  # per client
MAX_CONCURRENCY, MAX_QUEUE = 2, 1  # 4 clients over 2 slots and 1 place in the queue: some get a 429
PREFIX_BYTES = 256 * 1024  # small, so conversations' prefixes go in and out
MAX_TOKENS = 12
SYSTEM = "You write Python. " * 8  # a prefix every conversation shares: the prefix cache keeps it
ASKS = ["def add(a, b):", "class Point:", "import os", "x = [1, 2,", "for i in range(3):", "print('hi')"]
ROUTES = ("chat", "responses", "messages")


def request(route: str, i: int, stream: bool) -> tuple[str, dict]:
    """The path and body of ask i on `route`, sampled with seed i."""
    common = {"temperature": 0.8, "seed": i, "stream": stream}
    if route == "chat":
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASKS[i]}]
        return "v1/chat/completions", {"messages": msgs, "max_tokens": MAX_TOKENS, **common}
    if route == "responses":
        body = {"instructions": SYSTEM, "input": ASKS[i], "max_output_tokens": MAX_TOKENS, "store": False}
        return "v1/responses", body | common
    msgs = [{"role": "user", "content": ASKS[i]}]
    return "v1/messages", {"system": SYSTEM, "messages": msgs, "max_tokens": MAX_TOKENS, **common}


def whole_text(route: str, body: dict) -> str:
    if route == "chat":
        return body["choices"][0]["message"]["content"]
    if route == "responses":
        return "".join(p["text"] for item in body["output"] if item["type"] == "message" for p in item["content"])
    return "".join(b["text"] for b in body["content"] if b["type"] == "text")


def delta_text(route: str, event: dict) -> str:
    if route == "chat":
        return "".join(c["delta"].get("content") or "" for c in event.get("choices", []))
    if route == "responses":
        return event.get("delta", "") if event.get("type") == "response.output_text.delta" else ""
    return event["delta"].get("text", "") if event.get("type") == "content_block_delta" else ""


def ask(http: httpx.Client, url: str, route: str, i: int, stream: bool, leave_after: int | None = None):
    """One request: its text, or None where the client left after `leave_after` events, or "429"."""
    path, body = request(route, i, stream)
    if not stream:
        r = http.post(url + path, json=body)
        if r.status_code == 429:
            assert r.headers.get("retry-after"), r.headers
            return "429"
        assert r.status_code == 200, r.text
        return whole_text(route, r.json())
    with http.stream("POST", url + path, json=body) as r:
        if r.status_code == 429:
            assert r.headers.get("retry-after"), r.headers
            return "429"
        assert r.status_code == 200, r.read()
        text, events = "", 0
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            events += 1
            if leave_after is not None and events >= leave_after:
                return None  # closing the stream closes the connection mid-reply
            text += delta_text(route, json.loads(line[5:]))
        return text


def live(*classes: type) -> dict[type, list]:
    """The objects of each class alive in this process (the server runs in it), after a collection."""
    gc.collect()
    found: dict[type, list] = {c: [] for c in classes}
    for o in gc.get_objects():
        for c in classes:
            if c in type(o).__mro__:  # not isinstance: it asks some objects their __class__, and they warn
                found[c].append(o)
    return found


def unaccounted(h: dict, weights: int) -> int:
    """MLX's active bytes beyond the weights and the caches the server says it keeps (idle sessions, prefixes)."""
    return h["memory"]["active_bytes"] - weights - h["sessions"]["idle_bytes"] - h["prefix_cache"]["bytes"]


def kv_bytes_per_token(folder, itemsize: int) -> int:
    """A token's keys and values over every layer, from the model's config."""
    c = json.loads((folder / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * itemsize


def test_a_soak_of_mixed_requests_and_leaving_clients_loses_nothing_and_gives_memory_back(tiny_models):
    pair = Pair.load(str(tiny_models["qwen2"]), "suffix", num_draft=3)
    app = build_app(pair, max_concurrency=MAX_CONCURRENCY, max_queue=MAX_QUEUE, prefix_cache_bytes=PREFIX_BYTES)
    params = [v for _, v in tree_flatten(pair.target.parameters())]
    weights = sum(v.nbytes for v in params)
    with Running(app) as srv, httpx.Client(timeout=120) as http:
        queues = len(live(asyncio.Queue)[asyncio.Queue])  # the server's own, before any request
        solo = {(route, i): ask(http, srv.url, route, i, False) for route in ROUTES for i in range(len(ASKS))}
        for (route, i), text in solo.items():  # and again, streamed: the same text
            assert ask(http, srv.url, route, i, True) == text, (route, i)
        start = wait_for(srv, lambda h: h["active"] == h["queued"] == 0)
        tasks = len(live(asyncio.Task)[asyncio.Task])

        answered, left, refused, samples, errors = [0], [0], [0], [], []
        lock, stop = threading.Lock(), threading.Event()

        def client(seed: int) -> None:
            rng = random.Random(seed)
            with httpx.Client(timeout=120) as mine:
                for _ in range(REQUESTS):
                    route, i, stream = rng.choice(ROUTES), rng.randrange(len(ASKS)), rng.random() < 0.5
                    leave = rng.randint(1, 4) if stream and rng.random() < 0.3 else None
                    try:
                        got = ask(mine, srv.url, route, i, stream, leave)
                    except Exception as e:  # noqa: BLE001 - reported below, with the request
                        with lock:
                            errors.append(f"{route} {i} {stream}: {type(e).__name__}: {e}")
                        continue
                    with lock:
                        if got == "429":
                            refused[0] += 1
                        elif got is None:
                            left[0] += 1
                        else:
                            answered[0] += 1
                            if got != solo[(route, i)]:
                                errors.append(f"{route} {i} stream={stream}: {got!r} != solo {solo[(route, i)]!r}")

        def watch() -> None:  # the bounds, sampled while the soak runs
            while not stop.is_set():
                samples.append(health(srv))

        watcher = threading.Thread(target=watch)
        clients = [threading.Thread(target=client, args=(seed,)) for seed in range(CLIENTS)]
        watcher.start()
        for t in clients:
            t.start()
        for t in clients:
            t.join(600)
        stop.set()
        watcher.join(60)
        assert not errors, errors[:5]
        assert answered[0] + left[0] + refused[0] == CLIENTS * REQUESTS and answered[0] > 0

        end = wait_for(srv, lambda h: h["active"] == h["queued"] == 0)
        done = (end["completed"], end["cancelled"], end["failed"], end["rejected"])
        base = 2 * len(solo)  # the solo runs, streamed and not
        assert end["failed"] == 0 and end["rejected"] == refused[0], done
        assert end["completed"] + end["cancelled"] == base + answered[0] + left[0], done  # none lost
        assert end["completed"] >= base + answered[0], done  # every reply received was counted completed
        taken = max(s["active"] + s["queued"] for s in samples)  # a slot the thread has yet to fill takes one more
        assert taken <= MAX_CONCURRENCY + MAX_QUEUE, taken
        assert end["prefix_cache"]["max_bytes"] == PREFIX_BYTES
        kept = max(s["prefix_cache"]["bytes"] for s in samples + [end])
        assert kept <= PREFIX_BYTES, kept
        assert end["sessions"]["total"] <= MAX_CONCURRENCY + 2  # the pool's bound (IDLE_EXTRA)
        # MLX's memory: what the kept caches do not account for grows by less than one request's keys and values
        # (a request's state kept past its end, for each of its requests, would be dozens of them)
        longest = max(r["prompt_tokens"] for r in end["requests"]) + MAX_TOKENS
        one = longest * kv_bytes_per_token(tiny_models["qwen2"], params[0].dtype.size)
        grown = unaccounted(end, weights) - unaccounted(start, weights)
        assert grown < one, (grown, one, start, end)
        assert end["memory"]["active_bytes"] <= 1.1 * start["memory"]["active_bytes"], (start["memory"], end["memory"])

        # Python's: no row is left, no session beyond the pool's, no job but those /health lists (its recent ones), no
        # stream queue but theirs and the server's own, no task beyond those before the soak
        found = live(Row, Session, Job, asyncio.Queue, asyncio.Task)
        assert not found[Row], len(found[Row])
        assert len(found[Session]) == end["sessions"]["total"], (len(found[Session]), end["sessions"])
        listed = {r["id"] for r in end["requests"]}
        unlisted = [j for j in found[Job] if j.id not in listed]  # a few still being let go when /health answered
        assert len(unlisted) <= MAX_CONCURRENCY, (len(found[Job]), len(listed))
        assert len(found[asyncio.Queue]) <= queues + len(found[Job]), (len(found[asyncio.Queue]), queues)
        assert len(found[asyncio.Task]) <= tasks, (len(found[asyncio.Task]), tasks)
