"""`mlx-spec convert`: an HF/GGUF/recipe source into an MLX folder, optionally shrunk into a draft model."""

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ConvertError, MlxSpecError, SourceError, UnsupportedError
from ..version import __version__
from .calibrated import quantize_calibrated, samples
from .importance import (
    PICKS,
    block_similarity,
    calibration_texts,
    calibration_tokens,
    most_important,
)
from .layers import check_layers, keep_layer_indices, kept_config
from .paths import atomic_dir, ensure_free_space
from .progress import progress
from .prune import parse_prune, prune_model
from .quant import AFFINE_BITS, CALIBRATED, FP_MODES, check_mode, format_name, nf4_model

SUPPORTED_BITS = AFFINE_BITS
SUPPORTED_GROUP_SIZES = (32, 64, 128)
DTYPES = ("auto", "float32", "float16", "bfloat16")
DEFAULT_GROUP_SIZE = 64  # mlx-lm's default: the usual accuracy/size balance for affine int4
HEAD_KEYS = ("embed_tokens", "lm_head")  # modules --head-bits applies to
CALIBRATED_TOKENS = 4096  # calibration tokens for GPTQ/AWQ/DWQ (the shipped text has about 1.2k Qwen tokens)


def draft_methods() -> dict:
    """Every way `convert` shrinks a model into a draft, by name, as `convert` options.

    `keep_fraction` stands for --keep-layers at that share of the source's blocks (rounded, at least
    one). Benchmarks (the compression suite, MODEL@METHOD names) take their methods from here, so a
    method added to `convert` is measured without touching them.
    """
    methods: dict[str, dict[str, str | int | float]] = {dtype: {"dtype": dtype} for dtype in DTYPES if dtype != "auto"}
    methods.update(
        {f"int{bits}": {"dtype": "float32", "quantize": bits} for bits in sorted(SUPPORTED_BITS, reverse=True)}
    )
    methods.update(
        {mode: {"dtype": "float32", "quantize": bits, "quant_mode": mode} for mode, (_group, bits) in FP_MODES.items()}
    )
    methods["nf4"] = {"dtype": "float32", "quantize": 4, "quant_mode": "nf4"}
    methods.update({f"{m}-int4": {"dtype": "float32", "quantize": 4, "quant_mode": m} for m in CALIBRATED})
    methods.update(
        {
            "layers-half": {"dtype": "float32", "keep_fraction": 0.5},
            "layers-quarter": {"dtype": "float32", "keep_fraction": 0.25},
            "layers-half-first": {"dtype": "float32", "keep_fraction": 0.5, "layer_pick": "first"},
            "layers-half-importance": {"dtype": "float32", "keep_fraction": 0.5, "layer_pick": "importance"},
        }
    )
    methods.update(
        {
            "prune-0.25": {"dtype": "float32", "prune": "unstructured:0.25"},
            "prune-block16-0.25": {"dtype": "float32", "prune": "block:16:0.25"},
            "prune-2:4": {"dtype": "float32", "prune": "2:4"},
            "prune-4:8": {"dtype": "float32", "prune": "4:8"},
        }
    )
    return methods


def auto_dtype() -> str:
    """bfloat16 where MLX runs on a GPU (Metal or CUDA): the dtype most checkpoints ship in, which mlx-lm's convert
    keeps; float32 on the CPU backend, where half types are slow."""
    import mlx.core as mx

    return "float32" if mx.default_device() == mx.cpu else "bfloat16"


def validate(
    dtype: str, quantize: int | None, group_size: int, head_bits: int | None, quant_mode: str = "affine"
) -> None:
    """Reject bad options before anything is read or written."""
    check_mode(quant_mode, group_size, DEFAULT_GROUP_SIZE, head_bits)
    if quant_mode != "affine" and quantize is None:
        raise ConvertError(f"quantization mode {quant_mode} needs --quantize")
    if quant_mode in FP_MODES or quant_mode == "nf4":
        quantize = None  # its bits are the format's
    if dtype not in DTYPES:
        raise ConvertError(f"--dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    for flag, bits in (("--quantize", quantize), ("--head-bits", head_bits)):
        if bits is not None and bits not in SUPPORTED_BITS and not (flag == "--head-bits" and bits == 16):
            raise ConvertError(f"{flag} bits must be one of {SUPPORTED_BITS}, got {bits}")
    if group_size not in SUPPORTED_GROUP_SIZES:
        raise ConvertError(f"--group-size must be one of {SUPPORTED_GROUP_SIZES}, got {group_size}")
    if head_bits is not None and quantize is None:
        raise ConvertError("--head-bits needs --quantize")


def check_options(
    out,
    *,
    dtype: str = "auto",
    quantize: int | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    head_bits: int | None = None,
    keep_layers: int | None = None,
    layers: Sequence[int] | None = None,
    force: bool = False,
    quant_mode: str = "affine",
    prune: str | None = None,
    layer_pick: str = "even",
    calibration=None,
    **_ignored,
) -> None:
    """Every check that needs no model: options, the calibration file, and an existing output folder."""
    validate(dtype, quantize, group_size, head_bits, quant_mode)
    if keep_layers is not None and layers is not None:
        raise ConvertError("pass either --keep-layers or --layers, not both")
    if layer_pick not in PICKS:
        raise ConvertError(f"--layer-pick must be one of {', '.join(PICKS)}, got '{layer_pick}'")
    if layer_pick != "even" and keep_layers is None:
        raise ConvertError(f"--layer-pick {layer_pick} needs --keep-layers K")
    if prune is not None:
        parse_prune(prune)
    if calibration is not None or layer_pick == "importance" or quant_mode in CALIBRATED:
        calibration_texts(calibration)
    if Path(out).exists() and not force:
        raise ConvertError(f"output folder {out} already exists (pass --force to replace it)")


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def _eval_by_module(model) -> None:
    """Quantize one module at a time: evaluated lazily at save time, MLX's FP modes held every weight's temporaries
    at once (converting the 1.5B float32 to mxfp4 peaked at 21 GB of RAM)."""
    import mlx.core as mx
    import mlx.nn as nn

    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            mx.eval(module.parameters())
            mx.clear_cache()


def convert_folder(
    src: Path,
    out,
    *,
    source: str,
    source_sha256: str,
    dtype: str = "auto",
    quantize: int | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    head_bits: int | None = None,
    keep_layers: int | None = None,
    layers: Sequence[int] | None = None,
    force: bool = False,
    quant_mode: str = "affine",
    prune: str | None = None,
    layer_pick: str = "even",
    calibration=None,
    recipe: str | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> Path:
    """Convert the model folder `src` into an MLX folder at `out`, written atomically.

    source / source_sha256: where `src` came from, for the provenance block (`make.resolve.convert`
    resolves any model spec and passes them).
    quantize: bits for MLX affine quantization (quant_mode "affine"), or the bits of quant_mode's format
    (mxfp4, nvfp4, mxfp8; nf4 is rounded and stored dequantized: `make.quant`); head_bits: bits for
    the embedding and lm_head (16 keeps them unquantized). keep_layers / layers: layer-drop (mutually
    exclusive); layer_pick: how keep_layers picks its blocks (even, first, importance on the
    `calibration` file, default mlx_spec/recipes/calibration.txt). prune: a `make.prune` spec ('2:4', ...),
    applied before quantization. Operations run in the order drop, dtype, prune, quantize.
    Returns `out`. Provenance goes into config.json under "mlx_spec".
    """
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import (
        dequantize_model,
        load_model,
        load_tokenizer,
        quantize_model,
        save_config,
        save_model,
    )

    check_options(
        out,
        dtype=dtype,
        quantize=quantize,
        group_size=group_size,
        head_bits=head_bits,
        keep_layers=keep_layers,
        layers=layers,
        force=force,
        quant_mode=quant_mode,
        prune=prune,
        layer_pick=layer_pick,
        calibration=calibration,
    )
    out = Path(out)

    started = time.perf_counter()
    src = Path(src)
    if not _weights_bytes(src):
        raise SourceError(f"{src}: no .safetensors weights found")
    src_cfg = json.loads((src / "config.json").read_text())
    prior = src_cfg.pop("mlx_spec", None) or {}  # a folder mlx-spec made: its source (and operations, but random:NAME)
    from ..models import eagle3, mtp
    from ..models.rope import overrides
    from .heads import convert_head

    if eagle3.is_head(src_cfg):
        if keep_layers is not None or layers is not None or prune or head_bits is not None or quant_mode != "affine":
            raise ConvertError("an EAGLE-3 head converts with --dtype and --quantize BITS (affine) only")
        return convert_head(
            src,
            out,
            dtype=auto_dtype() if dtype == "auto" else dtype,
            quantize=quantize,
            group_size=group_size,
            force=force,
            source=str(source),
        )
    try:
        rope = overrides(src_cfg)  # transformers 5's rope_parameters, where mlx-lm reads them
    except UnsupportedError as e:
        raise UnsupportedError(f"{src}: {e}") from None
    ensure_free_space(
        out.parent, int(_weights_bytes(src) * (2 if dtype == "float32" else 1.1)), f"converting into {out}"
    )

    try:
        model, config = load_model(src, lazy=True, model_config=rope)
        tokenizer = load_tokenizer(src, eos_token_ids=config.get("eos_token_id"))
    except MlxSpecError:
        raise
    except ValueError as e:
        if "not supported" in str(e):
            raise UnsupportedError(f"{src}: unsupported architecture '{src_cfg.get('model_type')}'") from None
        raise SourceError(f"{src}: cannot load the model: {str(e).splitlines()[0]}") from None
    except Exception as e:  # a bad safetensors header or a missing file surfaces here
        raise SourceError(
            f"{src}: cannot load the model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None

    ops = list(prior.get("operations", []))
    n_layers = len(model.layers)
    try:
        if keep_layers is not None:
            layers = keep_layer_indices(n_layers, keep_layers)  # "even"; also checks the count
            if layer_pick == "first":
                layers = list(range(keep_layers))
            elif layer_pick == "importance":
                tokens = calibration_tokens(tokenizer, calibration_texts(calibration))
                log(f"ranking {n_layers} blocks on {sum(map(len, tokens))} calibration tokens")
                similarity = block_similarity(model, tokens)
                layers = most_important(similarity, keep_layers)
        elif layers is not None:
            check_layers(layers, n_layers)
    except ConvertError as e:
        raise ConvertError(f"--{'keep-layers' if keep_layers is not None else 'layers'}: {e}") from None
    if layers is not None:  # every refusal comes before the progress bar and before any write
        layers = sorted(layers)
        if not hasattr(getattr(model, "model", None), "layers"):
            raise ConvertError(f"layer-drop: mlx-lm's {config.get('model_type')} keeps its blocks elsewhere")
        config = kept_config(config, layers)

    steps = (
        2 + (layers is not None) + (quantize is not None) + (prune is not None)
    )  # [drop] dtype [prune] [quantize] save
    with progress(total=steps, desc=f"converting {src.name}", unit="step") as bar:
        if layers is not None:
            model.model.layers = [model.model.layers[i] for i in layers]  # saving renumbers them 0..K-1
            ops.append(
                {
                    "op": "layer_drop",
                    "kept": layers,
                    "of": n_layers,
                    "pick": layer_pick if keep_layers else "list",
                    **({"similarity": [round(v, 5) for v in similarity]} if layer_pick == "importance" else {}),
                }
            )
            bar.update()

        if any(getattr(m, "bits", None) for _, m in model.named_modules()):
            model = dequantize_model(model)  # requantize/cast from float, never stack quantizations
            config.pop("quantization", None)
            config.pop("quantization_config", None)
            ops.append({"op": "dequantize"})

        target = auto_dtype() if dtype == "auto" else dtype
        mx_dtype = getattr(mx, target)
        keep = getattr(model, "cast_predicate", lambda _k: True)  # mlx-lm's: what must keep its dtype (routing biases)
        model.update(
            tree_map_with_path(
                lambda k, v: v.astype(mx_dtype) if mx.issubdtype(v.dtype, mx.floating) and keep(k) else v,
                model.parameters(),
            )
        )
        config["torch_dtype"] = target
        ops.append({"op": "dtype", "dtype": target})
        bar.update()

        if prune is not None:
            op, _sparsity = prune_model(model, parse_prune(prune))
            ops.append(op)
            bar.update()

        if quantize is not None and quant_mode == "nf4":
            ops.append(
                {
                    "op": "quantize",
                    "mode": "nf4",
                    "bits": 4,
                    "block": 64,
                    "linear_layers": nf4_model(model),
                    "stored": target,
                    "note": "simulated: rounded to NF4 and stored dequantized, no memory saved",
                }
            )
            bar.update()
        elif quantize is not None and quant_mode in CALIBRATED:
            data = samples(calibration_tokens(tokenizer, calibration_texts(calibration), CALIBRATED_TOKENS))
            log(f"{quant_mode}: calibrating on {data.size} tokens")
            model, config = quantize_calibrated(quant_mode, model, config, data, quantize, group_size)
            ops.append(
                {
                    "op": "quantize",
                    "bits": quantize,
                    "group_size": group_size,
                    "mode": "affine",
                    "method": quant_mode,
                    "format": format_name(quantize, quant_mode),
                    "calibration_tokens": data.size,
                }
            )
            bar.update()
        elif quantize is not None:
            fp = quant_mode in FP_MODES
            group = FP_MODES[quant_mode][0] if fp else group_size

            def predicate(path, _module):
                if head_bits is not None and any(k in path for k in HEAD_KEYS):
                    return False if head_bits == 16 else {"group_size": group_size, "bits": head_bits, "mode": "affine"}
                return True

            model, config = quantize_model(model, config, group, quantize, mode=quant_mode, quant_predicate=predicate)
            _eval_by_module(model)
            ops.append(
                {
                    "op": "quantize",
                    "bits": quantize,
                    "group_size": group,
                    "mode": quant_mode,
                    "format": format_name(quantize, quant_mode),
                    **({"head_bits": head_bits} if head_bits is not None else {}),
                }
            )
            bar.update()

        keep_mtp = layers is None and prune is None and mtp.has_mtp(src)  # the target's own: a draft has none to keep
        if keep_mtp:
            ops.append({"op": "mtp_layers", "file": mtp.FILE, "dtype": target, "note": "kept beside the model"})
        config["mlx_spec"] = {
            "source": prior.get("source", str(source)),
            "source_sha256": prior.get("source_sha256", source_sha256),
            "operations": ops,
            "version": __version__,
            **({"recipe": recipe} if recipe else {}),
        }
        with atomic_dir(out, force=force) as tmp:
            if keep_mtp:
                mtp.save(tmp, src, mx_dtype)
            save_model(tmp, model, donate_model=True)  # the lazy graph runs here: the longest step
            save_config(config, tmp / "config.json")
            tokenizer.save_pretrained(str(tmp))
            for extra in ("generation_config.json",):
                if (src / extra).is_file():
                    shutil.copy(src / extra, tmp / extra)
        bar.update()
    log(f"wrote {out} in {time.perf_counter() - started:.1f} s")
    return out
