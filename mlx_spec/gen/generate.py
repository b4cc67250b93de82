"""A generation of one request: the prompt prefilled into the caller's cache, then an engine of one row."""

from collections.abc import Generator, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream

from ..device import Peak
from ..errors import GenerationError
from ..models.cache import rewindable
from .cache import cache_tokens, new_cache, prefill_cache, rewind
from .engine import Engine
from .planner import Planner
from .registry import default_num_draft
from .rows import Row, Step
from .sampling import Sampler
from .stats import Stats
from .tunables import DEFAULT_MAX_TOKENS


def speculative_generate_step(
    prompt: Sequence[int],
    model,
    drafter=None,
    *,
    prompt_cache: list | None = None,
    planner: Planner | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temp: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    seed: int | None = None,
    num_draft: int | None = None,
    adaptive: bool = True,
    eos_token_ids: Sequence[int] = (),
    stats: Stats | None = None,
    accept: dict | None = None,
) -> Generator[Step, None, None]:
    """Yield `Step(token, from_draft, finish_reason)` as the target alone would (greedy: the same tokens; sampling: the
    same law). prompt_cache: the caller's, with a prefix of `prompt`; finished or closed, all tokens but the last."""
    if num_draft is not None and num_draft <= 0:
        raise GenerationError(f"--num-draft must be >= 1, got {num_draft}")
    stats = stats if stats is not None else Stats()
    row = Row.start(
        model,
        prompt,
        max_tokens,
        drafter=drafter,
        sampler=Sampler(temp, top_p, top_k, seed),
        eos=frozenset(eos_token_ids),
        k_max=num_draft or default_num_draft(drafter),
        stats=stats,
        accept=accept if accept is not None else {},
    )
    context = row.context
    cache = rewindable(prompt_cache) if prompt_cache is not None else new_cache(model)
    cached = None if cache is None else cache_tokens(cache) if prompt_cache is not None else 0
    if cache is None or cached is None or cached > len(context) - 1:
        raise GenerationError(
            f"the prompt cache holds {cached} tokens; it must hold a prefix of the prompt "
            f"({len(context)} tokens) and no more than all but its last token"
        )
    stats.prompt_tokens, stats.prompt_cached = len(context), cached
    if row.budget == 0:
        return
    engine = Engine(model, planner if planner is not None else Planner(adaptive=adaptive))
    peak, yielded = Peak(), len(context)
    with mx.stream(generation_stream):
        try:
            prefill_cache(
                model, cache, context[cached:-1], None if engine.limit is None else engine.limit - cached, row.parts
            )
            engine.add(row, cache)
        except BaseException:
            rewind(cache, cached)  # an interrupted prefill leaves the cache as it came
            raise
    try:
        while not row.done:
            with mx.stream(generation_stream):
                steps = engine.round()[0]
            stats.peak_memory_gb = peak.gb()
            for step in steps:
                yielded += 1
                yield step
    finally:
        del context[yielded:]  # closed mid-round: the tokens not yielded go too
        with mx.stream(generation_stream):
            engine.remove(row)  # whatever was queued or drafted past what was yielded goes
        stats.costs = {s: c for (p, s), c in engine.planner.costs.passes.items() if p == 1}
        stats.peak_memory_gb = peak.gb()
