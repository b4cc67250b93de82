"""Load a model folder; check that a draft model's tokenizer can draft for the target."""

import json
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GenerationError, MlxSpecError, SourceError
from ..models.base import text_of
from ..models.rope import overrides

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load_folder(folder) -> tuple["nn.Module", "TokenizerWrapper", Path]:
    """(model, tokenizer, folder) for an MLX or HF model folder (names and hub ids are the faces' to resolve)."""
    from mlx_lm.utils import load

    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise SourceError(f"{folder}: not a model folder (no config.json)")
    try:
        config = overrides(json.loads((folder / "config.json").read_text()))
        model, tokenizer = load(str(folder), model_config=config)[:2]  # mlx-lm types it as 2 or 3
    except MlxSpecError as e:
        raise type(e)(f"{folder}: {e}") from None
    except Exception as e:  # corrupt safetensors, missing tokenizer files ...
        what = f"{type(e).__name__}: " if not isinstance(e, ValueError) else ""
        raise SourceError(f"{folder}: cannot load: {what}{(str(e).splitlines() or [''])[0]}") from None
    _FOLDERS[id(model)] = folder
    weakref.finalize(model, _FOLDERS.pop, id(model), None)
    return model, tokenizer, folder


_FOLDERS: dict[int, Path] = {}


def folder_of(model) -> Path | None:
    """The folder a model was loaded from by `load_folder` (where a checkpoint's extra layers, e.g. MTP, are)."""
    return _FOLDERS.get(id(model))


def vocab_width(model) -> int:
    """Width of the model's logits (its padded vocabulary)."""
    return text_of(model).vocab_size


def check_tokenizers(target_tok, draft_tok) -> int:
    """Raise unless the two tokenizers map strings to the same ids and split text alike; return the vocab size."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        diff = [t for t in tv if dv.get(t) != tv[t]]
        example = f" (e.g. {diff[0]!r}: target id {tv[diff[0]]}, draft id {dv.get(diff[0])})" if diff else ""
        raise GenerationError(
            f"the draft's tokenizer differs from the target's: "
            f"{len(diff) or abs(len(tv) - len(dv))} of {len(tv)} tokens differ{example}"
        )
    probe = "def f(x):\n    return x  # héllo 世界"
    if target_tok.encode(probe) != draft_tok.encode(probe):
        raise GenerationError(
            "the draft's tokenizer splits text differently from the target's (same vocab, other merges)"
        )
    return len(tv)
