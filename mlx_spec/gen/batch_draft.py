"""Drafting for several rows of a batch at once, one pass per draft position: a draft model over its own joint cache
(`BatchDraft`, each row rewound on its own once the target has verified), or a view of the target itself (a subset
of its layers, a quantized copy: `SelfDraft`) over the batch's target cache."""

from typing import Dict, List, Optional

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from . import batch_cache
from .drafters.base import Draft
from .drafters.model import ModelDrafter
from .drafters.self_draft import SelfDrafter
from .sampling import sample


class BatchDraft:
    """The rows drafting with one draft model, and its joint cache.

    Row i of the cache holds the first `held[i]` tokens of its context. A row joins with all but the last token
    (its drafter's own cache caught up and lent, `ModelDrafter.lend`). A round feeds every member the context
    tokens it lacks (right-padded to the longest, the padding rolled out after), then k - 1 of its drafts, one
    position per pass; `settle` keeps of those what the target accepted. Rows whose drafts the round did not use are
    fed all the same (a batched pass feeds every row) and keep none.
    """

    def __init__(self, model):
        self.model = model
        self.rows: list = []
        self.parts: List[ModelDrafter] = []
        self.held: List[int] = []
        self.cache: Optional[list] = None
        self.fed = 0  # draft positions of the last round past `held`, not settled yet
        self.seen: set = set()  # (rows, positions) shapes run: a new one builds kernels on a GPU
        self.cold = False  # the last round ran a shape for the first time

    def __contains__(self, row) -> bool:
        return any(r is row for r in self.rows)

    def takes(self, part: ModelDrafter, joint: list) -> bool:
        """Whether a row drafting with `part` can draft here: the same draft model, on a cache of its own."""
        return part.model is self.model and not part.in_target_cache

    def join(self, row, part: ModelDrafter) -> bool:
        """Take the row in with its drafter's cache; False (the cache stays the drafter's) if that cannot batch."""
        cache = part.lend(row.context)
        if not batch_cache.batchable(cache):
            part.take_back(cache, row.context[:-1])
            return False
        self.cache = batch_cache.join(self.cache, cache)
        self.rows.append(row)
        self.parts.append(part)
        self.held.append(len(row.context) - 1)
        return True

    def leave(self, row) -> None:
        """Take the row out; its drafter gets its cache back."""
        i = next(j for j, r in enumerate(self.rows) if r is row)
        self.parts[i].take_back(batch_cache.extract(self.cache, i, self.held[i]), row.context[: self.held[i]])
        keep = [j for j in range(len(self.rows)) if j != i]
        for lst in (self.rows, self.parts, self.held):
            del lst[i]
        if keep:
            batch_cache.keep_rows(self.cache, keep)
        else:
            self.cache = None

    def draft(self, joint: list, rows: list, k: int) -> Dict[int, Draft]:
        """k tokens for every member (greedy or sampled by its row's `probs_fn`), evaluated: k passes. {index in
        the batch's `rows`: its draft} (`joint`, the batch's target cache, is not read)."""
        todo = [r.context[h:] for r, h in zip(self.rows, self.held)]  # each ends with the row's last token
        width = max(len(t) for t in todo)
        inputs = mx.array([t + [t[-1]] * (width - len(t)) for t in todo])  # (m, width)
        logits = self.model(inputs, cache=self.cache)  # (m, width, V)
        logits = mx.stack([logits[i, len(t) - 1] for i, t in enumerate(todo)])  # (m, V)
        batch_cache.rewind(self.cache, [width - len(t) for t in todo])
        self.held = [len(r.context) for r in self.rows]
        shapes = {(len(todo), width)} | ({(len(todo), 1)} if k > 1 else set())
        self.cold, self.seen = bool(shapes - self.seen), self.seen | shapes
        drafted, probs = _steps(self.model, self.cache, logits, self.rows, self.parts[0].align, k)
        self.fed = k - 1
        for part in self.parts:
            part.fed_total += k - 1
        index = {id(r): i for i, r in enumerate(rows)}
        return {index[id(r)]: Draft(t, p, ModelDrafter.name) for r, t, p in zip(self.rows, drafted, probs)}

    def settle(self, kept: List[int]) -> None:
        """After the verify: each member keeps the first `kept[i]` of the drafts fed last round (the target's)."""
        kept = [min(n, self.fed) for n in kept]
        if self.fed:
            batch_cache.rewind(self.cache, [self.fed - n for n in kept])
        self.held = [h + n for h, n in zip(self.held, kept)]
        self.fed = 0


class SelfDraft:
    """The rows drafting with one view of the target (`SelfDrafter`: a subset of its layers, or a quantized copy of
    all of them), which reads and writes the batch's own target cache.

    A round runs k passes of the view over every row of the batch, one position each, from each row's last token:
    a row the view does not draft for runs along (a batched pass feeds every row). The view's layers' entries for
    those positions are trimmed after, so the verify pass writes the target's own there (QSpec's KV overwrite).
    Only attention layers take part: a recurrent layer's state cannot be trimmed back by a position count.
    """

    fed = 0  # nothing to settle after the verify: the target's pass wrote the positions

    def __init__(self, part: SelfDrafter):
        self.part, self.model, self.layers = part, part.model, list(part.layers)
        self.blocks = [id(b) for b in part.model.model.layers]
        self.seen: set = set()
        self.cold = False

    def __contains__(self, row) -> bool:
        return False  # nobody lends a cache: nothing to give back when a row leaves

    def takes(self, part: ModelDrafter, joint: list) -> bool:
        """Whether a row drafting with `part` can draft here: a view with the same blocks (the same layers of the
        same target, or the same quantized copy), over attention layers of the batch's target cache `joint`."""
        return (part.in_target_cache and [id(b) for b in part.model.model.layers] == self.blocks
                and all(isinstance(joint[i], BatchKVCache) for i in self.layers))

    def draft(self, joint: list, rows: list, k: int) -> Dict[int, Draft]:
        """k tokens for every row of the batch that drafts with this view (greedy or sampled by its `probs_fn`),
        evaluated: k passes of the view over the batch's target cache `joint`, whose view layers are back where
        they were after. {index in `rows`: its draft}."""
        cache = [joint[i] for i in self.layers]
        self.cold, self.seen = len(rows) not in self.seen, self.seen | {len(rows)}
        last = mx.array([[r.context[-1]] for r in rows])
        try:
            logits = self.model(last, cache=cache)[:, -1]
            drafted, probs = _steps(self.model, cache, logits, rows, self.part.align, k)
        finally:
            for c in cache:
                c.trim(k)
        return {i: Draft(t, p, self.part.name) for i, (r, t, p) in enumerate(zip(rows, drafted, probs))
                if r.model is not None}


def _steps(model, cache: list, logits: mx.array, rows: list, align, k: int):
    """k draft tokens per row from the logits (m, V) of each row's next position, each greedy or sampled by its
    row's `probs_fn` (the distribution kept), feeding each back through `model` over `cache` but the last:
    (tokens per row, their distributions (k, V) per row or None), evaluated."""
    tokens, probs = [], []
    for j in range(k):
        aligned = align(logits)  # (m, V): the members draft for one target
        step = mx.argmax(aligned, axis=-1)  # (m,)
        dists = [r.probs_fn(aligned[i : i + 1]) if r.probs_fn is not None else None for i, r in enumerate(rows)]
        if any(d is not None for d in dists):
            step = mx.concatenate([sample(d) if d is not None else step[i : i + 1] for i, d in enumerate(dists)])
            dists = [d[0] if d is not None else None for d in dists]
        tokens.append(step)
        probs.append(dists)
        if j + 1 < k:
            logits = model(step[:, None], cache=cache)[:, -1]
    drafted = mx.stack(tokens, axis=1)  # (m, k)
    rows_p = [mx.stack([d[i] for d in probs]) if r.probs_fn is not None else None for i, r in enumerate(rows)]
    mx.eval(drafted, [p for p in rows_p if p is not None])
    return drafted.tolist(), rows_p
