"""What every learned drafter's loader does with its weights: read a drafter folder's safetensors, and fill its
module from them as they were saved (quantized where its config says), a missing, extra or misshapen weight being a
one-line error."""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

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
        out.update({k.removeprefix("model."): v for k, v in mx.load(str(f)).items() if "rotary_emb" not in k})
    return out


def fill(module: nn.Module, weights: dict[str, mx.array], fails: str, quant: dict | None = None) -> nn.Module:
    """`module` with `weights` loaded strictly and evaluated, its linear layers quantized first where `quant` (a
    config's `quantization`) says and the weights hold their scales; `fails`: the error's words, before the reason."""
    if quant:
        nn.quantize(
            module,
            quant["group_size"],
            quant["bits"],
            class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights,
        )
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise SourceError(f"{fails}: {str(e).splitlines()[0]}") from None
    mx.eval(module.parameters())
    return module
