"""The request's side of a job: items from the scheduler thread onto an asyncio.Queue; a client that left."""

import asyncio
import uuid

from .errors import ApiError
from .params import Params
from .scheduler import Job, QueueFull, Scheduler

DISCONNECT_POLL = 0.25  # seconds between checks for a vanished client while its request waits or runs unstreamed


class Disconnected(Exception):
    """The client closed the connection."""


class Ticket:
    """A submitted job as seen from the event loop: its items arrive on `queue` in order (`app.Run` reads them);
    `cancel` when the client is gone."""

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

    def cancel(self, unanswered: bool = False) -> None:
        """Stop the job (a no-op once it has finished); unanswered: the client left before its whole reply reached it,
        so the job counts as cancelled even if it completed."""
        self.scheduler.cancel(self.job, unanswered)
