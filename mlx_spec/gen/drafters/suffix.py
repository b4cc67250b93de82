"""Suffix drafting in the style of SuffixDecoding (arXiv 2411.04975): the longest match, the most frequent way on.

The context (prompt and output so far) is indexed by a suffix automaton, built online in amortised
O(1) per token. Each round the drafter takes the longest suffix of the context that occurred before
(any length, not just the last N-1 tokens an n-gram table keys on), and follows the most frequent
continuation of that match token by token, for up to ALPHA times the match length (SuffixDecoding's
max_spec = alpha * match_length) and at most K tokens. It stops early where the continuation's
empirical probability (occurrences of the longer string over occurrences of the shorter) multiplied
along the draft falls under MIN_SCORE. On code edits, where the answer copies long stretches of the
input, a long sure match drafts long.

Memory across requests (vLLM's suffix decoding and llama.cpp's ngram-mod have it, mlx-lm has not): with
`memory` (`suffix:shared` uses the process's `PROCESS_MEMORY`), every finished generation's output joins a
second automaton shared by all drafters of the process, and a round drafts from whichever of the context and
the memory holds the longer match. A server answering similar requests drafts from its earlier answers.

No maintained Python library builds a suffix automaton incrementally with occurrence counts over
integer tokens, so it is written here (the textbook construction, plus a counter walk).
"""

import threading
from typing import Dict, List, Optional, Tuple

from ...errors import GenerationError
from ..tunables import SUFFIX_ALPHA as ALPHA
from ..tunables import SUFFIX_COUNT_WALK as COUNT_WALK
from ..tunables import SUFFIX_MATCH_TAIL as MATCH_TAIL
from ..tunables import SUFFIX_MEMORY_TOKENS as MEMORY_TOKENS
from ..tunables import SUFFIX_MIN_MATCH as MIN_MATCH
from ..tunables import SUFFIX_MIN_SCORE as MIN_SCORE
from .base import Draft, Drafter

SEPARATOR = -1  # between the outputs in a memory: no match runs across two, and no draft past one


class SuffixIndex:
    """An online suffix automaton over a token list, with occurrence counts per state.

    State 0 is the root. `length[v]` is the longest string of state v, `link[v]` its suffix link,
    `next[v]` its transitions, `count[v]` how many end positions its strings have (exact while the
    counter walk of each new token reaches the root, which COUNT_WALK bounds).
    """

    def __init__(self):
        self.tokens: List[int] = []
        self.length: List[int] = [0]
        self.link: List[int] = [-1]
        self.next: List[Dict[int, int]] = [{}]
        self.count: List[int] = [0]
        self.last = 0

    def _state(self, length: int, link: int, nxt: Dict[int, int], count: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(nxt)
        self.count.append(count)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
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

    def match(self) -> Tuple[int, int]:
        """(state, length) of the longest suffix of the text that also occurs earlier; (0, 0) if none."""
        v = self.link[self.last] if self.last else 0
        return (v, self.length[v]) if v > 0 else (0, 0)

    def match_tail(self, tail: List[int]) -> Tuple[int, int]:
        """(state, length) of the longest suffix of `tail` that occurs in the text; (0, 0) if none."""
        v, n = 0, 0
        for t in tail:
            while v and t not in self.next[v]:
                v = self.link[v]
                n = self.length[v]
            if t in self.next[v]:
                v, n = self.next[v][t], n + 1
        return (v, n) if n else (0, 0)

    def continuation(self, state: int, k: int) -> List[int]:
        """Up to k tokens following `state` by the most frequent transition each step, while sure enough."""
        out, score = [], 1.0
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

    def add(self, output: List[int]) -> None:
        if not output:
            return
        with self._lock:
            text = self.index.tokens
            if len(text) + len(output) + 1 > self.max_tokens:  # keep the newer half (whole outputs)
                keep = text[len(text) // 2:]
                keep = keep[keep.index(SEPARATOR) + 1:] if SEPARATOR in keep else []
                self.index = SuffixIndex()
                for t in keep:
                    self.index.extend(t)
            for t in list(output[-self.max_tokens // 2:]) + [SEPARATOR]:
                self.index.extend(t)

    def draft(self, context: List[int], k: int, min_match: int, alpha: float) -> Tuple[int, List[int]]:
        """(match length, draft) from the memory for the context's suffix."""
        with self._lock:
            state, length = self.index.match_tail(context[-MATCH_TAIL:])
            if length < min_match:
                return length, []
            return length, self.index.continuation(state, min(k, max(1, int(alpha * length))))


PROCESS_MEMORY = SuffixMemory()  # what `suffix:shared` remembers


class SuffixDrafter(Drafter):
    """Drafts the most frequent continuation of the longest earlier match of the context's suffix."""

    name = "suffix"
    free = True  # dictionary walks: microseconds against a forward pass

    def __init__(self, alpha: float = ALPHA, min_match: int = MIN_MATCH, memory: Optional[SuffixMemory] = None):
        if alpha <= 0 or min_match < 1:
            raise GenerationError("suffix: alpha must be > 0 and min_match >= 1")
        self.alpha, self.min_match, self.memory = alpha, min_match, memory
        self.index = SuffixIndex()
        self._prompt_len: Optional[int] = None  # where the current generation's output starts in the index

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        if self.memory is not None and self._prompt_len is not None:  # the last generation's output is final
            self.memory.add(self.index.tokens[self._prompt_len:])
        self._sync(prompt)
        self._prompt_len = len(prompt)

    def _sync(self, context: List[int]) -> None:
        """Index what the context adds; start over when it is not an extension (a session's edited turn)."""
        have = self.index.tokens
        if len(context) < len(have) or context[len(have) - 1 : len(have)] != have[-1:] or \
                context[max(0, len(have) - 8) : len(have)] != have[-8:]:
            self.index = SuffixIndex()
            have = self.index.tokens
        for token in context[len(have):]:
            self.index.extend(token)

    def _draft(self, context: List[int], k: int) -> List[int]:
        self._sync(context)
        state, length = self.index.match()
        if self.memory is not None:
            remembered, draft = self.memory.draft(context, k, self.min_match, self.alpha)
            if remembered > length:
                return draft
        if length < self.min_match:
            return []
        return self.index.continuation(state, min(k, max(1, int(self.alpha * length))))

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        return Draft(self._draft(context, k) if k > 0 else [], source=self.name)
