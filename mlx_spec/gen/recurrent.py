"""Rewinding recurrent layers (gated delta nets, Mamba, LFM2's short convolutions), so that hybrid and
recurrent models can be speculated on.

mlx-lm keeps a recurrent layer's state in an `ArraysCache` of fixed size that cannot be trimmed: after a
verify pass it holds the state after the whole draft, and the state after the accepted prefix is gone.
mlx-lm therefore refuses speculative decoding on these models. Here, each call of a recurrent layer keeps
the state it started from and the layer's input (references to arrays the pass computed anyway, no copy).
Trimming restores the state before the call and runs only that layer's token mixer (its norm and mixer:
no attention layer, no MLP, no head) on the accepted prefix of the recorded input. That costs the mixers'
projections over the accepted tokens, not a second forward pass.

mlx-lm offers no hook for a layer's input, so each recurrent layer instance gets a recording subclass of its
own class (`enable`): parameters, weights and outputs are unchanged, and with a cache that is not ours
it only adds one isinstance check. Written here because no maintained library rewinds these caches.

In a batch (`batch_cache`), a layer's rows share one `RewindableRows` cache: the recording layer records each
batched call into it, and `trim_rows` rewinds each row by its own count, restoring its state before the call
its kept part ends in. The rows keeping the same count of a call replay together, with no padding mask: a mixer
needs no support for mlx-lm's per-row `lengths` (mamba's and olmo_hybrid's have none).
"""

import functools
import inspect
from typing import List, Optional

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from .tunables import RECURRENT_CALLS as MAX_CALLS, RECURRENT_RECORD as MAX_RECORD

# (mixer, norm) attribute pairs of recurrent blocks in mlx-lm: qwen3_next / qwen3_5, mamba / mamba2, lfm2.
MIXERS = (("linear_attn", "input_layernorm"), ("mixer", "norm"), ("conv", "operator_norm"))


class RewindableCache:
    """Mixed into a layer's ArraysCache (its class is swapped by `rewindable`): an offset, a short history
    of calls and `trim`. The history is cleared by `commit` (the engine calls it at the start of each round)."""

    def _start(self, offset: int) -> None:
        self.offset, self._calls = offset, []

    def record(self, layer, x, mask) -> None:
        n = x.shape[1]
        if n > MAX_RECORD:
            self._calls.clear()
        else:
            self._calls.append((list(self.cache), layer, x, mask))
            del self._calls[:-MAX_CALLS]
        self.offset += n

    def commit(self) -> None:
        """Forget the history: what is held now is final (frees the recorded inputs and old states)."""
        self._calls.clear()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens; returns how many were dropped (fewer if the history does not reach)."""
        done = 0
        while done < n and self._calls:
            state, layer, x, mask = self._calls.pop()
            self.cache = list(state)
            length = x.shape[1]
            self.offset -= length
            keep = length - (n - done)
            if keep <= 0:
                done += length
                continue
            x, mask = x[:, :keep], (mask[..., :keep] if mask is not None else None)
            self._calls.append((list(state), layer, x, mask))
            _replay(layer, x, mask, self)
            self.offset += keep
            done = n
        return done


class RewindableRows(RewindableCache):
    """A batch's joint recurrent cache (one row per generation): per-row offsets (an array) and a per-row rewind.

    After `trim_rows`, each row keeps a reference to the call it was rewound in, so a row taken out (`extract`)
    can still be trimmed within it. Rows keep it across `filter` and `extend` until `commit`.
    """

    def _start(self, offset) -> None:
        self.offset, self._calls, self._rows = offset, [], [None] * offset.size

    @property
    def batch_size(self) -> int:
        return self.offset.size  # (mlx-lm's counts 1 while every state is still None)

    def commit(self) -> None:
        self._calls.clear()
        self._rows = [None] * len(self._rows)

    def trim_rows(self, drop: List[int]) -> None:
        """Drop row i's last `drop[i]` positions, which may span several recorded calls: each row's state is restored
        to before the call its kept part ends in and that part replayed, the rows keeping the same count of a call
        in one replay. Older calls are forgotten; each row keeps the call it ends in, for `extract`."""
        left, parts, index = list(drop), [self.cache], list(range(len(drop)))
        count, last = len(drop), True
        self._rows = [None] * len(drop)
        while self._calls and (last or any(left)):
            call = before, layer, x, mask = self._calls.pop()
            width, groups = x.shape[1], {}
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
                part.cache = [mx.zeros_like(a[idx]) if s is None else s[idx] for s, a in zip(before, self.cache)]
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

    def extract(self, idx: int):
        """Row idx as a generation's own rewindable cache, trimmable within the call it was last rewound in."""
        out = _own(self)(len(self.cache))
        out.cache = [None if s is None else s[idx: idx + 1] for s in self.cache]
        out._start(self.offset[idx].item())
        if self._rows[idx] is not None:
            (before, layer, x, mask), i, k = self._rows[idx]
            out._calls.append(([None if s is None else s[i: i + 1] for s in before], layer, x[i: i + 1, :k],
                               _take(mask, [i], k)))
        return out


def joint(cache: RewindableCache) -> RewindableRows:
    """A joint cache of one row holding `cache`'s state (`cache` itself is not changed)."""
    out = _subclass(_base(cache), RewindableRows)(len(cache.cache))
    out.cache = list(cache.cache)
    out._start(mx.array([cache.offset]))
    return out


def _base(cache) -> type:
    """The mlx-lm class a rewindable cache was made from."""
    return next(c for c in type(cache).__mro__ if not issubclass(c, RewindableCache))


def _own(cache) -> type:
    return _subclass(_base(cache), RewindableCache)


def _take(mask, rows: List[int], keep: int):
    """The given rows' first `keep` positions of a recorded (rows, positions) mask."""
    return None if mask is None else mask[mx.array(rows)][..., :keep]


def _replay(layer, x, mask, cache) -> None:
    """Run `layer`'s token mixer on `x` from the restored state: the cache ends at the state after `x`."""
    for mixer_name, norm_name in MIXERS:
        mixer, norm = getattr(layer, mixer_name, None), getattr(layer, norm_name, None)
        if callable(mixer) and callable(norm):
            names = _parameters(type(mixer).__call__)
            mixer(norm(x), **({"mask": mask} if "mask" in names else {}), cache=cache)
            return
    _call_original(layer, x, mask, cache)  # an unknown block: the whole block, its output dropped


def _call_original(layer, x, mask, cache):
    original = _original_call(layer)
    names = _parameters(original)
    return original(layer, x, **({"mask": mask} if "mask" in names else {}), cache=cache)


class _Recording:
    """Mixed into a recurrent layer's class: records the input of each call that uses a rewindable cache."""

    def __call__(self, x, *args, **kwargs):
        bound = _signature(_original_call(self)).bind(self, x, *args, **kwargs).arguments
        cache = bound.get("cache")
        if isinstance(cache, RewindableCache):
            cache.record(self, x, bound.get("mask"))
        return super().__call__(x, *args, **kwargs)


def _original_call(layer):
    return type(layer).__mro__[2].__call__  # [recording subclass, _Recording, the layer's own class, ...]


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


def _parameters(fn):
    return _signature(fn).parameters


_SUBCLASSES: dict = {}


def _subclass(cls, mixin):
    key = (cls, mixin)
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(f"Rewindable{cls.__name__}", (mixin, cls), {})
    return _SUBCLASSES[key]


def recurrent_layers(model, cache: List) -> List[int]:
    """Indices of the layers whose cache entry is a recurrent state."""
    return [i for i, c in enumerate(cache) if isinstance(c, ArraysCache)]


def enable(model, cache: List) -> bool:
    """Make `cache` (fresh, or already rewindable) rewindable for `model`, in place; False if it cannot be.

    A recurrent cache that already holds a state of unknown length (made outside mlx-spec and used) stays
    as it is: the engine then decodes without drafts, as before.
    """
    idx = recurrent_layers(model, cache)
    if not idx:
        return True
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) != len(cache):
        return False
    for i in idx:
        c = cache[i]
        if not isinstance(c, RewindableCache):
            if not c.empty():
                return False
            c.__class__ = _subclass(type(c), RewindableCache)
            c._start(0)
        layer = layers[i]
        if not isinstance(layer, _Recording):
            layer.__class__ = _subclass(type(layer), _Recording)
    return True


def commit(cache: List) -> None:
    for c in cache:
        if isinstance(c, RewindableCache):
            c.commit()


def states(cache: List) -> List[Optional[mx.array]]:
    """Every array the recurrent layers hold (for mx.eval)."""
    return [a for c in cache if isinstance(c, ArraysCache) for a in c.cache if a is not None]
