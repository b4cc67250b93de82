"""QSpec's drafting half on MLX: a low-precision copy of the target drafts into the target's own KV cache.

QSpec (qspec-complementary-quantization) drafts with W4A4 and verifies with W4A16 over shared
weights; MLX has no activation-quantized kernels, so here the draft is a weight-quantized copy of
the target (any MLX mode: affine int2-int8, mxfp4, nvfp4, mxfp8) and the verifier is the target
itself. What transfers is the KV overwrite: the copy has the target's layers, so it reads and
writes the target's cache, its entries for drafted positions are trimmed and the verify pass
writes the target's exact ones. No draft cache and no draft prefill; acceptance is close to the
target's agreement with itself. The copy's weight bytes are the only extra memory. On a CPU
without fast quantized matmuls (this project's Linux machine) its steps are slow: measured, not
tuned away; the planner switches it off where it does not pay.
"""

import copy
import weakref
from typing import Dict, Optional, Tuple

import mlx.nn as nn

from ...errors import ConvertError, GenerationError
from ...make.quant import FP_MODES, parse_quantize
from ..tunables import QUANT_SELF_FORMAT as DEFAULT_FORMAT
from ..tunables import QUANT_SELF_GROUP as GROUP_SIZE
from .self_draft import SelfDrafter


def _structure(module):
    """A copy of every container module (model, blocks, attention, MLP) that shares the weight arrays."""
    if isinstance(module, nn.Module):
        out = copy.copy(module)
        for key, value in module.items():
            out[key] = _structure(value)
        return out
    if isinstance(module, list):
        return [_structure(v) for v in module]
    if isinstance(module, dict):
        return {k: _structure(v) for k, v in module.items()}
    return module


def quantized_copy(model, fmt: str = DEFAULT_FORMAT):
    """`model` with every linear and embedding layer quantized to `fmt`, leaving `model` itself untouched."""
    try:
        bits, mode = parse_quantize(fmt)
    except ConvertError as e:
        raise GenerationError(f"quant-self:{fmt}: {e}") from None
    if mode not in ("affine", *FP_MODES):
        raise GenerationError(f"quant-self:{fmt}: needs an MLX kernel format (int2-int8, {', '.join(FP_MODES)})")
    if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules()):
        raise GenerationError("quant-self: the target is already quantized; draft from a float target")
    group = FP_MODES[mode][0] if mode in FP_MODES else GROUP_SIZE
    view = _structure(model)
    # nn.quantize replaces leaf modules in the copied containers with new quantized ones; the target's stay.
    nn.quantize(view, group_size=group, bits=bits, mode=mode,
                class_predicate=lambda _p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group == 0)
    return view


_COPIES: Dict[Tuple[int, str], Tuple[weakref.ref, object]] = {}  # (id(target), format) -> (target, its copy)


def shared_copy(model, fmt: str):
    """`quantized_copy(model, fmt)`, made once per live target and format: every session's quant-self drafter
    drafts with the same weights (one copy's memory, and a batch's rows draft together)."""
    key = (id(model), fmt)
    hit = _COPIES.get(key)
    if hit is None or hit[0]() is not model:
        hit = (weakref.ref(model, lambda _ref, key=key: _COPIES.pop(key, None)), quantized_copy(model, fmt))
        _COPIES[key] = hit
    return hit[1]


class QuantSelfDrafter(SelfDrafter):
    """Drafts with a quantized copy of every layer of the target (one per target and format), in the target's own
    cache."""

    name = "quant-self"

    def __init__(self, model, fmt: str, vocab_size: int, real_vocab: Optional[int] = None, head_ids=None):
        self.format = fmt
        quantized = shared_copy(model, fmt)
        super().__init__(quantized, range(len(model.model.layers)), vocab_size, real_vocab, head_ids)
