"""Small helpers over mlx-lm's per-layer caches: how many tokens they hold, and rewinding all layers together."""

from typing import List, Optional

from mlx_lm.models.cache import make_prompt_cache

from . import recurrent


def cache_tokens(cache: List) -> Optional[int]:
    """Tokens held by every layer of `cache`, or None if the layers disagree (an interrupted update)."""
    offsets = {getattr(c, "offset", None) for c in cache}
    if len(offsets) != 1 or None in offsets:
        return None
    return offsets.pop()


def rewind(cache: List, n_tokens: int) -> bool:
    """Trim every layer back to `n_tokens` tokens (layers may be at different offsets after an
    interrupted forward pass). False if some layer can no longer be trimmed that far (a sliding-window
    cache past its window, a recurrent layer whose history does not reach): the cache is then unusable
    and must be rebuilt."""
    ok = True
    for c in cache:
        extra = getattr(c, "offset", 0) - n_tokens
        if extra > 0:
            if c.is_trimmable():
                trimmed = c.trim(extra)
                ok = ok and (trimmed is None or trimmed >= extra)
            else:
                ok = False
    return ok


def new_cache(model) -> List:
    """mlx-lm's cache for `model` (one object per layer), its recurrent layers rewindable."""
    return recurrent.rewindable(make_prompt_cache(model))
