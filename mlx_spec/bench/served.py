"""Served throughput: 1, 2, 4... concurrent clients against `mlx-spec serve` in four modes, in one process.

Three servers share the loaded weights and listen on loopback: `off`, no drafter (plain decoding, batched: requests
that start while others generate share each forward pass); `turns`, the pair's drafter with each request taking its
own turns (`serve --no-batch`); `on`, the drafter with batched speculation (the default). The fourth mode, `mlx-lm`,
is mlx-lm's own `batch_generate` (its `BatchGenerator`, no draft) on the same prompts, called directly (no HTTP: the
comparison flatters it by the server's overhead). The clients are the official `openai` client on threads, as a
user's programs would be. Each cell (a client count, a repeat) sends the same fresh prompts to every mode, the order
turning from repeat to repeat, so the ratios compare like with like and share the machine's noise. Throughput is the
completion tokens of the cell over its wall time, first request sent to last reply.

With one request per client (`requests=1`) a cell is a wave: every client sends at once and the cell ends with the
slowest reply. With more, each client sends its next request as soon as its reply ends (as vLLM's serving benchmark
does with a concurrency limit), so the server stays under load of that many clients; mlx-lm's `batch_generate` then
gets every prompt with `completion_batch_size` set to the client count, which keeps as many generating.
"""

import dataclasses
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_spec.errors import MlxSpecError
from mlx_spec.named import DEFAULT_DRAFT, DEFAULT_MODEL, Log

from . import prompts as bench_prompts
from .common import RunFile, machine_info, machine_line, md_table
from .host import Host, L, Loaded
from .prompts import Prompt

DEFAULT_CLIENTS = (1, 2, 4)  # concurrent clients per cell
SERVE_MAX_TOKENS = 64  # per request: long enough for speculation to settle, short enough for 4 clients on a CPU
SERVE_REPEATS = 3  # a multiple of 3: every client count gets as many HumanEval, edit and prose prompts
WARMUP_TOKENS = 4
MODES = ("off", "turns", "on", "mlx-lm")  # off (plain decoding) first: it is the baseline of the ratios


@dataclass
class ThroughputSettings:
    model: str = DEFAULT_MODEL
    draft: str = DEFAULT_DRAFT
    clients: Sequence[int] = DEFAULT_CLIENTS
    max_tokens: int = SERVE_MAX_TOKENS
    repeats: int = SERVE_REPEATS
    num_draft: int | None = None
    requests: int = 1  # per client and cell: each sends its next one when its reply ends

    def check(self) -> None:
        if not self.clients or min(self.clients) < 1:
            raise MlxSpecError(f"--clients must be positive counts, got {list(self.clients)}")
        if self.max_tokens < 1 or self.repeats < 1 or self.requests < 1:
            raise MlxSpecError("--max-tokens, --repeats and --requests must be at least 1")
        if self.draft in (None, "", "none"):
            raise MlxSpecError("--draft must name a drafter: the run compares it against none")


@dataclass
class Cell:
    """One client count, one repeat, one mode: what the clients got and how long it took."""

    clients: int
    repeat: int
    mode: str
    prompts: list[str]  # client i sends prompts i, i + clients, i + 2 * clients, ... one after the other
    kinds: list[str] = field(default_factory=list)  # each prompt's set: humaneval, edit or prose
    wall_s: float = 0.0
    tokens: int = 0
    texts: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def _ask(client, text: str, max_tokens: int):
    return client.chat.completions.create(
        model="served", messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0.0
    )


def run_mlx_lm(pair: Loaded, cell: Cell, max_tokens: int) -> Cell:
    """The cell's prompts through mlx-lm's `batch_generate` (greedy), timed the same way."""
    from mlx_lm.generate import batch_generate

    prompts = [pair.chat_ids([{"role": "user", "content": text}]) for text in cell.prompts]
    t0 = time.perf_counter()
    r = batch_generate(
        pair.target,
        pair.tokenizer,
        prompts,
        max_tokens=max_tokens,
        return_token_ids=True,
        completion_batch_size=cell.clients,
    )
    cell.wall_s = time.perf_counter() - t0
    cell.texts = list(r.texts)
    assert r.token_ids is not None  # asked for with return_token_ids
    cell.tokens = sum(len(t) for t in r.token_ids)
    cell.latencies_s = [cell.wall_s] * len(prompts)  # one call: every reply arrives at its end
    return cell


def run_cell(url: str, cell: Cell, max_tokens: int) -> Cell:
    """All of the cell's clients at once, each on its own thread and connection, sending its prompts one after the
    other; the wall time covers them all."""
    import openai

    n = len(cell.prompts)
    replies: list[Any] = [None] * n  # each client's ChatCompletion, or the exception it raised
    latencies = [0.0] * n
    start = threading.Barrier(cell.clients + 1)

    def client_thread(c: int) -> None:
        client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=3600)
        start.wait()
        for i in range(c, n, cell.clients):
            t0 = time.perf_counter()
            try:
                replies[i] = _ask(client, cell.prompts[i], max_tokens)
            except Exception as e:  # recorded, then raised on the main thread: a lost request fails the run
                replies[i] = e
            latencies[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(cell.clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    cell.wall_s = time.perf_counter() - t0
    failed = [r for r in replies if isinstance(r, Exception)]
    if failed:
        raise MlxSpecError(f"a request failed ({cell.mode}, {cell.clients} clients): {failed[0]}")
    cell.latencies_s = latencies
    cell.texts = [r.choices[0].message.content for r in replies]
    cell.tokens = sum(r.usage.completion_tokens for r in replies)
    stats = [r.model_extra.get("mlx_spec", {}) for r in replies]
    cell.drafted = sum(s.get("drafted", 0) for s in stats)
    cell.accepted = sum(s.get("accepted", 0) for s in stats)
    return cell


KINDS = ("humaneval", "edit", "prose")


def plan_prompts(
    tokenizer, clients: Sequence[int], repeats: int, requests: int = 1
) -> dict[tuple[int, int], list[Prompt]]:
    """Fresh prompts for every (client count, repeat) cell, the kinds in turn within each client count.

    Prompt i of repeat r with n = clients x requests prompts gets kind (r * n + i) mod 3, so over 3 repeats (or any
    multiple) every client count sends the same number of HumanEval, edit and prose prompts, and its throughput can
    be set against the others' without a different prompt mix deciding the comparison.
    """
    kinds = {
        (c, r): [KINDS[(r * c * requests + i) % len(KINDS)] for i in range(c * requests)]
        for c in clients
        for r in range(repeats)
    }
    need = {k: sum(ks.count(k) for ks in kinds.values()) for k in KINDS}
    if need["prose"] > len(bench_prompts.PROSE_QUESTIONS):
        raise MlxSpecError(
            f"this run needs {need['prose']} prose prompts and there are "
            f"{len(bench_prompts.PROSE_QUESTIONS)}: use fewer --repeats or --clients"
        )
    found = bench_prompts.build(tokenizer, need["humaneval"], need["edit"], n_prose=need["prose"])
    pool = {k: [p for p in found if p.set == k] for k in KINDS}
    return {cell: [pool[k].pop(0) for k in ks] for cell, ks in kinds.items()}


def _ratios(mine: list[Cell], base: list[Cell]) -> list[float] | None:
    """Cell-by-cell throughput ratios against the same cells of another mode (same prompts, same repeat)."""
    by = {x.repeat: x for x in base}
    out = [
        x.tokens_per_second / by[x.repeat].tokens_per_second
        for x in mine
        if x.repeat in by and by[x.repeat].tokens_per_second
    ]
    return out or None


def summarize(cells: list[Cell], clients: Sequence[int]) -> list[dict]:
    """Per client count and mode: median throughput over repeats (with the spread) and the ratios."""
    rows = []
    for c in clients:
        by_mode = {m: [x for x in cells if x.clients == c and x.mode == m] for m in MODES}
        for m in MODES:
            mine = by_mode[m]
            if not mine:
                continue
            tps = [x.tokens_per_second for x in mine]
            one = [x.tokens_per_second for x in cells if x.clients == clients[0] and x.mode == m]
            vs = {b: _ratios(mine, by_mode[b]) if b != m else None for b in ("off", "turns", "mlx-lm")}
            vs_off = vs["off"] or [1.0]
            rows.append(
                {
                    "clients": c,
                    "mode": m,
                    "cells": len(mine),
                    "tokens": sum(x.tokens for x in mine),
                    "tokens_per_second": statistics.median(tps),
                    "min": min(tps),
                    "max": max(tps),
                    "vs_off": statistics.median(vs_off),
                    "vs_off_range": [min(vs_off), max(vs_off)],
                    "vs_turns": statistics.median(vs["turns"]) if vs["turns"] else None,
                    "vs_turns_range": [min(vs["turns"]), max(vs["turns"])] if vs["turns"] else None,
                    "vs_mlx_lm": statistics.median(vs["mlx-lm"]) if vs["mlx-lm"] else None,
                    "vs_mlx_lm_range": [min(vs["mlx-lm"]), max(vs["mlx-lm"])] if vs["mlx-lm"] else None,
                    "vs_first_clients": statistics.median(tps) / statistics.median(one) if one else None,
                    "acceptance": (
                        sum(x.accepted for x in mine) / sum(x.drafted for x in mine)
                        if sum(x.drafted for x in mine)
                        else None
                    ),
                    "latency_s": statistics.median(lat for x in mine for lat in x.latencies_s),
                    "kinds": {k: sum(x.kinds.count(k) for x in mine) for k in KINDS},
                }
            )
    return rows


def _ratio(r: dict, key: str) -> str:
    if r.get(key) is None:
        return ""
    lo, hi = r[key + "_range"]
    return f"{r[key]:.2f}× ({lo:.2f}–{hi:.2f})"


MODE_NAMES = {
    "off": "plain, batched",
    "turns": "drafter, turn-taking",
    "on": "drafter, batched",
    "mlx-lm": "mlx-lm BatchGenerator",
}


def markdown(data: dict) -> str:
    s = data["settings"]
    head = (
        f"# Served throughput: {s['model']} with drafter `{s['draft']}`\n\n"
        f"{machine_line(data['machine'])}\n\n"
        f"`{' '.join(data['command'])}`\n\n"
        f"{s['repeats']} repeat(s) per client count, {s.get('requests', 1)} request(s) per client and cell (each "
        f"sent when the client's previous reply ended), {s['max_tokens']} max tokens per request, greedy; "
        f"each cell sends the same fresh prompts to every mode; ratios are cell by cell (median, min–max); "
        f"mlx-lm's `batch_generate` runs in-process without HTTP. Prompts H/E/P counts the HumanEval, "
        f"code-edit and prose prompts of a row (with a multiple of 3 repeats every client count gets the same "
        f"mix).\n\n"
    )
    rows = [
        [
            r["clients"],
            MODE_NAMES.get(r["mode"], r["mode"]),
            r["cells"],
            r["tokens"],
            r["tokens_per_second"],
            f"{r['min']:.2f}–{r['max']:.2f}",
            _ratio(r, "vs_off") if r["mode"] != "off" else "1.00×",
            _ratio(r, "vs_turns") if r["mode"] != "turns" else "1.00×",
            _ratio(r, "vs_mlx_lm") if r["mode"] != "mlx-lm" else "1.00×",
            f"{r['vs_first_clients']:.2f}×" if r["vs_first_clients"] else "",
            f"{100 * r['acceptance']:.1f}%" if r["acceptance"] is not None else "",
            f"{r['latency_s']:.1f}",
            "/".join(str(r["kinds"][k]) for k in KINDS),
        ]
        for r in data["summary"]
    ]
    table = md_table(
        [
            "Clients",
            "Mode",
            "Cells",
            "Tokens",
            "Tokens/s (median)",
            "Spread",
            "vs plain",
            "vs turn-taking",
            "vs mlx-lm",
            f"vs {s['clients'][0]} client(s)",
            "Acceptance",
            "Latency s (median)",
            "Prompts H/E/P",
        ],
        rows,
    )
    same = data["identical"]
    return (
        head + table + f"\n\nReplies identical to plain decoding (greedy), drafter turn-taking and batched: "
        f"{same[0]}/{same[1]}.\n"
    )


def run_throughput(host: Host[L], s: ThroughputSettings, out: str, log: Log = lambda _m: None) -> RunFile:
    """Measure every cell on `host`'s servers, rewriting the run file after each, and return it (JSON and markdown
    written)."""
    s.check()
    on = host.load(s.model, s.draft, num_draft=s.num_draft, more=(), log=log)
    off = host.plain(on)
    plan = plan_prompts(on.tokenizer, s.clients, s.repeats, s.requests)
    run = RunFile("serve", Path(out), {"machine": machine_info(), "settings": dataclasses.asdict(s), "cells": []})
    concurrency = max(s.clients)
    cells: list[Cell] = []
    with (
        host.start(on, max_concurrency=concurrency, max_tokens=s.max_tokens) as url_on,
        host.start(on, max_concurrency=concurrency, max_tokens=s.max_tokens, batch=False) as url_turns,
        host.start(off, max_concurrency=concurrency, max_tokens=s.max_tokens) as url_off,
    ):
        urls = {"on": url_on, "turns": url_turns, "off": url_off}

        def measure(mode: str, cell: Cell, max_tokens: int) -> Cell:
            return run_mlx_lm(off, cell, max_tokens) if mode == "mlx-lm" else run_cell(urls[mode], cell, max_tokens)

        for mode in MODES:  # untimed: the first forward passes of each mode build MLX's kernels
            measure(mode, Cell(2, -1, mode, [bench_prompts.WARMUP_PROMPT] * 2), WARMUP_TOKENS)
        for r in range(s.repeats):
            for c in s.clients:
                chosen = plan[(c, r)]
                order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
                for mode in order:
                    cell = measure(
                        mode, Cell(c, r, mode, [p.text for p in chosen], [p.set for p in chosen]), s.max_tokens
                    )
                    cells.append(cell)
                    log(
                        f"repeat {r + 1}/{s.repeats}, {c} client(s), drafter {mode}: {cell.tokens} tokens in "
                        f"{cell.wall_s:.1f} s = {cell.tokens_per_second:.2f} tokens/s"
                    )
                    run.data["cells"] = [dataclasses.asdict(x) for x in cells]
                    run.flush()
    pairs = [
        (a, b)
        for a in cells
        for b in cells
        if a.mode == "off" and b.mode in ("turns", "on") and (a.clients, a.repeat) == (b.clients, b.repeat)
    ]
    run.data["identical"] = [sum(a.texts == b.texts for a, b in pairs), len(pairs)]
    run.data["summary"] = summarize(cells, list(s.clients))
    run.data["complete"] = True
    run.flush()
    run.write_markdown(markdown(run.data))
    return run
