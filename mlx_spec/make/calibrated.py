"""Calibrated quantization through mlx-lm's own `mlx_lm.quant` modules: GPTQ, AWQ and DWQ.

We write no quantizer: each function feeds the project's calibration text (mlx_spec/recipes/calibration.txt,
or a file the caller names) to mlx-lm's implementation and returns the model and its `quantization`
config. The result is ordinary MLX affine quantization, so it loads and runs like `--quantize intN`.
mlx-lm's command-line versions download a calibration set from the web; ours ships with the project.
"""

import copy

import mlx.core as mx
import mlx.nn as nn

from ..errors import ConvertError, UnsupportedError
from .progress import quiet_unless_terminal
from .quant import CALIBRATED

SEQUENCE_LENGTH = 256  # calibration tokens per sample
DWQ_LEARNING_RATE = 1e-6  # mlx-lm's default for DWQ
DWQ_BATCH = 2
DWQ_VALID = 2  # samples held out to check that distillation did not make the draft worse


def samples(tokens: list[list[int]], length: int = SEQUENCE_LENGTH) -> mx.array:
    """The calibration token lists joined and cut into rows of `length` (at least one row)."""
    flat = [t for ids in tokens for t in ids]
    if len(flat) < 2:
        raise ConvertError("calibration: the text gives fewer than 2 tokens")
    length = min(length, len(flat))
    rows = len(flat) // length
    return mx.array(flat[: rows * length]).reshape(rows, length)


def gptq(model, config: dict, data: mx.array, bits: int, group_size: int):
    from mlx_lm.quant.gptq import gptq_quantize

    model, quant = gptq_quantize(
        model,
        data,
        bits,
        group_size,
        fallback_bits=bits,
        fallback_group_size=group_size,
        batch_size=min(8, data.shape[0]),
    )
    return model, dict(config, quantization=quant)


def awq(model, config: dict, data: mx.array, bits: int, group_size: int):
    from mlx_lm.quant.awq import AWQ_MODEL_CONFIGS, awq_quantize, update_config

    model_type = config.get("model_type")
    if model_type not in AWQ_MODEL_CONFIGS:
        raise UnsupportedError(f"awq: mlx-lm has no AWQ rules for {model_type} (it has {', '.join(AWQ_MODEL_CONFIGS)})")
    awq_quantize(
        model,
        data,
        AWQ_MODEL_CONFIGS[model_type],
        group_size=group_size,
        bits=bits,
        embed_group_size=group_size,
        embed_bits=bits,
    )
    return model, update_config(model, dict(config))


def dwq(model, config: dict, data: mx.array, bits: int, group_size: int):
    """Quantize, then distil the quantized model's scales and biases toward the float model's outputs."""
    import mlx.optimizers as optimizers
    from mlx_lm.quant.dwq import dwq_quantize
    from mlx_lm.utils import quantize_model

    rows = [(data[i].tolist(), 0) for i in range(data.shape[0])]
    if len(rows) < DWQ_BATCH + DWQ_VALID:
        raise ConvertError(
            f"dwq: the calibration text gives {len(rows)} samples of {data.shape[1]} tokens; "
            f"it needs at least {DWQ_BATCH + DWQ_VALID}"
        )
    train, valid = rows[:-DWQ_VALID], rows[-DWQ_VALID:]
    mx.eval(model.parameters())
    q_model = copy.deepcopy(model)
    q_model, quantized = quantize_model(q_model, dict(config), group_size, bits)
    opt = optimizers.Adam(learning_rate=DWQ_LEARNING_RATE, bias_correction=True)
    dtype = next(v.dtype for _, v in _floats(model))
    dwq_quantize(
        q_model,
        lambda batch, _i, split: model(batch),
        opt,
        train,
        valid,
        batch_size=DWQ_BATCH,
        max_seq_length=data.shape[1],
        seed=0,
        dtype=dtype,
    )
    q_model.eval()
    return q_model, quantized


def _floats(model):
    from mlx.utils import tree_flatten

    flat: list[tuple[str, mx.array]] = []
    tree_flatten(model.parameters(), destination=flat)
    return [(k, v) for k, v in flat if mx.issubdtype(v.dtype, mx.floating)]


def quantize_calibrated(
    method: str, model, config: dict, data: mx.array, bits: int, group_size: int
) -> tuple[nn.Module, dict]:
    """(model, config with `quantization`) by `method` in CALIBRATED."""
    assert method in CALIBRATED, method
    fn = {"gptq": gptq, "awq": awq, "dwq": dwq}[method]
    with quiet_unless_terminal():  # mlx-lm's own bars and prints: on a terminal only
        return fn(model, config, data, bits, group_size)
