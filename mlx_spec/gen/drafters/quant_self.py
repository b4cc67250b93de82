"""QSpec's drafting half (qspec-complementary-quantization): a weight-quantized copy of the target drafts in the
target's own cache, which the verify pass then overwrites; the copy's weights are the only extra memory."""

import weakref
from typing import Dict, Optional, Tuple

import mlx.nn as nn

from ...errors import ConvertError, GenerationError
from ...make.quant import quantized_copy
from ..tunables import QUANT_SELF_GROUP as GROUP_SIZE
from .self_draft import SelfDrafter

_COPIES: Dict[Tuple[int, str], Tuple[weakref.ref, object]] = {}  # (id(target), format) -> (target, its copy)


def shared_copy(model, fmt: str):
    """`model` quantized to `fmt`, made once per live target and format: every quant-self drafter of a target drafts
    with the same weights (one copy's memory, and a batch's rows draft together)."""
    key = (id(model), fmt)
    hit = _COPIES.get(key)
    if hit is None or hit[0]() is not model:
        if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules()):
            raise GenerationError("quant-self: the target is already quantized; draft from a float target")
        try:
            copy = quantized_copy(model, fmt, GROUP_SIZE)
        except ConvertError as e:
            raise GenerationError(f"quant-self:{fmt}: {e}") from None
        hit = (weakref.ref(model, lambda _ref, key=key: _COPIES.pop(key, None)), copy)
        _COPIES[key] = hit
    return hit[1]


class QuantSelfDrafter(SelfDrafter):
    """Drafts with a quantized copy of every layer of the target (one per target and format), in the target's own
    cache."""

    name = "quant-self"

    def __init__(self, model, fmt: str, vocab_size: int, real_vocab: Optional[int] = None, head_ids=None):
        self.format = fmt
        super().__init__(shared_copy(model, fmt), range(len(model.model.layers)), vocab_size, real_vocab, head_ids)
