"""Verification: which draft tokens the target accepts, and the token it adds after them."""

from typing import List, Optional, Tuple

import mlx.core as mx

from .sampling import sample


def verify_greedy(target_logits: mx.array, draft: List[int]) -> Tuple[int, int]:
    """Accept the longest prefix of `draft` equal to the target's argmax; return (accepted, next token).

    target_logits: (n+1, V), row i scores the token after draft[:i].
    """
    best = mx.argmax(target_logits, axis=-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == best[n]:
        n += 1
    return n, best[n]


def _residual(q: mx.array, p: mx.array) -> mx.array:
    """normalize(max(q - p, 0)): the part of the target q the draft p under-covers."""
    r = mx.maximum(q - p, 0.0)
    return r / r.sum()


def verify_sampling(target_probs: mx.array, draft: List[int], draft_probs: Optional[mx.array]) -> Tuple[int, int]:
    """Speculative sampling; return (accepted, next token). q: target, p: draft.

    Accept draft token x with probability min(1, q(x) / p(x)).
    On the first rejection, resample from normalize(max(q - p, 0)).
    If all n are accepted, sample a bonus token from q at position n.
    target_probs: (n+1, V); draft_probs: (n, V), or None for a deterministic draft (one-hot p).
    """
    n = len(draft)
    if n == 0:
        return 0, sample(target_probs[0]).item()
    idx = mx.array(draft)[:, None]
    q_x = mx.take_along_axis(target_probs[:n], idx, axis=-1)[:, 0]
    if draft_probs is None:
        p = mx.zeros_like(target_probs[:n]).at[mx.arange(n), mx.array(draft)].add(1.0)
    else:
        p = draft_probs
    p_x = mx.take_along_axis(p, idx, axis=-1)[:, 0]
    # u < q/p, written without the division so p(x) == 0 rejects cleanly
    accept = (mx.random.uniform(shape=(n,)) * p_x < q_x).tolist()
    a = next((i for i, ok in enumerate(accept) if not ok), n)
    if a == n:
        return n, sample(target_probs[n]).item()
    return a, sample(_residual(target_probs[a], p[a])).item()
