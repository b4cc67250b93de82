"""Progress bars for the long making steps: one tqdm bar each on a terminal, silent otherwise."""

import contextlib
import io
import sys
from typing import Any

from tqdm import tqdm

# disable=None: tqdm turns the bar off when stderr is not a terminal (logs, pipes, CI, tests).
_QUIET_OFF_TERMINAL: dict[str, Any] = dict(disable=None, dynamic_ncols=True)


def progress(**kwargs) -> tqdm:
    """A tqdm bar on stderr (total, desc, unit, ... as tqdm takes them)."""
    return tqdm(**_QUIET_OFF_TERMINAL, **kwargs)


def byte_progress(stream, total: int, desc: str):
    """A context manager wrapping `stream` so that each write advances a bytes bar."""
    return tqdm.wrapattr(stream, "write", total=total, desc=desc, **_QUIET_OFF_TERMINAL)


@contextlib.contextmanager
def quiet_unless_terminal():
    """Silence another library's own bars and prints (mlx-lm's quantizers) when stderr is not a terminal:
    both streams go to a buffer that is dropped (their tqdm bars are made with the stream of the moment)."""
    if sys.stderr.isatty():
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield
