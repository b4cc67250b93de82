"""Which transformer blocks matter: the cosine similarity of each block's input and output on calibration text.

A block whose output is nearly its input (cosine close to 1) changes the hidden state least, so
dropping it changes the network least (the training-free layer ranking of ShortGPT-style pruning,
and the measured-importance layer skipping of SWIFT and Draft & Verify). `convert --keep-layers K
--layer-pick importance` keeps the K blocks that change their input most.
"""

import sysconfig
from collections.abc import Iterable, Sequence
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import mlx.core as mx

from ..errors import ConvertError
from ..models.base import text_of
from .layers import Watched, with_blocks

CALIBRATION = files("mlx_spec") / "recipes" / "calibration.txt"  # package data, beside the recipes
CALIBRATION_TOKENS = 1024  # tokens of calibration text per ranking: enough for a stable order, cheap to run
PICKS = ("even", "first", "importance")  # how --keep-layers K chooses its blocks
# Pure-Python standard library modules whose source joins the calibration text as a draft head's base vocabulary:
# code and English docstrings that ship with every Python (about 1.2 MB, 11.5k Qwen2.5 tokens).
HEAD_MODULES = (
    "argparse",
    "dataclasses",
    "functools",
    "pathlib",
    "textwrap",
    "typing",
    "statistics",
    "string",
    "heapq",
    "bisect",
    "random",
    "datetime",
    "json/encoder",
    "json/decoder",
    "collections/__init__",
    "csv",
    "logging/__init__",
    "unittest/case",
    "shutil",
    "tempfile",
    "fractions",
    "difflib",
    "pprint",
    "enum",
    "abc",
    "contextlib",
    "copy",
    "glob",
    "fnmatch",
    "os",
)


def calibration_texts(path=None) -> list[str]:
    """The calibration passages (separated by two blank lines); a clear error for a missing, empty or binary file."""
    source: Traversable = Path(path) if path is not None else CALIBRATION
    try:
        raw = source.read_bytes()
    except OSError as e:
        raise ConvertError(f"calibration file {source}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConvertError(f"calibration file {source}: not UTF-8 text") from None
    if "\x00" in text:
        raise ConvertError(f"calibration file {source}: not text (it contains NUL bytes)")
    passages = [p.strip() for p in text.split("\n\n\n") if p.strip()]
    if not passages:
        raise ConvertError(f"calibration file {source}: empty")
    return passages


def vocabulary_texts() -> list[str]:
    """The calibration passages and the source of HEAD_MODULES: the text a draft head's base vocabulary comes from."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return calibration_texts() + [
        p.read_text(errors="ignore") for m in HEAD_MODULES if (p := stdlib / f"{m}.py").is_file()
    ]


_HEAD_IDS: dict[tuple, list[int]] = {}


def head_ids(tokenizer, real: int) -> list[int]:
    """A draft head's base vocabulary: the tokens of `vocabulary_texts` and EOS, once per tokenizer."""
    key = (getattr(tokenizer, "name_or_path", None) or id(tokenizer), real)
    if key not in _HEAD_IDS:
        ids = {t for text in vocabulary_texts() for t in tokenizer.encode(text)}
        ids.update(getattr(tokenizer, "eos_token_ids", None) or [])
        _HEAD_IDS[key] = sorted(t for t in ids if 0 <= t < real)
    return _HEAD_IDS[key]


def _turn(sink: list):
    """A `Watched` block's hook: records how far the block's output turned from its input (mean cosine)."""

    def see(x, y):
        a, b = x.astype(mx.float32), y.astype(mx.float32)
        sink.append(((a * b).sum(-1) / (mx.linalg.norm(a, axis=-1) * mx.linalg.norm(b, axis=-1) + 1e-6)).mean())

    return see


def block_similarity(model, token_lists: Iterable[Sequence[int]]) -> list[float]:
    """Per block, the mean cosine similarity of its input and output hidden states over the given token lists.

    The shared `model` is not changed: a shallow copy runs with probes in place of its blocks.
    """
    text = text_of(model)
    if text.body is None:
        raise ConvertError(f"importance ranking: mlx-lm's {type(model).__module__} keeps its blocks elsewhere")
    sinks: list[list[mx.array]] = [[] for _ in text.blocks]
    view = with_blocks(model, [Watched(layer, _turn(sink)) for layer, sink in zip(text.blocks, sinks)], text.path)
    seen = 0
    for tokens in token_lists:
        if len(tokens) < 2:
            continue
        view(mx.array(list(tokens))[None])
        mx.eval([s[-1] for s in sinks])
        seen += 1
    if not seen:
        raise ConvertError("importance ranking: no calibration text of at least 2 tokens")
    return [float(mx.stack(s).mean()) for s in sinks]


def calibration_tokens(tokenizer, texts: Sequence[str], budget: int = CALIBRATION_TOKENS) -> list[list[int]]:
    """Token lists from the passages, in order, until `budget` tokens (each passage cut to fit)."""
    out, used = [], 0
    for text in texts:
        ids = tokenizer.encode(text)[: budget - used]
        if len(ids) >= 2:
            out.append(ids)
            used += len(ids)
        if used >= budget:
            break
    return out


def most_important(similarity: Sequence[float], k: int) -> list[int]:
    """The k blocks that change their input most (lowest similarity), in block order."""
    if not 1 <= k <= len(similarity):
        raise ConvertError(
            f"the number of layers to keep must be between 1 and the layer count {len(similarity)}, got {k}"
        )
    order = sorted(range(len(similarity)), key=lambda i: similarity[i])
    return sorted(order[:k])
