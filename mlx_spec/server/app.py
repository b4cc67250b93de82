"""The Starlette app: one core that checks a prompt, submits its job and hands back its items, the OpenAI-compatible
routes as wire formats over it, the key check, /health, the page, JSON 404s and one log line per request."""

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import mlx.core as mx
from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mlx_spec.device import describe
from mlx_spec.gen.load import vocab_width

from . import errors, messages, openapi, responses
from . import params as P
from .bridge import DISCONNECT_POLL, Disconnected, Ticket
from .defaults import DEFAULT_HOST, KEEPALIVE_S, PREFIX_CACHE_BYTES
from .errors import ERROR, ApiError, bad_request
from .guard import HostCheck, check_json, host_names
from .pair import Pair
from .scheduler import Delta, Done, Failed, Scheduler
from .tools import Syntax, ToolCall, Tools, ToolText, parse_tools
from .wire import CompletionReply, live

STATIC = Path(__file__).parent / "static"
RUN = "mlx_spec.run"  # the request scope's key for its Run, which the log line reads

log = logging.getLogger("mlx_spec.server.requests")


class Run:
    """One submitted job as its route sees it: wait for the first item (queue and prefill), then read the items in
    order (Delta..., Done). A failure before the first item is an ApiError from `ready`; one after it, from `items`."""

    def __init__(self, ticket: Ticket, request: Request, route: str):
        self.ticket, self.request, self.route = ticket, request, route
        self.id = ticket.job.id
        self.done: Done | None = None  # set once the reply is complete
        self.error: ApiError | None = None
        self.finish: str | None = None  # the wire's finish reason where it differs from Done's (tool_calls)
        self.unanswered = False  # the client left before the whole reply reached it
        self._first = None
        self._getter: asyncio.Future | None = None

    async def _next(self, watch: bool, timeout: float | None = None):
        """The next item, None after `timeout`; with `watch`, Disconnected (the job cancelled) if the client left."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        if self._getter is None:  # kept across timeouts, so no item is lost to a cancelled get
            self._getter = asyncio.ensure_future(self.ticket.queue.get())
        while True:
            step = DISCONNECT_POLL if watch else None
            if end is not None:
                step = max(0.0, end - loop.time()) if step is None else min(step, max(0.0, end - loop.time()))
            done, _ = await asyncio.wait({self._getter}, timeout=step)
            if done:
                item, self._getter = self._getter.result(), None
                if isinstance(item, Failed):
                    self.error = item.error
                    raise item.error
                if isinstance(item, Done):
                    self.done = item
                return item
            if watch and await self.request.is_disconnected():
                self.cancel(unanswered=True)
                raise Disconnected()
            if end is not None and loop.time() >= end:
                return None

    async def ready(self, timeout: float | None = None, watch: bool = True) -> bool:
        """Wait up to `timeout` s (None: as long as it takes) for the first item; True once it is here."""
        if self._first is None:
            self._first = await self._next(watch, timeout)
        return self._first is not None

    async def items(self, watch: bool = False) -> AsyncIterator[Delta | Done]:
        """The items in order, the first included. watch: notice a client that leaves (a stream notices by itself)."""
        item = self._first if self._first is not None else await self._next(watch)
        self._first = None
        while True:
            yield item
            if isinstance(item, Done):
                return
            item = await self._next(watch)

    def cancel(self, unanswered: bool = False) -> None:
        """Stop the job (a no-op once it has finished); unanswered: the client left before the whole reply reached it
        (the job counts as cancelled, even if it completed)."""
        if self._getter is not None and not self._getter.done():
            self._getter.cancel()
        self.unanswered = self.unanswered or unanswered
        self.ticket.cancel(unanswered)


@dataclass
class ChatPrompt:
    """A chat request made ready for the core: its token ids, its parameters, and its tools' parser (None: no
    tools, or tool_choice "none": the reply is all content)."""

    ids: list[int]
    params: P.Params
    tools: Tools | None
    syntax: Syntax | None

    def tool_text(self) -> ToolText | None:
        """A fresh splitter of the reply into content and calls, or None where the reply is all content."""
        if self.syntax is None or self.tools is None:
            return None
        return ToolText(self.syntax, self.tools.shown, inside=self.tools.forced)


class Wire(Protocol):
    """An API's reply as `Api.reply` drives it: content and calls in, the API's events out (any type: `sse` makes
    one SSE event of each). `final` is the whole reply once `finish` has run."""

    final: dict

    def start(self) -> list[Any]:
        """The events a stream opens with, before the first token."""
        ...

    def add(self, parts: list[str | ToolCall], live: dict | None = None) -> list[Any]:
        """The events for the reply's next content and calls; `live`: the draft stats of the tokens they came from."""
        ...

    def finish(self, done: Done) -> list[Any]:
        """The last events; the whole reply goes to `final`."""
        ...

    def sse(self, event: Any) -> dict:
        """An event as `ServerSentEvent` fields."""
        ...

    def error(self, e: ApiError) -> dict:
        """A failure mid-stream as an SSE event."""
        ...


def whole_text(parts: list[str | ToolCall]) -> tuple[str, list[ToolCall]]:
    return "".join(p for p in parts if isinstance(p, str)), [p for p in parts if isinstance(p, ToolCall)]


class Api:
    """The routes' shared state: the pair, the scheduler, the key, the default reply length and the device."""

    def __init__(
        self, pair: Pair, scheduler: Scheduler, api_key: str | None, max_tokens: int | None, keepalive_s: float
    ):
        self.pair, self.scheduler, self.api_key, self.max_tokens = pair, scheduler, api_key, max_tokens
        self.keepalive_s = keepalive_s
        self.device = describe()  # asked once: /health is polled, and the model thread owns MLX meanwhile

    def authorize(self, request: Request) -> None:
        """401 unless the bearer key matches (when the server has one)."""
        if self.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")

    async def body(self, request: Request) -> dict:
        """The request's JSON body (a 415 unless declared JSON), read within the bound the model's context sets."""
        check_json(request)
        return P.parse_json(await P.read_body(request, self.pair.context))

    # --- the core: every API's routes go through these ---

    def chat_prompt(self, body: dict) -> ChatPrompt:
        """A chat-completions body (or another API's request turned into one) checked and rendered: messages and
        tools through the model's chat template."""
        p = P.params(body, self.max_tokens)
        tools = parse_tools(body)
        messages = P.messages(body)
        shown = tools.shown if tools else None
        ids = self.pair.chat_ids(messages, shown, open_call=bool(tools and tools.forced))
        syntax = self.pair.tool_syntax if shown else None
        return ChatPrompt(ids, p, tools, syntax)

    async def start(self, request: Request, ids: list[int], p: P.Params, prefix: str, param: str = "messages") -> Run:
        """Check a prompt's length and drafter, fill in the reply's length, and submit its job: a 400 (or a 429 when
        the queue is full) before anything runs."""
        limit = self.pair.context
        if limit is not None and len(ids) >= limit:
            raise bad_request(
                f"the prompt is {len(ids)} tokens long but the model's context is {limit} tokens; shorten the {param}",
                param=param,
                code="context_length_exceeded",
            )
        p.draft = self.pair.check_draft(p.draft)
        if p.max_tokens is None:  # no length asked: up to the end of the context, as mlx-lm's server does
            p.max_tokens = max(1, (limit or P.UNSTATED_CONTEXT) - len(ids))
        run = Run(Ticket(self.scheduler, ids, p, prefix), request, request.url.path)
        request.scope[RUN] = run
        return run

    async def answer(
        self,
        run: Run,
        whole: Callable[[], Awaitable[dict]],
        stream: Callable[[], AsyncIterator[str | dict]] | None,
        error: Callable[[ApiError], str | dict] = lambda e: json.dumps(e.body()),
    ) -> Response:
        """The response over a submitted run: `whole()`'s JSON (it reads `run.items(watch=True)`), or an SSE stream of
        `stream()`'s events (`run.items()`). Errors before the first item are HTTP errors; a stream whose prompt is
        still prefilling after `keepalive_s` starts anyway, with keep-alive comments, and a later error travels as
        `error(e)`. A client that leaves, or any failure, cancels the job."""
        try:
            if stream is None:
                await run.ready()
                reply = await whole()
                if await run.request.is_disconnected():  # it completed after the client left
                    raise Disconnected()
                return JSONResponse(reply)
            await run.ready(timeout=self.keepalive_s)

            async def events():
                ended = False
                try:
                    async for event in stream():
                        yield event
                    ended = True
                except ApiError as e:  # the status is sent already, so the error travels as an event
                    ended = True
                    yield error(e)
                finally:
                    run.cancel(unanswered=not ended)  # closed early: the client left

            keepalive = lambda: ServerSentEvent(comment="keep-alive")  # noqa: E731
            return EventSourceResponse(events(), sep="\n", ping=self.keepalive_s, ping_message_factory=keepalive)
        except Disconnected:
            run.cancel(unanswered=True)
            return Response(status_code=499)  # nobody reads it; the job was cancelled
        except BaseException:
            run.cancel()  # e.g. the server is shutting down
            raise

    async def reply(
        self, run: Run, prompt: ChatPrompt, wire: Wire, finished: Callable[[], None] = lambda: None
    ) -> Response:
        """The response over a chat run in another API's shape: the generated text split into content and calls
        (`prompt.tool_text()`) and handed to `wire` as it comes; non-streamed, `wire.final` as JSON; streamed, every
        event of `wire` as SSE. `finished()` runs once the reply is complete (to keep it, to set `run.finish`)."""
        split = prompt.tool_text()
        feed, flush = (split.feed, split.end) if split else ((lambda text: [text]), list)

        def events(item: Delta | Done) -> list:
            if isinstance(item, Delta):
                return wire.add(feed("".join(t for t, _ in item.pieces)), live(item))
            out = wire.add(flush()) + wire.finish(item)
            finished()
            return out

        async def whole() -> dict:
            async for item in run.items(watch=True):
                events(item)
            return wire.final

        async def stream():
            for e in wire.start():
                yield wire.sse(e)
            async for item in run.items():
                for e in events(item):
                    yield wire.sse(e)

        return await self.answer(run, whole, stream if prompt.params.stream else None, wire.error)

    # --- /v1/chat/completions and /v1/completions ---

    async def chat(self, request: Request) -> Response:
        self.authorize(request)
        prompt = self.chat_prompt(await self.body(request))
        run = await self.start(request, prompt.ids, prompt.params, "chatcmpl")
        reply = CompletionReply(run.id, self.pair.name, chat=True)

        async def whole() -> dict:
            pieces = [d async for d in run.items(watch=True) if isinstance(d, Delta)]
            text = "".join(t for d in pieces for t, _ in d.pieces)
            split = prompt.tool_text()
            text, calls = whole_text(split.feed(text) + split.end()) if split else (text, [])
            assert run.done is not None  # `items` ends with it
            run.finish = reply.finish(run.done, calls)
            return reply.response(text, run.done, calls)

        async def stream():
            split = prompt.tool_text()
            calls = []
            yield json.dumps(reply.first())
            async for item in run.items():
                if isinstance(item, Delta):
                    parts = split.feed("".join(t for t, _ in item.pieces)) if split else None
                    if parts is None:
                        yield json.dumps(reply.chunk(item))
                        continue
                    calls += [p for p in parts if isinstance(p, ToolCall)]
                    for chunk in reply.parts(parts, item):
                        yield json.dumps(chunk)
                    continue
                if split:
                    parts = split.end()
                    calls += [p for p in parts if isinstance(p, ToolCall)]
                    for chunk in reply.parts(parts, None):
                        yield json.dumps(chunk)
                run.finish = reply.finish(item, calls)
                yield json.dumps(reply.last(item, run.finish))
                if prompt.params.include_usage:
                    yield json.dumps(reply.usage_chunk(item))
            yield "[DONE]"

        return await self.answer(run, whole, stream if prompt.params.stream else None)

    async def completions(self, request: Request) -> Response:
        self.authorize(request)
        body = await self.body(request)
        p = P.params(body, self.max_tokens)
        prompt = P.prompt(body)
        if isinstance(prompt, list) and max(prompt) >= vocab_width(self.pair.target):
            raise bad_request(f"token id {max(prompt)} is outside the vocabulary", param="prompt")
        ids = self.pair.text_ids(prompt) if isinstance(prompt, str) else prompt
        run = await self.start(request, ids, p, "cmpl", param="prompt")
        reply = CompletionReply(run.id, self.pair.name, chat=False)

        async def whole() -> dict:
            pieces = [d async for d in run.items(watch=True) if isinstance(d, Delta)]
            assert run.done is not None  # `items` ends with it
            return reply.response("".join(t for d in pieces for t, _ in d.pieces), run.done)

        async def stream():
            async for item in run.items():
                yield json.dumps(reply.chunk(item) if isinstance(item, Delta) else reply.last(item))
                if isinstance(item, Done) and p.include_usage:
                    yield json.dumps(reply.usage_chunk(item))
            yield "[DONE]"

        return await self.answer(run, whole, stream if p.stream else None)

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        context = self.pair.context
        model = {
            "id": self.pair.name,
            "object": "model",
            "created": 0,
            "owned_by": "mlx-spec",
            "context_length": context,  # OpenRouter's and LM Studio's name
            "max_model_len": context,  # vLLM's name
            "mlx_spec": self.pair.info(),
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, _request: Request) -> Response:
        memory = {"active_bytes": mx.get_active_memory(), "cache_bytes": mx.get_cache_memory()}  # MLX's allocator
        return JSONResponse({**self.scheduler.health(), "device": self.device, "memory": memory})

    async def openapi(self, _request: Request) -> Response:
        return JSONResponse(openapi.schema())

    async def page(self, _request: Request) -> Response:
        return FileResponse(STATIC / "index.html")


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (an unknown route, a wrong method) in OpenAI's error shape."""
    what = "Invalid URL" if exc.status_code == 404 else exc.detail
    message = f"{what} ({request.method} {request.url.path})"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, message, code=code, headers=exc.headers).response()


def error_response(path: str, e: ApiError) -> Response:
    """An error in the shape of the API the path belongs to: Anthropic's under /v1/messages, else OpenAI's."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return JSONResponse(messages.error_body(e), status_code=e.status, headers=e.headers)
    return e.response()


def log_line(
    method: str, path: str, status: int, run: Run | None, seconds: float, error: ApiError | None = None
) -> str:
    """The request's one line: route, status, and for a generation its prompt, cache, output and drafts (for a
    refused request, why)."""
    line = f"{method} {path} {status}"
    if run is None and error is not None:
        line += f" error={error.message}"
    if run is not None and run.done is not None and run.done.stats:
        stats, done = run.done.stats, run.done
        line += (
            f" prompt={stats.get('prompt_tokens', 0)} cached={stats.get('prompt_cached', 0)}"
            f" out={stats.get('generation_tokens', 0)} drafted={stats.get('draft_share', 0.0):.0%}"
            f" finish={run.finish or done.finish_reason}"
        )
    elif run and run.error:
        line += f" error={run.error.status} {run.error.message}"
    if run is not None and (run.unanswered or run.done is None and run.error is None):
        line += " cancelled"
    return f"{line} {seconds:.2f}s"


class RequestLog:
    """ASGI middleware: one log line per API request once its response ends (the page's files and /health are
    left out: the page polls them)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope.get("path", "")
            if path.startswith("/v1") or status[0] >= 400:
                seconds = time.monotonic() - start
                log.info(log_line(scope.get("method", ""), path, status[0], scope.get(RUN), seconds, scope.get(ERROR)))


def build_app(
    pair: Pair,
    *,
    api_key: str | None = None,
    max_concurrency: int,
    max_tokens: int | None = None,
    max_queue: int | None = None,
    batch: bool = True,
    keepalive_s: float = KEEPALIVE_S,
    prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    host: str = DEFAULT_HOST,
    allowed_hosts: Iterable[str] = (),
    cors_origin: str | None = None,
) -> Starlette:
    """The app; its lifespan starts and stops the scheduler thread. `app.state.scheduler` is it, `app.state.api` the
    routes' core. max_tokens: a reply's length when a request gives none (None: up to the end of the context).
    batch: requests that start while others generate share batched rounds (else every request takes its own turns).
    keepalive_s: how long a stream waits for its first token before it starts with keep-alive comments.
    prefix_cache_bytes: the KV caches kept of prompt prefixes that conversations share (0: none).
    host, allowed_hosts: the address bound and the other names a request's `Host` may carry (beside the loopback
    names). cors_origin: the one web origin whose pages may call the API (None: no CORS headers at all)."""
    scheduler = Scheduler(pair, max_concurrency, max_queue, batch, prefix_cache_bytes)
    api = Api(pair, scheduler, api_key, max_tokens, keepalive_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

    routes = [
        Route("/", api.page),
        Route("/health", api.health),
        Route("/openapi.json", api.openapi),
        Route("/v1/models", api.models),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        *responses.routes(api),
        *messages.routes(api),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(RequestLog), Middleware(HostCheck, host_names(host, allowed_hosts), error_response)]
    if cors_origin is not None:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=[cors_origin],
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
            )
        )
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=middleware,
        # Starlette types a handler as taking any exception; each of these gets the class it is registered for
        exception_handlers={ApiError: errors.handle, HTTPException: http_error},  # type: ignore[dict-item]
    )
    app.state.scheduler, app.state.api = scheduler, api
    return app
