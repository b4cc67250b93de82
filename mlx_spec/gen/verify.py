"""Verification: which draft tokens the target accepts, and the token it adds after them.

Each rule is split in two: a lazy part that builds everything on the device (so the engine reads a whole round
in one host synchronisation), and a host part that reads the result.
"""

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

from .sampling import sample


def accept_greedy(draft: Sequence[int], targets: Sequence[int]) -> Tuple[int, int]:
    """Accept the longest prefix of `draft` equal to the target's tokens; return (accepted, next token)."""
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return n, targets[n]


def _residual(q: mx.array, p: mx.array) -> mx.array:
    """normalize(max(q - p, 0)) per row: the part of the target q the draft p under-covers."""
    r = mx.maximum(q - p, 0.0)
    return r / r.sum(axis=-1, keepdims=True)


def sampling_targets(q: mx.array, draft: mx.array, p: Optional[mx.array]) -> Tuple[mx.array, mx.array]:
    """Speculative sampling, built lazily: (accept (n,), candidates (n+1,)). q: target, p: draft.

    Accept draft token x with probability min(1, q(x) / p(x)).
    On the first rejection, resample from normalize(max(q - p, 0)).
    If all n are accepted, sample a bonus token from q at position n.
    q: (n+1, V) target distributions; draft: (n,) token ids; p: (n, V), or None for a deterministic draft
    (one-hot p). candidates[i] is the token the round ends with if the first rejection is at i (i = n: the bonus);
    every candidate is drawn, and the host keeps one, so the whole round needs one synchronisation.
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


def accept_sampling(accept: Sequence[bool], candidates: Sequence[int]) -> Tuple[int, int]:
    """(accepted, next token) from what `sampling_targets` built, once read."""
    a = next((i for i, ok in enumerate(accept) if not ok), len(accept))
    return a, candidates[a]


def verify_sampling(target_probs: mx.array, draft: List[int], draft_probs: Optional[mx.array]) -> Tuple[int, int]:
    """Speculative sampling in one call (reads the device): (accepted, next token)."""
    accept, candidates = sampling_targets(target_probs, mx.array(draft, dtype=mx.uint32), draft_probs)
    mx.eval(accept, candidates)
    return accept_sampling(accept.tolist(), candidates.tolist())


def shadow_judgement(draft: Sequence[int], produced: Sequence[int]):
    """(judged, matched) of a draft that was not verified, against the tokens the round produced: a token matches
    where it equals the produced one (the verifier's own rule under greedy decoding; under sampling a fixed token is
    accepted with the target's probability of it, the chance the sampled token equals it). Draft tokens beyond the
    produced ones were never judged."""
    m = 0
    while m < len(draft) and m < len(produced) and draft[m] == produced[m]:
        m += 1
    return (len(draft) if m < len(produced) else m), m
