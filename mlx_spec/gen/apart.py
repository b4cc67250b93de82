"""Whether a target's mlx-lm code runs rows of different lengths in one pass (probed once per model): where it reads
the cache's offset as one number (gpt_bigcode), each request runs alone."""

import mlx.core as mx

from ..make.layers import per_model
from ..models.base import text_of
from . import recurrent
from .cache import new_cache
from .joint import Rows, batchable

_SEEN: dict[int, str | None] = {}


def apart(model) -> str | None:
    """Why rows cannot share a pass of `model` (one line), or None where they can or their caches never join."""
    return per_model(_SEEN, model, id(model), lambda: _probe(model))


def _probe(model) -> str | None:
    """Two rows, of two tokens and of one, joined as the engine joins them, then one pass over both."""
    run, rows = recurrent.recording(model), Rows[int]()
    for i, n in enumerate((2, 1)):
        cache = new_cache(model)
        if not batchable(cache):
            return None  # never joins others: nothing to ask
        mx.eval(run(mx.zeros((1, n), dtype=mx.uint32), cache=cache))
        rows.add(i, cache)
    try:
        mx.eval(run(mx.zeros((2, 1), dtype=mx.uint32), cache=rows.layers))
    except Exception as e:  # mlx-lm's code for this type, whatever it raises
        why = (str(e).splitlines() or [""])[0]
        return f"{text_of(model).model_type} cannot run requests of different lengths in one pass ({why})"
    return None
