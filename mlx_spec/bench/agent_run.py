"""`mlx-spec bench run agent`: multi-turn agent sessions replayed against mlx-spec's server and mlx-lm's, in one run.

Every configuration gets its own server, so none reads another's prefix cache: one mlx-spec server per drafter and
one for the target alone (the same loaded weights, in this process; every request names its drafter in `draft`),
and `python -m mlx_lm.server` on the same model folder in a child process with the BLAS this process loaded. The run
is interleaved turn by turn: every configuration answers turn t of a session before any answers turn t + 1, in an
order that rotates by one each turn, so load drifts hit all alike. The client (httpx, streamed) times each request:
TTFT from sending it to the first streamed text, wall time to the stream's end.
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from mlx_spec import blas
from mlx_spec.errors import MlxSpecError
from mlx_spec.gen import registry
from mlx_spec.make.resolve import resolve
from mlx_spec.named import Log

from . import agent, agent_sessions
from .common import folder_sha256, machine_info
from .host import Host, L
from .results import ResultFile

WARMUP = [{"role": "user", "content": "Say hello."}]  # untimed, per configuration: MLX builds its kernels
WARMUP_TOKENS = 4
START_S = 600.0  # mlx_lm.server loads the model before it listens


def order(configs: list[str], turn: int) -> list[str]:
    """The configurations' order at the run's `turn`-th request round: rotated by one each round."""
    r = turn % len(configs)
    return configs[r:] + configs[:r]


@dataclasses.dataclass
class StreamedReply:
    """One streamed reply as the client saw it."""

    text: str = ""
    calls: list[dict] = dataclasses.field(default_factory=list)
    ttft: float = 0.0
    total: float = 0.0
    last: float = 0.0  # request sent to the last streamed text
    usage: dict = dataclasses.field(default_factory=dict)
    stats: dict = dataclasses.field(default_factory=dict)
    finish: str | None = None

    @property
    def decode_tps(self) -> float | None:
        n = self.usage.get("completion_tokens", 0) - 1
        return n / (self.last - self.ttft) if n > 0 and self.last > self.ttft else None


def stream(client, url: str, body: dict) -> StreamedReply:
    """POST a streamed chat completion and time it: the first and last chunk carrying text or a call."""
    r = StreamedReply()
    t0 = time.perf_counter()
    with client.stream("POST", url + "v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise MlxSpecError(f"{url}: HTTP {resp.status_code}: {resp.read().decode()[:300]}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            r.usage = chunk.get("usage") or r.usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                calls = delta.get("tool_calls") or []
                if delta.get("content") or calls:
                    now = time.perf_counter() - t0
                    r.ttft = r.ttft or now
                    r.last = now
                r.text += delta.get("content") or ""
                r.calls += [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
                if choice.get("finish_reason"):
                    r.finish = choice["finish_reason"]
                    r.stats = chunk.get("mlx_spec") or r.stats  # mlx-spec's whole statistics ride on this chunk
    r.total = time.perf_counter() - t0
    if not r.ttft:  # a reply with no text: the client learns it at the end
        r.ttft = r.last = r.total
    return r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preloaded_blas(pid: int) -> str | None:
    """The OpenBLAS a process has mapped (Linux), else None."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    return next((line.split()[-1] for line in maps.splitlines() if "libopenblas" in line), None)


@contextmanager
def mlx_lm_server(folder: Path, cache_bytes: int, log: Log) -> Iterator[tuple[str, str | None]]:
    """`python -m mlx_lm.server` on `folder`, with this process's BLAS preloaded: (its URL, the BLAS it mapped)."""
    import httpx

    port = _free_port()
    env = dict(os.environ)
    if blas.path:  # mlx-spec opens OpenBLAS before MLX loads; LD_PRELOAD does the same for a process we do not own
        env["LD_PRELOAD"] = ":".join(x for x in (blas.path, env.get("LD_PRELOAD")) if x)
    cmd = [sys.executable, "-m", "mlx_lm.server", "--model", str(folder), "--port", str(port)]
    cmd += ["--log-level", "WARNING", "--prompt-cache-bytes", str(cache_bytes)]
    log(f"starting {' '.join(cmd[1:])}")
    err = tempfile.TemporaryFile("w+")  # not a pipe: a long run's warnings would fill it and stall the child
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                err.seek(0)
                raise MlxSpecError(f"mlx_lm.server exited: {err.read()[-500:]}")
            try:
                if httpx.get(url + "v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise MlxSpecError(f"mlx_lm.server did not answer within {START_S:.0f} s")
            time.sleep(0.5)
        yield url, _preloaded_blas(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()


def draft_models(suite: agent.AgentSuite) -> list[str]:
    """The draft models the suite's drafters name, each once."""
    return list(dict.fromkeys(m for d in suite.drafts if (m := registry.parse(d).model)))


def load_pair(host: Host[L], suite: agent.AgentSuite, folder: Path, log: Log) -> L:
    """The target and every draft model the drafters name, loaded once for all the servers."""
    models = draft_models(suite)
    return host.load(str(folder), models[0] if models else "none", num_draft=None, more=models[1:], log=log)


def body(turn: agent_sessions.Turn, config: str, max_tokens: int) -> dict:
    b: dict = {"model": "default_model", "messages": turn.messages, "max_tokens": max_tokens, "temperature": 0.0}
    b.update(stream=True, stream_options={"include_usage": True})
    if turn.tools:
        b["tools"] = turn.tools
    if config != agent.MLX_LM_SERVER:
        b["draft"] = config  # the drafter of this reply (mlx-spec's extension field)
    return b


def record(
    turn: agent_sessions.Turn, config: str, target: str, seq: int, r: StreamedReply, plain: StreamedReply | None
) -> dict:
    same = None if plain is None else (r.text, r.calls) == (plain.text, plain.calls)
    return {
        "key": f"{target}|{config}|{turn.id}",
        "row": f"{target}|{config}",
        "config": config,
        "prompt": turn.id,
        "session": turn.session,
        "turn": turn.index,
        "set": turn.kind,
        "repeat": 0,
        "seq": seq,
        "prompt_tokens": r.usage.get("prompt_tokens"),
        "cached_tokens": (r.usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "n_tokens": r.usage.get("completion_tokens", 0),
        "ttft": r.ttft,
        "total": r.total,
        "decode_tps": r.decode_tps,
        "text": r.text,
        "calls": r.calls,
        "identical": same,
        "finish": r.finish,
        "stats": {k: r.stats[k] for k in ("proposed", "accepted", "rounds", "prompt_cached") if k in r.stats},
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": os.getloadavg()[0],
    }


def run_agent(
    name_or_path: str,
    out: str,
    resume: str | None = None,
    log: Log = lambda _m: None,
    model: str | None = None,
    *,
    host: Host[Any],
) -> ResultFile:
    """Run an agent suite against `host`'s servers into a result file (rewritten after every request) and its
    page."""
    import httpx

    if resume:
        raise MlxSpecError("an agent run cannot resume: its servers' caches would differ; start it again")
    suite = agent.load(name_or_path, model)
    sessions = agent_sessions.build(suite.sessions)  # a missing module fails before anything loads
    folder = resolve(suite.model, log)
    pair = load_pair(host, suite, folder, log)
    for d in suite.drafts:
        pair.check_draft(d)  # a drafter the server cannot take fails before anything runs
    result = ResultFile.create(out, suite.as_dict(), machine_info())
    for name in [suite.model, *draft_models(suite)]:  # which weights were measured
        f = resolve(name, log)
        result.data["models"][name] = {"folder": str(f), "sha256": folder_sha256(f)}
    log(f"writing {result.path}")
    cache = int(suite.prefix_cache_gb * 1e9)
    configs = suite.configs
    with ExitStack() as stack:
        urls = {
            c: stack.enter_context(host.start(pair, max_concurrency=1, prefix_cache_bytes=cache))
            for c in configs
            if c != agent.MLX_LM_SERVER
        }
        if suite.mlx_lm_server:
            urls[agent.MLX_LM_SERVER], result.data["mlx_lm_blas"] = stack.enter_context(
                mlx_lm_server(folder, cache, log)
            )
        client = stack.enter_context(httpx.Client(timeout=None))
        warm = agent_sessions.Turn("warm-up", 0, "warm-up", WARMUP)
        for c in configs:
            stream(client, urls[c], body(warm, c, WARMUP_TOKENS))
        turns = [t for session in sessions for t in session]
        for i, turn in enumerate(turns):  # every configuration answers a turn before any answers the next
            replies: dict[str, StreamedReply] = {}
            sent: dict[str, int] = {}
            for c in order(configs, i):
                sent[c] = len(configs) * i + len(sent)
                replies[c] = stream(client, urls[c], body(turn, c, suite.max_tokens))
                log(
                    f"{turn.id} {c}: {replies[c].usage.get('completion_tokens', 0)} tokens in "
                    f"{replies[c].total:.2f} s (first after {replies[c].ttft:.2f} s)"
                )
            for c in configs:  # recorded in configuration order, each knowing plain's reply
                plain = None if c == agent.PLAIN else replies[agent.PLAIN]
                r = record(turn, c, str(folder), sent[c], replies[c], plain)
                result.data["records"].append(r)
                result.done.add(r["key"])
            result.publish(agent.render)
    result.data["complete"] = True
    result.publish(agent.render)
    return result
