"""The joint caches of a batch (one object per layer, one row per generation): merging a generation's cache in,
taking a row's cache out, and rewinding each row by its own count.

Attention layers use mlx-lm's `BatchKVCache` (rows of different lengths sit left-padded in it, as in its
`BatchGenerator`). A row is rewound on its own by rolling the positions it drops into its left padding
(`prepare(right_padding=...)` then `finalize()`), so every row ends at the same column again.

Recurrent layers (gated delta nets, Mamba) use `recurrent.RewindableRows`: the rows' states stacked, the batched
passes recorded, and each row rewound by restoring its state before the pass its kept part ends in and replaying
its layer's mixer on that part. A hybrid's attention layers rewind as above.
"""

from typing import List, Optional, Sequence

from mlx_lm.models.cache import BatchKVCache, KVCache

from . import recurrent
from .recurrent import RewindableCache, RewindableRows


def batchable(cache: Sequence) -> bool:
    """Whether a generation's cache can join a batch: plain KV caches and rewindable recurrent ones (no sliding
    window, no recurrent state of unknown length)."""
    return all(type(c) is KVCache or (isinstance(c, RewindableCache) and not isinstance(c, RewindableRows))
               for c in cache)


def merge(cache: Sequence) -> List:
    """A batch of one row from a generation's cache (the cache itself is copied, never changed)."""
    return [recurrent.joint(c) if isinstance(c, RewindableCache) else BatchKVCache.merge([c]) for c in cache]


def join(joint: Optional[List], cache: Sequence) -> List:
    """`joint` with a generation's cache as one more row (a new joint cache when `joint` is None)."""
    one = merge(cache)
    if joint is None:
        return one
    extend(joint, one)
    return joint


def extend(joint: List, more: List) -> None:
    """Append the rows of `more` (a `merge` result or another joint cache) to `joint`, in place."""
    for mine, new in zip(joint, more):
        mine.extend(new)


def extract(joint: List, i: int, tokens: int) -> List:
    """Row i's cache as a generation's own, holding its first `tokens` tokens."""
    out = [c.extract(i) for c in joint]
    for c in out:
        n = c.offset - tokens
        if c.trim(n) < n:  # a recurrent row trims only within the pass it was last rewound in
            raise ValueError(f"row {i} cannot be trimmed back {n} tokens")
    return out


def keep_rows(joint: List, rows: List[int]) -> None:
    """Keep only the given rows, in place."""
    for c in joint:
        c.filter(rows)


def start_round(joint: List) -> None:
    """What the joint cache holds now is final: a round's rewind goes back no further than this."""
    recurrent.commit(joint)


def rewind(joint: List, drop: List[int]) -> None:
    """Drop each row's last `drop[i]` positions (of the passes since the last rewind or `start_round`): a recurrent
    layer replays each row's kept part; an attention layer trims the part common to all and rolls the rest into
    the row's left padding."""
    common = min(drop)
    extra = [n - common for n in drop]
    for c in joint:
        if isinstance(c, RewindableRows):
            c.trim_rows(drop)
            continue
        if common:
            c.trim(common)
        if any(extra):
            c.prepare(right_padding=extra)
            c.finalize()
