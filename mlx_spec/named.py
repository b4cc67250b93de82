"""What every face shares: models and drafters by name, and the faces' defaults.

Names (recipes, hub ids, .gguf files) are resolved through the making layer, which may download
and convert; the folders are loaded and the drafters built through the generating layer.
"""

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.nn as nn
from mlx.utils import tree_flatten

from .gen import registry
from .gen.load import load_folder
from .make.quant import format_name
from .make.resolve import resolve

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "hybrid:qwen2.5-coder-0.5b"  # the README's main job
DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime."
# What the faces' --model, --draft and --num-draft accept: one wording for every command that takes them.
MODEL_HELP = "Target: recipe, folder, .gguf or HF repo"
DRAFT_HELP = (
    "Drafter: a model spec, 'ngram[:N]', 'suffix[:shared]' (the longest earlier match; shared: also in "
    "this process's earlier outputs), 'self[:LAYERS|importance[:K]]', 'quant-self[:FORMAT]' (a quantized "
    "copy of the target drafting in its cache), 'eagle3:HEAD' (an EAGLE-3 head: folder or HF repo), "
    "'mtp[:CHECKPOINT]' (the target's own MTP layers: Qwen3-Next, Qwen3.5, DeepSeek-V3, GLM-4.5+), "
    "'dflash:DRAFTER' (a DFlash block drafter, e.g. z-lab's: folder or HF repo), "
    "'hybrid[:D]' (n-gram, suffix and D; 'hybrid:none': those two alone) or 'none'"
)
NUM_DRAFT_HELP = (
    "Max draft tokens per round K (default: " + ", ".join(f"{k} {v}" for k, v in registry.DEFAULT_K.items()) + ")"
)

Log = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


def load_model(spec: str, log: Log = _quiet) -> tuple[nn.Module, "TokenizerWrapper", Path]:
    """(model, tokenizer, folder) for any model spec: folder, .gguf, recipe or HF repo."""
    return load_folder(resolve(spec, log))


def make_drafter(
    spec: registry.Spec,
    target,
    tokenizer,
    *,
    loaded: dict[str, tuple] | None = None,
    log: Log = _quiet,
    subset_head: bool = True,
):
    """A drafter from any spec (a string or a parsed `gen.registry.DrafterSpec`), loading draft models by name.

    loaded: {model spec: (model, tokenizer)} already in memory, so a draft is never loaded twice.
    """

    def load(name: str):
        if loaded is not None and name in loaded:
            return loaded[name]
        return load_model(name, log)[:2]

    drafter = registry.build(heads_resolved(spec, log), target, tokenizer, load=load, subset_head=subset_head)
    if drafter is not None and drafter.left_out:
        log(drafter.left_out)  # before generation: what the drafter runs without, and why
    return drafter


def heads_resolved(spec: registry.Spec, log: Log = _quiet) -> registry.DrafterSpec:
    """`spec` with a learned drafter's head (a folder or an HF repo, fetched) named by its local folder."""
    s = registry.parse(spec)
    if s.kind in registry.LEARNED and s.arg:
        return registry.DrafterSpec(s.kind, str(resolve(s.arg, log)))
    if s.kind == "hybrid" and s.inner is not None and s.inner.kind in registry.LEARNED:
        inner = heads_resolved(s.inner, log)
        return registry.DrafterSpec("hybrid", str(inner), inner)
    return s


def short_name(spec: registry.Spec) -> str:
    """A model or drafter spec for a table or a title: folders and files by their last part
    ('hybrid:/x/y' -> 'hybrid:y'), 'none' for no drafter."""
    s = registry.parse(spec)
    if s.kind == "model":
        p = Path(s.arg).expanduser()
        return p.name if p.exists() else s.arg
    return f"{s.kind}:{short_name(s.arg)}" if s.arg and s.kind in ("hybrid", *registry.LEARNED) else str(s)


def draft_model_spec(draft: registry.Spec) -> str | None:
    """The model a drafter spec loads (a model spec, or a hybrid's inner one), else None."""
    return registry.parse(draft).model


def load_pair(model: str, draft: registry.Spec, *, log: Log = _quiet):
    """(target, tokenizer, drafter) for a target spec and a drafter spec.

    Both names are resolved (fetched, converted), the draft's first, before anything is loaded, so an
    unavailable draft fails in seconds, not after the target has been fetched or loaded.
    """
    draft = registry.parse(draft)  # a malformed spec fails first
    draft_name = draft.model
    draft_folder = resolve(draft_name, log) if draft_name else None  # the draft first: usually the smaller fetch
    target_folder = resolve(model, log)
    target, tokenizer, _ = load_folder(target_folder)
    loaded = {draft_name: load_folder(draft_folder)[:2]} if draft_name else None
    drafter = make_drafter(draft, target, tokenizer, loaded=loaded, log=log)
    return target, tokenizer, drafter


def load(model: str, draft: registry.Spec = "none", *, log: Log = _quiet):
    """(model, tokenizer, drafter) by name, as mlx-lm's `load` gives (model, tokenizer); the drafter is None for
    "none". Any model spec (recipe, folder, .gguf, HF repo) and drafter spec (`DRAFT_HELP`)."""
    return load_pair(model, draft, log=log)


def table_name(spec: registry.Spec) -> str:
    """A spec for an M3 Max table (/compare, bench suites): short, 'N/A' for no drafter (the M3 Max tables' word)."""
    return "N/A" if registry.parse(spec).kind == "none" else short_name(spec)


def draft_model(drafter, target):
    """The network a drafter runs (the target's own layers for self-drafting), or None for table lookups."""
    return next((p.model for p in drafter.parts if p.model is not None), None) if drafter is not None else None


def quantization(model) -> str:
    """'int4', 'mxfp4' etc. from the quantized layers mlx-lm built from the config's `quantization`, else the
    weights' dtype."""
    if model is None:
        return "N/A"
    formats = sorted(
        {
            format_name(m.bits, getattr(m, "mode", "affine"))
            for _, m in model.named_modules()
            if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
        }
    )
    if formats:
        return "/".join(formats)
    weights = list(dict(tree_flatten(model.parameters())).values())
    return str(weights[0].dtype).rpartition(".")[2] if weights else "N/A"
