"""The rows' cache: a lone row's own, or one joint `BatchKVCache` with gaps, so each row rewinds by its own count."""

from collections.abc import Sequence
from typing import Generic, TypeVar

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache, KVCache

from . import recurrent
from .cache import rewind
from .recurrent import RewindableCache, RewindableRows


class RaggedKVCache(BatchKVCache):
    """A `BatchKVCache` whose rows may have gaps: `gaps[i, j]` is True where row i's column j holds a position the
    row dropped (`drop`). The one place mlx-spec reads `BatchKVCache`'s internals (`_idx`: the columns in use)."""

    gaps: mx.array | None = None

    @classmethod
    def of(cls, cache: KVCache) -> "RaggedKVCache":
        """A joint cache of one row holding a copy of `cache`'s positions."""
        return cls.merge([cache]) if cache.keys is not None else cls([0])

    def _gaps(self, width: int) -> mx.array:
        """The gaps over the first `width` columns (False past what is recorded)."""
        g = (self.gaps if self.gaps is not None else mx.zeros((self.offset.shape[0], 0), dtype=mx.bool_))[:, :width]
        return mx.pad(g, [(0, 0), (0, width - g.shape[1])]) if g.shape[1] < width else g

    def drop(self, extra: list[int]) -> None:
        """Row i gives up its last `extra[i]` positions: they become a gap at the end of its columns."""
        e = mx.array(extra)
        self.gaps = self._gaps(self._idx) | (mx.arange(self._idx)[None] >= self._idx - e[:, None])
        self.offset = self.offset - e

    def trim(self, n):
        n = super().trim(n)
        if self.gaps is not None:
            self.gaps = self.gaps[:, : self._idx]
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)
        return mask if self.gaps is None else mask & ~self._gaps(self._idx + N)[:, None, None, :]

    def _columns(self, i: int) -> list[int]:
        """Row i's columns that hold its positions, in order."""
        start = int(self.left_padding[i])
        gap: list[bool] = self._gaps(self._idx)[i].tolist()  # type: ignore[assignment]  # mlx: a scalar or a list
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
        index = mx.array([[0] * (width - len(c)) + c for c in cols])[:, None, :, None]  # (B, 1, width, 1)
        rows = mx.array(batch_indices)
        self.keys = mx.take_along_axis(self.keys[rows], index, axis=2)
        self.values = mx.take_along_axis(self.values[rows], index, axis=2)
        self.offset = self.offset[rows]
        self.left_padding = mx.array([width - len(c) for c in cols])
        self._idx, self.gaps = width, None

    def put(self, i: int, cache: KVCache) -> None:
        """Row i becomes `cache`'s positions (at most `_idx` of them), right-aligned; what row i held is gone."""
        n = cache.offset
        # mlx-lm leaves `keys` and `values` unannotated (None until the first update): a row holds them here
        self.keys[i : i + 1, :, self._idx - n : self._idx, :] = cache.keys[..., :n, :]  # type: ignore[index]
        self.values[i : i + 1, :, self._idx - n : self._idx, :] = cache.values[..., :n, :]  # type: ignore[index]
        rows = mx.arange(self.offset.shape[0]) == i
        self.left_padding = mx.where(rows, self._idx - n, self.left_padding)
        self.offset = mx.where(rows, n, self.offset)
        if self.gaps is not None:
            self.gaps = self.gaps & ~rows[:, None]

    def extend(self, other):
        if self.gaps is None and other.gaps is None:
            return super().extend(other)
        a, b = self._idx, other._idx
        mine, theirs = self._gaps(a), other._gaps(b)  # taken before the rows are joined (`_gaps` sizes by the rows)
        super().extend(other)
        m = self._idx
        self.gaps = mx.concatenate([mx.pad(mine, [(0, 0), (m - a, 0)]), mx.pad(theirs, [(0, 0), (m - b, 0)])])


def batchable(cache: Sequence) -> bool:
    """Whether a generation's cache can join others: plain KV caches and rewindable recurrent ones."""
    return all(
        type(c) is KVCache or (isinstance(c, RewindableCache) and not isinstance(c, RewindableRows)) for c in cache
    )


def _merge(cache: Sequence) -> list:
    """A joint cache of one row from a generation's cache (copied, never changed)."""
    return [recurrent.joint(c) if isinstance(c, RewindableCache) else RaggedKVCache.of(c) for c in cache]


def _extract(joint: list, i: int, tokens: int) -> list:
    """Row i's cache as a generation's own, its first `tokens` tokens, copied now (not holding the joint buffers)."""
    out = [c.extract(i) for c in joint]
    for c in out:
        n = c.offset - tokens
        if c.trim(n) < n:  # a recurrent row trims only within the pass it was last rewound in
            raise ValueError(f"row {i} cannot be trimmed back {n} tokens")
    mx.eval([c.state for c in out])
    return out


Owner = TypeVar("Owner")


class Rows(Generic[Owner]):
    """The cache the rows run over (`layers`, [] without rows) and the row in each of its places (`owners`; None: a
    row left)."""

    def __init__(self):
        self.layers: list = []
        self.owners: list[Owner | None] = []

    @property
    def joint(self) -> bool:
        return len(self.owners) > 1

    def index(self, owner: Owner) -> int:
        return next(i for i, o in enumerate(self.owners) if o is owner)

    def paddable(self) -> bool:
        """Whether dummy positions may pad a pass (attention caches only: they are dropped like any position)."""
        return all(type(c) is (RaggedKVCache if self.joint else KVCache) for c in self.layers)

    def columns(self) -> int:
        """The longest row's columns (1 where no layer is attention)."""
        return max([c.size() for c in self.layers if isinstance(c, (KVCache, BatchKVCache))], default=1)

    def add(self, owner: Owner, cache: list) -> None:
        """A row whose `cache` holds its context but the last: alone as it is, else copied into a free or new place."""
        if not self.owners:
            self.layers, self.owners = cache, [owner]
            return
        if not self.joint:
            self.layers = _merge(self.layers)
        free = next((i for i, o in enumerate(self.owners) if o is None), None)
        if free is not None and all(
            isinstance(c, RaggedKVCache)
            and type(o) is KVCache
            and c.keys is not None
            and o.keys is not None
            and o.offset <= c.size()
            for c, o in zip(self.layers, cache)
        ):
            for c, o in zip(self.layers, cache):
                c.put(free, o)
            self.owners[free] = owner
            return
        for mine, new in zip(self.layers, _merge(cache)):
            mine.extend(new)
        self.owners.append(owner)

    def remove(self, owner: Owner, tokens: int) -> list:
        """Take a row out: its cache, holding its first `tokens` tokens (a lone row's own, trimmed)."""
        i = self.index(owner)
        if not self.joint:
            out, self.layers, self.owners = self.layers, [], []
            if not rewind(out, tokens):
                raise ValueError(f"the row's cache cannot be trimmed back to {tokens} tokens")
            return out
        out = _extract(self.layers, i, tokens)
        self.owners[i] = None  # runs along until a new row takes it or the rows are packed
        if not any(o is not None for o in self.owners):
            self.layers, self.owners = [], []
        return out

    def pack(self, tokens: Sequence[int]) -> None:
        """Drop the places of rows that left; the row left alone gets a cache of its own (holding `tokens[0]`)."""
        keep = [i for i, o in enumerate(self.owners) if o is not None]
        if len(keep) == 1:
            self.layers, self.owners = _extract(self.layers, keep[0], tokens[0]), [self.owners[keep[0]]]
            return
        for c in self.layers:
            c.filter(keep)
        mx.eval([c.state for c in self.layers])
        self.owners = [self.owners[i] for i in keep]

    def keep(self, kept: Sequence[int], fed: int) -> None:
        """A lone row keeps, of the `fed` positions of the last pass, those at indices `kept`, in order (a draft
        tree's path); the others are dropped. Plain attention caches only."""
        idx = mx.array(list(kept))
        for c in self.layers:
            start = c.offset - fed
            for name in ("keys", "values"):
                a = getattr(c, name)
                a[..., start : start + len(kept), :] = a[..., start + idx, :]
            c.offset = start + len(kept)

    def start_round(self) -> None:
        """What the cache holds now is final: a round's rewind goes back no further than this."""
        recurrent.commit(self.layers)

    def rewind(self, drop: Sequence[int]) -> None:
        """Drop each place's last `drop[i]` positions (of the passes since `start_round`): a recurrent layer replays
        each row's kept part; an attention layer trims the part common to all and leaves the rest as a gap."""
        if not self.joint:
            for c in self.layers:
                if drop[0] and c.trim(drop[0]) < drop[0]:
                    raise ValueError(f"the cache cannot be trimmed back {drop[0]} tokens")
            return
        common = min(drop)
        extra = [n - common for n in drop]
        for c in self.layers:
            if isinstance(c, RewindableRows):
                c.trim_rows(list(drop))
                continue
            if common:
                c.trim(common)
            if any(extra):
                c.drop(extra)
