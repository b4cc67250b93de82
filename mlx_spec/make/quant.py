"""Weight formats for `convert --quantize`: MLX's affine and floating-point modes, and NF4 as a simulation.

MLX quantizes with real kernels in four modes (mlx-lm's `quantize_model` does the work): affine
int2-int8, and the microscaling floating-point formats mxfp4, nvfp4 (the FP4 of
ptq-impact-nf4-fp4-int8 §2.2) and mxfp8, whose group size is fixed by the format. NF4 (4-bit
NormalFloat, QLoRA; the same paper) has no MLX kernel: its weights are rounded to the NF4 codebook
and stored dequantized in the model's float dtype, so a folder made with it shows NF4's accuracy but
saves no memory and runs at float speed.
"""

import copy
from functools import lru_cache
from statistics import NormalDist

import mlx.core as mx
import mlx.nn as nn

from ..errors import ConvertError

AFFINE_BITS = (2, 3, 4, 6, 8)  # what MLX affine quantization implements
FP_MODES = {"mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}  # mode -> (group size, bits), fixed by the format
NF4_BLOCK = 64  # weights sharing one absmax scale (QLoRA's and bitsandbytes' block size)
NF4_OFFSET = 0.9677083  # QLoRA's quantile range: (1 - 1/(2*15) + 1 - 1/(2*16)) / 2
CALIBRATED = ("gptq", "awq", "dwq")  # affine formats chosen with calibration data by mlx_lm.quant (make.calibrated)
MODES = ("affine", *FP_MODES, "nf4", *CALIBRATED)
QUANTIZE_HELP = (
    "int2|int3|int4|int6|int8 (MLX affine), gptq-int4|awq-int4|dwq-int4 (any of those bits, calibrated "
    "by mlx-lm on the project's calibration text), mxfp4|nvfp4|mxfp8 (MLX FP modes), "
    "nf4 (simulated: no memory saved)"
)


def parse_quantize(text: str | None) -> tuple[int | None, str]:
    """'int4' / '4' -> (4, 'affine'); 'gptq-int4' -> (4, 'gptq'); 'mxfp4' -> (4, 'mxfp4'); 'nf4' -> (4, 'nf4');
    None -> (None, 'affine')."""
    if text is None:
        return None, "affine"
    t = text.strip().lower()
    if t in FP_MODES:
        return FP_MODES[t][1], t
    if t == "nf4":
        return 4, "nf4"
    method, sep, rest = t.partition("-")
    if sep and method in CALIBRATED:
        return parse_quantize(rest)[0], method
    try:
        bits = int(t.removeprefix("int"))
    except ValueError:
        raise ConvertError(f"--quantize must be one of {QUANTIZE_HELP}; got '{text}'") from None
    if bits not in AFFINE_BITS:
        raise ConvertError(f"--quantize bits must be one of {AFFINE_BITS}, got {bits}")
    return bits, "affine"


def format_name(bits: int, mode: str) -> str:
    """The name `parse_quantize` reads back: 'int4', 'gptq-int4', 'mxfp4', 'nf4'."""
    if mode in CALIBRATED:
        return f"{mode}-int{bits}"
    return f"int{bits}" if mode == "affine" else mode


@lru_cache(maxsize=1)
def nf4_codebook() -> mx.array:
    """The 16 NF4 values in [-1, 1]: 8 positive and 7 negative normal quantiles and an exact zero (QLoRA)."""
    ppf = NormalDist().inv_cdf

    def grid(n):  # n points from NF4_OFFSET down to 0.5, the last one dropped
        return [NF4_OFFSET + (0.5 - NF4_OFFSET) * i / (n - 1) for i in range(n - 1)]

    values = [ppf(p) for p in grid(9)] + [0.0] + [-ppf(p) for p in grid(8)]
    top = max(abs(v) for v in values)
    return mx.array(sorted(v / top for v in values), dtype=mx.float32)


def nf4_roundtrip(w: mx.array, block: int = NF4_BLOCK) -> mx.array:
    """w rounded to NF4 (per block of `block` weights: absmax scale, nearest codebook value), in w's dtype."""
    if w.size % block:
        raise ConvertError(f"nf4: a weight of {w.size} values does not split into blocks of {block}")
    code = nf4_codebook()
    mids = (code[1:] + code[:-1]) / 2
    flat = w.astype(mx.float32).reshape(-1, block)
    out = []
    step = max(1, (1 << 22) // (block * len(mids)))  # rows per chunk: bounds the comparison temporaries
    for i in range(0, flat.shape[0], step):
        x = flat[i : i + step]
        scale = mx.max(mx.abs(x), axis=1, keepdims=True)
        safe = mx.where(scale > 0, scale, 1.0)
        idx = ((x / safe)[..., None] > mids).sum(axis=-1)
        out.append(code[idx] * scale)
        mx.eval(out[-1])
    return mx.concatenate(out).reshape(w.shape).astype(w.dtype)


def nf4_model(model) -> int:
    """Round every linear layer's weight to NF4 in place (embeddings stay as they are); returns the count."""
    from mlx.utils import tree_unflatten

    count = 0
    for _, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.weight.ndim == 2:
            module.update(tree_unflatten([("weight", nf4_roundtrip(module.weight))]))
            count += 1
    if not count:
        raise ConvertError("nf4: the model has no linear layers")
    return count


def check_mode(mode: str, group_size: int, default_group: int, head_bits: int | None) -> None:
    """The FP formats fix their own group size; NF4 has no head option (it keeps embeddings float)."""
    if mode not in MODES:
        raise ConvertError(f"quantization mode must be one of {MODES}, got '{mode}'")
    if mode in FP_MODES and group_size != default_group:
        raise ConvertError(f"--group-size does not apply to {mode}: its groups are {FP_MODES[mode][0]} by format")
    if mode == "nf4" and head_bits is not None:
        raise ConvertError("--head-bits does not apply to nf4 (it rounds linear layers, embeddings stay float)")
    if mode in CALIBRATED and head_bits is not None:
        raise ConvertError(f"--head-bits does not apply to {mode} (mlx-lm quantizes the embedding at the same bits)")


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


def quantized_copy(model, fmt: str, group_size: int):
    """`model` with every linear and embedding layer quantized to the MLX kernel format `fmt` (group_size: affine
    formats'), its other weights shared and `model` itself untouched (the quant-self drafter's copy)."""
    if not isinstance(model, nn.Module):  # its containers could not be copied: nn.quantize would reach the model's own
        raise ConvertError(f"needs the model itself (an mlx.nn.Module), got a {type(model).__name__}")
    bits, mode = parse_quantize(fmt)
    if mode not in ("affine", *FP_MODES):
        raise ConvertError(f"needs an MLX kernel format (int2-int8, {', '.join(FP_MODES)})")
    group = FP_MODES[mode][0] if mode in FP_MODES else group_size
    view = _structure(model)
    # nn.quantize replaces leaf modules in the copied containers with new quantized ones; the model's stay.
    nn.quantize(
        view,
        group_size=group,
        bits=bits,  # type: ignore[arg-type]  # mlx annotates it `int = None`: None is the mode's default
        mode=mode,
        class_predicate=lambda _p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group == 0,
    )
    return view
