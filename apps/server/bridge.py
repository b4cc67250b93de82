"""The request's side of a job: items from the scheduler thread onto an asyncio.Queue; noticing a client that left."""

import asyncio
import uuid

from starlette.requests import Request

from .errors import ApiError
from .params import Params
from .scheduler import Job, QueueFull, Scheduler

DISCONNECT_POLL = 0.25  # seconds between checks for a vanished client while its request waits or runs unstreamed


class Disconnected(Exception):
    """The client closed the connection."""


class Ticket:
    """A submitted job as seen from the event loop: `get` its items in order, `cancel` when the client is gone."""

    def __init__(self, scheduler: Scheduler, ids, params: Params, prefix: str):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

        def send(item) -> None:  # runs on the scheduler thread
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: the server is going down, nobody is listening
                pass

        self.scheduler = scheduler
        self.job = Job(f"{prefix}-{uuid.uuid4().hex[:24]}", ids, params, send)
        try:
            scheduler.submit(self.job)
        except QueueFull as e:
            raise ApiError(
                429, str(e), type="rate_limit_exceeded", code="queue_full", headers={"Retry-After": "1"}
            ) from None

    async def get(self, request: Request | None = None):
        """The next item; with `request`, raise Disconnected (and cancel the job) if the client leaves meanwhile."""
        if request is None:
            return await self.queue.get()
        getter = asyncio.ensure_future(self.queue.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL)
                if done:
                    return getter.result()
                if await request.is_disconnected():
                    self.cancel()
                    raise Disconnected()
        finally:
            if not getter.done():
                getter.cancel()

    def cancel(self) -> None:
        """Stop the job (a no-op once it has finished)."""
        self.scheduler.cancel(self.job)
