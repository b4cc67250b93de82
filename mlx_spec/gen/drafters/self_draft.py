"""The target drafts for itself in its own cache: through a subset of its layers, or a quantized copy (QSpec)."""

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from ...errors import ConvertError, GenerationError, UnsupportedError
from ...make.importance import block_similarity, most_important
from ...make.layers import INDEX_DEPENDENT, keep_layer_indices, per_model, with_blocks
from ...make.quant import quantized_copy
from ...models.base import text_of
from ...models.cache import RaggedKVCache, rewindable
from .. import recurrent
from ..cache import cache_tokens, new_cache, rewind
from ..joint import JointCache
from ..tunables import IMPORTANCE_TOKENS, QUANT_SELF_GROUP
from .base import Draft, Drafting, Member
from .model import ModelDrafter, draft_steps


def layer_view(model, layers: Sequence[int]):
    """A view running embed -> `layers` -> norm -> head of `model`, sharing its weights, recurrent blocks recording."""
    view = recurrent.recording(model)
    return with_blocks(view, [view.layers[i] for i in layers])


def refuse(model, name: str, layers: list[int], caches_only: bool = False) -> None:
    """Raise, in one line, where drafting through blocks `layers` of `model` in its own cache cannot run (caches_only:
    where its caches cannot serve it)."""
    text = text_of(model)
    kind, whole = text.model_type, layers == list(range(len(text.blocks)))
    cache = new_cache(model)
    if len(cache) != len(text.blocks):
        raise UnsupportedError(f"{name} drafting is not supported for {kind}: its layers share caches")
    if cache_tokens(cache) is None:
        held = ", ".join(sorted({type(c).__name__ for c in cache if getattr(c, "offset", None) is None}))
        raise UnsupportedError(f"{name} drafting is not supported for {kind}: its caches ({held}) hold no offset")
    if caches_only:
        return
    text.need_body(f"{name} drafting")
    if kind in INDEX_DEPENDENT and not whole:
        raise UnsupportedError(
            f"{name} drafting with a subset of layers is not supported for {kind}: its layers depend on their index"
        )
    if not whole:  # a model that picks a mask by a layer's index (olmo3's `swa_idx`) may not run a subset at all
        try:
            mx.eval(layer_view(model, layers)(mx.array([[0, 1]]), cache=[cache[i] for i in layers]))
        except Exception as e:  # mlx-lm's code for this type, whatever it raises
            raise UnsupportedError(
                f"{name} drafting with a subset of layers is not supported for {kind}: "
                f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            ) from None


class SelfDrafter(ModelDrafter):
    """Drafts with a subset of the target's layers in its cache, the entries trimmed after (QSpec's KV overwrite)."""

    name = "self"
    in_target_cache = True

    def __init__(self, model, layers: Sequence[int], vocab_size: int, real_vocab: int | None = None, head_ids=None):
        refuse(model, self.name, list(layers))
        self.layers = list(layers)
        self.target_cache: list | None = None
        super().__init__(layer_view(model, self.layers), vocab_size, real_vocab, head_ids)
        self.blocks = [id(b) for b in self.model.layers]

    def drafting(self) -> Drafting:
        return SelfDrafting(self)

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        """Share the target's per-layer caches; nothing to prefill (the target's prefill is ours)."""
        if target_cache is None:
            raise GenerationError("the self drafter needs the target's cache: reset(prompt, target_cache)")
        self.target_cache = rewindable(target_cache)
        if self.target_cache is None:
            raise GenerationError(f"{self.name} drafter: the target's recurrent cache cannot be rewound")
        super().reset(prompt)

    def behind(self, context: list[int]) -> int:
        return 0  # the target's cache is ours: nothing to catch up

    def propose(self, context: list[int], k: int, sampler=None) -> Draft:
        if self.target_cache is None:
            raise GenerationError("self drafter used before reset(prompt, target_cache)")
        rows: JointCache[SelfDrafter] = JointCache()
        rows.add(self, self.target_cache)
        return self.drafting().propose([Member(self, context, sampler, 0)], k, rows)[0]


class SelfDrafting(Drafting):
    """The rows drafting with one view of the target over the engine's target cache: k passes over every place from
    its last token, their entries trimmed after (a place not asked runs along; beside other rows, attention only)."""

    def __init__(self, part: SelfDrafter):
        self.part = part

    def takes(self, part) -> bool:
        return getattr(part, "blocks", None) == self.part.blocks

    def propose(
        self, members: Sequence[Member], k: int, target=None, chunk: int | None = None, tree: int = 0
    ) -> list[Draft]:
        part = self.part
        cache = [target.layers[i] for i in part.layers]
        if k <= 0 or target.joint and not all(isinstance(c, RaggedKVCache) for c in cache):
            return [Draft.of([], source=part.name) for _ in members]
        at = {m.place: m for m in members}
        last = mx.array([[at[i].context[-1] if i in at else 0] for i in range(len(target.owners))], dtype=mx.uint32)
        held, sizes = cache[0].offset, [c.size() for c in cache]
        try:
            state = part.forward(last, cache)[:, -1]
            tokens, probs = draft_steps(part, state, [at.get(i) for i in range(len(target.owners))], k, cache)
        finally:  # drop the draft's entries, as many as were written even if interrupted: the verify pass writes them
            if target.joint:
                for c, n in zip(cache, sizes):
                    c.trim(c.size() - n)
            else:
                rewind(cache, held)
        if part.head is not None and part.subset:
            part.head.add([m.context[-1] for m in members])
        mx.async_eval(tokens)
        return [Draft(tokens[m.place], probs[m.place], part.name) for m in members]


class ImportanceSelfDrafter(SelfDrafter):
    """Self drafting with the `keep` blocks that change their input most on the prompt's tail, ranked at each reset."""

    def __init__(self, model, keep: int, vocab_size: int, real_vocab: int | None = None, head_ids=None):
        self.target, self.keep = model, keep
        super().__init__(model, keep_layer_indices(len(model.layers), keep), vocab_size, real_vocab, head_ids)

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        tail = list(prompt[-IMPORTANCE_TOKENS:])
        if len(tail) >= 2:
            self.layers = most_important(block_similarity(self.target, [tail]), self.keep)
            self.view(layer_view(self.target, self.layers))
            self.blocks = [id(b) for b in self.model.layers]
        super().reset(prompt, target_cache)


_COPIES: dict[tuple[int, str], object] = {}  # (id(target), format) -> its copy, while the target lives


def shared_copy(model, fmt: str):
    """`model` quantized to `fmt`, made once per live target and format: its quant-self drafters share the weights."""

    def make():
        if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules()):
            raise GenerationError("quant-self: the target is already quantized; draft from a float target")
        try:
            return quantized_copy(model, fmt, QUANT_SELF_GROUP)
        except ConvertError as e:
            raise GenerationError(f"quant-self:{fmt}: {e}") from None

    return per_model(_COPIES, model, (id(model), fmt), make)


class QuantSelfDrafter(SelfDrafter):
    """Drafts with a quantized copy of all the target's layers (one per target and format), in the target's cache."""

    name = "quant-self"

    def __init__(self, model, fmt: str, vocab_size: int, real_vocab: int | None = None, head_ids=None):
        self.format = fmt
        refuse(model, self.name, list(range(len(model.layers))), caches_only=True)  # before the copy is made
        copy = shared_copy(model, fmt)
        try:  # a model whose code reads a weight as a dense matrix (seed_oss) cannot run quantized
            mx.eval(copy(mx.array([[0, 1]]), cache=new_cache(copy)))
        except Exception as e:  # mlx-lm's code for this type, whatever it raises
            raise UnsupportedError(
                f"{self.name} drafting is not supported for {text_of(model).model_type}: its quantized copy does not "
                f"run: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            ) from None
        super().__init__(copy, range(len(model.layers)), vocab_size, real_vocab, head_ids)
