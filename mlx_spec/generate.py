"""The speculative generation loop: draft, verify in one target pass, rewind the caches, emit tokens."""

import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Union

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .adaptive import AdaptiveK
from .drafters.base import Draft, Drafter
from .errors import GenerationError
from .sampling import make_probs_fn
from .verify import verify_greedy, verify_sampling

DEFAULT_MAX_TOKENS = 256
DEFAULT_NUM_DRAFT = 6  # max K for model drafters; adaptive K and the confidence stop usually draft fewer
PREFILL_STEP = 512  # prompt tokens per forward pass: bounds attention scratch memory


@dataclass
class Stats:
    """What a generation measured; algorithms fill it, only faces print it."""

    prompt_tokens: int = 0
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
    peak_memory_gb: float = 0.0
    fallback: Optional[str] = None  # why speculation stopped early, if it did

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_time if self.prompt_time else 0.0

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
    def from_draft(self) -> float:
        """Share of generated tokens that came from drafts."""
        return self.accepted / self.generation_tokens if self.generation_tokens else 0.0

    def acceptance_by_position(self) -> List[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        for k in ("prompt_tps", "generation_tps", "acceptance_rate", "mean_accepted", "from_draft"):
            d[k] = getattr(self, k)
        d["acceptance_by_position"] = self.acceptance_by_position()
        return d


@dataclass
class Event:
    """One generated token."""

    token: int
    text: str  # the text this token completed (may be "" mid-character)
    from_draft: bool
    stats: Stats
    finish_reason: Optional[str] = None  # "stop" (EOS), "length" on the last event


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


def speculative_generate_step(
    prompt: Sequence[int],
    model,
    drafter: Optional[Drafter] = None,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temp: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    num_draft: int = DEFAULT_NUM_DRAFT,
    adaptive: bool = True,
    eos_token_ids: Sequence[int] = (),
    stats: Optional[Stats] = None,
) -> Iterator[tuple]:
    """Yield (token, from_draft) exactly as the target alone would produce them.

    Greedy (temp 0): token-identical to plain greedy decoding. Sampling: the same
    distribution, by speculative sampling. With no drafter it is plain decoding.
    Stops after an EOS token (yielded) or `max_tokens` tokens.
    """
    probs_fn = make_probs_fn(temp, top_p, top_k)
    if num_draft <= 0:
        raise GenerationError(f"--num-draft must be >= 1, got {num_draft}")
    if max_tokens < 0:
        raise GenerationError(f"--max-tokens must be >= 0, got {max_tokens}")
    prompt = list(prompt)
    if not prompt:
        raise GenerationError("the prompt is empty")
    limit = context_limit(model)
    if limit is not None and len(prompt) >= limit:
        raise GenerationError(f"the prompt has {len(prompt)} tokens but the model's context is {limit}")
    if limit is not None:
        max_tokens = min(max_tokens, limit - len(prompt))
    stats = stats if stats is not None else Stats()
    eos = set(eos_token_ids)
    mx.reset_peak_memory()
    start = time.perf_counter()  # prompt time includes the drafter's own prompt processing
    cache = make_prompt_cache(model)
    if drafter is not None:
        drafter.reset(prompt)
        if hasattr(drafter, "bind"):
            drafter.bind(cache)
    controller = AdaptiveK(num_draft, adaptive=adaptive)
    for i in range(0, len(prompt) - 1, PREFILL_STEP):
        model(mx.array(prompt[i : min(i + PREFILL_STEP, len(prompt) - 1)])[None], cache=cache)
        mx.eval([c.state for c in cache])
    stats.prompt_tokens = len(prompt)

    context = prompt  # (a copy) everything so far; context[-1] is fed to the target next
    produced = 0
    first_at = None
    while produced < max_tokens:
        k, source = 0, ""
        if drafter is not None:
            if can_trim_prompt_cache(cache):
                source = drafter.source(context)
                k = controller.next_k(max_tokens - produced - 1, source)
            elif stats.fallback is None:
                stats.fallback = "target cache not trimmable: plain decoding from here"
        t0 = time.perf_counter()
        draft = drafter.propose(context, k, probs_fn) if k > 0 else Draft([])
        draft.tokens = draft.tokens[:k]
        n = len(draft.tokens)
        t1 = time.perf_counter()
        logits = model(mx.array([context[-1]] + draft.tokens)[None], cache=cache)[0]  # (n+1, V)
        if probs_fn is None:
            a, nxt = verify_greedy(logits, draft.tokens)
        else:
            dp = draft.probs[:n] if draft.probs is not None else None
            a, nxt = verify_sampling(probs_fn(logits), draft.tokens, dp)
        if n > a:
            trim_prompt_cache(cache, n - a)
        t2 = time.perf_counter()
        stats.rounds += 1
        stats.draft_time += t1 - t0
        stats.verify_time += t2 - t1
        _record(stats, n, a)
        if drafter is not None:
            drafter.feedback(n, a)
            controller.update(n, a, t2 - t1, t1 - t0, source)

        new = draft.tokens[:a] + [nxt]
        context.extend(new)  # our own copy of the prompt: drafters read it, never keep it
        for j, tok in enumerate(new):
            produced += 1
            stats.generation_tokens = produced
            now = time.perf_counter()
            if first_at is None:
                first_at = now
                stats.prompt_time = now - start
            stats.generation_time = now - first_at
            stats.peak_memory_gb = mx.get_peak_memory() / 1e9
            yield tok, j < a
            if tok in eos or produced >= max_tokens:
                return


def stream_generate(
    model,
    tokenizer,
    prompt: Union[str, List[int]],
    drafter: Optional[Drafter] = None,
    **kwargs,
) -> Iterator[Event]:
    """Text events for `prompt` (a string is tokenized as is; apply a chat template first if needed)."""
    if isinstance(prompt, str):
        prompt = tokenizer.encode(prompt)
    stats = kwargs.pop("stats", None) or Stats()
    eos = kwargs.pop("eos_token_ids", None)
    eos = list(tokenizer.eos_token_ids) if eos is None else eos
    max_tokens = kwargs.get("max_tokens", DEFAULT_MAX_TOKENS)
    detok = tokenizer.detokenizer
    detok.reset()
    produced = 0
    for tok, from_draft in speculative_generate_step(prompt, model, drafter, eos_token_ids=eos, stats=stats, **kwargs):
        produced += 1
        finish = "stop" if tok in eos else ("length" if produced >= max_tokens else None)
        if tok not in eos:
            detok.add_token(tok)
        if finish:
            detok.finalize()
        yield Event(tok, detok.last_segment, from_draft, stats, finish)


@dataclass
class Response:
    """A finished generation."""

    text: str
    tokens: List[int]
    from_draft: List[bool]
    stats: Stats
    finish_reason: Optional[str]


def generate(model, tokenizer, prompt, drafter: Optional[Drafter] = None, **kwargs) -> Response:
    """Run `stream_generate` to the end and collect the text, tokens and stats."""
    text, tokens, flags, finish, stats = [], [], [], None, kwargs.get("stats") or Stats()
    kwargs["stats"] = stats
    for ev in stream_generate(model, tokenizer, prompt, drafter, **kwargs):
        text.append(ev.text)
        tokens.append(ev.token)
        flags.append(ev.from_draft)
        finish = ev.finish_reason
    return Response("".join(text), tokens, flags, stats, finish)
