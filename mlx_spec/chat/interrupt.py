"""Ctrl-C stops a reply, not the program: SIGINT becomes a flag the event loop checks after each token."""

import signal
from collections.abc import Callable, Generator

from mlx_spec.gen.stream import Event


def drain(
    events: Generator[Event, None, None], show: Callable[[Event], None] | None = None, stoppable: bool = True
) -> tuple[list[Event], bool]:
    """Run `events` to the end or to Ctrl-C; return (the events seen, whether Ctrl-C stopped them).

    The first Ctrl-C only sets a flag, so the generator is closed between tokens, never inside a
    cache update. A second Ctrl-C raises at once, for a long prompt that yields no token to stop at;
    the engine rewinds its caches on any exception, so that is safe too, only less tidy.
    stoppable False (a target split over ranks, which run every round together): Ctrl-C is not caught here.
    """
    seen: list[Event] = []
    hit: list[bool] = []

    def on_sigint(_sig, _frame):
        if hit:
            raise KeyboardInterrupt
        hit.append(True)

    old = signal.signal(signal.SIGINT, on_sigint) if stoppable else None
    try:
        for ev in events:
            seen.append(ev)
            if show is not None:
                show(ev)
            if hit:
                break
    except KeyboardInterrupt:
        if not stoppable:
            raise
        hit.append(True)
    finally:
        events.close()
        if stoppable:
            signal.signal(signal.SIGINT, old)
    return seen, bool(hit)
