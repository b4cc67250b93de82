"""Caches mlx-lm lacks, kept beside the models as mlx-lm keeps its own (`mlx_lm.models.cache`): a batch KV cache
whose rows may have gaps, and recurrent layers' caches (gated delta nets, Mamba, LFM2's convolutions) that rewind,
which mlx-lm cannot trim: a trim restores a recorded call's starting state and replays the token mixer on the part kept.
"""

import copy
import functools
import inspect
import weakref

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import ArraysCache, BatchKVCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache

from .window import ROOM, RoomyChunkedKVCache, SlidingKVCache, position_mask

MAX_CALLS = 64  # calls of a layer kept for rewinding: more than a round makes (K draft passes + the verify)
MAX_RECORD = 256  # a longer call (a prefill chunk) is not kept: trimming into it reports failure
# (mixer, norm) attribute pairs of recurrent blocks in mlx-lm: qwen3_next / qwen3_5, mamba / mamba2, lfm2,
# bailing_moe_linear.
MIXERS = (
    ("linear_attn", "input_layernorm"),
    ("mixer", "norm"),
    ("conv", "operator_norm"),
    ("attention", "input_layernorm"),
)
_HELD: "weakref.WeakKeyDictionary[ArraysCache, int]" = weakref.WeakKeyDictionary()  # tokens a wrapped state holds


def _through(name: str):
    """An attribute read and written on the wrapped cache."""
    return property(lambda self: getattr(self.inner, name), lambda self, v: setattr(self.inner, name, v))


class RewindableCache(ArraysCache):
    """A recurrent layer's cache as the engine sees it: an mlx-lm `ArraysCache`'s state, its tokens, its calls."""

    cache, left_padding, lengths = _through("cache"), _through("left_padding"), _through("lengths")

    def __init__(self, inner: ArraysCache, offset=0):
        self.inner, self.offset = inner, offset
        self._calls: list[tuple] = []  # (states before, layer, x, kwargs, offset) of each call since the last commit
        self._advanced = False  # whether the running call's mixer advanced the cache itself

    def _held(self) -> None:
        _HELD[self.inner] = self.offset  # a later generation over the caller's cache knows what it holds

    def record(self, layer, x, kw: dict) -> None:
        """A call of `layer` on input x (and keyword arguments `kw`: its mask, a position) is about to run from the
        state held now."""
        if x.shape[1] > MAX_RECORD:
            self._calls.clear()
        else:
            self._calls.append((list(self.cache), layer, x, kw, self.offset + x.shape[1]))
            del self._calls[:-MAX_CALLS]

    def advance(self, n: int) -> None:
        """The layer's mixer took n tokens (mlx-lm's recurrent mixers call this after each update)."""
        super().advance(n)
        self._step(n)

    def _step(self, n: int) -> None:
        self.offset = self.offset + n
        self._advanced = True
        self._held()

    def counted(self, run, n: int):
        """`run()`, a call over n tokens; where the mixer updates its state without `advance` (bailing_moe_linear's
        linear attention), the n tokens are counted here."""
        self._advanced = False
        out = run()
        if not self._advanced:
            self._step(n)
        return out

    def commit(self) -> None:
        """Forget the history: what is held now is final (frees the recorded inputs and old states)."""
        self._calls.clear()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens; returns how many were dropped (fewer if the history does not reach)."""
        done = 0
        while done < n and self._calls and self._calls[-1][4] == self.offset:  # (not where a pass went unrecorded)
            state, layer, x, kw, _ = self._calls.pop()
            self.cache = list(state)
            length = x.shape[1]
            self.offset -= length
            keep = length - (n - done)
            if keep <= 0:
                done += length
                continue
            x, kw = x[:, :keep], _take(kw, None, keep, x.shape[1])
            _replay(layer, x, kw, self)  # advances the offset by keep
            self._calls.append((list(state), layer, x, kw, self.offset))
            done = n
        self._held()
        return done


class RewindableRows(RewindableCache):
    """A joint recurrent cache, one row per generation, each with its offset and rewound by its own count; each row
    keeps the call it was last rewound in (until `commit`), so a row taken out can still be trimmed within it."""

    def __init__(self, inner: ArraysCache, offset: mx.array):
        super().__init__(inner, offset)
        # each row's (call, index in it, tokens of it kept) to replay on extraction; None: its state is final
        self._rows: list[tuple | None] = [None] * offset.size

    def _held(self) -> None:
        pass  # the state is the engine's own

    @property
    def batch_size(self) -> int:
        return self.offset.size  # (mlx-lm's counts 1 while every state is still None)

    def commit(self) -> None:
        self._calls.clear()
        self._rows = [None] * len(self._rows)

    def trim_rows(self, drop: list[int]) -> None:
        """Drop row i's last `drop[i]` positions, across recorded calls: each row's state is restored to before the
        call its kept part ends in and that part replayed, the rows keeping as many of a call in one replay."""
        left, parts, index = list(drop), [self.cache], list(range(len(drop)))
        count, last = len(drop), True
        self._rows = [None] * len(drop)
        while self._calls and (last or any(left)):
            call = before, layer, x, kw, _ = self._calls.pop()
            width = x.shape[1]
            groups: dict[int, list[int]] = {}
            for i, d in enumerate(left):
                if last and not d:
                    self._rows[i] = (call, i, width)  # keeps all: the state after the pass
                elif 0 < d <= width:
                    groups.setdefault(width - d, []).append(i)
                    left[i] = 0
                elif d > width:
                    left[i] = d - width
            for keep, rows in groups.items():
                idx = mx.array(rows)
                part = ArraysCache(len(before))
                # mlx-lm leaves ArraysCache.cache unannotated: [None] * size until the first update
                part.cache = [mx.zeros_like(a[idx]) if s is None else s[idx] for s, a in zip(before, self.cache)]  # type: ignore[misc]
                if keep:
                    _replay(layer, x[idx, :keep], _take(kw, rows, keep, width), part)
                parts.append(part.cache)
                for j, i in enumerate(rows):
                    index[i], self._rows[i] = count + j, (call, i, keep) if keep else None
                count += len(rows)
            last = False
        if any(left):
            raise ValueError("a row cannot be rewound past the calls recorded since the last rewind or commit")
        if len(parts) > 1:  # each row's state: the last pass's (a row that kept all) or its replay's
            where = mx.array(index)
            self.cache = [mx.concatenate([p[e] for p in parts])[where] for e in range(len(self.cache))]
        self.offset = self.offset - mx.array(drop)
        self._calls.clear()

    def filter(self, batch_indices) -> None:
        super().filter(mx.array(batch_indices))
        self.offset = self.offset[mx.array(batch_indices)]
        self._rows = [self._rows[i] for i in batch_indices]

    def extend(self, other) -> None:
        super().extend(other)
        self.offset = mx.concatenate([self.offset, other.offset])
        self._rows += other._rows

    @classmethod
    def of(cls, cache: RewindableCache) -> "RewindableRows":
        """A joint cache of one row holding `cache`'s state (`cache` itself is not changed)."""
        inner = ArraysCache(len(cache.cache))
        inner.cache = list(cache.cache)
        return cls(inner, mx.array([cache.offset]))

    def extract(self, idx: int) -> RewindableCache:
        """Row idx as a generation's own rewindable cache, trimmable within the call it was last rewound in."""
        inner = ArraysCache(len(self.cache))
        inner.cache = [None if s is None else s[idx : idx + 1] for s in self.cache]
        out = RewindableCache(inner, self.offset[idx].item())
        row = self._rows[idx]
        if row is not None:
            (before, layer, x, kw, _), i, k = row
            state = [None if s is None else s[i : i + 1] for s in before]
            out._calls.append((state, layer, x[i : i + 1, :k], _take(kw, [i], k, x.shape[1]), out.offset))
        return out


def _take(kw: dict, rows: list[int] | None, keep: int, length: int) -> dict:
    """A recorded call's keyword arguments for the given rows (None: all) and its first `keep` of `length` positions:
    the mask is (rows, ..., positions), another input of the call's positions (rwkv7's `v_first`) (rows, positions,
    ...), a per-row array (a position) (rows,)."""
    out = dict(kw)
    for name, v in kw.items():
        if not isinstance(v, mx.array):
            continue
        if v.ndim and rows is not None:
            v = v[mx.array(rows)]
        if name == "mask":
            v = v[..., :keep]
        elif v.ndim >= 2 and v.shape[1] == length:
            v = v[:, :keep]
        out[name] = v
    return out


def _replay(layer, x, kw: dict, cache) -> None:
    """Run `layer`'s token mixer on `x` from the restored state: the cache ends at the state after `x`."""
    run, inputs = layer, x  # an unknown block: the whole block, its output dropped
    for mixer_name, norm_name in MIXERS:
        mixer, norm = getattr(layer, mixer_name, None), getattr(layer, norm_name, None)
        if callable(mixer) and callable(norm):
            run, inputs = mixer, norm(x)
            break
    takes = _signature(type(run).__call__).parameters
    args = {k: v for k, v in kw.items() if k in takes}
    if isinstance(cache, RewindableCache):
        cache.counted(lambda: run(inputs, **args, cache=cache), x.shape[1])
    else:
        run(inputs, **args, cache=cache)


@functools.cache
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


def _takes_cache(module: nn.Module) -> bool:
    return not isinstance(module, Recorder) and "cache" in _signature(type(module).__call__).parameters


class Recorder(nn.Module):
    """A recurrent block that records each call over a rewindable cache (or a layer's several caches, one of them
    rewindable), then runs unchanged."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    @classmethod
    def inside(cls, block):
        """A copy of `block` (a layer of several caches: mlx-lm's CacheList) whose submodules that take a cache record
        their calls; `block` itself is not changed."""
        takes = [n for n, c in block.children().items() if isinstance(c, nn.Module) and _takes_cache(c)]
        out = copy.copy(block) if takes else block  # (a block recording already: its children are Recorders)
        for name in takes:
            setattr(out, name, cls(block[name]))
        return out

    def __call__(self, *args, **kwargs):
        bound = _signature(type(self.block).__call__).bind(self.block, *args, **kwargs).arguments
        cache, layer = bound.get("cache"), self.block
        if isinstance(cache, CacheGroup):  # the block takes the layer's whole list: replayed with its recurrent member
            slot = next((i for i, m in enumerate(cache.caches) if isinstance(m, RewindableCache)), None)
            if slot is not None:
                cache, layer = cache.caches[slot], InGroup(self.block, slot, cache.caches)
        if not isinstance(cache, RewindableCache):
            return self.block(*args, **kwargs)
        (_, x), *rest = list(bound.items())[1:]  # (past the block itself: its input, then the rest)
        cache.record(layer, x, {k: v for k, v in rest if k != "cache"} | {"mask": bound.get("mask")})
        return cache.counted(lambda: self.block(*args, **kwargs), x.shape[1])

    def __getattr__(self, name):
        if name == "block" or name in self:  # an mlx Module keeps its children in itself, a dict
            return super().__getattr__(name)
        return getattr(self["block"], name)  # what the model reads of its blocks (e.g. `is_linear`)


class InGroup:
    """A module that takes a layer's whole list of caches, replayed over its recurrent member alone: the other members
    fresh, no mask (the replay's output is dropped; only the recurrent state it leaves is kept)."""

    def __init__(self, module, slot: int, members):
        self.module, self.slot = module, slot
        self.fresh = [
            functools.partial(ArraysCache, len(m.cache)) if isinstance(m, ArraysCache) else KVCache for m in members
        ]

    def __call__(self, x, cache):
        self.module(x, cache=CacheList(*(cache if i == self.slot else new() for i, new in enumerate(self.fresh))))


class CacheGroup(CacheList):
    """mlx-lm's `CacheList` (one layer's several caches: deepseek_v32's two attentions, falcon_h1's and baichuan_m1's
    recurrent state beside attention) as the engine sees it: the tokens it holds, rewound, joined and taken apart
    member by member."""

    @property
    def offset(self):
        return next(c.offset for c in self.caches if hasattr(c, "offset"))

    def trim(self, n: int) -> int:
        return min(c.trim(n) for c in self.caches)

    def extract(self, idx):
        return CacheGroup(*(c.extract(idx) for c in self.caches))

    def size(self) -> int:
        return max(c.size() for c in self.caches)


def rewindable(cache: list) -> list | None:
    """The engine's view of a cache: recurrent entries wrapped to rewind, sliding windows held with room to rewind (a
    window that wrapped already stays as it is); None where a recurrent state's length is unknown."""
    kinds = (ArraysCache, RotatingKVCache, CacheList, ChunkedKVCache)
    if all(
        not isinstance(c, kinds) or isinstance(c, (RewindableCache, CacheGroup, RoomyChunkedKVCache)) for c in cache
    ):
        return cache
    out = []
    for c in cache:
        if isinstance(c, ArraysCache) and not isinstance(c, RewindableCache):
            held = _HELD.get(c, 0 if c.empty() else None)
            if held is None:
                return None
            c = RewindableCache(c, held)
        elif isinstance(c, RotatingKVCache):
            c = SlidingKVCache.of(c) or c
        elif isinstance(c, ChunkedKVCache) and not isinstance(c, RoomyChunkedKVCache):
            c = RoomyChunkedKVCache.of(c)
        elif isinstance(c, CacheList) and not isinstance(c, CacheGroup):
            members = rewindable(list(c.caches))
            if members is None:
                return None
            c = CacheGroup(*members)
        out.append(c)
    return out


def unrewindable(cache: list, blocks: int | None = None) -> str | None:
    """Why a draft cannot be taken back from `cache` (a layer kind mlx-spec does not rewind), or None where it can;
    blocks: the model's count of blocks (a recurrent state that is no block's is replayed by none)."""
    if blocks is not None and len(cache) != blocks and any(isinstance(c, ArraysCache) for c in cache):
        return "it keeps a state beside its blocks' caches (not one cache per block)"
    for c in cache:
        for m in c.caches if isinstance(c, CacheList) else (c,):
            if isinstance(m, (KVCache, RewindableCache, BatchKVCache)):
                continue
            if isinstance(m, RotatingKVCache):
                return "a sliding-window cache that already wrapped past its window cannot rewind"
            if not m.is_trimmable():
                return f"its {type(m).__name__} layers cannot rewind"
    return None


def commit(cache: list) -> None:
    """What every rewindable layer of `cache` holds now is final (its history is freed, a window's old positions)."""
    for c in cache:
        if isinstance(c, RewindableCache):
            c.commit()
        elif isinstance(c, (SlidingKVCache, RaggedKVCache)):
            c.forget()
        elif isinstance(c, CacheGroup):
            commit(list(c.caches))


class RaggedKVCache(BatchKVCache):
    """A `BatchKVCache` whose rows may have gaps: `gaps[i, j]` is True where row i's column j holds a position the
    row dropped (`drop`). The one place mlx-spec reads `BatchKVCache`'s internals (`_idx`: the columns in use)."""

    gaps: mx.array | None = None
    window: int | None = None  # a sliding window's: rows see their last `window` positions (`SlidingKVCache`)
    chunk: int | None = None  # llama4's chunked attention: rows see their positions in their own chunk
    room: int = ROOM

    @classmethod
    def of(cls, cache: KVCache | RoomyChunkedKVCache) -> "RaggedKVCache":
        """A joint cache of one row holding a copy of `cache`'s positions."""
        if isinstance(cache, SlidingKVCache):
            start = cache.start
        elif isinstance(cache, RoomyChunkedKVCache):
            start = cache.start_position
        else:
            return cls.merge([cache]) if cache.keys is not None else cls([0])
        held = KVCache()
        if cache.keys is not None:
            held.offset = cache.offset - start
            held.keys, held.values = cache.keys[..., : held.offset, :], cache.values[..., : held.offset, :]
        out = cls.merge([held]) if held.offset else cls([0])
        out.offset = mx.array([cache.offset])  # each row's next position: what RoPE reads
        if isinstance(cache, SlidingKVCache):
            out.window, out.room = cache.window, cache.room
        else:
            out.chunk, out.room = cache.chunk_size, cache.room
        return out

    @property
    def span(self) -> int | None:
        """The most recent positions a query may see (a window, or a chunk at most), or None: all of them."""
        return self.window or self.chunk

    def _valid(self, width: int) -> mx.array:
        """(B, width) which of the first `width` columns hold a row's positions (not padding, not a gap)."""
        return (mx.arange(width)[None] >= self.left_padding[:, None]) & ~self._gaps(width)

    def forget(self) -> None:
        """A sliding window's (a chunk's) columns that no row can see again, even after a round's rewind, are dropped
        (at least a step of them)."""
        span = self.span
        if span is None or self.keys is None or self._idx < span - 1 + self.room + self.step:
            return
        valid = self._valid(self._idx)
        first = self.offset - valid.sum(axis=1)  # each row's oldest position held
        pos = first[:, None] + mx.cumsum(valid.astype(mx.int32), axis=1) - 1
        needed = valid & (pos >= (self.offset - (span - 1 + self.room))[:, None])
        cut = int(mx.min(mx.where(needed.any(axis=1), mx.argmax(needed, axis=1), self._idx)).item())
        if cut < self.step:
            return
        self.keys = mx.contiguous(self.keys[..., cut : self._idx, :])
        self.values = mx.contiguous(self.values[..., cut : self._idx, :])
        self.gaps = self.gaps[:, cut : self._idx] if self.gaps is not None else None
        self.left_padding = mx.maximum(self.left_padding - cut, 0)
        self._idx -= cut

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

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs):
        window = window_size or self.window
        if window is not None or self.chunk is not None:  # by position: a gap's columns are no positions
            return position_mask(self._valid(self._idx), self.offset, N, window, self.chunk)
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)
        return mask if self.gaps is None else mask & ~self._gaps(self._idx + N)[:, None, None, :]

    def _columns(self, i: int) -> list[int]:
        """Row i's columns that hold its positions, in order."""
        start = int(self.left_padding[i])
        gap: list[bool] = self._gaps(self._idx)[i].tolist()  # type: ignore[assignment]  # mlx: a scalar or a list
        return [j for j in range(start, self._idx) if not gap[j]]

    def _arrays(self) -> tuple[mx.array, mx.array]:
        """The keys and values (a cache with gaps holds positions; mlx-lm types the fields as their initial None)."""
        return self.keys, self.values  # type: ignore[return-value]

    def extract(self, idx):
        if self.gaps is None and self.span is None:
            return super().extract(idx)
        cache: KVCache | RoomyChunkedKVCache = KVCache()
        if self.window is not None:
            cache = SlidingKVCache(self.window, self.room)
        elif self.chunk is not None:
            cache = RoomyChunkedKVCache(self.chunk, self.room)
        cols = mx.array(self._columns(idx))
        keys, values = self._arrays()
        cache.keys = mx.contiguous(mx.take(keys[idx : idx + 1], cols, axis=2))
        cache.values = mx.contiguous(mx.take(values[idx : idx + 1], cols, axis=2))
        cache.offset = cache.keys.shape[2]
        if self.span is not None:
            cache.offset = int(self.offset[idx].item())  # type: ignore[arg-type]  # (an integer array: an int)
            start = cache.offset - cache.keys.shape[2]
            if isinstance(cache, SlidingKVCache):
                cache.start = start
            elif isinstance(cache, RoomyChunkedKVCache):
                cache.start_position = start
        return cache

    def filter(self, batch_indices):
        if self.gaps is None:
            return super().filter(batch_indices)
        # Pack the rows kept: each row's positions right-aligned at the last column, no gaps.
        cols = [self._columns(i) for i in batch_indices]
        width = max(len(c) for c in cols)
        index = mx.array([[0] * (width - len(c)) + c for c in cols])[:, None, :, None]  # (B, 1, width, 1)
        rows = mx.array(batch_indices)
        keys, values = self._arrays()
        self.keys = mx.take_along_axis(keys[rows], index, axis=2)  # type: ignore[assignment]  # typed None, as above
        self.values = mx.take_along_axis(values[rows], index, axis=2)  # type: ignore[assignment]
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
