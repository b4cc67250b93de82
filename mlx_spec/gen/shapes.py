"""The shapes a model's passes run at: which it ran before (a GPU builds kernels per shape), a few padded sizes."""

import weakref

from ..device import builds_per_shape
from .tunables import PREFILL_STEP, SIZES

_SEEN: dict[int, set[int]] = {}


def first_time(model, size) -> bool:
    """Whether `model` runs this shape for the first time (noted now) on a device that builds kernels per shape."""
    if id(model) not in _SEEN:
        weakref.finalize(model, _SEEN.pop, id(model), None)
    seen = _SEEN.setdefault(id(model), set())
    new = size not in seen
    seen.add(size)
    return new and builds_per_shape()


def padded(n: int) -> int:
    """The next of `SIZES` at or above n, above them the next power of two up to PREFILL_STEP, else n."""
    size = next((s for s in SIZES if s >= n), 1 << (n - 1).bit_length())
    return size if size <= PREFILL_STEP else n
