"""Load a target and build a drafter from their specs; check that a draft model can draft for the target."""

from pathlib import Path
from typing import Callable, Optional, Tuple

from .drafters.base import Drafter
from .errors import GenerationError, MlxSpecError, SourceError

Log = Callable[[str], None]


def load_model(spec: str, log: Log = lambda _m: None) -> Tuple[object, object, Path]:
    """(model, tokenizer, folder) for any model spec: folder, .gguf, recipe or HF repo."""
    from mlx_lm.utils import load

    from .sources import resolve

    folder = resolve(spec, log)
    try:
        model, tokenizer = load(str(folder))
    except MlxSpecError:
        raise
    except ValueError as e:
        raise SourceError(f"{folder}: cannot load: {str(e).splitlines()[0]}") from None
    except Exception as e:  # corrupt safetensors, missing tokenizer files ...
        raise SourceError(f"{folder}: cannot load: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return model, tokenizer, folder


def vocab_width(model) -> int:
    """Width of the model's logits (its padded vocabulary)."""
    args = getattr(model, "args", None)
    v = getattr(args, "vocab_size", None)
    if v is None:
        v = model.model.embed_tokens.weight.shape[0]
    return v


def check_tokenizers(target_tok, draft_tok) -> int:
    """Raise unless the two tokenizers map the same strings to the same ids; return the real vocab size.

    Vocab sizes alone are not enough: padded vocabularies (151936 vs 152064) are fine, while two
    tokenizers of equal size but different merges or ids are not.
    """
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        diff = [t for t in tv if dv.get(t) != tv[t]]
        example = f" (e.g. {diff[0]!r}: target id {tv[diff[0]]}, draft id {dv.get(diff[0])})" if diff else ""
        raise GenerationError(
            f"the draft's tokenizer differs from the target's: {len(diff) or abs(len(tv) - len(dv))} of "
            f"{len(tv)} tokens differ{example}"
        )
    probe = "def f(x):\n    return x  # héllo 世界"
    if target_tok.encode(probe) != draft_tok.encode(probe):
        raise GenerationError("the draft's tokenizer splits text differently from the target's (same vocab, other merges)")
    return len(tv)


def make_drafter(
    spec: Optional[str],
    target,
    target_tok,
    *,
    num_draft: int = 7,
    min_confidence: Optional[float] = None,
    loaded: Optional[dict] = None,
    log: Log = lambda _m: None,
) -> Optional[Drafter]:
    """A drafter from its spec: None/'none', 'ngram', 'self[:LAYERS]', 'hybrid[:D]', or a model spec.

    hybrid without ':D' falls back to the self drafter over half the target's layers.
    loaded: {model spec: (model, tokenizer)} already in memory, so a draft is never loaded twice.
    """
    from .drafters.hybrid import HybridDrafter
    from .drafters.model import ModelDrafter
    from .drafters.ngram import DEFAULT_K, NGramDrafter
    from .drafters.self_draft import SelfDrafter, parse_layers

    if spec in (None, "", "none"):
        return None
    from .drafters.model import DEFAULT_MIN_CONFIDENCE

    min_confidence = DEFAULT_MIN_CONFIDENCE if min_confidence is None else min_confidence
    width = vocab_width(target)
    real = len(target_tok.get_vocab())
    if spec == "ngram":
        return NGramDrafter(k=max(num_draft, DEFAULT_K))
    if spec.startswith("hybrid"):
        inner = spec.partition(":")[2] or f"self:{max(1, len(target.layers) // 2)}"
        if inner.startswith("hybrid") or inner == "ngram":
            raise GenerationError(f"hybrid needs a model or self drafter to fall back on, got '{inner}'")
        return HybridDrafter(NGramDrafter(k=max(num_draft, DEFAULT_K)),
                             make_drafter(inner, target, target_tok, num_draft=num_draft,
                                          min_confidence=min_confidence, loaded=loaded, log=log))
    if spec == "self" or spec.startswith("self:"):
        layers = parse_layers(spec.partition(":")[2] or str(max(1, len(target.layers) // 2)), len(target.layers))
        return SelfDrafter(target, layers, width, real, min_confidence=min_confidence)
    draft, draft_tok = (loaded or {}).get(spec) or load_model(spec, log)[:2]
    real = check_tokenizers(target_tok, draft_tok)
    return ModelDrafter(draft, width, real, min_confidence=min_confidence)
