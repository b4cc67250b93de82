"""The shapes a model's passes run at: which were seen before, padding to a few sizes, building them ahead.

MLX's GPU backends build kernels for each new input shape the first time they meet it (on CUDA a pass over T
positions cost 57-102 ms the first time a T was seen in a process and 6-10 ms after, BENCHMARKS.md §24); its
CPU backend does not. So a pass at a first-seen shape is not timed as a cost, passes run at the few sizes of
`SIZES` where the cache allows dummy positions, and on a GPU those sizes are built once when a model loads.
"""

import weakref
from typing import Dict, Iterable, Optional, Set, Tuple

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from .tunables import PREFILL_STEP, SIZES

_SEEN: Dict[int, Set[int]] = {}


def first_time(model, size: int) -> bool:
    """Whether `model` runs a pass over `size` positions for the first time in this process (and note it), on a
    device that builds kernels per shape: there that pass's time is a build, not a cost."""
    key = id(model)
    if key not in _SEEN:
        _SEEN[key] = set()
        weakref.finalize(model, _SEEN.pop, key, None)
    seen = _SEEN[key]
    new = size not in seen
    seen.add(size)
    return new and builds_per_shape()


def builds_per_shape() -> bool:
    """Whether the device in use builds kernels per input shape (MLX's GPU backends: Metal, CUDA)."""
    return mx.default_device().type == mx.DeviceType.gpu


def paddable(cache) -> bool:
    """Whether dummy positions can be written to `cache` and trimmed at once: plain attention caches only (a
    recurrent layer's state or a rotating window would have to be rewound through them)."""
    return all(type(c) is KVCache for c in cache)


def padded(n: int) -> int:
    """The size a pass of n positions runs at where the device builds per shape and dummies are allowed: the
    next of `SIZES`, above them the next power of two up to PREFILL_STEP, else n."""
    size = next((s for s in SIZES if s >= n), None)
    if size is None:
        size = 1 << (n - 1).bit_length()
    return size if size <= PREFILL_STEP else n


def all_sizes() -> Tuple[int, ...]:
    """Every size `padded` gives: what a model runs at once warmed (a verify, a catch-up, a prompt's last chunk)."""
    return tuple(sorted({padded(n) for n in range(1, PREFILL_STEP + 1)}))


def warm(model, sizes: Optional[Iterable[int]] = None) -> None:
    """Build `model`'s kernels for passes of each size (default `all_sizes`) on a scratch cache, where the device
    builds per shape; elsewhere nothing is built per shape and this returns at once."""
    if not builds_per_shape():
        return
    sizes = all_sizes() if sizes is None else sizes
    cache = make_prompt_cache(model)
    for size in sizes:
        mx.eval(model(mx.zeros((1, size), dtype=mx.uint32), cache=cache))
        for c in cache:
            c.trim(size)
        first_time(model, size)
