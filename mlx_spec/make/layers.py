"""The layer-index rules: which blocks a layer-drop keeps, and how a config follows the kept blocks.

Used by `convert --keep-layers/--layers` and by the self drafter, so both read one rule.
"""

import copy
import weakref
from collections.abc import Callable, Sequence

from ..errors import ConvertError
from ..models.base import holder_of

# Architectures whose block i behaves by its index i (Gemma's sliding/global attention pattern is
# derived from the index in mlx-lm), so a subset of blocks would silently change the attention. The hybrid
# recurrent models take their masks from the cache at a fixed block index, so a subset would fail or mis-mask;
# Gemma 3n and 4 read per-layer inputs by block index, Llama 4 picks chunked or global attention by it.
INDEX_DEPENDENT = (
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gemma3n",
    "gemma4",
    "gemma4_text",
    "llama4",
    "cohere2",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "lfm2",
    "lfm2_moe",
)
# Where HF configs keep the block count, and the lists with one entry per block (transformers
# checks len(layer_types) == num_hidden_layers; mlx-lm models index the others by block).
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
PER_LAYER_KEYS = (
    "layer_types",
    "mlp_layer_types",
    "no_rope_layers",
    "layer_rope_theta",
    "partial_rotary_factors",
    "num_attention_heads_per_layer",
    "num_query_heads",
    "num_kv_heads",
    "ffn_multipliers",
    "block_configs",
    "is_moe_layer",
)
# mlx-lm ignores `layer_types` for these and makes block i global iff (i + 1) % sliding_window_pattern == 0
# (models/gemma3_text.py, cohere2.py); every other block uses the sliding window.
PATTERN_TYPED = ("gemma3_text", "cohere2")


def with_blocks(model, blocks: list, holder: str | None = None):
    """A model object that runs embed -> `blocks` -> norm -> head of `model`, sharing its weights (`holder`: the path
    of the submodule that holds the blocks, found by `holder_of` if not given).

    mlx-lm has no "run these blocks" entry point, so the modules along the path are copied shallowly and the
    innermost copy gets its own block list; `model` itself is never changed, so a request running it at the
    same time is unaffected. Used for layer subsets (self drafting) and for probes around each block.
    """
    path = (holder or holder_of(model) or "model").split(".")
    copies = [copy.copy(model)]
    for name in path:
        copies.append(copy.copy(getattr(copies[-1], name)))
    copies[-1].layers = blocks
    for parent, name, child in zip(copies[:-1], path, copies[1:]):
        setattr(parent, name, child)
    return copies[0]


def per_model(store: dict, model, key, make: Callable[[], object]):
    """`make()`, kept in `store` under `key` until `model` is let go: a view of a model, or a module read beside it,
    made once for every request that runs that model."""
    if key not in store:
        store[key] = make()
        weakref.finalize(model, store.pop, key, None)
    return store[key]


class Watched:
    """Stands in for one block: runs it and hands its input and output to `see` (models that read a block's
    attributes, e.g. its attention type, still can)."""

    def __init__(self, block, see):
        self._block, self._see = block, see

    def __call__(self, x, *args, **kwargs):
        y = self._block(x, *args, **kwargs)
        self._see(x, y)
        return y

    def __getattr__(self, name):
        return getattr(self._block, name)


def keep_layer_indices(n_layers: int, k: int) -> list[int]:
    """K evenly spaced blocks of n, first and last included.

    The seed (draft-model-generation-compression §3.2) takes blocks [0, n/(k-1), 2n/(k-1), ...];
    literally that indexes block n, one past the end, so we space over n-1 instead, which keeps
    its example (12 blocks, k=3 -> 0, 6, 11 here vs 0, 6, 12 there) and keeps the last block.
    """
    if not 1 <= k <= n_layers:
        raise ConvertError(f"the number of layers to keep must be between 1 and the layer count {n_layers}, got {k}")
    if k == 1:
        return [0]
    # i * (n-1) / (k-1) rounded half up, in integers so no float tie goes the other way
    return [(2 * i * (n_layers - 1) + (k - 1)) // (2 * (k - 1)) for i in range(k)]


def parse_layers(text: str, n_layers: int) -> list[int]:
    """'K' (K evenly spaced blocks), 'a-b' (a range), 'i,j,..' or a mix such as '0-3,8,11'; sorted, checked."""
    text = text.strip()
    try:
        if text.isdigit():
            return keep_layer_indices(n_layers, int(text))
        out: list[int] = []
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise ConvertError(f"layers must be 'K', 'a-b' or 'i,j,..', got '{text}'") from None
    check_layers(out, n_layers)
    return sorted(out)


def check_layers(layers, n_layers: int) -> None:
    """Raise unless `layers` are distinct block indices in [0, n_layers)."""
    layers = list(layers)
    if not layers or any(not 0 <= i < n_layers for i in layers) or len(set(layers)) != len(layers):
        raise ConvertError(f"layers must be distinct indices in [0, {n_layers}), got {layers}")


def kept_config(config: dict, kept: Sequence[int]) -> dict:
    """The HF config of a model made of blocks `kept` (renumbered 0..K-1) of the model `config` describes.

    Sets the block count and cuts the per-block lists to the kept blocks. Where mlx-lm derives a
    block's attention from its index (PATTERN_TYPED), picks the sliding_window_pattern under which
    every kept block keeps its attention type, and raises ConvertError when none does.
    """
    count_key = next((k for k in LAYER_COUNT_KEYS if k in config), None)
    if count_key is None:
        raise ConvertError(f"the config has no block count ({', '.join(LAYER_COUNT_KEYS)})")
    n, kept = int(config[count_key]), list(kept)
    check_layers(kept, n)
    out = {**config, count_key: len(kept)}
    for key in PER_LAYER_KEYS:
        if isinstance(config.get(key), list):
            if len(config[key]) != n:
                raise ConvertError(f"the config's {key} has {len(config[key])} entries for {n} blocks")
            out[key] = [config[key][i] for i in kept]
    if config.get("model_type") in PATTERN_TYPED:
        out.update(_repattern(config, kept, n))
    _check_builds(out, kept)
    return out


def _check_builds(config: dict, kept: list[int]) -> None:
    """Refuse a config mlx-lm cannot build (e.g. llama's layer_types with no full-attention block left).

    Building is cheap: MLX allocates nothing until the lazy random init is evaluated.
    """
    from mlx_lm.utils import _get_classes

    try:
        model_cls, args_cls = _get_classes(config)
        model_cls(args_cls.from_dict(config))
    except Exception as e:  # mlx-lm raises whatever its constructor hits (ValueError, IndexError, ...)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConvertError(f"mlx-lm cannot build a model of the kept blocks {kept}: {why}") from None


def _globals(pattern: int, n: int) -> list[bool]:
    """Which of n blocks mlx-lm makes global (full attention) under `sliding_window_pattern`."""
    return [(i + 1) % pattern == 0 for i in range(n)]


def _repattern(config: dict, kept: list[int], n: int) -> dict:
    """sliding_window_pattern and layer_types under which mlx-lm gives each kept block its old type."""
    from mlx_lm.utils import _get_classes

    # The pattern mlx-lm reads, its own default included; block i's type is fixed by it.
    pattern = _get_classes(config)[1].from_dict(config).sliding_window_pattern
    want = [_globals(pattern, n)[i] for i in kept]
    # mlx-lm takes the global mask from block pattern-1, so the pattern cannot exceed the block count.
    fits = [p for p in range(1, len(kept) + 1) if _globals(p, len(kept)) == want]
    if not fits:
        kinds = "".join("G" if g else "s" for g in want)
        raise ConvertError(
            f"{config['model_type']}: mlx-lm makes block j global iff (j+1) % sliding_window_pattern == 0, and no "
            f"pattern gives the kept blocks {kept} their attention types ({kinds}, G = global); keep blocks whose "
            "global ones fall every p-th"
        )
    out = {
        "sliding_window_pattern": fits[0],
        "layer_types": ["full_attention" if g else "sliding_attention" for g in want],
    }
    if "_sliding_window_pattern" in config:  # transformers' spelling, kept in step
        out["_sliding_window_pattern"] = fits[0]
    return out
