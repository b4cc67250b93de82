"""A separate small model drafts autoregressively with its own KV cache (e.g. an int4 0.5B for a 1.5B)."""

import time
from collections import deque
from typing import Deque, Iterable, List, Optional, Tuple

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

from ...errors import GenerationError
from .. import recurrent
from ..cache import new_cache, rewind
from .base import Draft, Drafter
from .head import SURE, SubsetHead

# Most draft tokens per round for model and self drafters: a cap, the policy (from measured acceptance and verify
# costs) and the confidence stop draft fewer. 15 fills the cheapest verify pass measured here (16 positions, §14 of
# BENCHMARKS.md); it was 6 before verify passes were padded (BENCHMARKS.md §16).
DEFAULT_K = 15
# Stop drafting after a token the draft itself gives < 50 % (the token is still proposed). 0.5 was picked from two
# 64-token tuning runs on the Qwen pair (one HumanEval, one edit prompt): K=6 with 0.5 was 11-19 % faster than
# K=4 with no stop (then the unsure token was dropped).
DEFAULT_MIN_CONFIDENCE = 0.5
PREFILL_STEP = 512  # prompt tokens per forward pass: bounds the attention scratch memory
ONE_PASS = 8  # catch-up tokens fed in the same pass as the token drafting continues from (see _forward)
STEP_EMA = 0.3  # weight of the newest one-token draft step time (splits a round's catch-up from its steps)
# The share of draft steps whose pass launched ahead is wasted, over the last WASTE_WINDOW steps, (wasted + 1) /
# (steps + 2): a window, not an EMA, so that a stop every ~20 steps does not flip launching on after each clean run.
WASTE_WINDOW = 64
CALIBRATE_TOKENS = 16  # prompt tokens fed on a scratch cache when a drafter starts, to time its catch-up per token
HINDSIGHT_MIN = 4  # output tokens a catch-up must feed for the drafter to judge them (`Draft.hindsight`)
HINDSIGHT_MAX = 128  # ... and the most it judges: the last ones, in the pass that drafts


def common_prefix(a: List[int], b: List[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def pays_to_go_on(n: int, conf: float, reach: float, expected: float, verify_cost, step: float) -> bool:
    """Whether drafting an (n+1)-th token raises the round's expected tokens per second, after n drafted tokens.

    The draft's confidence stands for the odds the target accepts a token (for the 0.5B drafting the 1.5B here
    its top-token probability is calibrated: 0.5-0.6 right 54-63 %, 0.8-0.9 86-95 %, above 0.9 99.8 % on
    engine2's HumanEval and edit replies, `notebooks/stop_rule_sim.py`). reach: the odds all n drafts are
    accepted (the product of their confidences); expected: the round's expected tokens with n drafts (1 + the
    sum of each prefix's reach); the next token is taken to be as sure as the last (`conf`). The round's cost is
    verify_cost(n) + n * step (seconds), so the same rule drafts long where a draft step is cheap beside a target
    step and cuts drafts where it is not: on this CPU a 0.5B step costs a third of a 1.5B step. A development
    tool gave, replayed over engine2's replies, 3 % less time on HumanEval and 7 % on the edits than the
    confidence stop alone (BENCHMARKS.md §21)."""
    now, more = verify_cost(n), verify_cost(n + 1)
    if now is None or more is None:
        return True
    return (expected + reach * conf) * (now + n * step) > expected * (more + (n + 1) * step)


def _top(logits: mx.array) -> Tuple[mx.array, mx.array]:
    """Each row's best column of logits (n, V) and its softmax probability (lazy)."""
    at = mx.argmax(logits, axis=-1)
    return at, mx.take_along_axis(mx.softmax(logits, axis=-1), at[:, None], axis=-1)[:, 0]


class ModelDrafter(Drafter):
    """Greedy or sampled drafts from a small model.

    The cache holds exactly `self._fed` tokens. Each round it is trimmed back to the longest
    prefix it shares with the new context (rejected drafts go), and the missing context tokens
    are fed in one forward pass, so rounds may be skipped freely and a session's next turn only
    feeds what is new. `fed_total` counts every token fed through the model.
    """

    name = "model"

    def __init__(self, model, vocab_size: int, real_vocab: Optional[int] = None,
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE, head_ids: Optional[Iterable[int]] = None,
                 pipeline: Optional[bool] = None):
        """vocab_size: the target's logits width; real_vocab: tokens the tokenizer really has
        (ids at or above it are padding and are never drafted); head_ids: the base vocabulary subset of
        greedy draft steps (`head.SubsetHead`; the context's tokens join it), None for the full head;
        pipeline: launch each next draft pass before reading the token (True), never (False), or where this
        machine's measured costs say it pays (None, `_launches`)."""
        self.model = model
        self.pipeline = pipeline
        self.head = SubsetHead(model, head_ids) if head_ids is not None and SubsetHead.supports(model) else None
        self.head_steps = [0, 0]  # greedy draft steps decided by the subset, and by the full head
        self.vocab_size = vocab_size
        self.real_vocab = real_vocab
        self.min_confidence = min_confidence
        self.fed_total = 0
        self.cache = None
        self._fed: List[int] = []
        self._step_s: Optional[float] = None  # seconds per one-token draft pass (EMA)
        self._host_s: Optional[float] = None  # ... of which the host spends building it, before it waits (EMA)
        self.ahead = [0, 0]  # draft steps a next pass could have been launched from, and those where it is wasted
        self._recent: Deque[bool] = deque(maxlen=WASTE_WINDOW)  # ... whether each of the last ones was wasted
        self._catch_up_s: Optional[float] = None  # seconds per token fed without logits (timed once, at start)
        self._output_from: Optional[int] = None  # the context's first output token (the prompt's length)
        self._hindsight: Optional[List[bool]] = None  # what the last _forward judged

    def _new_cache(self):
        cache = new_cache(self.model)
        if not can_trim_prompt_cache(cache):
            raise GenerationError(f"{self.name} drafter: its KV cache cannot be trimmed, so drafts cannot be rewound")
        return cache  # a sliding-window cache may stop being trimmable later: _sync rebuilds it then

    def reset(self, prompt: List[int], target_cache: Optional[list] = None) -> None:
        """Keep the prefix of `prompt` the cache already holds; the rest is fed when the policy first drafts.

        Deferred so that a draft the policy never uses (one too slow to pay on this machine) costs nothing:
        an int8 0.5B's prompt took 57 s of a 102 s reply on this CPU. On its first start the drafter times a
        short pass instead (`step_cost`), which is what the policy needs to decide.
        """
        if self.cache is None:
            self.cache, self._fed = self._new_cache(), []
        self._output_from = len(prompt)
        if self.head is not None:
            self.head.add(prompt)
        if len(prompt) > 1:
            self._guarded(lambda: self._sync(prompt))
        if self._step_s is None:
            self._calibrate(prompt)

    def _calibrate(self, prompt: List[int]) -> None:
        """Time a catch-up pass (CALIBRATE_TOKENS of the prompt, no logits) and a one-token draft step, on a scratch
        cache: the drafter's own cache is untouched.

        The catch-up is costed per token beyond the one pass a draft step makes anyway (a catch-up rides along in
        the first draft pass): a 14-token pass of the 0.5B took 0.26 s here against 0.16-0.18 s for one token,
        0.018 s a token split evenly but 0.005-0.008 s beyond the step (a 132-token catch-up in a reply: 0.009 s
        a token). Split evenly, the seed priced the probe of a sat-out 0.5B above the probe budget
        (BENCHMARKS.md §10-11; `notebooks/catch_up_cost.py`)."""
        cache = make_prompt_cache(self.model)
        tokens = prompt[-CALIBRATE_TOKENS - 1:]
        mx.eval(self.model(mx.array(tokens[:1])[None], cache=cache))  # warm-up: first-call allocations
        fed = tokens[1:-1] or tokens[:1]
        t0 = time.perf_counter()
        self.model(mx.array(fed)[None], cache=cache)
        mx.eval([c.state for c in cache])
        t1 = time.perf_counter()
        last = mx.array(tokens[-1:])[None]
        mx.eval(self.head.subset(self.head.hidden(last, cache)[-1]) if self.head is not None
                else self.model(last, cache=cache)[0, -1])
        t2 = time.perf_counter()
        self._step_s, whole = t2 - t1, t1 - t0
        marginal = (whole - self._step_s) / (len(fed) - 1) if len(fed) > 1 else 0.0
        self._catch_up_s = marginal if marginal > 0 else whole / len(fed)  # timing noise: the even split, dearer

    def lag(self, source: str, context: List[int]) -> int:
        """Context tokens (all but the last, which drafting starts from) the cache does not hold yet.

        Cheap: the cache holds a prefix of the context plus at most the drafts rejected last round, so only
        its tail is compared (a rejected draft equal to the context token there is missed: an estimate).
        """
        i = min(len(self._fed), len(context) - 1)
        while i > 0 and self._fed[i - 1] != context[i - 1]:
            i -= 1
        return max(0, len(context) - 1 - i)

    def step_cost(self, source: str) -> Tuple[Optional[float], Optional[float]]:
        return self._step_s, self._catch_up_s

    def _guarded(self, fn):
        """Run fn; if it is interrupted (Ctrl-C, a closed generator), rewind the cache to `_fed`."""
        try:
            return fn()
        except BaseException:
            if not rewind(self.cache, len(self._fed)):
                self.cache, self._fed = self._new_cache(), []
            raise

    def _feed(self, tokens: List[int]) -> None:
        """Feed tokens into the cache in PREFILL_STEP chunks (the logits are never computed: lazy)."""
        for i in range(0, len(tokens), PREFILL_STEP):
            chunk = tokens[i : i + PREFILL_STEP]
            self.model(mx.array(chunk)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self._fed.extend(chunk)
            self.fed_total += len(chunk)

    def _forward(self, tokens: List[int], hidden: bool = False, judge: int = 0) -> mx.array:
        """Feed tokens, return the last position's logits (V,), target-aligned (its hidden state if `hidden`).

        The last ONE_PASS tokens (a short catch-up and the token the draft continues from) go through the
        model together: on a memory-bound CPU or GPU a pass over 2-8 tokens costs about what a pass over one
        does. Earlier tokens are fed without logits, so a long catch-up (after the n-gram drafted for a
        while) does not compute the output head over every position.

        judge: the last `judge` tokens are output the target produced while this drafter sat out; the pass
        that feeds them also scores the positions before them, and `_hindsight` records, for each, whether the
        greedy draft there would have been that token (on the subset head when there is one: a few thousand
        rows, not the whole vocabulary).
        """
        split = max(0, len(tokens) - max(ONE_PASS, judge + 1))
        self._feed(tokens[:split])
        last = tokens[split:]
        x = mx.array(last)[None]
        if hidden:
            h = self.head.hidden(x, self.cache)
            out, best = h[-1], (self._head_choice(h[-1 - judge : -1])[0] if judge else None)
        else:
            logits = self.model(x, cache=self.cache)[0]
            out = logits[-1]
            best = mx.argmax(self._align(logits[-1 - judge : -1]), axis=-1).tolist() if judge else None
        if judge:
            self._hindsight = [a == b for a, b in zip(best, last[-judge:])]
        self._fed.extend(last)
        self.fed_total += len(last)
        return out if hidden else self._align(out)

    def _head_choice(self, h: mx.array, logits: Optional[mx.array] = None,
                     best: Optional[mx.array] = None) -> Tuple[List[int], List[float], List[bool]]:
        """The greedy draft token at each hidden state h (n, d), the draft's probability of it, and whether the
        subset decided it: the subset's best where it holds SURE of the subset's mass, the full head's elsewhere
        (scored for those rows only). One rule for the drafting step and for the hindsight of a catch-up.
        logits, best: the subset's logits and best token ids, when the caller built them already. One host
        synchronisation, and one more where some row is unsure."""
        logits = self.head.subset(h).astype(mx.float32) if logits is None else logits
        at, share = _top(logits)
        best = self.head.ids()[at] if best is None else best
        mx.eval(best, share)
        tokens, conf = best.tolist(), share.tolist()
        sure = [c >= SURE for c in conf]
        unsure = [i for i, ok in enumerate(sure) if not ok]
        if unsure:
            best, share = _top(self._align(self.head.full(h[mx.array(unsure)])).astype(mx.float32))
            mx.eval(best, share)
            for i, t, c in zip(unsure, best.tolist(), share.tolist()):
                tokens[i], conf[i] = t, c
        return tokens, conf, sure

    def _judged(self, context: List[int], todo: List[int]) -> int:
        """How many of `todo`'s tokens (the catch-up) to judge: the target's output among them, but not the first
        (the position before it was fed in an earlier pass), and only a catch-up of HINDSIGHT_MIN or more."""
        if self._output_from is None:
            return 0
        n = min(len(todo) - 1, len(context) - self._output_from, HINDSIGHT_MAX)
        return n if n >= HINDSIGHT_MIN else 0

    def _align(self, logits: mx.array) -> mx.array:
        """Pad or cut the draft's logits (..., V) to the target's width and mask padding ids."""
        v = logits.shape[-1]
        if v > self.vocab_size:
            logits = logits[..., : self.vocab_size]
        elif v < self.vocab_size:
            pad = mx.full((*logits.shape[:-1], self.vocab_size - v), -mx.inf, logits.dtype)
            logits = mx.concatenate([logits, pad], axis=-1)
        if self.real_vocab is not None and self.real_vocab < self.vocab_size:
            mask = mx.arange(self.vocab_size) >= self.real_vocab
            logits = mx.where(mask, -mx.inf, logits)
        return logits

    def _sync(self, context: List[int]) -> List[int]:
        """Rewind the cache to what it shares with `context`; return the tokens still to feed."""
        keep = min(common_prefix(self._fed, context), len(context) - 1)
        if len(self._fed) > keep:
            if can_trim_prompt_cache(self.cache) and rewind(self.cache, keep):
                del self._fed[keep:]
            else:  # e.g. a sliding-window cache past its window: start over (slow, but correct)
                self.cache, self._fed, keep = self._new_cache(), [], 0
        recurrent.commit(self.cache)  # the held prefix is the context's: only this round's drafts get trimmed
        return context[keep:]

    def propose(self, context: List[int], k: int, probs_fn=None, source: Optional[str] = None) -> Draft:
        if k <= 0 or not context:
            return Draft([])
        if self.cache is None:
            self.cache = self._new_cache()
        return self._guarded(lambda: self._draft(context, k, probs_fn))

    def _launches(self) -> bool:
        """Whether this round launches each next draft pass before reading the token it continues from (mlx-lm's
        generate_step does, with mx.async_eval): the device then never waits for the host between passes, but a
        pass launched on a token the round does not keep (the confidence stop, or the subset's best token
        overruled by the full head) is thrown away. Decided by what this drafter measured on this machine: the
        host's time per step against the recent share of launches that would be wasted times the cost of a pass.
        On this CPU the host takes 2-3 % of a 0.5B pass (3.6 ms of 155-165 ms): it launches ahead while drafts
        run long and sure (HumanEval code: 0.999-1.009x a drafted token, nothing measurable), and stays
        synchronous where they stop early (a prose question: half the launches wasted, 0.65x forced);
        `notebooks/pipeline_cost.py`, BENCHMARKS.md §12. `pipeline` forces it either way."""
        if self.pipeline is not None:
            return self.pipeline
        if self._host_s is None or self._step_s is None:
            return False
        return self._host_s > self.waste() * self._step_s

    def _pays(self, n: int, conf: float, reach: float, expected: float) -> bool:
        """`pays_to_go_on` at the engine's verify costs and this drafter's step time; True when either is unknown."""
        if self.verify_cost is None or self._step_s is None:
            return True
        return pays_to_go_on(n, conf, reach, expected, self.verify_cost, self._step_s)

    def waste(self) -> float:
        """The recent share of draft steps whose pass, launched ahead, would be or was thrown away."""
        return (sum(self._recent) + 1) / (len(self._recent) + 2)

    def _choice(self, out: mx.array, probs_fn, subset: bool):
        """The step's guessed token as a lazy array (what a pass launched ahead is fed) and a function that reads the
        step in one host synchronisation: (token, confidence, probability row or None, the guess). Token and guess
        differ only where the subset's best token is not sure and the full head picks another."""
        if subset:
            logits = self.head.subset(out[None]).astype(mx.float32)
            guess = self.head.ids()[mx.argmax(logits, axis=-1)]

            def read():
                (tok,), (conf,), (sure,) = self._head_choice(out[None], logits, guess)
                self.head_steps[0 if sure else 1] += 1
                return tok, conf, None, guess.item()

            return guess, read
        if probs_fn is None:
            probs = mx.softmax(out.astype(mx.float32))
            tok = mx.argmax(out)
        else:
            probs = probs_fn(out)
            tok = mx.random.categorical(mx.log(probs))

        def read():
            conf = probs[tok]
            mx.eval(tok, conf)
            token = tok.item()
            return token, conf.item(), probs, token

        return tok, read

    def _launch(self, token: mx.array, hidden: bool) -> mx.array:
        """Feed a token the host has not read yet and start its pass (mx.async_eval); return its output as
        `_forward` does. The caller either keeps it (`_fed` gains the token) or rewinds the cache past it."""
        x = token.reshape(1, 1)
        out = self.head.hidden(x, self.cache)[-1] if hidden else self._align(self.model(x, cache=self.cache)[0, -1])
        mx.async_eval(out)
        self.fed_total += 1
        return out

    def _draft(self, context: List[int], k: int, probs_fn) -> Draft:
        todo = self._sync(context)  # what the cache lacks, ending with the token to continue from
        tokens, rows, catch_up, behind = [], [], 0.0, len(todo) - 1
        reach, expected = 1.0, 1.0  # the odds every draft so far is accepted, and the round's expected tokens
        # Greedy only: there a draft token is accepted exactly where it is the target's token.
        judge, self._hindsight = (self._judged(context, todo) if probs_fn is None else 0), None
        subset, pipelined = probs_fn is None and self.head is not None, self._launches()
        out = None  # this step's output when its pass was launched in the step before
        for i in range(k):
            t0 = time.perf_counter()
            if out is None:
                if subset:
                    self.head.add(todo)
                out = self._forward(todo, hidden=subset, judge=judge)
            guess, read = self._choice(out, probs_fn, subset)
            ahead = self._launch(guess, subset) if pipelined and i + 1 < k else None
            host = time.perf_counter() - t0
            tok, conf, probs, guessed = read()
            step = time.perf_counter() - t0
            if len(todo) == 1:  # a pure draft step: what one more drafted token costs
                self._step_s = step if self._step_s is None else (1 - STEP_EMA) * self._step_s + STEP_EMA * step
                self._host_s = host if self._host_s is None else (1 - STEP_EMA) * self._host_s + STEP_EMA * host
            else:  # the first pass also fed the catch-up: its time beyond one draft step is the round's catch-up
                catch_up = max(0.0, step - (self._step_s or 0.0))
            tokens.append(tok)
            rows.append(probs)
            # Stop after a low-confidence token: the tokens past it would seldom be accepted. The token itself is
            # kept: its pass is paid for, and one more token in the verify pass costs little (on this CPU ~5 % of a
            # target step) beside the target step it saves when accepted. Dropping it, as this loop once did,
            # cost one wasted draft pass per early stop (~0.2 s for the 0.5B here, a third of its rounds).
            # Stop also where one more token would not pay for its draft step and verify position (`_pays`).
            reach *= conf
            expected += reach
            go_on = conf >= self.min_confidence and i + 1 < k and self._pays(i + 1, conf, reach, expected)
            keep = go_on and tok == guessed  # a pass launched ahead here goes on with the guessed token
            if i + 1 < k:
                self.ahead[0] += 1
                self.ahead[1] += not keep
                self._recent.append(not keep)
            out, todo, judge = None, tokens[-1:], 0
            if ahead is not None:
                if keep:
                    out = ahead
                    self._fed.append(tok)
                    if subset:
                        self.head.add(todo)
                elif not rewind(self.cache, len(self._fed)):  # as in _sync: start over (slow, but correct)
                    self.cache, self._fed = self._new_cache(), []
            if not go_on:
                break
        return Draft(tokens, mx.stack(rows) if probs_fn is not None else None, catch_up, behind,
                     hindsight=(self.name, self._hindsight) if self._hindsight else None)
