"""Verification: which draft tokens the target accepts and the token it adds, built lazily, then read on the host."""

from collections.abc import Sequence
from typing import NamedTuple

import mlx.core as mx

from . import tree
from .sampling import Sampler, sample


class Given(NamedTuple):
    """A plain round's token that a queued step drew: place `place` of its tokens."""

    tokens: mx.array
    place: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def accept_greedy(draft: Sequence[int], targets: Sequence[int]) -> tuple[int, int]:
    """Accept the longest prefix of `draft` equal to the target's tokens; return (accepted, next token)."""
    n = common_prefix(draft, targets)
    return n, targets[n]


def _residual(q: mx.array, p: mx.array) -> mx.array:
    """normalize(max(q - p, 0)) per row: the part of the target q the draft p under-covers."""
    r = mx.maximum(q - p, 0.0)
    return r / r.sum(axis=-1, keepdims=True)


def sampling_targets(q: mx.array, draft: mx.array, p: mx.array | None) -> tuple[mx.array, mx.array]:
    """Speculative sampling, built lazily: (accept (n,), candidates (n+1,)) for target q (n+1, V), draft (n,) and its
    p (n, V), None for a deterministic (one-hot) draft.
    Accept draft token x with probability min(1, q(x) / p(x)).
    On the first rejection, resample from normalize(max(q - p, 0)).
    If all n are accepted, sample a bonus token from q at position n.
    candidates[i] is the round's last token if the first rejection is at i (i = n: the bonus); the host keeps one.
    """
    n = draft.size
    if n == 0:
        return mx.zeros((0,), dtype=mx.bool_), sample(q)
    idx = draft.astype(mx.uint32)[:, None]
    if p is None:
        p = mx.zeros_like(q[:n]).at[mx.arange(n), idx[:, 0]].add(1.0)
    q_x = mx.take_along_axis(q[:n], idx, axis=-1)[:, 0]
    p_x = mx.take_along_axis(p, idx, axis=-1)[:, 0]
    accept = mx.random.uniform(shape=(n,)) * p_x < q_x  # u < q/p, without the division: p(x) == 0 rejects
    candidates = mx.concatenate([sample(_residual(q[:n], p)), sample(q[n:])])
    return accept, candidates


def accept_sampling(accept: Sequence[bool], candidates: Sequence[int]) -> tuple[int, int]:
    """(accepted, next token) from what `sampling_targets` built, once read."""
    a = next((i for i, ok in enumerate(accept) if not ok), len(accept))
    return a, candidates[a]


def shadow_judgement(draft: Sequence[int], produced: Sequence[int]):
    """(judged, matched) of a draft that was not verified, against the tokens the round produced: greedy's rule (under
    sampling, a fixed token matches with the target's probability of it); tokens beyond the produced go unjudged."""
    m = common_prefix(draft, produced)
    return (len(draft) if m < len(produced) else m), m


def targets(sampler: Sampler, position: int, logits: mx.array, draft, n: int):
    """What acceptance needs of a row's logits (n + 1, V), its context `position` tokens long: its own tokens
    (greedy, seeded), or speculative sampling's draws (accept (n,), candidates (n + 1,)), lazily."""
    if n and draft.parents is not None:
        return (
            tree.exact_targets(sampler, logits, position, draft.parents)
            if sampler.exact
            else tree.sampling_targets(sampler.probs(logits), draft.tokens[:n], draft.parents)
        )
    if sampler.exact:
        return sampler.pick(logits, position)
    if not n:
        return mx.zeros((0,), dtype=mx.bool_), sample(sampler.probs(logits))
    p = draft.probs[:n] if draft.probs is not None else None
    return sampling_targets(sampler.probs(logits), draft.tokens[:n].astype(mx.uint32), p)


def accept(sampler: Sampler, built, draft, n: int) -> tuple:
    """Once read, a row's (draft tokens (a tree's: those of the path kept), how many the target accepted, the token it
    adds, the tree's nodes kept or None) from what `targets` built, or from a queued step's `Given` token."""
    drafted = draft.tokens.tolist()[:n] if n else []
    if isinstance(built, Given):
        return [], 0, built.tokens.tolist()[built.place], None  # type: ignore[index]  # mlx: tolist() may be a scalar
    if n and draft.parents is not None:
        path, nxt = (
            tree.accept_greedy(drafted, draft.parents, built.tolist())
            if sampler.exact
            else tree.accept_sampling(built[0].tolist(), built[1].tolist(), draft.parents)
        )
        return [drafted[j] for j in path], len(path), nxt, path
    a, nxt = (
        accept_greedy(drafted, built.tolist())
        if sampler.exact
        else accept_sampling(built[0].tolist(), built[1].tolist())
    )
    return drafted, a, nxt, None
