"""The target drafts for itself through a subset of its own layers: no extra weights, no extra KV cache."""

import contextlib
from typing import List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from ..errors import GenerationError, UnsupportedError
from .base import Draft
from .model import DEFAULT_MIN_CONFIDENCE, ModelDrafter

# Architectures whose layer i depends on its index i (gemma's sliding/global pattern),
# so running a subset would silently change the attention pattern.
INDEX_DEPENDENT = ("gemma2", "gemma3", "gemma3_text", "cohere2")


def parse_layers(spec: str, n_layers: int) -> List[int]:
    """'0-11', '0,2,4', or 'K' (K evenly spaced layers, first and last included)."""
    from ..convert import keep_layer_indices

    try:
        if "-" in spec or "," in spec:
            out = []
            for part in spec.split(","):
                lo, _, hi = part.partition("-")
                out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
        else:
            return keep_layer_indices(n_layers, int(spec))
    except ValueError:
        raise GenerationError(f"self:LAYERS must be 'K', 'a-b' or 'i,j,..', got '{spec}'") from None
    if not out or any(not 0 <= i < n_layers for i in out) or len(set(out)) != len(out):
        raise GenerationError(f"self:{spec}: layers must be distinct indices in [0, {n_layers})")
    return sorted(out)


class SelfDrafter(ModelDrafter):
    """Runs embed -> chosen layers -> norm -> lm_head of the target itself.

    KV overwrite (QSpec §3.1): the chosen layers read and write the *target's* caches. After
    drafting, their draft entries are trimmed away and the verify pass writes the target's
    exact entries for the same positions, so the draft always continues from verified KV.
    """

    name = "self"

    def __init__(self, model, layers: Sequence[int], vocab_size: int, real_vocab: Optional[int] = None,
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE):
        model_type = getattr(getattr(model, "args", None), "model_type", "")
        if model_type in INDEX_DEPENDENT:
            raise UnsupportedError(f"self drafting is not supported for {model_type}: its layers depend on their index")
        if not hasattr(model, "model") or not hasattr(model.model, "layers"):
            raise UnsupportedError("self drafting needs an mlx-lm model with model.model.layers")
        self.layers = list(layers)
        self.target_cache = None
        super().__init__(model, vocab_size, real_vocab, min_confidence)

    def _new_cache(self):
        return None  # uses the target's cache, bound by the engine

    def bind(self, target_cache) -> None:
        """Share the target's per-layer caches (called by the engine for each generation)."""
        self.target_cache = target_cache
        self.cache = [target_cache[i] for i in self.layers]

    @contextlib.contextmanager
    def _subset(self):
        # mlx-lm has no "run these layers" entry point, so swap the layer list for the call.
        inner = self.model.model
        full = inner.layers
        inner.layers = [full[i] for i in self.layers]
        try:
            yield
        finally:
            inner.layers = full

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        if self.target_cache is None:
            raise GenerationError("self drafter used before bind(target_cache)")
        if k <= 0 or not context:
            return Draft([])
        offset = self.target_cache[0].offset
        self._fed = list(context[:offset])  # the target cache holds exactly the context minus its last token
        with self._subset():
            draft = super().propose(context, k, probs_fn)
        fed = len(self._fed) - offset
        trim_prompt_cache(self.cache, fed)  # drop draft KV: verification rewrites these positions
        del self._fed[offset:]
        mx.eval([c.state for c in self.cache])
        return draft
