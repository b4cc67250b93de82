"""ANPD: the adaptive multi-level N-gram drafter (Ou et al. 2024, arXiv:2404.08698), no model needed."""

from typing import Dict, List, Optional, Tuple

from ...errors import GenerationError
from ..tunables import NGRAM_MIN_N as DEFAULT_MIN_N
from ..tunables import NGRAM_MIN_TRUST as DEFAULT_MIN_TRUST
from ..tunables import NGRAM_N as DEFAULT_N
from ..tunables import NGRAM_SYNC_TAIL as _SYNC_TAIL
from ..tunables import NGRAM_TRUST_EMA as TRUST_EMA
from ..tunables import NGRAM_TRUST_RECOVERY as TRUST_RECOVERY
from .base import Draft, Drafter

Gram = Tuple[int, ...]


class NGramDrafter(Drafter):
    """Drafts by chained maximum-likelihood N-gram lookups over the context itself.

    One table serves every level n in [min_n, n] (tuple keys of different lengths never
    collide): `_counts[gram]` is how often the n-gram `gram` occurred, and `_best[ctx]` is
    `(token, count)`, the most frequent next token after the (n-1)-token `ctx`. Both are
    updated in O(levels) per new token and queried in O(levels) per drafted token.
    """

    name = "ngram"
    free = True  # dictionary lookups: microseconds against a forward pass

    def __init__(self, n: int = DEFAULT_N, min_n: int = DEFAULT_MIN_N, min_trust: float = DEFAULT_MIN_TRUST):
        """n: longest n-gram (key = last n-1 tokens); min_n: shortest level; min_trust: stop drafting at a token
        whose match level is accepted less often than this (0 disables it and gives the paper's drafter exactly)."""
        if n < 2:
            raise GenerationError(f"ngram: n must be >= 2, got {n}")
        if not 2 <= min_n <= n:
            raise GenerationError(f"ngram: min_n must be in [2, n={n}], got {min_n}")
        self.n, self.min_n, self.min_trust = n, min_n, min_trust
        self.trust = {m: 1.0 for m in range(min_n, n + 1)}  # level -> acceptance estimate (optimistic start)
        self._levels: List[int] = []  # match level of each token of the last draft
        self.proposed_total = 0  # acceptance stats from learn(); read-only diagnostics
        self.accepted_total = 0
        self._rebuild([])

    # ---- Memory: INITIALIZE / UPDATE (paper Sec 3.1) ----

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """A generation starts at `prompt`: index what is new if it extends what is indexed (a session's
        next turn), else INITIALIZE from it."""
        self._sync(prompt)

    def _rebuild(self, prompt: List[int]) -> None:
        """INITIALIZE: forget the tables and index the prompt tokens."""
        self._counts: Dict[Gram, int] = {}
        self._best: Dict[Gram, Tuple[int, int]] = {}
        self._tokens: List[int] = []  # our own copy of what is indexed, so caller mutation can't desync us
        self._index(prompt)

    def _index(self, tokens: List[int]) -> None:
        """UPDATE with each token in turn: pair it with its previous n-1, ..., min_n-1 tokens."""
        seq, counts, best = self._tokens, self._counts, self._best
        lo, hi = self.min_n, self.n
        for tok in tokens:
            seq.append(tok)
            i = len(seq) - 1
            for m in range(lo, min(hi, i + 1) + 1):  # m = n-gram length; needs i >= m-1
                gram = tuple(seq[i - m + 1 : i + 1])
                c = counts.get(gram, 0) + 1
                counts[gram] = c
                ctx = gram[:-1]
                cur = best.get(ctx)
                # Most frequent wins; ">=" breaks ties toward the most recent occurrence.
                if cur is None or c >= cur[1]:
                    best[ctx] = (tok, c)

    def _sync(self, context: List[int]) -> None:
        """Index only the tokens of `context` not yet seen; re-index if it is not an extension."""
        seen = len(self._tokens)
        tail = min(seen, _SYNC_TAIL)
        # O(1) check (first token + last few indexed) instead of an O(L) prefix compare. A rewrite
        # it misses only lowers draft quality: the verifier keeps the output lossless regardless.
        extends = len(context) >= seen and (
            seen == 0
            or (context[0] == self._tokens[0] and context[seen - tail : seen] == self._tokens[seen - tail :])
        )
        if not extends:
            self._rebuild(context)
        elif len(context) > seen:
            self._index(context[seen:])
        else:
            return
        for level, t in self.trust.items():  # new tokens: untrusted levels earn a retry over time
            if t < self.min_trust:
                self.trust[level] = t + TRUST_RECOVERY

    # ---- QUERY: multi-level lookup (Alg 2) chained K times (Alg 1, lines 12-16) ----

    def _query(self, window: List[int]) -> Tuple[Optional[int], int]:
        """Alg 2: (next token, level) from the longest level matching `window`; (None, 0) if none match."""
        best = self._best
        for m in range(min(self.n, len(window) + 1), self.min_n - 1, -1):
            hit = best.get(tuple(window[len(window) - m + 1 :]))
            if hit is not None:
                return hit[0], m
        return None, 0

    def _chain(self, context: List[int], k: int) -> Tuple[List[int], List[int]]:
        """Alg 1 lines 12-16: up to k chained lookups on the last n-1 tokens of context+draft.

        Returns (tokens, match level of each). Stops at the first miss, or at a level whose drafts
        have not been paying (trust below min_trust). Reads the tables, never changes them.
        """
        self._sync(context)
        window = self._tokens[-(self.n - 1) :]  # a copy: drafted tokens must not enter the tables
        out: List[int] = []
        levels: List[int] = []
        for _ in range(k):
            tok, level = self._query(window)
            if tok is None or self.trust[level] < self.min_trust:
                break
            out.append(tok)
            levels.append(level)
            window.append(tok)
            del window[: max(0, len(window) - (self.n - 1))]  # keep the n-1 tokens the next key needs
        return out, levels

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        """Draft up to k tokens continuing `context`; empty when no level matches.

        Follows the paper: each drafted token is one multi-level query on the last n-1 tokens of
        context+draft, so lookups chain through the draft. Drafting stops at the first miss.
        probs_fn is ignored: the drafter is deterministic (probs=None, one-hot to the verifier).
        """
        out, self._levels = self._chain(context, k)
        return Draft(out, source=self.name)

    def learn(self, proposed: int, accepted: int) -> None:
        """Update each level's acceptance estimate from the tokens the verifier judged.

        The paper's adaptivity is the per-token UPDATE of the tables, which `_sync` already does
        from the context (accepted tokens + the target's correction); rejected draft tokens never
        enter the tables. Per-level trust is our addition (see DEFAULT_MIN_TRUST). Tokens after
        the first rejection were never judged, so they teach nothing.
        """
        self.proposed_total += proposed
        self.accepted_total += accepted
        for i, level in enumerate(self._levels[: min(accepted + 1, proposed)]):
            hit = 1.0 if i < accepted else 0.0
            self.trust[level] = (1 - TRUST_EMA) * self.trust[level] + TRUST_EMA * hit
