"""The speculative generation loop: plan, propose, verify in one target pass, rewind, record, yield."""

import time
from typing import Iterator, List, NamedTuple, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from ..errors import GenerationError
from . import recurrent, shapes
from .cache import cache_tokens, new_cache, rewind
from .drafters.base import Draft, Drafter
from .planner import PLAIN, Plan, Planner
from .registry import default_num_draft
from .sampling import make_probs_fn, sample
from .stats import Stats
from .tunables import DEFAULT_MAX_TOKENS, PREFILL_STEP
from .verify import accept_greedy, accept_sampling, greedy_targets, sampling_targets

FINISH_REASONS = ("stop", "length", "context")  # EOS; max_tokens; the model's context is full


class Step(NamedTuple):
    """One generated token, as the target alone would have produced it."""

    token: int
    from_draft: bool  # this token was a draft token the target accepted
    finish_reason: Optional[str]  # on the last token: one of FINISH_REASONS


def context_limit(model) -> Optional[int]:
    """The model's maximum context, if its config states one."""
    args = getattr(model, "args", None)
    return getattr(args, "max_position_embeddings", None) or getattr(args, "context_length", None)


def shadow_judgement(draft: Sequence[int], produced: Sequence[int]):
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
        top = peak if peak > self.peak0 else self.seen  # a new process-wide peak happened during the run
        return max(0, top - self.base) / 1e9


def prefill_cache(model, cache, tokens: List[int], room: Optional[int]) -> None:
    """Feed `tokens` in chunks; where the device builds per shape, the last chunk runs at a padded size (dummy
    positions trimmed at once) so a new prompt length is not a new shape. room: positions left in the context."""
    pad = shapes.builds_per_shape() and shapes.paddable(cache)
    for i in range(0, len(tokens), PREFILL_STEP):
        chunk = tokens[i : i + PREFILL_STEP]
        size = shapes.padded(len(chunk)) if pad else len(chunk)
        if room is not None and i + size > room:
            size = len(chunk)
        model(mx.array(chunk + chunk[-1:] * (size - len(chunk)))[None], cache=cache)
        if size > len(chunk):
            trim_prompt_cache(cache, size - len(chunk))
        mx.eval([c.state for c in cache])


class _Loop:
    """The state of one generation: the target, its cache, the drafter's parts and the planner."""

    def __init__(self, model, cache, drafter: Optional[Drafter], planner: Planner, probs_fn, stats: Stats):
        self.model, self.cache, self.planner, self.probs_fn, self.stats = model, cache, planner, probs_fn, stats
        parts = list(drafter.parts) if drafter is not None else []
        self.parts = {p.name: p for p in parts}
        self.free = [p.name for p in parts if p.free]  # in the drafter's order: the first with a draft offers it
        # The most each source drafts: the planner's k_max; in a hybrid, its own kind's default K below that.
        self.caps = {p.name: planner.k_max if len(parts) == 1 else min(default_num_draft(p), planner.k_max)
                     for p in parts}
        self.costly = [p.name for p in parts if not p.free]
        self.last_read, self.away = time.perf_counter(), 0.0  # the round clock: see `read`

    def read(self, *arrays) -> float:
        """The round's one host synchronisation; returns the round's seconds: the time since the last read, less
        the time the generator was suspended at a yield (the caller's), so a round holds all of the engine's own
        work and its wait for the device."""
        t = time.perf_counter()
        mx.eval(*arrays)
        now = time.perf_counter()
        self.stats.syncs += 1
        self.stats.wait_time += now - t
        seconds, self.last_read, self.away = now - self.last_read - self.away, now, 0.0
        return seconds

    def plan(self, context: List[int], room: int):
        """(the next round's Plan, the free draft offered this round or None)."""
        offer = None
        for name in self.free:  # a suffix match before an n-gram's
            draft = self.parts[name].propose(context, min(self.caps[name], room))
            if len(draft):
                offer = draft
                break
        offers = {offer.source: len(offer)} if offer is not None else {}
        offers.update({name: self.caps[name] for name in self.costly})
        behind = {name: self.parts[name].behind(context) for name in self.costly}
        return self.planner.plan(offers, room, behind, self.free), offer

    def launch(self, token):
        """Queue a plain step fed `token` (an int or a lazy scalar): its lazy (next token, logits (V,))."""
        x = mx.array([token]) if isinstance(token, int) else token.reshape(1)
        logits = self.model(x[None], cache=self.cache)[0, -1]
        y = mx.argmax(logits) if self.probs_fn is None else sample(self.probs_fn(logits))
        mx.async_eval(y)
        return y, logits

    def verify(self, context: List[int], draft: Draft, size: int, pending=None):
        """One target pass over [last token] + draft (+ dummy positions up to `size`, trimmed at once), read
        with the draft in one synchronisation: (draft tokens, accepted, next token, hindsight matches or None,
        the round's seconds). pending: a plain step queued on the last token already (token, logits): its
        logits are the first row and the pass feeds the draft alone."""
        n = len(draft)
        tokens = draft.tokens if isinstance(draft.tokens, mx.array) else mx.array(draft.tokens, dtype=mx.uint32)
        head = [] if pending is not None else [mx.array([context[-1]], dtype=mx.uint32)]
        fed = mx.concatenate([*head, tokens.astype(mx.uint32), mx.full((size - n - 1,), context[-1], dtype=mx.uint32)])
        logits = self.model(fed[None], cache=self.cache)[0]
        if pending is not None:
            logits = mx.concatenate([pending[1][None], logits])
        logits = logits[: n + 1]  # (n+1, V): row i scores the token after draft[:i]
        if size > n + 1:
            trim_prompt_cache(self.cache, size - n - 1)
        seen = draft.hindsight[0] if draft.hindsight is not None else mx.zeros((0,))
        if self.probs_fn is None:
            targets = greedy_targets(logits)
            seconds = self.read(targets, tokens, seen)
            drafted = tokens.tolist()
            a, nxt = accept_greedy(drafted, targets.tolist())
        else:
            accept, candidates = sampling_targets(self.probs_fn(logits), tokens, draft.probs)
            seconds = self.read(accept, candidates, tokens, seen)
            drafted = tokens.tolist()
            a, nxt = accept_sampling(accept.tolist(), candidates.tolist())
        matches = None
        if draft.hindsight is not None and self.probs_fn is None:
            matches = [p == t for p, t in zip(seen.tolist(), draft.hindsight[1])]
        if n > a:
            trim_prompt_cache(self.cache, n - a)
        return drafted, a, nxt, matches, seconds

    def judge(self, offer: Optional[Draft], used: str, produced: List[int]) -> None:
        """The free source's draft that was offered but not used, judged against the tokens produced."""
        if offer is not None and offer.source != used:
            judged, matched = shadow_judgement(list(offer.tokens), produced)
            self.planner.judge(offer.source, judged, matched)
            self.parts[offer.source].learn(judged, matched)

    def trace(self, plan: Plan, n: int, a: int, seconds: float, behind: int = 0, size: int = 1, matches=None):
        if self.stats.trace is not None:
            entry = {"source": plan.source, "proposed": n, "accepted": a, "seconds": seconds, "size": size,
                     "behind": behind}
            if plan.probe:
                entry["probe"] = True
            if matches is not None:
                entry["hindsight"] = [sum(matches), len(matches)]
            self.stats.trace.append(entry)


def speculative_generate_step(
    prompt: Sequence[int],
    model,
    drafter: Optional[Drafter] = None,
    *,
    prompt_cache: Optional[list] = None,
    planner: Optional[Planner] = None,
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

    Greedy (temp 0): token-identical to plain greedy decoding (in float32; in half precision up to the rounding
    of a pass over several positions against one, README). Sampling: the same distribution, by speculative
    sampling. With no drafter it is plain decoding, each next step queued before the host reads the current one.
    The last step carries the finish reason: "stop" (an EOS token, yielded), "length" (max_tokens) or "context"
    (the model's context is full). This is the one place that decides when generation stops.

    prompt: the whole context. prompt_cache: the target's cache, owned by the caller (as in mlx-lm's
    generate_step); it may already hold a prefix of `prompt`, and only the rest is prefilled. When the generator
    finishes or is closed, even mid-round, the cache holds exactly the context minus its last token: prompt + the
    tokens yielded so far, no rejected drafts. planner: decides each round (a caller may keep one across
    generations); num_draft, when given, is the most tokens a round drafts (its k_max).
    """
    probs_fn = make_probs_fn(temp, top_p, top_k)
    if num_draft is not None and num_draft <= 0:
        raise GenerationError(f"--num-draft must be >= 1, got {num_draft}")
    if max_tokens < 0:
        raise GenerationError(f"--max-tokens must be >= 0, got {max_tokens}")
    context = list(prompt)  # the prompt and the tokens yielded so far; context[-1] is fed to the target next
    if not context:
        raise GenerationError("the prompt is empty")
    limit = context_limit(model)
    if limit is not None and len(context) >= limit:
        raise GenerationError(f"the prompt has {len(context)} tokens but the model's context is {limit}")
    budget, at_limit = max_tokens, "length"
    if limit is not None and limit - len(context) < max_tokens:
        budget, at_limit = limit - len(context), "context"
    if planner is None:
        planner = Planner(num_draft or default_num_draft(drafter), adaptive=adaptive)
    elif num_draft is not None:
        planner.k_max = num_draft
    cache = prompt_cache if prompt_cache is not None else new_cache(model)
    recurrent.enable(model, cache)  # a caller's fresh mlx-lm cache: recurrent layers become rewindable
    cached = cache_tokens(cache) if prompt_cache is not None else 0
    if cached is None or cached > len(context) - 1:
        raise GenerationError(f"the prompt cache holds {cached} tokens; it must hold a prefix of the prompt "
                              f"({len(context)} tokens) and no more than all but its last token")
    stats = stats if stats is not None else Stats()
    stats.prompt_tokens, stats.prompt_cached = len(context), cached
    eos, peak = set(eos_token_ids), _Peak()
    start = time.perf_counter()  # prompt time includes the drafter's own prompt processing
    with mx.stream(generation_stream):
        try:
            prefill_cache(model, cache, context[cached:-1], None if limit is None else limit - cached)
            if drafter is not None:
                for part in drafter.parts:
                    part.reset(context, cache)
        except BaseException:
            rewind(cache, cached)  # an interrupted prefill leaves the cache as it came
            raise
    loop = _Loop(model, cache, drafter, planner, probs_fn, stats)
    planner.pad = shapes.paddable(cache)
    produced, first_at, pending = 0, None, None  # pending: a queued plain step (token, logits); the cache holds context

    def deliver(tokens: List[int], drafted: int):
        nonlocal produced, first_at
        for j, tok in enumerate(tokens):
            produced += 1
            now = time.perf_counter()
            if first_at is None:
                first_at, stats.prompt_time = now, now - start
            stats.generation_tokens, stats.generation_time = produced, now - first_at
            finish = "stop" if tok in eos else (at_limit if produced >= budget else None)
            stats.finish_reason = finish
            context.append(tok)
            away = time.perf_counter()
            yield Step(tok, j < drafted, finish)
            loop.away += time.perf_counter() - away
            if finish:
                return True
        return False

    try:
        with mx.stream(generation_stream):
            while produced < budget:
                room = budget - produced - 1
                if pending is None:
                    recurrent.commit(cache)  # the cache holds the context: earlier history is no longer needed
                plan, offer = PLAIN, None
                if loop.parts and room > 0:
                    if can_trim_prompt_cache(cache):  # a sliding window stops being trimmable past its size
                        plan, offer = loop.plan(context, room)
                    elif stats.fallback is None:
                        stats.fallback = "target cache not trimmable: plain decoding from here"
                # A plain step, the next one queued on it before the host reads it; a queued step is also read first
                # where the round's drafter drafts through the target's own cache (self, quant-self).
                drain = pending is not None and plan.k > 0 and loop.parts[plan.source].in_target_cache
                if plan.k == 0 or drain:
                    cold = pending is None
                    if pending is None:
                        cold = shapes.first_time(model, 1) or cold
                        pending = loop.launch(context[-1])
                    nxt = loop.launch(pending[0]) if room > 0 and not drain else None
                    seconds = loop.read(pending[0])
                    tok = pending[0].item()
                    stats.record(0, 0)
                    planner.record(PLAIN, 0, 0, seconds, warm=not cold and not drain)
                    loop.trace(PLAIN, 0, 0, seconds)
                    loop.judge(offer, "", [tok])
                    pending = nxt
                    if (yield from deliver([tok], 0)):
                        return
                else:
                    part = loop.parts[plan.source]
                    draft = offer if offer is not None and offer.source == plan.source else \
                        part.propose(context, plan.k, probs_fn)
                    if isinstance(draft.tokens, list):
                        draft.tokens = draft.tokens[: plan.k]
                    n = len(draft)
                    size = plan.size if n == plan.k else planner.size(n)
                    if not planner.pad or (limit is not None and len(context) + size - 1 > limit):
                        size = n + 1  # no dummy position past the model's context (absolute position tables)
                    cold = shapes.first_time(model, size - (pending is not None)) or draft.cold
                    drafted, a, nxt, matches, seconds = loop.verify(context, draft, size, pending)
                    pending = None
                    stats.record(n, a)
                    planner.record(plan, n, a, seconds, draft.behind, warm=not cold, free=part.free)
                    if matches is not None:
                        planner.hindsight(plan.source, matches)
                    loop.trace(plan, n, a, seconds, draft.behind, size, matches)
                    part.learn(n, a)
                    new = drafted[:a] + [nxt]
                    loop.judge(offer, plan.source, new)
                    if (yield from deliver(new, a)):
                        return
                stats.peak_memory_gb = peak.gb()
    finally:
        rewind(cache, len(context) - 1)  # whatever was queued or drafted past what was yielded goes
        stats.costs = dict(planner.costs)
        stats.peak_memory_gb = peak.gb()
