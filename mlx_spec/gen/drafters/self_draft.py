"""The target drafts for itself through a subset of its own layers: no extra weights, no extra KV cache."""

from typing import List, Optional, Sequence

import mlx.core as mx

from ...errors import ConvertError, GenerationError, UnsupportedError
from ...make.layers import INDEX_DEPENDENT, parse_layers as _parse, with_blocks
from .. import recurrent
from ..cache import rewind
from . import reuse
from .base import Draft
from .head import output_logits
from .model import DEFAULT_MIN_CONFIDENCE, ModelDrafter


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

    KV overwrite (QSpec §3.1): the chosen layers read and write the *target's* caches. After
    drafting, their draft entries are trimmed away and the verify pass writes the target's
    exact entries for the same positions, so the draft always continues from verified KV.
    """

    name = "self"

    def __init__(self, model, layers: Sequence[int], vocab_size: int, real_vocab: Optional[int] = None,
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE, head_ids=None):
        model_type = getattr(getattr(model, "args", None), "model_type", "")
        if not hasattr(model, "model") or not hasattr(model.model, "layers"):
            raise UnsupportedError(f"{self.name} drafting needs an mlx-lm model with model.model.layers")
        if model_type in INDEX_DEPENDENT and list(layers) != list(range(len(model.model.layers))):
            raise UnsupportedError(f"self drafting with a subset of layers is not supported for {model_type}: "
                                   "its layers depend on their index")
        self.layers = list(layers)
        self.target_cache = None
        self.whole = model
        self.reuse_n = 0  # > 0: the layers are the first reuse_n blocks and the verify pass reuses the draft's
        self.reused = 0  # rounds whose verify pass reused the draft's first blocks
        self._views: dict = {}
        self._kept: List[mx.array] = []
        super().__init__(layer_view(model, self.layers), vocab_size, real_vocab, min_confidence, head_ids)

    def _new_cache(self):
        raise GenerationError("self drafter used before reset(prompt, target_cache)")

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """Share the target's per-layer caches; nothing to prefill (the target's prefill is ours)."""
        if target_cache is None:
            raise GenerationError("the self drafter needs the target's cache: reset(prompt, target_cache)")
        self.target_cache = target_cache
        self.cache = [target_cache[i] for i in self.layers]
        # Recurrent layers of the target (or of a quantized copy) record their calls into the shared cache,
        # so that the draft passes can be trimmed like attention entries.
        if not recurrent.enable(self.model, self.cache):
            raise GenerationError(f"{self.name} drafter: the target's recurrent cache cannot be rewound")
        n = len(self.layers)
        first = self.layers == list(range(n)) and not recurrent.recurrent_layers(self.whole, target_cache)
        if first and n not in self._views:
            ok = reuse.supports(self.whole, layer_view, n)
            self._views[n] = (reuse.prefix_view(self.whole, layer_view, n),
                              layer_view(self.whole, range(n, len(self.whole.model.layers)))) if ok else None
        self.reuse_n = n if first and self._views.get(n) else 0

    def _forward(self, tokens: List[int], hidden: bool = False, judge: int = 0) -> mx.array:
        """With reuse: the first blocks' pass, keeping its hidden states for the verify pass (a self draft shares
        the target's cache, so it never catches up: nothing to judge)."""
        if not self.reuse_n:
            return super()._forward(tokens, hidden, judge)
        h = self._views[self.reuse_n][0].model(mx.array(tokens)[None], cache=self.cache)
        self._kept.append(h)
        self._fed.extend(tokens)
        self.fed_total += len(tokens)
        out = self.whole.model.norm(h)[0, -1]
        return out if hidden else self._align(output_logits(self.whole, out))

    def lag(self, source: str, context: List[int]) -> int:
        return 0  # the target's cache is ours: nothing to catch up

    def _launches(self) -> bool:
        return False  # its passes write the target's cache (and, reusing, keep hidden states): never launched ahead

    def propose(self, context: List[int], k: int, probs_fn=None, source: Optional[str] = None) -> Draft:
        if self.target_cache is None:
            raise GenerationError("self drafter used before reset(prompt, target_cache)")
        if k <= 0 or not context:
            return Draft([])
        offset = self.target_cache[0].offset
        self._fed = list(context[:offset])  # the target cache holds exactly the context minus its last token
        self._kept = []
        try:
            draft = super().propose(context, k, probs_fn)
        except BaseException:  # drop draft KV, even if interrupted
            rewind(self.cache, offset)
            raise
        finally:
            del self._fed[offset:]
        if self.reuse_n and draft.tokens:  # the verify pass keeps these entries and starts at block reuse_n
            prefix, suffix = self._views[self.reuse_n]
            draft.verify = reuse.Reuse(prefix, suffix, self.target_cache, self.reuse_n, offset, self._kept)
            self.reused += 1
        else:  # drop draft KV: verification rewrites these positions
            rewind(self.cache, offset)
        mx.eval([c.state for c in self.cache])
        return draft


IMPORTANCE_TOKENS = 32  # prompt tokens the layer ranking runs on: about one multi-token pass of the target


class ImportanceSelfDrafter(SelfDrafter):
    """Self drafting with the `keep` blocks that matter most for this context, re-chosen at every reset.

    Training-free layer selection in the spirit of SWIFT and Draft & Verify: before each generation
    the target runs the last IMPORTANCE_TOKENS prompt tokens once with probes on its blocks
    (`make.importance.block_similarity`, on a shallow copy: the shared target is untouched), and the
    blocks whose output changes their input least are skipped. A session's next turn ranks again on
    its own, longer context.
    """

    def __init__(self, model, keep: int, vocab_size: int, real_vocab: Optional[int] = None,
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE, head_ids=None):
        from ...make.layers import keep_layer_indices

        self.target, self.keep = model, keep
        super().__init__(model, keep_layer_indices(len(model.model.layers), keep), vocab_size, real_vocab,
                         min_confidence, head_ids)

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        from ...make.importance import block_similarity, most_important

        tail = list(prompt[-IMPORTANCE_TOKENS:])
        if len(tail) >= 2:
            self.layers = most_important(block_similarity(self.target, [tail]), self.keep)
            self.model = layer_view(self.target, self.layers)
            if self.head is not None:
                self.head.model = self.model
        super().reset(prompt, target_cache)
