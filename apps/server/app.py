"""The Starlette app: the OpenAI-compatible routes, the key check, /health, and the page with its static files."""

import contextlib
import hmac
import json
from pathlib import Path

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mlx_spec.device import describe
from mlx_spec.gen.load import vocab_width

from . import errors
from . import params as P
from .bridge import Disconnected, Ticket
from .errors import ApiError, bad_request
from .pair import Pair
from .scheduler import Delta, Done, Failed, Scheduler
from .wire import Reply

STATIC = Path(__file__).parent / "static"


class Api:
    """The routes' shared state: the pair, the scheduler, the key, the default reply length and the device."""

    def __init__(self, pair: Pair, scheduler: Scheduler, api_key: str | None, max_tokens: int):
        self.pair, self.scheduler, self.api_key, self.max_tokens = pair, scheduler, api_key, max_tokens
        self.device = describe()  # asked once: /health is polled, and the model thread owns MLX meanwhile

    def authorize(self, request: Request) -> None:
        """401 unless the bearer key matches (when the server has one)."""
        if self.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")

    def check_length(self, ids, param: str) -> None:
        """400 for a prompt the model cannot take, before it waits in the queue."""
        limit = self.pair.context
        if limit is not None and len(ids) >= limit:
            raise bad_request(
                f"the prompt is {len(ids)} tokens long but the model's context is {limit} tokens; shorten the {param}",
                param=param,
                code="context_length_exceeded",
            )

    async def chat(self, request: Request) -> Response:
        self.authorize(request)
        body = P.parse_json(await P.read_body(request, self.pair.context))
        p = P.params(body, self.max_tokens)
        messages = P.messages(body)
        try:
            ids = self.pair.chat_ids(messages)
        except Exception as e:  # the model's chat template rejects the conversation (e.g. roles out of order)
            raise bad_request(f"the chat template rejects these messages: {e}", param="messages") from None
        return await self._run(request, ids, p, chat=True)

    async def completions(self, request: Request) -> Response:
        self.authorize(request)
        body = P.parse_json(await P.read_body(request, self.pair.context))
        p = P.params(body, self.max_tokens)
        prompt = P.prompt(body)
        if isinstance(prompt, list) and max(prompt) >= vocab_width(self.pair.target):
            raise bad_request(f"token id {max(prompt)} is outside the vocabulary", param="prompt")
        ids = self.pair.text_ids(prompt) if isinstance(prompt, str) else prompt
        return await self._run(request, ids, p, chat=False)

    async def _run(self, request: Request, ids, p: P.Params, chat: bool) -> Response:
        self.check_length(ids, "messages" if chat else "prompt")
        p.draft = self.pair.check_draft(p.draft)
        ticket = Ticket(self.scheduler, ids, p, "chatcmpl" if chat else "cmpl")
        reply = Reply(ticket.job.id, self.pair.name, chat)
        try:
            item = await ticket.get(request)  # queue wait and prefill: errors up to here are plain HTTP errors
            if isinstance(item, Failed):
                raise item.error
            if p.stream:
                return EventSourceResponse(self._stream(ticket, reply, item, p, chat), sep="\n")
            text = []
            while not isinstance(item, (Done, Failed)):
                text.append("".join(t for t, _ in item.pieces))
                item = await ticket.get(request)
            if isinstance(item, Failed):
                raise item.error
            return JSONResponse(reply.response("".join(text), item))
        except Disconnected:
            return Response(status_code=499)  # nobody reads it; the job was cancelled
        except BaseException:
            ticket.cancel()  # e.g. the server is shutting down
            raise

    async def _stream(self, ticket: Ticket, reply: Reply, item, p: P.Params, chat: bool):
        """SSE data: chunks, the last with the stats, maybe usage, then [DONE]. Closing it (the client left) cancels the job."""
        try:
            if chat:
                yield json.dumps(reply.first())
            while True:
                if isinstance(item, Delta):
                    yield json.dumps(reply.chunk(item))
                elif isinstance(item, Done):
                    yield json.dumps(reply.last(item))
                    if p.include_usage:
                        yield json.dumps(reply.usage_chunk(item))
                    break
                else:  # failed mid-stream: the status is sent already, so the error travels as an event
                    yield json.dumps(item.error.body())
                    break
                item = await ticket.get()
            yield "[DONE]"
        finally:
            ticket.cancel()

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        model = {
            "id": self.pair.name,
            "object": "model",
            "created": 0,
            "owned_by": "mlx-spec",
            "mlx_spec": self.pair.info(),
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, _request: Request) -> Response:
        return JSONResponse({**self.scheduler.health(), "device": self.device})

    async def page(self, _request: Request) -> Response:
        return FileResponse(STATIC / "index.html")


def build_app(
    pair: Pair,
    *,
    api_key: str | None = None,
    max_concurrency: int,
    max_tokens: int,
    max_queue: int | None = None,
    batch: bool = True,
) -> Starlette:
    """The app; its lifespan starts and stops the scheduler thread. `app.state.scheduler` is it. batch: requests
    that start while others generate share batched rounds (else every request takes its own turns)."""
    scheduler = Scheduler(pair, max_concurrency, max_queue, batch)
    api = Api(pair, scheduler, api_key, max_tokens)

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
        Route("/v1/models", api.models),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ApiError: errors.handle})
    app.state.scheduler = scheduler
    return app
