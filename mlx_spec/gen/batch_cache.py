"""The joint caches of a batch (one object per layer, one row per generation): merging a generation's cache in,
taking a row's cache out, and rewinding each row by its own count.

Attention layers use `RaggedKVCache`, mlx-lm's `BatchKVCache` (rows of different lengths sit left-padded in it, as
in its `BatchGenerator`) whose rows may also have gaps: a row rewound further than the others keeps the positions it
dropped as a gap its attention masks out, so every row ends at the same column again without moving its keys and
values (`BatchKVCache`'s own way, `prepare(right_padding=...)` then `finalize()`, rolls every row's whole buffer).
A row that leaves leaves its place (a new row's cache can be written into it, `put`); gaps and places go when
the batch packs the rows it keeps (`keep_rows`).

Recurrent layers (gated delta nets, Mamba) use `recurrent.RewindableRows`: the rows' states stacked, the batched
passes recorded, and each row rewound by restoring its state before the pass its kept part ends in and replaying
its layer's mixer on that part. A hybrid's attention layers rewind as above.
"""

from typing import List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, KVCache

from . import recurrent
from .recurrent import RewindableCache, RewindableRows


class RaggedKVCache(BatchKVCache):
    """A `BatchKVCache` whose rows may have gaps: `gaps[i, j]` is True where row i's column j holds a position the
    row dropped (`drop`); attention masks it out. `gaps` is None while no row has one, and spans at most `_idx`
    columns (columns past it are free)."""

    gaps: Optional[mx.array] = None

    @classmethod
    def of(cls, cache: BatchKVCache) -> "RaggedKVCache":
        """The same cache (its arrays shared) as a `RaggedKVCache`."""
        out = cls.__new__(cls)
        out.__dict__.update(cache.__dict__)
        return out

    def _gaps(self, width: int) -> mx.array:
        """The gaps over the first `width` columns (False past what is recorded)."""
        g = self.gaps if self.gaps is not None else mx.zeros((self.offset.shape[0], 0), dtype=mx.bool_)
        g = g[:, :width]
        return mx.pad(g, [(0, 0), (0, width - g.shape[1])]) if g.shape[1] < width else g

    def drop(self, extra: List[int]) -> None:
        """Row i gives up its last `extra[i]` positions: they become a gap at the end of its columns."""
        e = mx.array(extra)
        cols = mx.arange(self._idx)[None]
        self.gaps = self._gaps(self._idx) | (cols >= self._idx - e[:, None])
        self.offset = self.offset - e

    def trim(self, n):
        n = super().trim(n)
        if self.gaps is not None:
            self.gaps = self.gaps[:, : self._idx]
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)
        if self.gaps is None:
            return mask
        return mask & ~self._gaps(self._idx + N)[:, None, None, :]

    def _columns(self, i: int) -> List[int]:
        """Row i's columns that hold its positions, in order."""
        start = self.left_padding[i].item()
        if self.gaps is None:
            return list(range(start, self._idx))
        gap = self._gaps(self._idx)[i].tolist()
        return [j for j in range(start, self._idx) if not gap[j]]

    def extract(self, idx):
        if self.gaps is None:
            return super().extract(idx)
        cache = KVCache()
        cols = mx.array(self._columns(idx))
        cache.keys = mx.contiguous(mx.take(self.keys[idx : idx + 1], cols, axis=2))
        cache.values = mx.contiguous(mx.take(self.values[idx : idx + 1], cols, axis=2))
        cache.offset = cache.keys.shape[2]
        return cache

    def filter(self, batch_indices):
        if self.gaps is None:
            return super().filter(batch_indices)
        # Pack the rows kept: each row's positions right-aligned at the last column, no gaps.
        cols = [self._columns(i) for i in batch_indices]
        width = max(len(c) for c in cols)
        index = mx.array([[0] * (width - len(c)) + c for c in cols])[:, None, :, None]
        rows = mx.array(batch_indices)
        self.keys = mx.take_along_axis(self.keys[rows], index, axis=2)
        self.values = mx.take_along_axis(self.values[rows], index, axis=2)
        self.offset = self.offset[rows]
        self.left_padding = mx.array([width - len(c) for c in cols])
        self._idx, self.gaps = width, None

    def put(self, i: int, cache: KVCache) -> None:
        """Row i becomes `cache`'s positions (at most `_idx` of them), right-aligned; what row i held is gone."""
        n = cache.offset
        self.keys[i : i + 1, :, self._idx - n : self._idx, :] = cache.keys[..., :n, :]
        self.values[i : i + 1, :, self._idx - n : self._idx, :] = cache.values[..., :n, :]
        rows = mx.arange(self.offset.shape[0]) == i
        self.left_padding = mx.where(rows, self._idx - n, self.left_padding)
        self.offset = mx.where(rows, n, self.offset)
        if self.gaps is not None:
            self.gaps = self.gaps & ~rows[:, None]

    def extend(self, other):
        a, b = self._idx, other._idx
        ragged = isinstance(other, RaggedKVCache) and other.gaps is not None
        if self.gaps is None and not ragged:
            return super().extend(other)
        mine = self._gaps(a)  # taken before the rows are joined (`_gaps` sizes by the rows)
        theirs = other._gaps(b) if ragged else mx.zeros((other.offset.shape[0], b), dtype=mx.bool_)
        super().extend(other)
        m = self._idx
        self.gaps = mx.concatenate([mx.pad(mine, [(0, 0), (m - a, 0)]), mx.pad(theirs, [(0, 0), (m - b, 0)])])


def batchable(cache: Sequence) -> bool:
    """Whether a generation's cache can join a batch: plain KV caches and rewindable recurrent ones (no sliding
    window, no recurrent state of unknown length)."""
    return all(type(c) is KVCache or (isinstance(c, RewindableCache) and not isinstance(c, RewindableRows))
               for c in cache)


def merge(cache: Sequence) -> List:
    """A batch of one row from a generation's cache (the cache itself is copied, never changed)."""
    return [recurrent.joint(c) if isinstance(c, RewindableCache) else RaggedKVCache.of(BatchKVCache.merge([c]))
            for c in cache]


def join(joint: Optional[List], cache: Sequence) -> List:
    """`joint` with a generation's cache as one more row (a new joint cache when `joint` is None)."""
    one = merge(cache)
    if joint is None:
        return one
    extend(joint, one)
    return joint


def extend(joint: List, more: List) -> None:
    """Append the rows of `more` (a `merge` result or another joint cache) to `joint`, in place."""
    for mine, new in zip(joint, more):
        mine.extend(new)


def extract(joint: List, i: int, tokens: int) -> List:
    """Row i's cache as a generation's own, holding its first `tokens` tokens."""
    out = [c.extract(i) for c in joint]
    for c in out:
        n = c.offset - tokens
        if c.trim(n) < n:  # a recurrent row trims only within the pass it was last rewound in
            raise ValueError(f"row {i} cannot be trimmed back {n} tokens")
    mx.eval([c.state for c in out])  # copied now: a copy still pending would hold the joint cache's buffers, and
    # the next pass, unable to write its positions into them in place, would copy them whole
    return out


def put(joint: List, i: int, cache: Sequence) -> bool:
    """Row i of `joint` becomes a generation's cache, in place, if it fits (attention layers only, no longer than
    the joint cache's columns); False, nothing changed, if not."""
    if not all(isinstance(c, RaggedKVCache) and c.keys is not None and type(o) is KVCache and o.keys is not None
               and o.offset <= c.size()
               for c, o in zip(joint, cache)):
        return False
    for c, o in zip(joint, cache):
        c.put(i, o)
    return True


def columns(joint: List) -> int:
    """The longest row's columns in the joint cache (1 where it has no attention layer)."""
    return max([c.size() for c in joint if isinstance(c, BatchKVCache)], default=1)


def keep_rows(joint: List, rows: List[int]) -> None:
    """Keep only the given rows, in place."""
    for c in joint:
        c.filter(rows)


def start_round(joint: List) -> None:
    """What the joint cache holds now is final: a round's rewind goes back no further than this."""
    recurrent.commit(joint)


def rewind(joint: List, drop: List[int]) -> None:
    """Drop each row's last `drop[i]` positions (of the passes since the last rewind or `start_round`): a recurrent
    layer replays each row's kept part; an attention layer trims the part common to all and leaves the rest as a
    gap in the row."""
    common = min(drop)
    extra = [n - common for n in drop]
    for c in joint:
        if isinstance(c, RewindableRows):
            c.trim_rows(drop)
            continue
        if common:
            c.trim(common)
        if any(extra):
            c.drop(extra)
