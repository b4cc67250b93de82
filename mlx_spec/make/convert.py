"""`mlx-spec convert`: an HF/GGUF/recipe source into an MLX folder, optionally shrunk into a draft model."""

import json
import shutil
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from .. import __version__
from ..errors import ConvertError, MlxSpecError, SourceError, UnsupportedError
from .layers import check_layers, keep_layer_indices, kept_config
from .paths import atomic_dir, ensure_free_space
from .progress import progress

SUPPORTED_BITS = (2, 3, 4, 6, 8)  # what MLX affine quantization implements
SUPPORTED_GROUP_SIZES = (32, 64, 128)
DTYPES = ("auto", "float32", "float16", "bfloat16")
DEFAULT_GROUP_SIZE = 64  # mlx-lm's default: the usual accuracy/size balance for affine int4
HEAD_KEYS = ("embed_tokens", "lm_head")  # modules --head-bits applies to


def draft_methods() -> dict:
    """Every way `convert` shrinks a model into a draft, by name, as `convert` options.

    `keep_fraction` stands for --keep-layers at that share of the source's blocks (rounded, at least
    one). Benchmarks (the compression suite, MODEL@METHOD names) take their methods from here, so a
    method added to `convert` is measured without touching them.
    """
    methods = {dtype: {"dtype": dtype} for dtype in DTYPES if dtype != "auto"}
    methods.update({f"int{bits}": {"dtype": "float32", "quantize": bits} for bits in sorted(SUPPORTED_BITS, reverse=True)})
    methods.update({"layers-half": {"dtype": "float32", "keep_fraction": 0.5},
                    "layers-quarter": {"dtype": "float32", "keep_fraction": 0.25}})
    return methods


def auto_dtype() -> str:
    """float16 where MLX runs on a GPU (Metal); float32 on the CPU backend, where half types are slow."""
    import mlx.core as mx

    return "float32" if mx.default_device() == mx.cpu else "float16"


def validate(dtype: str, quantize: Optional[int], group_size: int, head_bits: Optional[int]) -> None:
    """Reject bad options before anything is read or written."""
    if dtype not in DTYPES:
        raise ConvertError(f"--dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    for flag, bits in (("--quantize", quantize), ("--head-bits", head_bits)):
        if bits is not None and bits not in SUPPORTED_BITS and not (flag == "--head-bits" and bits == 16):
            raise ConvertError(f"{flag} bits must be one of {SUPPORTED_BITS}, got {bits}")
    if group_size not in SUPPORTED_GROUP_SIZES:
        raise ConvertError(f"--group-size must be one of {SUPPORTED_GROUP_SIZES}, got {group_size}")
    if head_bits is not None and quantize is None:
        raise ConvertError("--head-bits needs --quantize")


def check_options(out, *, dtype: str = "auto", quantize: Optional[int] = None, group_size: int = DEFAULT_GROUP_SIZE,
                  head_bits: Optional[int] = None, keep_layers: Optional[int] = None,
                  layers: Optional[Sequence[int]] = None, force: bool = False, **_ignored) -> None:
    """Every check that needs no model: options, and an existing output folder."""
    validate(dtype, quantize, group_size, head_bits)
    if keep_layers is not None and layers is not None:
        raise ConvertError("pass either --keep-layers or --layers, not both")
    if Path(out).exists() and not force:
        raise ConvertError(f"output folder {out} already exists (pass --force to replace it)")


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def convert_folder(
    src: Path,
    out,
    *,
    source: str,
    source_sha256: str,
    dtype: str = "auto",
    quantize: Optional[int] = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    head_bits: Optional[int] = None,
    keep_layers: Optional[int] = None,
    layers: Optional[Sequence[int]] = None,
    force: bool = False,
    recipe: Optional[str] = None,
    log: Callable[[str], None] = lambda _m: None,
) -> Path:
    """Convert the model folder `src` into an MLX folder at `out`, written atomically.

    source / source_sha256: where `src` came from, for the provenance block (`make.resolve.convert`
    resolves any model spec and passes them).
    quantize: bits for MLX affine quantization; head_bits: bits for the embedding and lm_head
    (16 keeps them unquantized). keep_layers / layers: layer-drop (mutually exclusive).
    Returns `out`. Provenance goes into config.json under "mlx_spec".
    """
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import dequantize_model, load_model, load_tokenizer, quantize_model, save_config, save_model

    check_options(out, dtype=dtype, quantize=quantize, group_size=group_size, head_bits=head_bits,
                  keep_layers=keep_layers, layers=layers, force=force)
    out = Path(out)

    started = time.perf_counter()
    src = Path(src)
    if not _weights_bytes(src):
        raise SourceError(f"{src}: no .safetensors weights found")
    src_cfg = json.loads((src / "config.json").read_text())
    prior = src_cfg.pop("mlx_spec", None)
    ensure_free_space(out.parent, int(_weights_bytes(src) * (2 if dtype == "float32" else 1.1)), f"converting into {out}")

    try:
        model, config = load_model(src, lazy=True)
        tokenizer = load_tokenizer(src, eos_token_ids=config.get("eos_token_id"))
    except MlxSpecError:
        raise
    except ValueError as e:
        if "not supported" in str(e):
            raise UnsupportedError(f"{src}: unsupported architecture '{src_cfg.get('model_type')}'") from None
        raise SourceError(f"{src}: cannot load the model: {str(e).splitlines()[0]}") from None
    except Exception as e:  # a bad safetensors header or a missing file surfaces here
        raise SourceError(f"{src}: cannot load the model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None

    ops = list(prior["operations"]) if prior else []
    n_layers = len(model.layers)
    try:
        if keep_layers is not None:
            layers = keep_layer_indices(n_layers, keep_layers)
        elif layers is not None:
            check_layers(layers, n_layers)
    except ConvertError as e:
        raise ConvertError(f"--{'keep-layers' if keep_layers is not None else 'layers'}: {e}") from None
    if layers is not None:  # every refusal comes before the progress bar and before any write
        layers = sorted(layers)
        if not hasattr(getattr(model, "model", None), "layers"):
            raise ConvertError(f"layer-drop: mlx-lm's {config.get('model_type')} keeps its blocks elsewhere")
        config = kept_config(config, layers)

    steps = 2 + (layers is not None) + (quantize is not None)  # [drop], dtype, [quantize], save
    with progress(total=steps, desc=f"converting {src.name}", unit="step") as bar:
        if layers is not None:
            model.model.layers = [model.model.layers[i] for i in layers]  # saving renumbers them 0..K-1
            ops.append({"op": "layer_drop", "kept": layers, "of": n_layers})
            bar.update()

        if any(getattr(m, "bits", None) for _, m in model.named_modules()):
            model = dequantize_model(model)  # requantize/cast from float, never stack quantizations
            config.pop("quantization", None)
            config.pop("quantization_config", None)
            ops.append({"op": "dequantize"})

        target = auto_dtype() if dtype == "auto" else dtype
        mx_dtype = getattr(mx, target)
        model.update(tree_map_with_path(
            lambda _k, v: v.astype(mx_dtype) if mx.issubdtype(v.dtype, mx.floating) else v, model.parameters()))
        config["torch_dtype"] = target
        ops.append({"op": "dtype", "dtype": target})
        bar.update()

        if quantize is not None:
            def predicate(path, _module):
                if head_bits is not None and any(k in path for k in HEAD_KEYS):
                    return False if head_bits == 16 else {"group_size": group_size, "bits": head_bits, "mode": "affine"}
                return True

            model, config = quantize_model(model, config, group_size, quantize, quant_predicate=predicate)
            ops.append({"op": "quantize", "bits": quantize, "group_size": group_size, "mode": "affine",
                        **({"head_bits": head_bits} if head_bits is not None else {})})
            bar.update()

        config["mlx_spec"] = {
            "source": prior["source"] if prior else str(source),
            "source_sha256": prior["source_sha256"] if prior else source_sha256,
            "operations": ops,
            "version": __version__,
            **({"recipe": recipe} if recipe else {}),
        }
        with atomic_dir(out, force=force) as tmp:
            save_model(tmp, model, donate_model=True)  # the lazy graph runs here: the longest step
            save_config(config, tmp / "config.json")
            tokenizer.save_pretrained(str(tmp))
            for extra in ("generation_config.json",):
                if (src / extra).is_file():
                    shutil.copy(src / extra, tmp / extra)
        bar.update()
    log(f"wrote {out} in {time.perf_counter() - started:.1f} s")
    return out
