"""`mlx-spec convert`: an HF/GGUF/recipe source into an MLX folder, optionally shrunk into a draft model."""

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Options:
    """What `convert` does to a model: every option of `mlx-spec convert` but the source and the output folder.

    quantize: bits for MLX affine quantization (quant_mode "affine"), or the bits of quant_mode's format (mxfp4,
    nvfp4, mxfp8; nf4 is rounded and stored dequantized: `make.quant`); head_bits: bits for the embedding and lm_head
    (16 keeps them unquantized). keep_layers / layers: layer-drop (mutually exclusive); layer_pick: how keep_layers
    picks its blocks (even, first, importance on the `calibration` file, default mlx_spec/recipes/calibration.txt).
    prune: a `make.prune` spec ('2:4', ...), applied before quantization. recipe: the recipe's name, for the provenance.
    """

    dtype: str = "auto"
    quantize: int | None = None
    group_size: int = DEFAULT_GROUP_SIZE
    head_bits: int | None = None
    keep_layers: int | None = None
    layers: Sequence[int] | None = None
    force: bool = False
    quant_mode: str = "affine"
    prune: str | None = None
    layer_pick: str = "even"
    calibration: str | Path | None = None
    recipe: str | None = None

    def check(self, out) -> None:
        """Every check that needs no model: options, the calibration file, and an existing output folder."""
        validate(self.dtype, self.quantize, self.group_size, self.head_bits, self.quant_mode)
        if self.keep_layers is not None and self.layers is not None:
            raise ConvertError("pass either --keep-layers or --layers, not both")
        if self.layer_pick not in PICKS:
            raise ConvertError(f"--layer-pick must be one of {', '.join(PICKS)}, got '{self.layer_pick}'")
        if self.layer_pick != "even" and self.keep_layers is None:
            raise ConvertError(f"--layer-pick {self.layer_pick} needs --keep-layers K")
        if self.prune is not None:
            parse_prune(self.prune)
        if self.calibration is not None or self.layer_pick == "importance" or self.quant_mode in CALIBRATED:
            calibration_texts(self.calibration)
        if Path(out).exists() and not self.force:
            raise ConvertError(f"output folder {out} already exists (pass --force to replace it)")

    @property
    def target_dtype(self) -> str:
        return auto_dtype() if self.dtype == "auto" else self.dtype


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
    options: Options = Options(),
    *,
    source: str,
    source_sha256: str,
    log: Callable[[str], None] = lambda _m: None,
) -> Path:
    """Convert the model folder `src` into an MLX folder at `out`, written atomically.

    source / source_sha256: where `src` came from, for the provenance block (`make.resolve.convert` resolves any
    model spec and passes them). Operations run in the order drop, dtype, prune, quantize. Returns `out`.
    Provenance goes into config.json under "mlx_spec".
    """
    from mlx_lm.utils import dequantize_model, save_config, save_model

    from ..models import eagle3, mtp

    o = options
    o.check(out)
    out = Path(out)
    started = time.perf_counter()
    src = Path(src)
    if not _weights_bytes(src):
        raise SourceError(f"{src}: no .safetensors weights found")
    src_cfg = json.loads((src / "config.json").read_text())
    prior = src_cfg.pop("mlx_spec", None) or {}  # a folder mlx-spec made: its source (and operations, but random:NAME)
    if eagle3.is_head(src_cfg):
        return _convert_head(src, out, o, source)
    model, config, tokenizer = _load(src, src_cfg, out, o.dtype)

    ops = list(prior.get("operations", []))
    layers, drop = _pick_layers(model, config, tokenizer, o, log)  # every refusal before any write
    if layers is not None:
        config = kept_config(config, layers)
    # [drop] dtype [prune] [quantize] save
    steps = 2 + (layers is not None) + (o.quantize is not None) + (o.prune is not None)
    with progress(total=steps, desc=f"converting {src.name}", unit="step") as bar:
        if layers is not None:
            model.model.layers = [model.model.layers[i] for i in layers]  # saving renumbers them 0..K-1
            ops.append(drop)
            bar.update()

        if any(getattr(m, "bits", None) for _, m in model.named_modules()):
            model = dequantize_model(model)  # requantize/cast from float, never stack quantizations
            config.pop("quantization", None)
            config.pop("quantization_config", None)
            ops.append({"op": "dequantize"})

        ops.append(_cast(model, config, o.target_dtype))
        bar.update()

        if o.prune is not None:
            op, _sparsity = prune_model(model, parse_prune(o.prune))
            ops.append(op)
            bar.update()

        if o.quantize is not None:
            model, config, op = _quantize(model, config, tokenizer, o, log)
            ops.append(op)
            bar.update()

        keep_mtp = layers is None and o.prune is None and mtp.has_mtp(src)  # the target's own: a draft has none
        if keep_mtp:
            ops.append({"op": "mtp_layers", "file": mtp.FILE, "dtype": o.target_dtype, "note": "kept beside the model"})
        config["mlx_spec"] = {
            "source": prior.get("source", str(source)),
            "source_sha256": prior.get("source_sha256", source_sha256),
            "operations": ops,
            "version": __version__,
            **({"recipe": o.recipe} if o.recipe else {}),
        }
        with atomic_dir(out, force=o.force) as tmp:
            if keep_mtp:
                import mlx.core as mx

                mtp.save(tmp, src, getattr(mx, o.target_dtype))
            save_model(tmp, model, donate_model=True)  # the lazy graph runs here: the longest step
            save_config(config, tmp / "config.json")
            tokenizer.save_pretrained(str(tmp))
            for extra in ("generation_config.json",):
                if (src / extra).is_file():
                    shutil.copy(src / extra, tmp / extra)
        bar.update()
    log(f"wrote {out} in {time.perf_counter() - started:.1f} s")
    return out


def _convert_head(src: Path, out: Path, o: Options, source: str) -> Path:
    """An EAGLE-3 head: cast and affine quantization only."""
    from .heads import convert_head

    shrunk = o.keep_layers is not None or o.layers is not None or o.prune
    if shrunk or o.head_bits is not None or o.quant_mode != "affine":
        raise ConvertError("an EAGLE-3 head converts with --dtype and --quantize BITS (affine) only")
    return convert_head(
        src, out, dtype=o.target_dtype, quantize=o.quantize, group_size=o.group_size, force=o.force, source=str(source)
    )


def _load(src: Path, src_cfg: dict, out: Path, dtype: str):
    """mlx-lm's lazy model, its config and its tokenizer, after checking the disk has room for the output."""
    from mlx_lm.utils import load_model, load_tokenizer

    from ..models.rope import overrides

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
    return model, config, tokenizer


def _pick_layers(model, config: dict, tokenizer, o: Options, log) -> tuple[list[int] | None, dict]:
    """The blocks kept (sorted; None: all) and the layer-drop operation's record."""
    n_layers = len(model.layers)
    layers = o.layers
    similarity = None
    try:
        if o.keep_layers is not None:
            layers = keep_layer_indices(n_layers, o.keep_layers)  # "even"; also checks the count
            if o.layer_pick == "first":
                layers = list(range(o.keep_layers))
            elif o.layer_pick == "importance":
                tokens = calibration_tokens(tokenizer, calibration_texts(o.calibration))
                log(f"ranking {n_layers} blocks on {sum(map(len, tokens))} calibration tokens")
                similarity = block_similarity(model, tokens)
                layers = most_important(similarity, o.keep_layers)
        elif layers is not None:
            check_layers(layers, n_layers)
    except ConvertError as e:
        raise ConvertError(f"--{'keep-layers' if o.keep_layers is not None else 'layers'}: {e}") from None
    if layers is None:
        return None, {}
    if not hasattr(getattr(model, "model", None), "layers"):
        raise ConvertError(f"layer-drop: mlx-lm's {config.get('model_type')} keeps its blocks elsewhere")
    kept = sorted(layers)
    op = {"op": "layer_drop", "kept": kept, "of": n_layers, "pick": o.layer_pick if o.keep_layers else "list"}
    if similarity is not None:
        op["similarity"] = [round(v, 5) for v in similarity]
    return kept, op


def _cast(model, config: dict, target: str) -> dict:
    """Cast the floating weights to `target` (but those mlx-lm's `cast_predicate` keeps); the operation's record."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    mx_dtype = getattr(mx, target)
    keep = getattr(model, "cast_predicate", lambda _k: True)  # mlx-lm's: what must keep its dtype (routing biases)
    model.update(
        tree_map_with_path(
            lambda k, v: v.astype(mx_dtype) if mx.issubdtype(v.dtype, mx.floating) and keep(k) else v,
            model.parameters(),
        )
    )
    config["torch_dtype"] = target
    return {"op": "dtype", "dtype": target}


def _quantize(model, config: dict, tokenizer, o: Options, log) -> tuple:
    """Quantize by `o.quant_mode` (nf4, a calibrated method, or MLX's affine and FP modes): (model, config, op)."""
    from mlx_lm.utils import quantize_model

    assert o.quantize is not None
    if o.quant_mode == "nf4":
        return (
            model,
            config,
            {
                "op": "quantize",
                "mode": "nf4",
                "bits": 4,
                "block": 64,
                "linear_layers": nf4_model(model),
                "stored": o.target_dtype,
                "note": "simulated: rounded to NF4 and stored dequantized, no memory saved",
            },
        )
    if o.quant_mode in CALIBRATED:
        data = samples(calibration_tokens(tokenizer, calibration_texts(o.calibration), CALIBRATED_TOKENS))
        log(f"{o.quant_mode}: calibrating on {data.size} tokens")
        model, config = quantize_calibrated(o.quant_mode, model, config, data, o.quantize, o.group_size)
        return (
            model,
            config,
            {
                "op": "quantize",
                "bits": o.quantize,
                "group_size": o.group_size,
                "mode": "affine",
                "method": o.quant_mode,
                "format": format_name(o.quantize, o.quant_mode),
                "calibration_tokens": data.size,
            },
        )
    group = FP_MODES[o.quant_mode][0] if o.quant_mode in FP_MODES else o.group_size
    head_bits = o.head_bits

    def predicate(path, _module):
        if head_bits is not None and any(k in path for k in HEAD_KEYS):
            return False if head_bits == 16 else {"group_size": o.group_size, "bits": head_bits, "mode": "affine"}
        return True

    model, config = quantize_model(model, config, group, o.quantize, mode=o.quant_mode, quant_predicate=predicate)
    _eval_by_module(model)
    return (
        model,
        config,
        {
            "op": "quantize",
            "bits": o.quantize,
            "group_size": group,
            "mode": o.quant_mode,
            "format": format_name(o.quantize, o.quant_mode),
            **({"head_bits": head_bits} if head_bits is not None else {}),
        },
    )
