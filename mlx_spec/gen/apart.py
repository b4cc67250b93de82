"""Whether a target's mlx-lm code runs rows of different lengths in one pass (probed once per model): where it reads
the cache's offset as one number (gpt_bigcode) or its width as a position (afm7), each request runs alone."""

import mlx.core as mx

from ..make.layers import per_model
from ..models.base import text_of
from . import recurrent
from .cache import new_cache
from .joint import JointCache, batchable

_SEEN: dict[int, str | None] = {}
TOLERANCE = 1e-2  # of the largest logit: a batch's other kernels round differently (bfloat16), a wrong position more


# Types whose mlx-lm attention depends on a key's column in the cache, which a row's padding and gaps shift, past what
# a probe of a few tokens shows (the conformance suite's batched runs show it)
BY_COLUMN = {"minimax_m3_vl": "its block-sparse attention groups keys by their column in the cache"}


def apart(model) -> str | None:
    """Why rows cannot share a pass of `model` (one line), or None where they can (found once per model)."""
    return per_model(_SEEN, model, id(model), lambda: _probe(model))


def _probe(model) -> str | None:
    """Two rows, of two tokens and of one, joined as the engine joins them, then one pass over both: it must run and
    give each row the logits it gets alone (afm7's shared-key layers read a position from the cache's width)."""
    text = text_of(model)
    what = f"{text.model_type} cannot run requests of different lengths in one pass"
    if text.model_type in BY_COLUMN:
        return f"{what} ({BY_COLUMN[text.model_type]})"
    run, rows, alone = recurrent.recording(model), JointCache[int](), []
    v = text.vocab_size  # (ids past it read no embedding row)
    try:
        for i, (held, nxt) in enumerate((([3 % v, 5 % v], 7 % v), ([4 % v], 9 % v))):
            caches = [new_cache(model), new_cache(model)]
            if not batchable(caches[0]):
                kinds = ", ".join(sorted({type(c).__name__ for c in caches[0]}))
                return f"{text.model_type}'s caches ({kinds}) do not join others'"
            for c in caches:
                mx.eval(run(mx.array([held], dtype=mx.uint32), cache=c))
            alone.append(run(mx.array([[nxt]], dtype=mx.uint32), cache=caches[1])[0, -1])
            rows.add(i, caches[0])
        joint = run(mx.array([[7 % v], [9 % v]], dtype=mx.uint32), cache=rows.layers)[:, -1]
        mx.eval(joint)
    except Exception as e:  # mlx-lm's code for this type, whatever it raises
        return f"{what} ({(str(e).splitlines() or [''])[0]})"
    for i, a in enumerate(alone):
        scale = float(mx.abs(a).max().item()) or 1.0  # type: ignore[arg-type]  # (a real array: a float)
        if not mx.allclose(joint[i].astype(mx.float32), a.astype(mx.float32), atol=TOLERANCE * scale).item():
            return f"{what} (a row's logits beside another differ from its own)"
    return None
