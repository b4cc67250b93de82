"""The target drafts for itself through a subset of its own layers: no extra weights, no extra KV cache."""

from typing import List, Optional, Sequence

from ...errors import ConvertError, GenerationError, UnsupportedError
from ...make.layers import INDEX_DEPENDENT, parse_layers as _parse, with_blocks
from .. import recurrent
from ..cache import rewind
from ..tunables import IMPORTANCE_TOKENS
from .base import Draft
from .model import ModelDrafter


def parse_layers(spec: str, n_layers: int) -> List[int]:
    """'K' (K evenly spaced layers, first and last included), 'a-b', 'i,j,..' (the making layer's rule);
    `importance[:K]` is handled by the registry (ImportanceSelfDrafter)."""
    try:
        return _parse(spec, n_layers)
    except ConvertError as e:
        raise GenerationError(f"self:{spec}: {e}") from None


def layer_view(model, layers: Sequence[int]):
    """A model object that runs embed -> `layers` -> norm -> head of `model`, sharing its weights."""
    return with_blocks(model, [model.model.layers[i] for i in layers])


class SelfDrafter(ModelDrafter):
    """Drafts with a subset of the target's own layers.

    KV overwrite (QSpec §3.1): the chosen layers read and write the *target's* caches. After drafting, their
    draft entries are trimmed away and the verify pass writes the target's exact entries for the same positions,
    so the draft always continues from verified KV. The draft passes stay lazy until the engine reads the round.
    """

    name = "self"
    in_target_cache = True

    def __init__(self, model, layers: Sequence[int], vocab_size: int, real_vocab: Optional[int] = None,
                 head_ids=None):
        model_type = getattr(getattr(model, "args", None), "model_type", "")
        if not hasattr(model, "model") or not hasattr(model.model, "layers"):
            raise UnsupportedError(f"{self.name} drafting needs an mlx-lm model with model.model.layers")
        if model_type in INDEX_DEPENDENT and list(layers) != list(range(len(model.model.layers))):
            raise UnsupportedError(f"self drafting with a subset of layers is not supported for {model_type}: "
                                   "its layers depend on their index")
        self.layers = list(layers)
        self.target_cache = None
        super().__init__(layer_view(model, self.layers), vocab_size, real_vocab, head_ids)

    def _new_cache(self):
        raise GenerationError("self drafter used before reset(prompt, target_cache)")

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """Share the target's per-layer caches; nothing to prefill (the target's prefill is ours)."""
        if target_cache is None:
            raise GenerationError("the self drafter needs the target's cache: reset(prompt, target_cache)")
        self.target_cache = target_cache
        self.cache = [target_cache[i] for i in self.layers]
        if self.subset:
            self.head.add(prompt)
        # Recurrent layers of the target (or of a quantized copy) record their calls into the shared cache,
        # so that the draft passes can be trimmed like attention entries.
        if not recurrent.enable(self.model, self.cache):
            raise GenerationError(f"{self.name} drafter: the target's recurrent cache cannot be rewound")

    def behind(self, context: List[int]) -> int:
        return 0  # the target's cache is ours: nothing to catch up

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        if self.target_cache is None:
            raise GenerationError("self drafter used before reset(prompt, target_cache)")
        if k <= 0 or not context:
            return Draft([], source=self.name)
        offset = self.target_cache[0].offset
        self._fed, self._drafted = list(context[:offset]), None  # the target cache holds the context but its last
        try:
            return super().propose(context, k, probs_fn)
        finally:  # drop the draft's entries, even if interrupted: the verify pass writes these positions
            rewind(self.cache, offset)
            self._fed, self._drafted = [], None




class ImportanceSelfDrafter(SelfDrafter):
    """Self drafting with the `keep` blocks that matter most for this context, re-chosen at every reset.

    Training-free layer selection in the spirit of SWIFT and Draft & Verify: before each generation
    the target runs the last IMPORTANCE_TOKENS prompt tokens once with probes on its blocks
    (`make.importance.block_similarity`, on a shallow copy: the shared target is untouched), and the
    blocks whose output changes their input least are skipped. A session's next turn ranks again on
    its own, longer context.
    """

    def __init__(self, model, keep: int, vocab_size: int, real_vocab: Optional[int] = None, head_ids=None):
        from ...make.layers import keep_layer_indices

        self.target, self.keep = model, keep
        super().__init__(model, keep_layer_indices(len(model.model.layers), keep), vocab_size, real_vocab, head_ids)

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        from ...make.importance import block_similarity, most_important

        tail = list(prompt[-IMPORTANCE_TOKENS:])
        if len(tail) >= 2:
            self.layers = most_important(block_similarity(self.target, [tail]), self.keep)
            self.model = layer_view(self.target, self.layers)
            if self.head is not None:
                self.head.model = self.model
        super().reset(prompt, target_cache)
