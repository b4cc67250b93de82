"""Sliding-window and chunked attention caches that rewind: the window (a chunk) and a round's positions more, held
in temporal order; the mask of a joint cache's rows by their positions.

mlx-lm's `RotatingKVCache` writes in place over its oldest position once full, so a rejected draft cannot be taken
back past the window; these hold `room` positions beyond it (the masks take the window apart from what is held).
"""

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import ChunkedKVCache, KVCache, RotatingKVCache

ROOM = 64  # positions held past the window: more than a round writes (a self draft's 15 passes, a 32-position verify)


class SlidingKVCache(KVCache):
    """A sliding-window layer's cache: positions [start, offset) in columns [0, offset - start), at least the last
    `window - 1 + room`; the older ones are dropped a step at a time, when the round commits (`forget`)."""

    keys: Any  # (B, n_kv_heads, columns, head_dim), None before the first update (mlx-lm leaves them untyped)
    values: Any

    def __init__(self, window: int, room: int = ROOM):
        super().__init__()
        self.window, self.room, self.start = window, room, 0

    @classmethod
    def of(cls, cache: RotatingKVCache) -> "SlidingKVCache | None":
        """The same positions as a rotating cache that has not wrapped yet (None where it has, or keeps a prefix)."""
        if cache.keep or not cache.is_trimmable():
            return None
        out = cls(cache.max_size)
        if cache.offset:
            keys, values = cache.state[:2]  # (not wrapped: in order, from position 0)
            out.keys, out.values = keys[..., : cache.offset, :], values[..., : cache.offset, :]
            out.offset = cache.offset
        return out

    def held(self) -> int:
        return self.offset - self.start

    def update_and_fetch(self, keys, values):
        prev = self.held()
        if self.keys is None or prev + keys.shape[2] > self.keys.shape[2]:
            B, n_kv_heads, S, k_head_dim = keys.shape
            grow = ((S + self.step - 1) // self.step) * self.step
            new_k = mx.zeros((B, n_kv_heads, grow, k_head_dim), keys.dtype)
            new_v = mx.zeros((B, n_kv_heads, grow, values.shape[3]), values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :prev, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], new_v], axis=2)
        self.offset += keys.shape[2]
        self.keys[..., prev : self.held(), :] = keys
        self.values[..., prev : self.held(), :] = values
        return self.keys[..., : self.held(), :], self.values[..., : self.held(), :]

    def size(self) -> int:
        return self.held()

    @property
    def state(self):
        return self.keys[..., : self.held(), :], self.values[..., : self.held(), :]

    @state.setter
    def state(self, v):
        self.keys, self.values = v
        self.offset = self.start + self.keys.shape[2]

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the last n positions, as far as the window stays whole behind the new end."""
        floor = self.start + self.window - 1 if self.start else 0
        n = max(0, min(n, self.offset - floor))
        self.offset -= n
        return n

    def forget(self) -> None:
        """Drop the positions no query can see again, even after a round's rewind (at least a step of them)."""
        excess = self.held() - (self.window - 1 + self.room)
        if excess >= self.step:
            self.keys = mx.contiguous(self.keys[..., excess : self.held(), :])
            self.values = mx.contiguous(self.values[..., excess : self.held(), :])
            self.start += excess

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs):
        window = window_size or self.window
        if return_array or self.held() + N > window:
            return create_causal_mask(N, self.held(), window_size=window)
        return None if N == 1 else "causal"

    def to_quantized(self, group_size: int = 64, bits: int = 4):
        raise NotImplementedError("a sliding window's cache is not quantized")


class RoomyChunkedKVCache(ChunkedKVCache):
    """llama4's chunked attention cache keeping `room` positions more than a chunk: a round written in several passes
    (a self draft's) rewinds without losing the start of the chunk its queries attend to."""

    keys: Any  # as `SlidingKVCache`'s
    values: Any

    def __init__(self, chunk_size: int, room: int = ROOM):
        super().__init__(chunk_size)
        self.room = room

    @classmethod
    def of(cls, cache: ChunkedKVCache) -> "RoomyChunkedKVCache":
        out = cls(cache.chunk_size)
        out.keys, out.values, out.offset, out.start_position = (
            cache.keys,
            cache.values,
            cache.offset,
            cache.start_position,
        )
        return out

    def maybe_trim_front(self):
        """(llama4 calls this before each pass) Drop what is older than a chunk and the room, a step at a time."""
        held = self.offset - self.start_position
        cut = held - (self.chunk_size + self.room)
        if self.keys is not None and cut >= self.step:
            self.start_position += cut
            self.keys, self.values = self.keys[..., cut:held, :], self.values[..., cut:held, :]


def position_mask(
    valid: mx.array, offset: mx.array, N: int, window: int | None = None, chunk: int | None = None
) -> mx.array:
    """(B, 1, N, C + N) mask of N new positions per row over C held columns plus themselves, by position: `valid`
    (B, C) marks the columns holding a row's positions (its latest, in order), `offset` (B,) the next position. A
    query sees its row's positions up to its own: the last `window` of them, or those in its `chunk` (llama4's)."""
    count = valid.sum(axis=1)
    held = (offset - count)[:, None] + mx.cumsum(valid.astype(mx.int32), axis=1) - 1  # (B, C) position of a column
    new = offset[:, None] + mx.arange(N)[None]  # (B, N)
    keys = mx.concatenate([held, new], axis=1)[:, None, :]  # (B, 1, C + N)
    seen = mx.concatenate([valid, mx.ones(new.shape, dtype=mx.bool_)], axis=1)[:, None, :]
    q = new[:, :, None]  # (B, N, 1)
    mask = seen & (keys <= q)
    if window is not None:
        mask = mask & (keys > q - window)
    if chunk is not None:
        mask = mask & (keys // chunk == q // chunk)
    return mask[:, None]
