"""The shapes a model's passes run at: which were seen before, padding to a few sizes, building them ahead (MLX's GPU
backends build kernels for each new input shape, BENCHMARKS.md §24; its CPU backend does not)."""

import weakref
from typing import Dict, Iterable, Optional, Set

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..device import builds_per_shape
from .tunables import PREFILL_STEP, SIZES

_SEEN: Dict[int, Set[int]] = {}


def first_time(model, size) -> bool:
    """Whether `model` runs this shape for the first time (noted now) on a device that builds kernels per shape."""
    if id(model) not in _SEEN:
        weakref.finalize(model, _SEEN.pop, id(model), None)
    seen = _SEEN.setdefault(id(model), set())
    new = size not in seen
    seen.add(size)
    return new and builds_per_shape()


def paddable(cache) -> bool:
    """Whether dummy positions can be written to `cache` and trimmed at once: plain attention caches only."""
    return all(type(c) is KVCache for c in cache)


def padded(n: int) -> int:
    """The next of `SIZES` at or above n, above them the next power of two up to PREFILL_STEP, else n."""
    size = next((s for s in SIZES if s >= n), 1 << (n - 1).bit_length())
    return size if size <= PREFILL_STEP else n


def warm(model, sizes: Optional[Iterable[int]] = None) -> None:
    """Build `model`'s kernels for passes of each size (default: every size `padded` gives, as a verify, a catch-up or
    a prompt's last chunk runs) on a scratch cache, where the device builds per shape; elsewhere this does nothing."""
    if not builds_per_shape():
        return
    sizes = sorted({padded(n) for n in range(1, PREFILL_STEP + 1)}) if sizes is None else sizes
    cache = make_prompt_cache(model)
    for size in sizes:
        mx.eval(model(mx.zeros((1, size), dtype=mx.uint32), cache=cache))
        for c in cache:
            c.trim(size)
        first_time(model, size)
