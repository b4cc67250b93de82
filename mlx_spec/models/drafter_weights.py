"""What every learned drafter's loader does with its weights: read a drafter folder's safetensors, and fill its
module from them as they were saved (quantized where its config says), every missing, extra or misshapen weight
named in a one-line error."""

from pathlib import Path
from typing import TypeVar

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import SourceError


def read(folder: Path) -> dict[str, mx.array]:
    """The weights of a drafter folder (model*.safetensors), the `model.` prefix dropped, RoPE tables left out."""
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        bins = list(folder.glob("*.bin")) + list(folder.glob("*.pt"))
        raise SourceError(
            f"{folder}: no .safetensors weights"
            + (f" ({bins[0].name} is a PyTorch pickle: save it as safetensors first)" if bins else "")
        )
    out = {}
    for f in files:
        out.update({k.removeprefix("model."): v for k, v in safetensors(f).items() if "rotary_emb" not in k})
    return out


M = TypeVar("M", bound=nn.Module)


def safetensors(file: Path | str) -> dict[str, mx.array]:
    """A .safetensors file's arrays by name."""
    return mx.load(str(file))  # type: ignore[return-value]  # mlx types load() as any format's result


def fill(module: M, weights: dict[str, mx.array], fails: str, quant: dict | None = None) -> M:
    """`module` with `weights` loaded strictly and evaluated, its linear layers quantized first where `quant` (a
    config's `quantization`) says and the weights hold their scales; `fails`: the error's words, before the reason."""
    if quant:
        nn.quantize(
            module,
            quant["group_size"],
            quant["bits"],
            class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights,
        )
    misfits = _misfits(dict(tree_flatten(module.parameters())), weights)
    if misfits:
        raise SourceError(f"{fails}: {misfits}")
    module.load_weights(list(weights.items()), strict=True)
    mx.eval(module.parameters())
    return module


def _misfits(params: dict[str, mx.array], weights: dict[str, mx.array]) -> str:
    """Every weight that does not fit the module's parameters, in one line: missing, unexpected, misshapen."""
    missing = [k for k in params if k not in weights]
    extra = [k for k in weights if k not in params]
    shapes = [
        f"{k} {tuple(weights[k].shape)} (expected {tuple(v.shape)})"
        for k, v in params.items()
        if k in weights and weights[k].shape != v.shape
    ]
    found = (("missing", missing), ("unexpected", extra), ("misshapen", shapes))
    return "; ".join(f"{what} {', '.join(keys)}" for what, keys in found if keys)
