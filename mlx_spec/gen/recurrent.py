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
