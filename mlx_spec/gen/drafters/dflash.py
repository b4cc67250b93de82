"""A DFlash drafter proposes a whole block in one pass from the target's hidden states: each row's cache holds the
projected states of its context, and the block [last token, mask, ...] reads them; one pass for all rows."""

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from ...device import builds_per_shape
from .. import shapes
from ..tunables import PREFILL_STEP
from .base import Draft, Drafting, Member
from .eagle3 import Eagle3Drafter
from .model import ModelDrafter, ModelDrafting, draw


class DFlashDrafter(Eagle3Drafter):
    """Drafts with a `models.dflash.DFlash` module whose cache holds the target's projected states of `fed`, the
    context but its last token (fed index j: context position j); the states it was shown wait in `held` until then,
    kept as an EAGLE-3 head keeps them. Each draft is the module's first k positions after the last token of one block
    of its trained size."""

    name = "dflash"
    origin = 0

    def __init__(self, module, vocab_size: int, real_vocab: int | None = None):
        ModelDrafter.__init__(self, module, vocab_size, real_vocab)
        self.head, self.subset = None, False
        self.reads, self.held = tuple(module.config.reads), []
        self.width = len(self.reads) * module.hidden_size

    def drafting(self) -> Drafting:
        return DFlashDrafting(self)

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        ModelDrafter.reset(self, prompt)

    def behind(self, context: list[int]) -> int:
        """Context states it feeds before its block beyond the one every round brings (that of the token before the
        last)."""
        return max(0, ModelDrafter.behind(self, context) - 1)

    def full(self, h: mx.array) -> mx.array:
        return ModelDrafter.full(self, self.model.logits(h))

    def greedy(self, h: mx.array) -> mx.array:
        return mx.argmax(self.full(h), axis=-1)


def block_mask(cache: list, n: int) -> mx.array | None:
    """What a block of n positions sees in each row (B, 1, n, columns + n): the row's own cached columns and the
    whole block; None for a row alone, which sees everything its cache holds."""
    c = cache[0]
    if not isinstance(c, BatchKVCache):
        return None
    mask = c.make_mask(n, return_array=True)  # causal over the block; other rows' padding and gaps masked
    return mask | (mx.arange(mask.shape[-1]) >= mask.shape[-1] - n)


class DFlashDrafting(ModelDrafting[DFlashDrafter]):
    """The rows drafting with one DFlash module over their caches as one (`JointCache`): each row's new context
    states in one pass, every row's block in a second."""

    def _draft(self, members: Sequence[Member], k: int, chunk: int | None, tree: int = 0) -> list[Draft]:
        part, module, (places, mine) = self.part, self.part.model, self._gather(members)
        counts, drop, ready = zip(*[_catch_up(o, m, chunk) for o, m in zip(places, mine)])
        if any(drop):
            self.rows.rewind(drop)
        self.rows.start_round()
        cold = self._context([o._at(len(o.fed), n) if o is not None and n else None for o, n in zip(places, counts)])
        if any(ready):
            tokens, probs, first = self._blocks(mine, ready, min(k, module.config.block_size - 1))
            cold = cold or first
        out = {}
        for i, (o, m, n, r) in enumerate(zip(places, mine, counts, ready)):
            if m is None or o is None:
                continue
            o.fed.extend(m.context[len(o.fed) : len(o.fed) + n])
            o.forget()
            out[id(o)] = (
                Draft(tokens[i], probs[i], part.name, max(0, n - 1), cold=cold)
                if r
                else Draft.of([], source=part.name, behind=n)
            )
        mx.async_eval([d.tokens for d in out.values() if len(d)])  # the device drafts while the host goes on
        return [out[id(m.part)] for m in members]

    def _blocks(self, members: list[Member | None], ready: Sequence[bool], n: int):
        """One pass over every place's block [its last token, mask, ...] (a place not drafting: token 0), its keys
        dropped after: (tokens (P, n), distributions, whether the shape ran for the first time) of `_drafts`."""
        module = self.part.model
        size = module.config.block_size
        block = mx.array(
            [
                [m.context[-1] if m is not None and r else 0] + [module.config.mask_token_id] * (size - 1)
                for m, r in zip(members, ready)
            ],
            dtype=mx.uint32,
        )  # (P, size)
        h = module.block(block, self.rows.layers, block_mask(self.rows.layers, size))
        self.rows.rewind([size] * len(members))
        logits = self.part.full(h[:, 1 : n + 1])  # (P, n, V): position j + 1 drafts token j
        drawing = [m if r else None for m, r in zip(members, ready)]  # every position drawn on its own
        tokens, probs = draw(drawing, mx.argmax(logits, axis=-1), logits, lambda x: x)
        return tokens, probs, shapes.first_time(self.model, ("block", len(members), size))

    def _context(self, states: list[mx.array | None]) -> bool:
        """Feed each place its new context states (n, width) (None: none), right-padded, the padding dropped, in
        chunks of PREFILL_STEP; whether a shape ran for the first time."""
        given = [s for s in states if s is not None]
        width, cold = max((s.shape[0] for s in given), default=0), False
        for start in range(0, width, PREFILL_STEP):
            pieces = [s[start : start + PREFILL_STEP] if s is not None else None for s in states]
            n = max(p.shape[0] if p is not None else 0 for p in pieces)
            size = shapes.padded(n) if builds_per_shape() and self.rows.paddable() else n
            lengths = [p.shape[0] if p is not None else 0 for p in pieces]
            x = mx.stack(
                [
                    mx.concatenate([p, mx.zeros((size - p.shape[0], self.part.width), p.dtype)])
                    if p is not None
                    else mx.zeros((size, self.part.width), given[0].dtype)
                    for p in pieces
                ]
            )  # (P, size, width)
            self.part.model.context(x, self.rows.layers)
            self.rows.rewind([size - a for a in lengths])
            cold = shapes.first_time(self.model, ("context", len(states), size)) or cold
        return cold


def _catch_up(o, m: Member | None, chunk: int | None):
    """A place's (context states to feed, positions to drop, whether it drafts): the states of its context but the
    last token that its cache lacks, a chunk a round where others wait."""
    if m is None:
        return 0, 0, False
    keep = o.agrees(m.context)
    todo, drop = len(m.context) - 1 - keep, len(o.fed) - keep
    del o.fed[keep:]
    o.agreed = keep + min(todo, chunk or todo)  # `fed` takes what is fed now
    if chunk is not None and todo > chunk:
        return chunk, drop, False
    return todo, drop, True
