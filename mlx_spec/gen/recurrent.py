"""Rewinding recurrent layers (gated delta nets, Mamba, LFM2's convolutions), which mlx-lm cannot trim: a trim restores
a recorded call's starting state and replays the token mixer on the part kept; the caller's model and caches stay."""

import functools
import inspect
import weakref

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from ..errors import UnsupportedError
from ..make.layers import per_model, with_blocks
from ..models.base import holder_of
from .tunables import RECURRENT_CALLS as MAX_CALLS
from .tunables import RECURRENT_RECORD as MAX_RECORD

# (mixer, norm) attribute pairs of recurrent blocks in mlx-lm: qwen3_next / qwen3_5, mamba / mamba2, lfm2.
MIXERS = (("linear_attn", "input_layernorm"), ("mixer", "norm"), ("conv", "operator_norm"))
_HELD: "weakref.WeakKeyDictionary[ArraysCache, int]" = weakref.WeakKeyDictionary()  # tokens a wrapped state holds


def _through(name: str):
    """An attribute read and written on the wrapped cache."""
    return property(lambda self: getattr(self.inner, name), lambda self, v: setattr(self.inner, name, v))


class RewindableCache(ArraysCache):
    """A recurrent layer's cache as the engine sees it: an mlx-lm `ArraysCache`'s state, its tokens, its calls."""

    cache, left_padding, lengths = _through("cache"), _through("left_padding"), _through("lengths")

    def __init__(self, inner: ArraysCache, offset=0):
        self.inner, self.offset = inner, offset
        self._calls: list[tuple] = []  # (states before, layer, x, mask, offset) of each call since the last commit

    def _held(self) -> None:
        _HELD[self.inner] = self.offset  # a later generation over the caller's cache knows what it holds

    def record(self, layer, x, mask) -> None:
        """A call of `layer` on input x is about to run from the state held now."""
        if x.shape[1] > MAX_RECORD:
            self._calls.clear()
        else:
            self._calls.append((list(self.cache), layer, x, mask, self.offset + x.shape[1]))
            del self._calls[:-MAX_CALLS]

    def advance(self, n: int) -> None:
        """The layer's mixer took n tokens (mlx-lm's recurrent mixers call this after each update)."""
        super().advance(n)
        self.offset = self.offset + n
        self._held()

    def commit(self) -> None:
        """Forget the history: what is held now is final (frees the recorded inputs and old states)."""
        self._calls.clear()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens; returns how many were dropped (fewer if the history does not reach)."""
        done = 0
        while done < n and self._calls and self._calls[-1][4] == self.offset:  # (not where a pass went unrecorded)
            state, layer, x, mask, _ = self._calls.pop()
            self.cache = list(state)
            length = x.shape[1]
            self.offset -= length
            keep = length - (n - done)
            if keep <= 0:
                done += length
                continue
            x, mask = x[:, :keep], (mask[..., :keep] if mask is not None else None)
            _replay(layer, x, mask, self)  # advances the offset by keep
            self._calls.append((list(state), layer, x, mask, self.offset))
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
            call = before, layer, x, mask, _ = self._calls.pop()
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
                    _replay(layer, x[idx, :keep], _take(mask, rows, keep), part)
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

    def extract(self, idx: int) -> RewindableCache:
        """Row idx as a generation's own rewindable cache, trimmable within the call it was last rewound in."""
        inner = ArraysCache(len(self.cache))
        inner.cache = [None if s is None else s[idx : idx + 1] for s in self.cache]
        out = RewindableCache(inner, self.offset[idx].item())
        row = self._rows[idx]
        if row is not None:
            (before, layer, x, mask, _), i, k = row
            out._calls.append(
                (
                    [None if s is None else s[i : i + 1] for s in before],
                    layer,
                    x[i : i + 1, :k],
                    _take(mask, [i], k),
                    out.offset,
                )
            )
        return out


def joint(cache: RewindableCache) -> RewindableRows:
    """A joint cache of one row holding `cache`'s state (`cache` itself is not changed)."""
    inner = ArraysCache(len(cache.cache))
    inner.cache = list(cache.cache)
    return RewindableRows(inner, mx.array([cache.offset]))


def _take(mask, rows: list[int], keep: int):
    """The given rows' first `keep` positions of a recorded (rows, positions) mask."""
    return None if mask is None else mask[mx.array(rows)][..., :keep]


def _replay(layer, x, mask, cache) -> None:
    """Run `layer`'s token mixer on `x` from the restored state: the cache ends at the state after `x`."""
    run, inputs = layer, x  # an unknown block: the whole block, its output dropped
    for mixer_name, norm_name in MIXERS:
        mixer, norm = getattr(layer, mixer_name, None), getattr(layer, norm_name, None)
        if callable(mixer) and callable(norm):
            run, inputs = mixer, norm(x)
            break
    masked = "mask" in _signature(type(run).__call__).parameters
    run(inputs, **({"mask": mask} if masked else {}), cache=cache)


@functools.cache
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


class Recorder(nn.Module):
    """A recurrent block that records each call over a rewindable cache, then runs unchanged."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def __call__(self, x, *args, **kwargs):
        bound = _signature(type(self.block).__call__).bind(self.block, x, *args, **kwargs).arguments
        cache = bound.get("cache")
        if isinstance(cache, RewindableCache):
            cache.record(self.block, x, bound.get("mask"))
        return self.block(x, *args, **kwargs)

    def __getattr__(self, name):
        if name == "block" or name in self:  # an mlx Module keeps its children in itself, a dict
            return super().__getattr__(name)
        return getattr(self["block"], name)  # what the model reads of its blocks (e.g. `is_linear`)


_VIEWS: dict[int, object] = {}


def recording(model):
    """`model`, or a view of it whose recurrent blocks record their calls (made once per model, the model unchanged)."""
    return per_model(_VIEWS, model, id(model), lambda: _recording(model))


def _recording(model):
    layers = getattr(model, "layers", None)
    idx = (
        [
            i
            for i, c in enumerate(make_prompt_cache(model))
            if isinstance(c, ArraysCache) and not isinstance(layers[i], Recorder)
        ]
        if layers is not None
        else []
    )  # its recurrent blocks
    if not idx:
        return model
    holder = holder_of(model)  # the module holding the blocks (`model.layers` may be a copy of its list)
    if holder is None:
        raise UnsupportedError(
            f"{type(model).__name__}: recurrent layers rewind only in an mlx-lm model whose "
            "blocks a submodule holds (model.model.layers, model.backbone.layers)"
        )
    return with_blocks(model, [Recorder(b) if i in idx else b for i, b in enumerate(layers)], holder)


def rewindable(cache: list) -> list | None:
    """The engine's view of a cache, recurrent entries wrapped to rewind; None where a state's length is unknown."""
    if all(not isinstance(c, ArraysCache) or isinstance(c, RewindableCache) for c in cache):
        return cache
    out = []
    for c in cache:
        if isinstance(c, ArraysCache) and not isinstance(c, RewindableCache):
            held = _HELD.get(c, 0 if c.empty() else None)
            if held is None:
                return None
            c = RewindableCache(c, held)
        out.append(c)
    return out


def commit(cache: list) -> None:
    """What every rewindable layer of `cache` holds now is final (its history is freed)."""
    for c in cache:
        if isinstance(c, RewindableCache):
            c.commit()
