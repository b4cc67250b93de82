"""A draft model drafting for several rows of a batch at once: one pass of the draft model per draft position over
a joint cache (`batch_cache`), each row rewound on its own once the target has verified."""

from typing import List, Optional

import mlx.core as mx

from . import batch_cache
from .drafters.base import Draft
from .drafters.model import ModelDrafter
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

    def draft(self, k: int) -> List[Draft]:
        """k tokens for every member (greedy or sampled by its row's `probs_fn`), evaluated: k passes."""
        todo = [r.context[h:] for r, h in zip(self.rows, self.held)]  # each ends with the row's last token
        width = max(len(t) for t in todo)
        inputs = mx.array([t + [t[-1]] * (width - len(t)) for t in todo])  # (m, width)
        logits = self.model(inputs, cache=self.cache)  # (m, width, V)
        logits = mx.stack([logits[i, len(t) - 1] for i, t in enumerate(todo)])  # (m, V)
        batch_cache.rewind(self.cache, [width - len(t) for t in todo])
        self.held = [len(r.context) for r in self.rows]
        shapes = {(len(todo), width)} | ({(len(todo), 1)} if k > 1 else set())
        self.cold, self.seen = bool(shapes - self.seen), self.seen | shapes
        tokens, probs = [], []
        for j in range(k):
            aligned = self.parts[0].align(logits)  # (m, V): the members draft for one target
            step = mx.argmax(aligned, axis=-1)  # (m,)
            dists = [r.probs_fn(aligned[i : i + 1]) if r.probs_fn is not None else None
                     for i, r in enumerate(self.rows)]
            if any(d is not None for d in dists):
                step = mx.concatenate([sample(d) if d is not None else step[i : i + 1] for i, d in enumerate(dists)])
                dists = [d[0] if d is not None else None for d in dists]
            tokens.append(step)
            probs.append(dists)
            if j + 1 < k:
                logits = self.model(step[:, None], cache=self.cache)[:, -1]
        drafted = mx.stack(tokens, axis=1)  # (m, k)
        rows_p = [mx.stack([d[i] for d in probs]) if r.probs_fn is not None else None for i, r in enumerate(self.rows)]
        mx.eval(drafted, [p for p in rows_p if p is not None])
        self.fed = k - 1
        for part in self.parts:
            part.fed_total += k - 1
        return [Draft(t, p, ModelDrafter.name) for t, p in zip(drafted.tolist(), rows_p)]

    def settle(self, kept: List[int]) -> None:
        """After the verify: each member keeps the first `kept[i]` of the drafts fed last round (the target's)."""
        kept = [min(n, self.fed) for n in kept]
        if self.fed:
            batch_cache.rewind(self.cache, [self.fed - n for n in kept])
        self.held = [h + n for h, n in zip(self.held, kept)]
        self.fed = 0
