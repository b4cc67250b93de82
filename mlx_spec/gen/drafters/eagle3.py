"""An EAGLE-3 head drafts from the target's own hidden states: each context token is fed beside the target's states
of the position before it, each draft token beside the head's own state before it; one pass for all rows, or for a
row alone a tree (`tree`)."""

import copy
from collections.abc import Sequence
from typing import Self, cast

import mlx.core as mx
import mlx.nn as nn

from .. import tree as trees
from ..tree import Positions
from ..tunables import EAGLE_HELD_CHUNKS as HELD_CHUNKS
from ..tunables import TREE_WIDTH
from .base import Draft, Drafting, Member
from .model import ModelDrafter, ModelDrafting


class Eagle3Drafter(ModelDrafter):
    """Drafts with an EAGLE-3 head (`models.eagle3.Eagle3Head`) in its own cache, which holds the context from its
    second token on (a token is fed beside the states before it, so the first has none)."""

    name = "eagle3"
    origin = 1
    trees = True

    def __init__(self, head, reads: Sequence[int], vocab_size: int, real_vocab: int | None = None):
        """reads: the target's blocks whose outputs the head takes, in the order it concatenates them."""
        super().__init__(head, vocab_size, real_vocab)
        self.head, self.subset = None, False  # its own draft vocabulary, mapped by `ids`
        self.reads, self.ids = tuple(reads), head.ids()
        self.width = head.config.target_hidden_size * len(self.reads)
        self.held: list[tuple[int, mx.array]] = []  # (first position, states (n, width)) not fed yet, in order
        self._view: tuple[nn.Module, Positions] | None = None  # the head as a tree's nodes run it

    def drafting(self) -> Drafting:
        return Eagle3Drafting(self)

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        super().reset(prompt[1:])

    def see(self, at: int, states: mx.array) -> None:
        keep = [(a, s[: at - a]) for a, s in self.held if a < at]  # what the target's cache no longer holds goes
        self.held = keep + [(at, states)]
        if len(self.held) > HELD_CHUNKS:  # one array again: the rounds' arrays are let go
            first, (a, s) = self.held[0][0], self.held[-1]
            self.held = [(first, self._at(first, a + s.shape[0] - first))]
            mx.async_eval(self.held[0][1])

    def behind(self, context: list[int]) -> int:
        return super().behind(context[1:]) if len(context) > 1 else 0

    def forward(self, x: mx.array, cache: list, states: mx.array | None = None) -> mx.array:
        return self.model(x, states, cache)

    def given(self, owners: Sequence[Self | None], starts: list[int], n: int) -> mx.array:
        """Each place's states for its n tokens fed from fed index `starts` (fed index j is context position j + 1,
        fed beside the states of position j); zeros where the target's states were never seen."""
        return mx.stack([o._at(a, n) if o is not None else mx.zeros((n, self.width)) for o, a in zip(owners, starts)])

    def _at(self, at: int, n: int) -> mx.array:
        """States of positions at..at+n-1, zeros where none is held."""
        pieces, pos = [], at
        for a, s in self.held:
            lo, hi = max(a, pos), min(a + s.shape[0], at + n)
            if hi > lo:
                pieces += ([mx.zeros((lo - pos, self.width))] if lo > pos else []) + [s[lo - a : hi - a]]
                pos = hi
        pieces += [mx.zeros((at + n - pos, self.width))] if pos < at + n else []
        return mx.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    def forget(self) -> None:
        """Drop the states of positions the head's cache holds (fed index j read the states of position j)."""
        n = len(self.fed)
        self.held = [(max(a, n), s[max(0, n - a) :]) for a, s in self.held if a + s.shape[0] > n]

    def full(self, h: mx.array) -> mx.array:
        logits = self.model.logits(h)
        out = mx.full((*logits.shape[:-1], self.vocab_size), -mx.inf, dtype=logits.dtype)
        out[..., self.ids] = logits
        return out

    def greedy(self, h: mx.array) -> mx.array:
        return self.ids[mx.argmax(self.model.logits(h), axis=-1)]

    def tree(self, state: mx.array, k: int, nodes: int, rows) -> tuple[mx.array, tuple[int, ...]]:
        """(tokens, parents) of a tree of at most `nodes` tokens, k deep, from the head's state (1, d) after the
        context, in its cache `rows` (one place): EAGLE-2's tree. Each depth feeds its TREE_WIDTH likeliest nodes
        in one pass, each attending to its ancestors, and each drafts its TREE_WIDTH likeliest children; a node's
        likelihood is the product of the head's probabilities along its path, and the `nodes` likeliest are kept
        (every ancestor of one is likelier). Its entries in the cache are dropped after."""
        cache, (view, pos) = rows.layers, self._tree_view()
        start = cache[0].offset
        score: list[float] = []  # the candidates'
        token: list[int] = []
        parent: list[int] = []
        depth: list[int] = []
        fed: list[int] = []  # the candidates fed, and their states
        out: dict[int, mx.array] = {}

        def expand(h: mx.array, who: list[int]) -> None:  # the children of candidates `who` (-1: the context)
            logp = nn.log_softmax(self.model.logits(h).astype(mx.float32), axis=-1)
            top = mx.argpartition(-logp, TREE_WIDTH - 1, axis=-1)[:, :TREE_WIDTH]
            # mlx types tolist() as a scalar or a list, whatever the shape
            lp: list[list[float]] = mx.take_along_axis(logp, top, axis=-1).tolist()  # type: ignore[assignment]
            ids: list[list[int]] = self.ids[top].tolist()
            for w, lps, tks in zip(who, lp, ids):
                for x, t in zip(lps, tks):
                    score.append((score[w] if w >= 0 else 0.0) + x)
                    token.append(t)
                    parent.append(w)
                    depth.append(depth[w] + 1 if w >= 0 else 1)

        expand(state, [-1])
        try:
            for d in range(1, k):
                level = sorted((c for c in range(len(score)) if depth[c] == d), key=lambda c: -score[c])[:TREE_WIDTH]
                hidden = mx.stack([out[parent[c]] if parent[c] >= 0 else state[0] for c in level])[None]
                mask = mx.ones((len(level), cache[0].offset + len(level)), dtype=mx.bool_)
                for i, c in enumerate(level):
                    line = [self._ancestor(f, c, parent) for f in fed] + [j == i for j in range(len(level))]
                    mask[i, start:] = mx.array(line)
                pos.at = mx.array(start + d - 1 - cache[0].offset)  # every node of a depth at the same position
                h = view(mx.array([[token[c] for c in level]], dtype=mx.uint32), hidden, cache, mask=mask)[0]
                fed += level
                out.update({c: h[i] for i, c in enumerate(level)})
                expand(h, level)
        finally:
            pos.at = None
            rows.rewind([cache[0].offset - start])
        keep = sorted(range(len(score)), key=lambda c: (-score[c], depth[c]))[:nodes]
        at = {c: i for i, c in enumerate(keep)}
        return mx.array([token[c] for c in keep], dtype=mx.uint32), tuple(at.get(parent[c], -1) for c in keep)

    @staticmethod
    def _ancestor(a: int, c: int, parent: list[int]) -> bool:
        while c >= 0 and c != a:
            c = parent[c]
        return c == a

    def _tree_view(self) -> tuple[nn.Module, Positions]:
        """The head whose attention reads the positions of a tree (made once; the head itself is unchanged)."""
        if self._view is None:
            pos, view = trees.Positions(), copy.copy(self.model)
            view.layers = [trees.roped(b, pos) for b in self.model.layers]
            self._view = (view, pos)
        return self._view


class Eagle3Drafting(ModelDrafting[Eagle3Drafter]):
    """The rows drafting with one head: a draft model's drafting over each row's context from its second token."""

    def propose(
        self, members: Sequence[Member], k: int, target=None, chunk: int | None = None, tree: int = 0
    ) -> list[Draft]:
        ready = [m._replace(context=m.context[1:]) for m in members if len(m.context) > 1]
        drafts = super().propose(ready, k, target, chunk, tree) if ready else []
        for m in ready:
            cast(Eagle3Drafter, m.part).forget()  # `takes` let in this head's drafters only
        out = {id(m.part): d for m, d in zip(ready, drafts)}  # (a row's drafter is its own)
        return [out.get(id(m.part), Draft.of([], source=self.part.name)) for m in members]
