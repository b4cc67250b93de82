"""Draft trees: continuations sharing their prefixes, verified in one target pass in which each node attends to the
context and its own ancestors (a tree attention mask) at the position of its depth; the longest path the target
agrees with is kept, the other nodes' positions are dropped from the cache.

A tree is its nodes' tokens and `parents` (per node the index of its parent, -1 for the row's last token), every
parent before its children, siblings in the drafter's order of preference."""

import copy
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from ..make.layers import per_model, with_blocks
from ..models.base import text_of
from .sampling import sample


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for a child of the row's last token."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def ancestry(parents: Sequence[int]) -> mx.array:
    """(n, n) bool: [j, i] where node i is node j or one of its ancestors."""
    rows: list[list[bool]] = []
    for j, p in enumerate(parents):
        row = list(rows[p]) if p >= 0 else [False] * len(parents)
        row[j] = True
        rows.append(row)
    return mx.array(rows, dtype=mx.bool_)


def layout(parents: Sequence[int], width: int, root: bool, prefix: int) -> tuple[mx.array, mx.array]:
    """(mask (width, prefix + width) bool, positions past the cache's offset (width,)) of a pass over `width`
    positions: the row's last token if `root` (else the cache holds it), the nodes, then padding, which sees the
    context and itself. A node's position is its depth past the last token's."""
    n, own = len(parents), int(root)
    fed = mx.zeros((width, width), dtype=mx.bool_)
    if own:
        fed[:, 0] = True  # every node, and the padding, follows the last token
    fed[own : own + n, own : own + n] = ancestry(parents)
    eye = mx.arange(width)
    fed = fed | (eye[:, None] == eye[None])
    mask = mx.concatenate([mx.ones((width, prefix), dtype=mx.bool_), fed], axis=1)
    at = [0] * own + [d - 1 + own for d in depths(parents)]
    at += [max(at, default=-1) + 1 + i for i in range(width - len(at))]
    return mask, mx.array(at, dtype=mx.int32)


class Positions:
    """What a view's next pass runs under: positions past the cache's offset (at) and a mask (None: a plain pass)."""

    def __init__(self):
        self.at: mx.array | None = None
        self.mask: mx.array | None = None


class _Rope(nn.Module):
    """Stands in for an attention's rotary embedding: in a tree pass each position at its own offset."""

    def __init__(self, rope, tree: Positions):
        super().__init__()
        self.inner = rope
        object.__setattr__(self, "_tree", tree)

    def __call__(self, x: mx.array, offset=0):
        at = self._tree.at
        if at is None:
            return self.inner(x, offset=offset)
        B, H, L, D = x.shape
        base = offset[:, None] if isinstance(offset, mx.array) and offset.ndim else offset
        pos = mx.broadcast_to(base + at, (B, L)).reshape(-1)  # one rotation a position: each is a batch of one
        y = self.inner(x.transpose(0, 2, 1, 3).reshape(B * L, H, 1, D), offset=pos)
        return y.reshape(B, L, H, D).transpose(0, 2, 1, 3)


class _Masked:
    """Stands in for one block: in a tree pass it is given the tree's mask for the one the model made."""

    def __init__(self, block, tree: Positions):
        self._block, self._tree = block, tree

    def __call__(self, x, *args, **kwargs):
        if self._tree.mask is not None:
            if args:
                args = (self._tree.mask,) + args[1:]
            else:
                kwargs["mask"] = self._tree.mask
        return self._block(x, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._block, name)


def roped(block, tree: Positions):
    """A shallow copy of `block` whose attention (the child holding a `rope`) reads positions from `tree`, or None."""
    for name, child in block.children().items():
        if isinstance(child, nn.Module) and "rope" in child:
            attn = copy.copy(child)
            attn.rope = _Rope(child.rope, tree)
            out = copy.copy(block)
            setattr(out, name, attn)
            return out
    return None


class View:
    """The target seen through a tree: `run` passes tokens under a tree's layout (every block's attention masked,
    its rotary positions set); the model is unchanged."""

    def __init__(self, model):
        self.tree = Positions()
        text = text_of(model)
        copies = [roped(b, self.tree) for b in text.blocks] if text.body is not None and text.blocks else None
        self.model = (
            with_blocks(model, [_Masked(b, self.tree) for b in copies], text.path)
            if copies and all(c is not None for c in copies)
            else None
        )

    def run(self, call, mask: mx.array, at: mx.array):
        """call(view): a pass of the view under (mask, at)."""
        self.tree.mask, self.tree.at = mask, at
        try:
            return call(self.model)
        finally:
            self.tree.mask = self.tree.at = None


_VIEWS: dict[int, View] = {}


def view(model) -> View:
    """The tree `View` of `model` (made once per model); its `model` is None where the blocks are not laid out as
    mlx-lm's attention models are (no tree runs there)."""
    return per_model(_VIEWS, model, id(model), lambda: View(model))


# --- acceptance ---


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """Each node's children in order (-1: the row's last token's)."""
    out: dict[int, list[int]] = {}
    for j, p in enumerate(parents):
        out.setdefault(p, []).append(j)
    return out


def _path(parents: Sequence[int], take) -> list[int]:
    """The nodes from the row's last token down, each the first child (in order) that take(parent, child) accepts."""
    kids, at = children(parents), -1
    path: list[int] = []
    while (nxt := next((c for c in kids.get(at, ()) if take(at, c)), None)) is not None:
        path.append(nxt)
        at = nxt
    return path


def accept_greedy(tokens: Sequence[int], parents: Sequence[int], targets: Sequence[int]) -> tuple[list[int], int]:
    """(the accepted path's nodes, the token the target adds after it); targets[0] follows the last token, targets[j +
    1] node j."""
    path = _path(parents, lambda at, c: tokens[c] == targets[at + 1])
    return path, targets[path[-1] + 1 if path else 0]


def exact_targets(sampler, logits: mx.array, position: int, parents: Sequence[int]) -> mx.array:
    """The row's own token after the last token and after each node (lazy): greedy, or seeded at the node's depth."""
    if sampler.temp == 0:
        return mx.argmax(logits, axis=-1)
    at = [0] + depths(parents)
    return mx.concatenate([sampler.pick(logits[i : i + 1], position + d) for i, d in enumerate(at)])


def sampling_targets(q: mx.array, tokens: mx.array, parents: Sequence[int]) -> tuple[mx.array, mx.array]:
    """Sampling through a tree of deterministic drafts, built lazily: (accept (n,), candidates (n + 1,)) for the
    target's laws q (n + 1, V) after the last token and each node.
    At a node, its children are tried in order: child c is taken with probability q(c) / (1 - the q of the siblings
    tried before it), the law with those siblings removed; once all are refused, the token is drawn from q with every
    child removed. This draws exactly from q. accept[j]: node j is taken if reached; candidates[i]: the token drawn
    after node i - 1 (i = 0: after the last token) when all its children are refused."""
    kids, n = children(parents), len(parents)
    at = [p + 1 for p in parents]  # each node's parent's row of q
    tok = tokens.astype(mx.uint32)
    q_x = q[mx.array(at, dtype=mx.uint32), tok] if n else mx.zeros((0,))
    earlier = mx.array([[float(parents[i] == parents[j] and i < j) for i in range(n)] for j in range(n)])
    spent = earlier @ q_x if n else mx.zeros((0,))  # the q of the siblings tried before each node
    accept = mx.random.uniform(shape=(n,)) * mx.maximum(1 - spent, 0.0) < q_x
    refused = mx.zeros(q.shape, dtype=mx.bool_)
    for p, cs in kids.items():
        refused[p + 1, tok[mx.array(cs)]] = True
    return accept, sample(_without(q, refused))


def _without(q: mx.array, refused: mx.array) -> mx.array:
    """q with the `refused` tokens removed, renormalized (q itself where rounding refused all of its mass)."""
    rest = mx.where(refused, 0.0, q)
    total = rest.sum(axis=-1, keepdims=True)
    return mx.where(total > 0, rest / mx.maximum(total, 1e-30), q)


def accept_sampling(accept: Sequence[bool], candidates: Sequence[int], parents: Sequence[int]) -> tuple[list[int], int]:
    """(the accepted path's nodes, the token after it) from what `sampling_targets` built, once read."""
    path = _path(parents, lambda _, c: accept[c])
    return path, candidates[path[-1] + 1 if path else 0]
