"""ANPD: the adaptive multi-level N-gram drafter (Ou et al. 2024, arXiv:2404.08698), no model needed."""

from ...errors import GenerationError
from ..tunables import NGRAM_MIN_N as DEFAULT_MIN_N
from ..tunables import NGRAM_MIN_TRUST as DEFAULT_MIN_TRUST
from ..tunables import NGRAM_N as DEFAULT_N
from ..tunables import NGRAM_TRUST_EMA as TRUST_EMA
from ..tunables import NGRAM_TRUST_RECOVERY as TRUST_RECOVERY
from .base import Draft, Drafter, Kept, extends


class NGramDrafter(Drafter):
    """Drafts by chained most-frequent N-gram lookups over the context itself, one table for every level n in
    [min_n, n]: `_counts[gram]` counts an n-gram, `_best[ctx]` is (token, count) of the most frequent after `ctx`."""

    name = "ngram"
    free = True  # dictionary lookups: microseconds against a forward pass

    def __init__(self, n: int = DEFAULT_N, min_n: int = DEFAULT_MIN_N, min_trust: float = DEFAULT_MIN_TRUST):
        """n: longest n-gram; min_n: shortest; min_trust: a level accepted less often stops a draft (0: the paper's)."""
        if n < 2:
            raise GenerationError(f"ngram: n must be >= 2, got {n}")
        if not 2 <= min_n <= n:
            raise GenerationError(f"ngram: min_n must be in [2, n={n}], got {min_n}")
        self.n, self.min_n, self.min_trust = n, min_n, min_trust
        self.trust = {m: 1.0 for m in range(min_n, n + 1)}  # level -> acceptance estimate (optimistic start)
        self._levels: list[int] = []  # match level of each token of the last draft
        self._rebuild([])

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        self._sync(prompt)

    def _rebuild(self, prompt: list[int]) -> None:
        """INITIALIZE (paper Sec 3.1): forget the tables and index the prompt tokens."""
        self._counts: dict[tuple[int, ...], int] = {}  # n-gram -> occurrences
        self._best: dict[tuple[int, ...], tuple[int, int]] = {}  # its first n-1 tokens -> (most frequent next, count)
        self._tokens: list[int] = []  # our own copy of what is indexed, so caller mutation can't desync us
        self._index(prompt)

    def fork(self, tokens: list[int]) -> Kept:
        """Tables like this drafter's indexing `tokens` alone (a kept prefix's)."""
        other = NGramDrafter(self.n, self.min_n, self.min_trust)
        other._rebuild(tokens)
        return Kept(self.name, other)

    def adopt(self, kept: Kept, n: int) -> None:
        """Start from a copy of `kept`'s tables where they index just the `n` tokens (a prefix of the next context):
        the next reset indexes the rest."""
        other = kept.state
        if kept.key == self.name and len(other._tokens) == n:
            self._counts, self._best, self._tokens = dict(other._counts), dict(other._best), list(other._tokens)

    def _index(self, tokens: list[int]) -> None:
        """UPDATE with each token in turn: pair it with its previous n-1, ..., min_n-1 tokens."""
        seq, counts, best = self._tokens, self._counts, self._best
        for tok in tokens:
            seq.append(tok)
            i = len(seq) - 1
            for m in range(self.min_n, min(self.n, i + 1) + 1):  # m = n-gram length; needs i >= m-1
                gram = tuple(seq[i - m + 1 : i + 1])
                c = counts.get(gram, 0) + 1
                counts[gram] = c
                cur = best.get(gram[:-1])
                if cur is None or c >= cur[1]:  # most frequent wins; ties go to the most recent occurrence
                    best[gram[:-1]] = (tok, c)

    def _sync(self, context: list[int]) -> None:
        """Index the tokens of `context` not indexed yet, or all of them where it does not extend what is indexed."""
        if not extends(context, self._tokens):
            self._rebuild(context)
        elif len(context) > len(self._tokens):
            self._index(context[len(self._tokens) :])
        else:
            return
        for level, t in self.trust.items():  # new tokens: untrusted levels earn a retry over time
            if t < self.min_trust:
                self.trust[level] = t + TRUST_RECOVERY

    def _query(self, window: list[int]) -> tuple[int | None, int]:
        """Alg 2: (next token, level) from the longest level matching `window`; (None, 0) if none match."""
        for m in range(min(self.n, len(window) + 1), self.min_n - 1, -1):
            hit = self._best.get(tuple(window[len(window) - m + 1 :]))
            if hit is not None:
                return hit[0], m
        return None, 0

    def propose(self, context: list[int], k: int, sampler=None) -> Draft:
        """Alg 1 lines 12-16: up to k lookups chained through the draft, each on the last n-1 tokens of
        context + draft; stops at the first miss or at a level whose trust is below min_trust (deterministic)."""
        self._sync(context)
        window = self._tokens[-(self.n - 1) :]  # a copy: drafted tokens must not enter the tables
        out, self._levels = [], []
        for _ in range(k):
            tok, level = self._query(window)
            if tok is None or self.trust[level] < self.min_trust:
                break
            out.append(tok)
            self._levels.append(level)
            window.append(tok)
            del window[: max(0, len(window) - (self.n - 1))]  # keep the n-1 tokens the next key needs
        return Draft.of(out, source=self.name)

    def learn(self, proposed: int, accepted: int) -> None:
        """Each judged token's match level learns whether it was accepted (per-level trust is our addition to ANPD)."""
        for i, level in enumerate(self._levels[: min(accepted + 1, proposed)]):
            self.trust[level] = (1 - TRUST_EMA) * self.trust[level] + TRUST_EMA * (i < accepted)
