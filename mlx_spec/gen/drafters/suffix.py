"""Suffix drafting as in SuffixDecoding (arXiv 2411.04975), over the context and optionally earlier outputs (written
here: no maintained Python library builds a suffix automaton online with counts over integer tokens)."""

import threading

from ..tunables import SUFFIX_ALPHA as ALPHA
from ..tunables import SUFFIX_COUNT_WALK as COUNT_WALK
from ..tunables import SUFFIX_MATCH_TAIL as MATCH_TAIL
from ..tunables import SUFFIX_MEMORY_TOKENS as MEMORY_TOKENS
from ..tunables import SUFFIX_MIN_MATCH as MIN_MATCH
from ..tunables import SUFFIX_MIN_SCORE as MIN_SCORE
from .base import Draft, Drafter, Kept, extends

SEPARATOR = -1  # between the outputs in a memory: no match runs across two, and no draft past one


class SuffixIndex:
    """An online suffix automaton over a token list (the textbook construction): `length[v]`, `link[v]`, `next[v]`
    and `count[v]` are state v's longest string, suffix link, transitions and end positions (state 0: the root)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.length: list[int] = [0]
        self.link: list[int] = [-1]
        self.next: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.last = 0

    def _state(self, length: int, link: int, nxt: dict[int, int], count: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(nxt)
        self.count.append(count)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append a token, in amortised O(1)."""
        self.tokens.append(token)
        cur = self._state(self.length[self.last] + 1, 0, {}, 0)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: the shorter strings now also end here
                clone = self._state(self.length[p] + 1, self.link[q], dict(self.next[q]), self.count[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        v, steps = cur, 0
        while v > 0 and steps < COUNT_WALK:  # every suffix of the text now ends here once more
            self.count[v] += 1
            v, steps = self.link[v], steps + 1

    def copy(self) -> "SuffixIndex":
        """An independent copy: a list copy a field, far cheaper than indexing the text again token by token."""
        other = SuffixIndex()
        other.tokens, other.length, other.link, other.count = (
            list(self.tokens),
            list(self.length),
            list(self.link),
            list(self.count),
        )
        other.next, other.last = [dict(d) for d in self.next], self.last
        return other

    def match(self) -> tuple[int, int]:
        """(state, length) of the longest suffix of the text that also occurs earlier; (0, 0) if none."""
        v = self.link[self.last] if self.last else 0
        return (v, self.length[v]) if v > 0 else (0, 0)

    def match_tail(self, tail: list[int]) -> tuple[int, int]:
        """(state, length) of the longest suffix of `tail` that occurs in the text; (0, 0) if none."""
        v, n = 0, 0
        for t in tail:
            while v and t not in self.next[v]:
                v = self.link[v]
                n = self.length[v]
            if t in self.next[v]:
                v, n = self.next[v][t], n + 1
        return (v, n) if n else (0, 0)

    def draft(self, state: int, length: int, k: int) -> list[int]:
        """Up to min(k, ALPHA x length) tokens after a match, by the most frequent transition each step, while the
        product of their empirical probabilities stays at or above MIN_SCORE; none for a match under MIN_MATCH."""
        k = min(k, max(1, int(ALPHA * length))) if length >= MIN_MATCH else 0
        out: list[int] = []
        score = 1.0
        while len(out) < k and self.next[state]:
            token, child = max(self.next[state].items(), key=lambda kv: self.count[kv[1]])
            score *= self.count[child] / max(1, self.count[state])
            if score < MIN_SCORE or token == SEPARATOR:
                break
            out.append(token)
            state = child
        return out


class SuffixMemory:
    """Earlier outputs, shared by the drafters of a process (a server's requests, a chat's turns)."""

    def __init__(self, max_tokens: int = MEMORY_TOKENS):
        self.max_tokens, self.index, self._lock = max_tokens, SuffixIndex(), threading.Lock()

    def add(self, output: list[int]) -> None:
        """Remember an output; past `max_tokens` the older half of the outputs goes."""
        if not output:
            return
        with self._lock:
            text, keep = self.index.tokens, []
            if len(text) + len(output) + 1 > self.max_tokens:  # start over from the newer half (whole outputs)
                keep = text[len(text) // 2 :]
                keep = keep[keep.index(SEPARATOR) + 1 :] if SEPARATOR in keep else []
                self.index = SuffixIndex()
            for t in keep + list(output[-self.max_tokens // 2 :]) + [SEPARATOR]:
                self.index.extend(t)

    def draft(self, context: list[int], k: int) -> tuple[int, list[int]]:
        """(match length, draft) from the memory for the context's suffix."""
        with self._lock:
            state, length = self.index.match_tail(context[-MATCH_TAIL:])
            return length, self.index.draft(state, length, k)


PROCESS_MEMORY = SuffixMemory()  # what `suffix:shared` remembers


class SuffixDrafter(Drafter):
    """The most frequent continuation of the longest earlier match of the context's suffix (context or `memory`)."""

    name = "suffix"
    free = True  # dictionary walks: microseconds against a forward pass

    def __init__(self, memory: SuffixMemory | None = None):
        self.memory = memory
        self.index = SuffixIndex()
        self._prompt_len: int | None = None  # where the current generation's output starts in the index

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        self._remember()
        self._sync(prompt)
        self._prompt_len = len(prompt)

    def fork(self, tokens: list[int]) -> Kept:
        """An index of `tokens` alone (a kept prefix's)."""
        index = SuffixIndex()
        for token in tokens:
            index.extend(token)
        return Kept(self.name, index)

    def adopt(self, kept: Kept, n: int) -> None:
        """Start from a copy of `kept`'s index where it indexes just the `n` tokens (a prefix of the next context):
        the next reset indexes the rest."""
        if kept.key == self.name and len(kept.state.tokens) == n:
            self._remember()
            self.index, self._prompt_len = kept.state.copy(), None

    def _remember(self) -> None:
        if self.memory is not None and self._prompt_len is not None:  # the last generation's output is final
            self.memory.add(self.index.tokens[self._prompt_len :])
            self._prompt_len = None

    def _sync(self, context: list[int]) -> None:
        """Index what the context adds; start over when it is not an extension (a session's edited turn)."""
        if not extends(context, self.index.tokens):
            self.index = SuffixIndex()
        for token in context[len(self.index.tokens) :]:
            self.index.extend(token)

    def propose(self, context: list[int], k: int, sampler=None) -> Draft:
        self._sync(context)
        state, length = self.index.match()
        if self.memory is not None:
            remembered, draft = self.memory.draft(context, k)
            if remembered > length:
                return Draft.of(draft, source=self.name)
        return Draft.of(self.index.draft(state, length, k), source=self.name)
