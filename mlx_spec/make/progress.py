"""Progress bars for the long making steps: one tqdm bar each on a terminal, silent otherwise."""

from tqdm import tqdm

# disable=None: tqdm turns the bar off when stderr is not a terminal (logs, pipes, CI, tests).
_QUIET_OFF_TERMINAL = dict(disable=None, dynamic_ncols=True)


def progress(**kwargs) -> tqdm:
    """A tqdm bar on stderr (total, desc, unit, ... as tqdm takes them)."""
    return tqdm(**_QUIET_OFF_TERMINAL, **kwargs)


def byte_progress(stream, total: int, desc: str):
    """A context manager wrapping `stream` so that each write advances a bytes bar."""
    return tqdm.wrapattr(stream, "write", total=total, desc=desc, **_QUIET_OFF_TERMINAL)
