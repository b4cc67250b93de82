"""`mlx-spec serve`: load the pair, build the app, run it under uvicorn and print the URL once it listens."""

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn

from mlx_spec.cluster import Cluster, ClusterError
from mlx_spec.device import describe
from mlx_spec.errors import MlxSpecError
from mlx_spec.gen import registry
from mlx_spec.named import Log

from .app import build_app
from .app import log as request_log
from .defaults import DEFAULT_HOST, DEFAULT_MAX_CONCURRENCY, DEFAULT_PORT, PREFIX_CACHE_BYTES
from .lockstep import Lockstep, load_pair
from .pair import Pair
from .scheduler import Scheduler

SHUTDOWN_GRACE_S = 5  # open streams get this long to end when the server stops


def _quiet(_msg: str) -> None:
    pass


class _Server(uvicorn.Server):
    """uvicorn's server, calling `on_ready` once it accepts connections."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]):
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_ready()


def _config(app, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S
    )


def _url(host: str, sock) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def api_key_from(key: str | None, file: Path | None) -> str | None:
    """The API key given on the command line, in MLX_SPEC_API_KEY (typer reads it into `key`) or in `file` (its text
    without the surrounding whitespace); an unreadable or empty file, or two keys, is an error."""
    if file is None:
        return key
    if key is not None:
        raise MlxSpecError("give the API key once: --api-key (or MLX_SPEC_API_KEY) or --api-key-file")
    try:
        text = Path(file).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise MlxSpecError(
            f"--api-key-file: cannot read {file}: {e.strerror if isinstance(e, OSError) else e}"
        ) from None
    if not text:
        raise MlxSpecError(f"--api-key-file: {file} is empty")
    return text


def serve(
    *,
    model: str,
    draft,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    api_key: str | None = None,
    api_key_file: Path | None = None,
    allowed_hosts: Sequence[str] = (),
    cors_origin: str | None = None,
    allow_draft: Sequence[registry.Spec] = (),
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    num_draft: int | None = None,
    adaptive: bool = True,
    max_tokens: int | None = None,
    fixed_draft: bool = False,
    batch: bool = True,
    prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    shard: str | None = None,
    log: Log = _quiet,
) -> None:
    """Serve the pair until Ctrl-C; the URL (port 0: the port picked) goes to stdout once it listens, a line per
    request to stderr. max_tokens: a reply's length when a request gives none (None: up to the end of the context).
    shard: the target split over the ranks `mlx.launch` started ("tensor" or "pipeline"); rank 0 serves, the others
    follow its steps and serve nothing. allowed_hosts: names beside the loopback ones and `host` that a request's `Host`
    may carry; cors_origin: the one web origin whose pages may call the API; allow_draft: more drafters requests may
    name, built at start; adaptive False: every round drafts what the drafter offers (`Planner.adaptive`)."""
    api_key = api_key_from(api_key, api_key_file)
    if not request_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        request_log.addHandler(handler)
        request_log.setLevel(logging.INFO)
    lockstep = None
    if shard is None:
        pair = Pair.load(
            model, draft, num_draft=num_draft, adaptive=adaptive, fixed=fixed_draft, allow=allow_draft, log=log
        )
    else:
        if allow_draft:
            raise MlxSpecError("--allow-draft does not work with --shard: a sharded server drafts with its own drafter")
        cluster = Cluster.join(shard)
        pair = load_pair(cluster, model, draft, num_draft=num_draft, adaptive=adaptive, fixed=fixed_draft, log=log)
        cluster.agree_seed(None)  # every rank samples alike; and no rank starts before all have loaded
        lockstep = Lockstep(cluster)
        if not lockstep.lead:
            return follow(pair, lockstep, prefix_cache_bytes)
    app = build_app(
        pair,
        api_key=api_key,
        max_concurrency=max_concurrency,
        max_tokens=max_tokens,
        batch=batch,
        prefix_cache_bytes=prefix_cache_bytes,
        host=host,
        allowed_hosts=allowed_hosts,
        cors_origin=cors_origin,
    )
    if lockstep is not None:
        app.state.scheduler.shard(lockstep)
    config = _config(app, host, port)
    sock = config.bind_socket()
    url, device = _url(host, sock), describe()

    def ready() -> None:
        log(
            f"serving {pair.model_spec} drafted by {pair.info()['draft_name']} on {device}: open {url} "
            f"(OpenAI API at {url}v1); Ctrl-C stops"
        )
        print(url, flush=True)

    _Server(config, ready).run(sockets=[sock])


def follow(pair: Pair, lockstep: Lockstep, prefix_cache_bytes: int) -> None:
    """A rank other than 0: no HTTP; replay rank 0's steps until it stops (a broken group: a ClusterError)."""
    scheduler = Scheduler(pair, 1, batch=False, prefix_bytes=prefix_cache_bytes)
    scheduler.shard(lockstep)
    scheduler.follow()
    if lockstep.broken is not None:
        raise ClusterError(lockstep.broken)


class Running:
    """A server on a background thread (tests, benchmarks): its `url`, `app`, and `stop()`."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, timeout: float = 60.0):
        config = _config(app, host, port)
        sock = config.bind_socket()
        self.app, self.url = app, _url(host, sock)
        ready = threading.Event()
        self._server = _Server(config, ready.set)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"the server did not start within {timeout} s")

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
