"""Drafter specs: parse one once into a DrafterSpec, build the drafter from it, and each kind's default K."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConvertError, GenerationError, UnsupportedError
from ..make.importance import head_ids
from ..make.layers import per_model
from ..models.base import text_of
from . import tunables
from .drafters.base import Drafter

# Most draft tokens per round, by kind: the one place these defaults live.
DEFAULT_K = {
    "model": tunables.MODEL_K,
    "self": tunables.MODEL_K,
    "quant-self": tunables.MODEL_K,
    "ngram": tunables.NGRAM_K,
    "suffix": tunables.SUFFIX_K,
    "hybrid": tunables.SUFFIX_K,
    "eagle3": tunables.MODEL_K,
    "mtp": tunables.MODEL_K,
    "dflash": tunables.MODEL_K,
}
KINDS = ("none", "ngram", "suffix", "self", "quant-self", "hybrid", "eagle3", "mtp", "dflash", "model")
LEARNED = ("eagle3", "mtp", "dflash")  # drafters reading the target's states, loaded from a folder of their own
NGRAM_N = (2, 16)  # the longest n-gram `ngram:N` may ask for
NO_SOURCE = "hybrid: no source drafts for this target, plain decoding"  # a hybrid's note where its target cannot rewind


@dataclass(frozen=True)
class DrafterSpec:
    """A parsed drafter spec: kind in KINDS, its argument, and a hybrid's parsed fallback (`inner`)."""

    kind: str
    arg: str = ""
    inner: "DrafterSpec | None" = None

    def __str__(self) -> str:
        if self.kind == "model":
            return self.arg
        return f"{self.kind}:{self.arg}" if self.arg else self.kind

    @property
    def model(self) -> str | None:
        """The model this spec loads (a model spec, or a hybrid's inner one), else None."""
        spec = self.inner if self.kind == "hybrid" else self
        return spec.arg if spec is not None and spec.kind == "model" else None


Spec = DrafterSpec | str | None


def parse(spec: Spec) -> DrafterSpec:
    """'none'/None/'', 'ngram', 'ngram:N', 'suffix', 'suffix:shared', 'self', 'self:LAYERS', 'quant-self',
    'quant-self:FORMAT', 'hybrid', 'hybrid:D' ('hybrid:none': suffix and n-gram alone), 'eagle3:FOLDER', 'mtp',
    'mtp:FOLDER', 'dflash:FOLDER', or anything else as a model spec; a DrafterSpec is returned as is."""
    if isinstance(spec, DrafterSpec):
        return spec
    spec = (spec or "").strip()
    if spec in ("", "none", "off"):
        return DrafterSpec("none")
    head, sep, arg = spec.partition(":")
    if head == "suffix" and sep and arg != "shared":  # suffix:shared, with the process's memory of earlier outputs
        raise GenerationError(f"'{spec}': the suffix drafter takes ':shared' or nothing")
    if head == "ngram" and sep and not (arg.isdigit() and NGRAM_N[0] <= int(arg) <= NGRAM_N[1]):  # ANPD's N
        raise GenerationError(f"'{spec}': N must be an integer in [{NGRAM_N[0]}, {NGRAM_N[1]}] (e.g. 'ngram:5')")
    if head in ("self", "quant-self", "hybrid") and sep and not arg:
        raise GenerationError(f"'{spec}': nothing after ':' (try '{head}' alone)")
    if head == "eagle3" and not arg:
        raise GenerationError(f"'{spec}': an EAGLE-3 drafter needs its head: 'eagle3:FOLDER'")
    if head == "dflash" and not arg:
        raise GenerationError(f"'{spec}': a DFlash drafter needs its folder: 'dflash:FOLDER'")
    if head == "hybrid":
        inner = parse(arg or "self")
        if inner.kind in ("hybrid", "ngram", "suffix") or (inner.kind == "none" and arg != "none"):
            raise GenerationError(
                f"hybrid needs a model or self drafter to fall back on (or 'none': the context's "
                f"sources alone), got '{arg}'"
            )
        return DrafterSpec(head, arg, inner)
    return DrafterSpec(head, arg) if head in KINDS[1:-1] else DrafterSpec("model", spec)


def default_num_draft(drafter: Drafter | Spec) -> int:
    """Default K for a drafter, a spec or None (plain decoding drafts nothing; 1 keeps K valid)."""
    if drafter is None:
        return 1
    kind = parse(drafter).kind if isinstance(drafter, (str, DrafterSpec)) else drafter.name
    return DEFAULT_K.get(kind, tunables.MODEL_K)


def build(
    spec: Spec, target, tokenizer, *, load: Callable[[str], tuple] | None = None, subset_head: bool = True
) -> Drafter | None:
    """The drafter for `spec` over `target` (None: plain decoding); load: a draft model spec -> (model, tokenizer)."""
    from ..make.layers import parse_layers
    from ..models.cache import unrewindable
    from .cache import new_cache
    from .drafters import suffix as _suffix
    from .drafters.hybrid import HybridDrafter
    from .drafters.model import ModelDrafter
    from .drafters.ngram import NGramDrafter
    from .drafters.self_draft import ImportanceSelfDrafter, QuantSelfDrafter, SelfDrafter
    from .load import check_tokenizers, load_folder, vocab_width

    s = parse(spec)
    if s.kind == "none":
        return None
    width, real = vocab_width(target), len(tokenizer.get_vocab())
    subset = head_ids(tokenizer, real) if subset_head and s.kind in ("self", "quant-self", "model") else None
    if s.kind == "suffix":
        return _suffix.SuffixDrafter(memory=_suffix.PROCESS_MEMORY if s.arg == "shared" else None)
    if s.kind == "ngram":
        n = int(s.arg) if s.arg else tunables.NGRAM_N
        return NGramDrafter(n=n, min_n=min(tunables.NGRAM_MIN_N, n))
    if s.kind == "hybrid":
        why = unrewindable(new_cache(target), len(text_of(target).blocks))
        if why is not None:  # no source can serve: it runs as plain decoding, and says why
            return HybridDrafter([], None, f"{NO_SOURCE}: {why}")
        try:
            inner = build(s.inner, target, tokenizer, load=load, subset_head=subset_head)
        except UnsupportedError as e:  # the target cannot serve this source: the context's sources still can
            return HybridDrafter([_suffix.SuffixDrafter(), NGramDrafter()], None, f"hybrid: {s.inner} left out: {e}")
        return HybridDrafter([_suffix.SuffixDrafter(), NGramDrafter()], inner)
    if s.kind == "eagle3":
        return _eagle3(s.arg, target, width, real)
    if s.kind == "mtp":
        return _mtp(s.arg, target, width, real)
    if s.kind == "dflash":
        return _dflash(s.arg, target, width, real)
    if s.kind == "quant-self":
        return QuantSelfDrafter(target, s.arg or tunables.QUANT_SELF_FORMAT, width, real, head_ids=subset)
    if s.kind == "self":
        n, half = len(target.layers), max(1, len(target.layers) // 2)
        head, _, count = s.arg.partition(":")
        if head == "importance":  # self:importance[:K], the K blocks that matter most for the prompt
            if count and not (count.isdigit() and 1 <= int(count) <= n):
                raise GenerationError(f"'{s}': K must be an integer in [1, {n}]")
            return ImportanceSelfDrafter(target, int(count) if count else half, width, real, head_ids=subset)
        try:  # 'K' evenly spaced blocks, 'a-b', 'i,j,..': the making layer's rule
            layers = parse_layers(s.arg or str(half), n)
        except ConvertError as e:
            raise GenerationError(f"self:{s.arg or half}: {e}") from None
        return SelfDrafter(target, layers, width, real, head_ids=subset)
    draft, draft_tok = (load or (lambda p: load_folder(p)[:2]))(s.arg)
    real = check_tokenizers(tokenizer, draft_tok)
    return ModelDrafter(draft, width, real, head_ids=subset)


_HEADS: dict[tuple, object] = {}


def _shared(kind: str, folder, target, load: Callable[[], object]):
    """The learned drafter's module of `kind` in `folder` for `target`, loaded once: every request's drafter shares
    it, so rows draft in one pass (let go with the target)."""
    return per_model(_HEADS, target, (kind, str(Path(folder).expanduser().resolve()), id(target)), load)


def _eagle3(folder: str, target, width: int, real: int) -> Drafter:
    """The EAGLE-3 head in `folder` over `target`: one that was made for another target is refused in one line."""
    from ..models import eagle3
    from .drafters.eagle3 import Eagle3Drafter

    text = text_of(target)
    head = _shared("eagle3", folder, target, lambda: eagle3.load(folder, embed=text.embed))
    c, n, hidden = head.config, len(text.blocks), text.hidden_size
    reads = c.reads or eagle3.default_reads(n)
    if c.target_hidden_size != hidden or c.vocab_size not in (width, real) or max(reads) >= n or min(reads) < 0:
        raise GenerationError(
            f"{folder}: this EAGLE-3 head was made for another target (it reads blocks {list(reads)} of hidden size "
            f"{c.target_hidden_size}, vocabulary {c.vocab_size}; the target has {n} blocks, hidden size {hidden}, "
            f"vocabulary {width})"
        )
    if "embed_tokens" in head and head.embed_tokens.weight.shape[0] not in (width, real):
        raise GenerationError(
            f"{folder}: the head embeds {head.embed_tokens.weight.shape[0]} tokens, the target {width}"
        )
    return Eagle3Drafter(head, reads, width, real)


def _mtp(folder: str, target, width: int, real: int) -> Drafter:
    """The MTP layers of the checkpoint in `folder` (default: the one the target was loaded from) over `target`."""
    from ..models import mtp
    from .drafters.mtp import MTPDrafter
    from .load import folder_of

    where = Path(folder).expanduser() if folder else folder_of(target)
    if where is None:
        raise GenerationError("'mtp': the target was not loaded from a folder; name its checkpoint: 'mtp:FOLDER'")
    return MTPDrafter(_shared("mtp", where, target, lambda: mtp.load(where, target)), len(target.layers), width, real)


def _dflash(folder: str, target, width: int, real: int) -> Drafter:
    """The DFlash drafter in `folder` over `target`: one that was made for another target is refused in one line."""
    from ..models import dflash
    from .drafters.dflash import DFlashDrafter

    module = _shared("dflash", folder, target, lambda: dflash.load(folder, target))
    text = text_of(target)
    c, n, hidden = module.config, len(text.blocks), text.hidden_size
    vocab = c.layer.get("vocab_size")
    if (
        module.hidden_size != hidden
        or c.target_layers not in (None, n)
        or max(c.reads) >= n
        or min(c.reads) < 0
        or vocab not in (None, width, real)
        or not 0 <= c.mask_token_id < width
    ):
        raise GenerationError(
            f"{folder}: this DFlash drafter was made for another target (it reads blocks {c.reads} of a target of "
            f"{c.target_layers or 'more'} blocks, hidden size {module.hidden_size}, vocabulary {vocab}, mask token "
            f"{c.mask_token_id}; the target has {n} blocks, hidden size {hidden}, vocabulary {width})"
        )
    return DFlashDrafter(module, width, real)
