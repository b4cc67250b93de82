"""A separate small model drafts with its own KV cache (e.g. the 0.5B for the 1.5B), lazily: one read per round."""

from typing import Iterable, List, Optional, Tuple

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache

from ...errors import GenerationError
from .. import recurrent, shapes
from ..cache import new_cache, rewind
from ..sampling import sample
from ..tunables import HINDSIGHT_MAX, HINDSIGHT_MIN, PREFILL_STEP
from .base import Draft, Drafter
from .head import SubsetHead


def common_prefix(a: List[int], b: List[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelDrafter(Drafter):
    """Greedy or sampled drafts from a small model, built lazily: the engine reads them with the verify pass.

    The cache holds `_fed` and then the tokens drafted last round but the last (`_drafted`, read by the engine
    with its verify pass). Each round it is trimmed back to the longest prefix it shares with the new context (rejected drafts
    go) and the missing context tokens are fed in the pass that starts the draft. The prompt is fed when the
    planner first drafts with the model, not at `reset`, so a draft model that does not pay costs nothing.
    """

    name = "model"

    def __init__(self, model, vocab_size: int, real_vocab: Optional[int] = None,
                 head_ids: Optional[Iterable[int]] = None):
        """vocab_size: the target's logits width; real_vocab: tokens the tokenizer really has (ids at or above it
        are padding and are never drafted); head_ids: the base vocabulary subset of greedy draft steps
        (`head.SubsetHead`; the context's tokens join it), None for the full head."""
        self.model = model
        self.head = SubsetHead(model, head_ids or []) if SubsetHead.supports(model) else None
        self.subset = head_ids is not None and self.head is not None
        self.vocab_size, self.real_vocab = vocab_size, real_vocab
        self.fed_total = 0  # every token fed through the model
        self.cache = None
        self._fed: List[int] = []
        self._drafted: Optional[Tuple[mx.array, int]] = None  # last round's draft, of which its cache holds n
        self._output_from: Optional[int] = None  # the context's first output token (the prompt's length)

    def _new_cache(self):
        cache = new_cache(self.model)
        if not can_trim_prompt_cache(cache):
            raise GenerationError(f"{self.name} drafter: its KV cache cannot be trimmed, so drafts cannot be rewound")
        return cache  # a sliding-window cache may stop being trimmable later: _sync rebuilds it then

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """Keep the prefix of `prompt` the cache already holds; the rest is fed when the planner first drafts."""
        if self.cache is None:
            self.cache, self._fed = self._new_cache(), []
        self._output_from = len(prompt)
        if self.subset:
            self.head.add(prompt)
        if len(prompt) > 1:
            self._guarded(lambda: self._sync(prompt))

    def behind(self, context: List[int]) -> int:
        """Context tokens (all but the last, which drafting starts from) the cache does not hold yet.

        Cheap: the cache holds a prefix of the context plus at most the drafts rejected last round, so only
        its tail is compared (a rejected draft equal to the context token there is missed: an estimate).
        """
        self._settle()
        i = min(len(self._fed), len(context) - 1)
        while i > 0 and self._fed[i - 1] != context[i - 1]:
            i -= 1
        return max(0, len(context) - 1 - i)

    def _guarded(self, fn):
        """Run fn; if it is interrupted (Ctrl-C, a closed generator), rewind the cache to `_fed`."""
        try:
            return fn()
        except BaseException:
            self._drafted = None
            if not rewind(self.cache, len(self._fed)):
                self.cache, self._fed = self._new_cache(), []
            raise

    def _settle(self) -> None:
        """The tokens drafted last round join `_fed` (the engine read them with its verify pass already)."""
        if self._drafted is not None:
            drafted, n = self._drafted
            self._fed.extend(drafted.tolist()[:n])
            self._drafted = None

    def _sync(self, context: List[int]) -> List[int]:
        """Rewind the cache to what it shares with `context`; return the tokens still to feed."""
        self._settle()
        keep = min(common_prefix(self._fed, context), len(context) - 1)
        if len(self._fed) > keep:
            if can_trim_prompt_cache(self.cache) and rewind(self.cache, keep):
                del self._fed[keep:]
            else:  # e.g. a sliding-window cache past its window: start over (slow, but correct)
                self.cache, self._fed, keep = self._new_cache(), [], 0
        recurrent.commit(self.cache)  # the held prefix is the context's: only this round's drafts get trimmed
        return context[keep:]

    def lend(self, context: List[int]) -> list:
        """Hand the cache to a batch (`batch_draft.py`), first brought to hold `context[:-1]` (the missing tokens
        fed now, in chunks): this drafter holds nothing until `take_back`."""
        if self.cache is None:
            self.cache = self._new_cache()

        def catch_up():
            todo = self._sync(context)[:-1]
            for i in range(0, len(todo), PREFILL_STEP):
                self.model(mx.array(todo[i : i + PREFILL_STEP])[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self._fed.extend(todo)
            self.fed_total += len(todo)

        self._guarded(catch_up)
        cache, self.cache, self._fed = self.cache, None, []
        return cache

    def take_back(self, cache: list, fed: List[int]) -> None:
        """Take back a lent cache, which now holds `fed`."""
        self.cache, self._fed, self._drafted = cache, list(fed), None

    def align(self, logits: mx.array) -> mx.array:
        """Pad or cut the draft's logits (..., V) to the target's width and mask padding ids."""
        v = logits.shape[-1]
        if v > self.vocab_size:
            logits = logits[..., : self.vocab_size]
        elif v < self.vocab_size:
            pad = mx.full((*logits.shape[:-1], self.vocab_size - v), -mx.inf, logits.dtype)
            logits = mx.concatenate([logits, pad], axis=-1)
        if self.real_vocab is not None and self.real_vocab < self.vocab_size:
            logits = mx.where(mx.arange(self.vocab_size) >= self.real_vocab, -mx.inf, logits)
        return logits

    def _pass(self, tokens: mx.array) -> Tuple[mx.array, bool]:
        """Feed tokens (1, L) and return the last position's state (hidden (d,) with a split head, else logits
        (V,)); where the device builds per shape and the cache allows, the pass runs at a padded size."""
        n = tokens.shape[1]
        size = shapes.padded(n) if shapes.builds_per_shape() and shapes.paddable(self.cache) else n
        if size > n:
            tokens = mx.concatenate([tokens, mx.broadcast_to(tokens[:, -1:], (1, size - n))], axis=1)
        out = self.head.hidden(tokens, self.cache) if self.head is not None else self.model(tokens, cache=self.cache)[0]
        if size > n:
            for c in self.cache:
                c.trim(size - n)
        return out[:n], shapes.first_time(self.model, size)

    def _greedy(self, h: mx.array) -> mx.array:
        """The greedy draft token at each row of h (n, d) or of logits (n, V) without a split head (lazy)."""
        if self.head is None:
            return mx.argmax(self.align(h), axis=-1)
        if self.subset:
            return self.head.ids()[mx.argmax(self.head.subset(h), axis=-1)]
        return mx.argmax(self.align(self.head.full(h)), axis=-1)

    def _pick(self, h: mx.array, probs_fn) -> Tuple[mx.array, Optional[mx.array]]:
        """The draft token after state h (1, d or V) and, when sampling, the distribution it was drawn from."""
        if probs_fn is None:
            return self._greedy(h), None
        logits = self.align(self.head.full(h) if self.head is not None else h)
        probs = probs_fn(logits)
        return sample(probs), probs[0]

    def _judged(self, context: List[int], todo: List[int]) -> int:
        """How many of `todo`'s tokens (the catch-up) to judge in hindsight: the target's output among them, but
        not the first (the position before it was fed in an earlier pass), and only a catch-up of HINDSIGHT_MIN
        or more."""
        if self._output_from is None:
            return 0
        n = min(len(todo) - 1, len(context) - self._output_from, HINDSIGHT_MAX)
        return n if n >= HINDSIGHT_MIN else 0

    def propose(self, context: List[int], k: int, probs_fn=None) -> Draft:
        if k <= 0 or not context:
            return Draft([], source=self.name)
        if self.cache is None:
            self.cache = self._new_cache()
        return self._guarded(lambda: self._draft(context, k, probs_fn))

    def _draft(self, context: List[int], k: int, probs_fn) -> Draft:
        todo = self._sync(context)  # what the cache lacks, ending with the token to continue from
        judge = self._judged(context, todo) if probs_fn is None else 0  # greedy: a match is an acceptance
        # A long catch-up is fed in chunks whose outputs are never needed; the last pass scores the judged positions
        # and the one drafting continues from.
        tail = min(len(todo), PREFILL_STEP) if self.head is not None else judge + 1
        for i in range(0, len(todo) - tail, PREFILL_STEP):
            self.model(mx.array(todo[i : min(i + PREFILL_STEP, len(todo) - tail)])[None], cache=self.cache)
        out, cold = self._pass(mx.array(todo[len(todo) - tail :])[None])
        # Judged on the subset as it was before these tokens joined it: the output must not credit itself.
        seen = (self._greedy(out[-1 - judge : -1]), todo[-judge:]) if judge else None
        if self.subset:
            self.head.add(todo)
        tokens, rows = [], []
        for i in range(k):
            tok, row = self._pick(out[-1:], probs_fn)
            tokens.append(tok)
            rows.append(row)
            if i + 1 < k:
                out, first = self._pass(tok.reshape(1, 1))
                cold = cold or first
        drafted = mx.concatenate(tokens)  # (k,)
        mx.async_eval(drafted)  # the device drafts while the host builds the verify pass
        self._fed.extend(todo)
        self._drafted = (drafted, k - 1)
        self.fed_total += len(todo) + k - 1
        return Draft(drafted, mx.stack(rows) if probs_fn is not None else None, self.name, len(todo) - 1, seen, cold)
