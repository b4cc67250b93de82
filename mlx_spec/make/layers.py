"""The layer-index rules: which blocks a layer-drop keeps, and how a config follows the kept blocks.

Used by `convert --keep-layers/--layers` and by the self drafter, so both read one rule.
"""

from typing import List

from ..errors import ConvertError

# Architectures whose block i behaves by its index i (Gemma's sliding/global attention pattern is
# derived from the index in mlx-lm), so a subset of blocks would silently change the attention.
INDEX_DEPENDENT = ("gemma2", "gemma3", "gemma3_text", "cohere2")


def keep_layer_indices(n_layers: int, k: int) -> List[int]:
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


def parse_layers(text: str, n_layers: int) -> List[int]:
    """'K' (K evenly spaced blocks), 'a-b' (a range), 'i,j,..' or a mix such as '0-3,8,11'; sorted, checked."""
    text = text.strip()
    try:
        if text.isdigit():
            return keep_layer_indices(n_layers, int(text))
        out: List[int] = []
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
