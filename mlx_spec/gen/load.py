"""Load a model folder; check that a draft model's tokenizer can draft for the target."""

from pathlib import Path
from typing import Tuple

from ..errors import GenerationError, MlxSpecError, SourceError


def load_folder(folder) -> Tuple[object, object, Path]:
    """(model, tokenizer, folder) for an MLX or HF model folder (names and hub ids are the faces' to resolve)."""
    from mlx_lm.utils import load

    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise SourceError(f"{folder}: not a model folder (no config.json)")
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
