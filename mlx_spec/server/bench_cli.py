"""The served benches' hold on the server: `Server` gives `mlx_spec.bench`'s served benches this server (the bench
sits below the apps), and `register` adds `mlx-spec bench serve` and the `agent` suite kind to the bench."""

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from mlx_spec import blas
from mlx_spec.bench.common import DEFAULT_OUT
from mlx_spec.bench.served import DEFAULT_CLIENTS, SERVE_MAX_TOKENS, SERVE_REPEATS
from mlx_spec.errors import MlxSpecError
from mlx_spec.named import (
    DEFAULT_DRAFT,
    DEFAULT_MODEL,
    DRAFT_HELP,
    MODEL_HELP,
    NUM_DRAFT_HELP,
    Log,
    load_model,
)

if TYPE_CHECKING:
    from .pair import Pair


class Server:
    """`mlx_spec.bench.host.Host` for this server: pairs loaded once, servers on loopback threads."""

    def load(self, model: str, draft: str, *, num_draft: int | None, more: Sequence[str], log: Log) -> "Pair":
        from .pair import Pair

        pair = Pair.load(model, draft, num_draft=num_draft, log=log)
        for m in more:
            pair.loaded[m] = load_model(m, log)[:2]
        return pair

    def plain(self, loaded: "Pair") -> "Pair":
        return dataclasses.replace(loaded, draft_spec=None, loaded={})

    @contextmanager
    def start(self, loaded: "Pair", **options: Any) -> Iterator[str]:
        from .app import build_app
        from .main import Running

        with Running(build_app(loaded, **options)) as running:
            yield running.url


def _log(msg: str) -> None:
    typer.echo(f"[bench] {msg}", err=True)


def serve(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    draft: str = typer.Option(DEFAULT_DRAFT, help=DRAFT_HELP + " (compared against none)"),
    clients: str = typer.Option(",".join(map(str, DEFAULT_CLIENTS)), help="Comma list of concurrent client counts"),
    max_tokens: int = typer.Option(SERVE_MAX_TOKENS, help="Max new tokens per request"),
    repeats: int = typer.Option(SERVE_REPEATS, help="Cells per client count (fresh prompts each)"),
    num_draft: int | None = typer.Option(None, help=NUM_DRAFT_HELP),
    requests: int = typer.Option(
        1,
        help="Requests per client and cell, each sent when its previous reply ends "
        "(1: every client sends once, all at the same time)",
    ),
    out: str = typer.Option(DEFAULT_OUT, help="Folder for the run's JSON and markdown"),
):
    """Served throughput of N concurrent clients: plain (batched), the drafter turn-taking, the drafter batched, and
    mlx-lm's BatchGenerator, as ratios from one run."""
    from mlx_spec.bench.served import ThroughputSettings, run_throughput

    if hint := blas.hint():
        typer.echo(hint, err=True)
    try:
        counts = [int(x) for x in clients.split(",") if x.strip()]
    except ValueError:
        raise MlxSpecError(f"--clients must be comma-separated counts, got '{clients}'") from None
    s = ThroughputSettings(
        model=model,
        draft=draft,
        clients=counts,
        max_tokens=max_tokens,
        repeats=repeats,
        num_draft=num_draft,
        requests=requests,
    )
    run = run_throughput(Server(), s, out, log=_log)
    typer.echo(run.md_path.read_text())
    _log(f"wrote {run.json_path} and {run.md_path}")


def register(bench: typer.Typer) -> None:
    """Add `serve` to the bench's commands (`mlx_spec.bench.app`) and the `agent` suite kind to `bench run`;
    `mlx_spec.cli` calls it when it mounts the bench."""
    from mlx_spec.bench import agent_run, runner

    bench.command("serve")(serve)
    runner.FACES["agent"] = functools.partial(agent_run.run_agent, host=Server())
