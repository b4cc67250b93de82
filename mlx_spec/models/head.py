"""A draft head over a vocabulary subset: a greedy draft step scores a few thousand rows of the output layer
(written here: mlx-lm has no partial output head)."""

from collections.abc import Iterable, Sequence

import mlx.core as mx
import mlx.nn as nn

from .base import text_of

IDS_STEP = 1024  # a draft head's subset is rounded up to a multiple of this: few shapes for the GPU to build


def _head(model):
    """The module that maps hidden states to logits, or None if the model is not laid out as expected."""
    return text_of(model).head


def _rows(layer, h: mx.array, ids: mx.array | None) -> mx.array:
    """h @ W[ids].T for a (quantized) linear or embedding layer; every row when ids is None."""
    pick = (lambda a: a[ids]) if ids is not None else (lambda a: a)
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        biases = layer.get("biases")
        out = mx.quantized_matmul(
            h,
            pick(layer.weight),
            pick(layer.scales),
            pick(biases) if biases is not None else None,
            transpose=True,
            group_size=layer.group_size,
            bits=layer.bits,
            mode=getattr(layer, "mode", "affine"),
        )
    else:
        out = h @ pick(layer.weight).T
    bias = layer.get("bias") if isinstance(layer, nn.Linear) else None
    return out + pick(bias) if bias is not None else out


class SubsetHead:
    """Logits of the states its text model's body gives (`base.Text`) from all rows of the model's head, or from a
    subset of them."""

    def __init__(self, model, base_ids: Iterable[int]):
        self.layer = _head(model)
        self._ids: list[int] = sorted(set(int(i) for i in base_ids))
        self._seen = set(self._ids)
        self._array: mx.array | None = None

    @staticmethod
    def supports(model) -> bool:
        """Whether `model`'s output equals its head applied to its text model's body's output (probed on two tokens)."""
        text = text_of(model)
        layer = text.head
        if layer is None or text.body is None or not hasattr(layer, "weight"):
            return False
        x = mx.array([[1, 2]])
        try:
            full = model(x)
            mine = _rows(layer, text.body(x), None)
        except Exception:  # an unexpected layout: keep the full head
            return False
        return full.shape == mine.shape and bool(mx.allclose(full, mine, rtol=1e-3, atol=1e-3))

    def add(self, tokens: Sequence[int]) -> None:
        """Put tokens (of the context) in the subset."""
        new = [t for t in tokens if t not in self._seen]
        if new:
            self._seen.update(new)
            self._ids.extend(new)
            self._array = None

    @property
    def size(self) -> int:
        return len(self._ids)

    def ids(self) -> mx.array:
        """The subset's ids, the first repeated up to a multiple of IDS_STEP (a repeat never changes an argmax's id)."""
        if self._array is None:
            pad = -len(self._ids) % IDS_STEP
            self._array = mx.array(self._ids + self._ids[:1] * pad, dtype=mx.uint32)
        return self._array

    def full(self, h: mx.array) -> mx.array:
        return _rows(self.layer, h, None)

    def subset(self, h: mx.array) -> mx.array:
        """Logits of the subset's tokens, in the order of `ids()`."""
        return _rows(self.layer, h, self.ids())
