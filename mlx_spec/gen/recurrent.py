"""Recording recurrent layers' calls, so that their caches (`models.cache.RewindableCache`) rewind: a view of the
model whose recurrent blocks record each call (and whose llama4 body runs joint rows by their own positions:
`models.llama4`); the caller's model and caches stay."""

from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

from ..errors import UnsupportedError
from ..make.layers import per_model, with_blocks
from ..models.base import text_of
from ..models.cache import Recorder
from ..models.llama4 import by_rows

_VIEWS: dict[int, object] = {}


def recording(model):
    """`model`, or a view of it whose recurrent blocks record their calls (made once per model, the model unchanged)."""
    return per_model(_VIEWS, model, id(model), lambda: _recording(by_rows(model)))


def _recording(model):
    layers = getattr(model, "layers", None)
    if layers is None:  # not an mlx-lm model of blocks
        return model
    caches = make_prompt_cache(model)
    # (a view of some blocks makes the whole model's caches where it counts them from its config: mamba2)
    blocks = [_recorded(b, c) for c, b in zip(caches, layers)]
    if all(n is b for n, b in zip(blocks, layers)):  # no recurrent block
        return model
    holder = text_of(model).path  # the module holding the blocks (`model.layers` may be a copy of its list)
    if holder is None:
        raise UnsupportedError(
            f"{type(model).__name__}: recurrent layers rewind only in an mlx-lm model whose "
            "blocks a submodule holds (model.model.layers, model.backbone.layers)"
        )
    return with_blocks(model, blocks + layers[len(blocks) :], holder)


def _recorded(block, cache):
    """`block` recording its recurrent calls: over its own recurrent cache, or inside it where a recurrent state sits
    beside attention in the layer's list of caches (falcon_h1's Mamba mixer, baichuan_m1's attention)."""
    if isinstance(block, Recorder):
        return block
    if isinstance(cache, ArraysCache):
        return Recorder(block)
    if isinstance(cache, CacheList) and any(isinstance(m, ArraysCache) for m in cache.caches):
        return Recorder.inside(block)
    return block
