"""The speculative generation loop: draft, verify in one target pass, rewind the caches, emit tokens."""

import time
from dataclasses import dataclass, field
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache, trim_prompt_cache

from ..errors import GenerationError
from . import recurrent
from .cache import cache_tokens, new_cache, rewind
from .drafters.base import Draft, Drafter
from .policy import Policy
from .registry import default_num_draft
from .sampling import make_probs_fn
from .verify import verify_greedy, verify_sampling

DEFAULT_MAX_TOKENS = 256
PREFILL_STEP = 512  # prompt tokens per forward pass: bounds attention scratch memory
FINISH_REASONS = ("stop", "length", "context")  # EOS; max_tokens; the model's context is full


@dataclass
class Stats:
    """What a generation measured; algorithms fill it, only faces print it."""

    prompt_tokens: int = 0  # the whole prompt (conversation so far)
    prompt_cached: int = 0  # of which were already in the caller's cache (not prefilled again)
    prompt_time: float = 0.0
    generation_tokens: int = 0
    generation_time: float = 0.0  # from the first generated token to the last
    rounds: int = 0  # target forward passes after the prompt
    spec_rounds: int = 0  # rounds that verified at least one draft token
    proposed: int = 0
    accepted: int = 0
    proposed_by_position: List[int] = field(default_factory=list)
    accepted_by_position: List[int] = field(default_factory=list)
    draft_time: float = 0.0
    verify_time: float = 0.0
    peak_memory_gb: float = 0.0  # highest MLX allocation during the run above what was in use at its start
    fallback: Optional[str] = None  # why speculation stopped early, if it did
    finish_reason: Optional[str] = None
    trace: Optional[List[dict]] = None  # a list to fill: one entry per round, what the policy chose and what it cost

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens this generation processed (the rest came from the cache)."""
        return self.prompt_tokens - self.prompt_cached

    @property
    def prompt_tps(self) -> float:
        return self.prefill_tokens / self.prompt_time if self.prompt_time else 0.0

    @property
    def generation_tps(self) -> float:
        n = self.generation_tokens - 1  # mlx-lm convention: the first token belongs to the prompt phase
        return n / self.generation_time if self.generation_time and n > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted(self) -> float:
        """Draft tokens accepted per speculative round."""
        return self.accepted / self.spec_rounds if self.spec_rounds else 0.0

    @property
    def draft_share(self) -> float:
        """Share of generated tokens that came from drafts (each token's own flag is `from_draft`)."""
        return self.accepted / self.generation_tokens if self.generation_tokens else 0.0

    def acceptance_by_position(self) -> List[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        if d["trace"] is None:
            del d["trace"]
        for k in ("prefill_tokens", "prompt_tps", "generation_tps", "acceptance_rate", "mean_accepted", "draft_share"):
            d[k] = getattr(self, k)
        d["acceptance_by_position"] = self.acceptance_by_position()
        return d


class Step(NamedTuple):
    """One generated token, as the target alone would have produced it."""

    token: int
    from_draft: bool  # this token was a draft token the target accepted
    finish_reason: Optional[str]  # on the last token: one of FINISH_REASONS


def context_limit(model) -> Optional[int]:
    """The model's maximum context, if its config states one."""
    args = getattr(model, "args", None)
    return getattr(args, "max_position_embeddings", None) or getattr(args, "context_length", None)


def _record(stats: Stats, n: int, a: int) -> None:
    if n == 0:
        return
    stats.spec_rounds += 1
    stats.proposed += n
    stats.accepted += a
    grow = n - len(stats.proposed_by_position)
    if grow > 0:
        stats.proposed_by_position += [0] * grow
        stats.accepted_by_position += [0] * grow
    for i in range(n):
        stats.proposed_by_position[i] += 1
        stats.accepted_by_position[i] += i < a


def shadow_judgement(draft: List[int], produced: List[int]) -> Tuple[int, int]:
    """(proposed, accepted) of a draft that was not verified, judged against the tokens the round produced.

    A draft token is "accepted" where it equals the produced token: under greedy decoding that is the
    verifier's own rule, and under sampling a fixed token is accepted with the target's probability of
    it, which is also the chance that the sampled token equals it. Draft tokens beyond the produced
    ones were never judged, so they count as not proposed.
    """
    m = 0
    while m < len(draft) and m < len(produced) and draft[m] == produced[m]:
        m += 1
    return (len(draft) if m < len(produced) else m), m


class _Peak:
    """The peak allocation above the start, without resetting the process-wide peak (the caller's)."""

    def __init__(self):
        self.base, self.peak0, self.seen = mx.get_active_memory(), mx.get_peak_memory(), 0

    def gb(self) -> float:
        self.seen = max(self.seen, mx.get_active_memory())
        peak = mx.get_peak_memory()
        # A new process-wide peak happened during the run; otherwise the highest allocation we saw.
        top = peak if peak > self.peak0 else self.seen
        return max(0, top - self.base) / 1e9


def _prefill(model, cache, tokens: List[int]) -> None:
    for i in range(0, len(tokens), PREFILL_STEP):
        model(mx.array(tokens[i : i + PREFILL_STEP])[None], cache=cache)
        mx.eval([c.state for c in cache])


def speculative_generate_step(
    prompt: Sequence[int],
    model,
    drafter: Optional[Drafter] = None,
    *,
    prompt_cache: Optional[list] = None,
    policy: Optional[Policy] = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temp: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    num_draft: Optional[int] = None,
    adaptive: bool = True,
    eos_token_ids: Sequence[int] = (),
    stats: Optional[Stats] = None,
) -> Iterator[Step]:
    """Yield `Step(token, from_draft, finish_reason)` exactly as the target alone would produce them.

    Greedy (temp 0): token-identical to plain greedy decoding. Sampling: the same distribution,
    by speculative sampling. With no drafter it is plain decoding. The last step carries the
    finish reason: "stop" (an EOS token, yielded), "length" (max_tokens) or "context" (the
    model's context is full). This is the one place that decides when generation stops.

    prompt: the whole context. prompt_cache: the target's cache, owned by the caller (as in
    mlx-lm's generate_step); it may already hold a prefix of `prompt` (its offset says how many
    tokens), and only the rest is prefilled. Unlike mlx-lm, `prompt` is the whole context, not
    just the new tokens, because drafters read all of it. When the generator finishes or is
    closed, even mid-round, the cache holds exactly the context minus its last token: prompt +
    the tokens yielded so far, no rejected drafts. policy: the draft-length policy (a caller may
    keep one across generations); num_draft, when given, sets its k_max.
    """
    probs_fn = make_probs_fn(temp, top_p, top_k)
    if num_draft is not None and num_draft <= 0:
        raise GenerationError(f"--num-draft must be >= 1, got {num_draft}")
    if max_tokens < 0:
        raise GenerationError(f"--max-tokens must be >= 0, got {max_tokens}")
    context = list(prompt)  # our own copy: everything so far; context[-1] is fed to the target next
    if not context:
        raise GenerationError("the prompt is empty")
    limit = context_limit(model)
    if limit is not None and len(context) >= limit:
        raise GenerationError(f"the prompt has {len(context)} tokens but the model's context is {limit}")
    budget, at_limit = max_tokens, "length"
    if limit is not None and limit - len(context) < max_tokens:
        budget, at_limit = limit - len(context), "context"
    if policy is None:
        policy = Policy(num_draft or default_num_draft(drafter), adaptive=adaptive)
    elif num_draft is not None:
        policy.k_max = num_draft
    cache = prompt_cache if prompt_cache is not None else new_cache(model)
    recurrent.enable(model, cache)  # a caller's fresh mlx-lm cache: recurrent layers become rewindable
    cached = cache_tokens(cache) if prompt_cache is not None else 0
    if cached is None or cached > len(context) - 1:
        raise GenerationError(f"the prompt cache holds {cached} tokens; it must hold a prefix of the prompt "
                              f"({len(context)} tokens) and no more than all but its last token")
    stats = stats if stats is not None else Stats()
    stats.prompt_tokens, stats.prompt_cached = len(context), cached
    eos = set(eos_token_ids)
    peak = _Peak()
    start = time.perf_counter()  # prompt time includes the drafter's own prompt processing
    try:
        _prefill(model, cache, context[cached:-1])
        if drafter is not None:
            drafter.reset(context, cache)
    except BaseException:
        rewind(cache, cached)  # an interrupted prefill leaves the cache as it came
        raise

    # Padding a verify pass writes dummy KV entries that are trimmed at once: plain attention caches only (a
    # recurrent layer's state or a rotating window would have to be rewound through them).
    policy.pad = all(type(c) is KVCache for c in cache)
    free = drafter.free_sources() if drafter is not None else set()  # judged every round (shadow drafts)
    if drafter is not None:
        for s in drafter.sources(context):  # a draft model's own timing, before it is fed the prompt
            policy.seed(s, *drafter.step_cost(s))
        drafter.price(policy.verify_seconds if policy.adaptive else None)  # fixed K: drafts are not cut to cost
    produced, first_at = 0, None
    while produced < budget:
        source, k, shadows = "", 0, {}
        recurrent.commit(cache)  # the cache holds the context: earlier history is no longer needed
        if drafter is not None:
            if can_trim_prompt_cache(cache):
                offers = drafter.sources(context)
                lags = {s: drafter.lag(s, context) for s in offers}
                source, k = policy.choose(offers, budget - produced - 1, lags)
                shadows = {s: drafter.propose(context, min(cap, policy.k_max), None, s).tokens
                           for s, cap in offers.items() if s != source and s in free}
            elif stats.fallback is None:
                stats.fallback = "target cache not trimmable: plain decoding from here"
        base = len(context)  # the cache holds base - 1 tokens
        try:
            t0 = time.perf_counter()
            draft = drafter.propose(context, k, probs_fn, source) if k > 0 else Draft([])
            draft.tokens = draft.tokens[:k]
            n = len(draft.tokens)
            t1 = time.perf_counter()
            size = n
            if draft.verify is not None:  # the drafter ran part of the verify pass already
                logits = draft.verify([context[-1]] + draft.tokens)
            else:
                if drafter is not None and cache_tokens(cache) != base - 1:
                    rewind(cache, base - 1)  # a draft left entries it did not hand over: the target writes its own
                # Dummy positions after the draft where a larger pass costs less (causal: they change nothing
                # before them), trimmed at once.
                size = policy.padded(n)
                if limit is not None:  # no dummy position past the model's context (absolute position tables)
                    size = max(n, min(size, limit - base))
                fed = [context[-1]] + draft.tokens + [context[-1]] * (size - n)
                logits = model(mx.array(fed)[None], cache=cache)[0][: n + 1]  # (n+1, V)
                if size > n:
                    trim_prompt_cache(cache, size - n)
            if probs_fn is None:
                a, nxt = verify_greedy(logits, draft.tokens)
            else:
                dp = draft.probs[:n] if draft.probs is not None else None
                a, nxt = verify_sampling(probs_fn(logits), draft.tokens, dp)
            if n > a:
                trim_prompt_cache(cache, n - a)
            t2 = time.perf_counter()
        except BaseException:
            rewind(cache, base - 1)  # interrupted mid-round: no half-written or rejected entries stay
            raise
        stats.rounds += 1
        stats.draft_time += t1 - t0
        stats.verify_time += t2 - t1
        _record(stats, n, a)
        if draft.hindsight is not None:  # the output it sat out, judged as it caught up: before this round
            policy.hindsight(*draft.hindsight)
        policy.update(source, n, a, t2 - t1, t1 - t0, draft.catch_up_s, draft.catch_up_tokens, size)
        if stats.trace is not None:
            stats.trace.append({"source": source, "proposed": n, "accepted": a, "verify_s": t2 - t1,
                                "draft_s": t1 - t0, "catch_up_s": draft.catch_up_s, "behind": draft.catch_up_tokens})
            if draft.hindsight is not None:
                stats.trace[-1]["hindsight"] = [sum(draft.hindsight[1]), len(draft.hindsight[1])]
            if size > n:
                stats.trace[-1]["padded"] = size
        if n and drafter is not None:
            drafter.feedback(source, n, a)
        new = draft.tokens[:a] + [nxt]
        for s, tokens in shadows.items():
            judged, matched = shadow_judgement(tokens, new)
            policy.observe(s, judged, matched)
            drafter.feedback(s, judged, matched)

        context.extend(new)  # the cache now holds base + a tokens: context[:-1]
        delivered = 0
        try:
            for j, tok in enumerate(new):
                produced += 1
                stats.generation_tokens = produced
                now = time.perf_counter()
                if first_at is None:
                    first_at = now
                    stats.prompt_time = now - start
                stats.generation_time = now - first_at
                stats.peak_memory_gb = peak.gb()
                finish = "stop" if tok in eos else (at_limit if produced >= budget else None)
                stats.finish_reason = finish
                delivered += 1
                yield Step(tok, j < a, finish)
                if finish:
                    return
        finally:
            if delivered < len(new):  # stopped or closed inside the round: drop what was not delivered
                del context[base + delivered :]
                rewind(cache, len(context) - 1)
