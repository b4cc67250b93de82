"""EAGLE-3 heads written: saved in the speculators layout, and converted from either published layout."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..models.eagle3 import FILE, Eagle3Head, load, tensors
from .paths import atomic_dir


def save(head: Eagle3Head, folder, force: bool = False, provenance: dict | None = None) -> None:
    """Write `head` in the speculators layout (config.json + model.safetensors), atomically: a folder appears whole;
    provenance: what made it, kept under "mlx_spec" in the config."""
    with atomic_dir(Path(folder), force=force) as tmp:
        mx.save_safetensors(str(tmp / FILE), tensors(head), metadata={"format": "mlx"})
        config = head.config.to_dict()
        if provenance:
            config["mlx_spec"] = provenance
        (tmp / "config.json").write_text(json.dumps(config, indent=2))


def convert_head(src, out, *, dtype: str, quantize: int | None, group_size: int, force: bool, source: str) -> Path:
    """An EAGLE-3 head from `src` (either layout) into an MLX folder at `out` in the speculators layout: cast to
    `dtype`, its linear layers (and its own embedding, if it ships one) quantized to `quantize` bits if asked."""
    head = load(src)
    head.set_dtype(getattr(mx, dtype))
    ops: list[dict[str, str | int]] = [{"op": "dtype", "dtype": dtype}]
    if quantize is not None:
        nn.quantize(
            head,
            group_size,
            quantize,
            class_predicate=lambda _p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0,
        )
        head.config.layer["quantization"] = {"group_size": group_size, "bits": quantize}
        ops.append({"op": "quantize", "bits": quantize, "group_size": group_size, "mode": "affine"})
    head.config.layer.pop("torch_dtype", None)
    save(head, out, force=force, provenance={"source": source, "operations": ops})
    return Path(out)
