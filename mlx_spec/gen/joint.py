"""The rows' cache: a lone row's own, or one joint `BatchKVCache` with gaps, so each row rewinds by its own count."""

from collections.abc import Sequence
from typing import Generic, TypeVar

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from ..models.cache import CacheGroup, RaggedKVCache, RewindableCache, RewindableRows, commit
from ..models.window import RoomyChunkedKVCache, SlidingKVCache
from .cache import rewind


def batchable(cache: Sequence) -> bool:
    """Whether a generation's cache can join others: plain, sliding-window and chunked KV caches, rewindable recurrent
    ones, and layers of several of these."""
    return all(
        type(c) in (KVCache, SlidingKVCache, RoomyChunkedKVCache)
        or (isinstance(c, RewindableCache) and not isinstance(c, RewindableRows))
        or (isinstance(c, CacheGroup) and batchable(c.caches))
        for c in cache
    )


def _merge(cache: Sequence) -> list:
    """A joint cache of one row from a generation's cache (copied, never changed)."""
    return [
        RewindableRows.of(c)
        if isinstance(c, RewindableCache)
        else CacheGroup(*_merge(c.caches))
        if isinstance(c, CacheGroup)
        else RaggedKVCache.of(c)
        for c in cache
    ]


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


class JointCache(Generic[Owner]):
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
        commit(self.layers)

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
        for c in (m for layer in self.layers for m in (layer.caches if isinstance(layer, CacheGroup) else (layer,))):
            if isinstance(c, RewindableRows):
                c.trim_rows(list(drop))
                continue
            if common:
                c.trim(common)
            if any(extra):
                c.drop(extra)
