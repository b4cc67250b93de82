"""Token steps to text events and a finished response (mlx-lm's generator chain: ids -> events -> text)."""

from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import GenerationError
from .drafters.base import Drafter
from .generate import speculative_generate_step
from .stats import Stats


@dataclass
class Event:
    """One generated token, the text it completed and the generation's running `Stats` (not mlx-lm's
    `GenerationResponse`, which has no room for the stats the faces read from each event)."""

    token: int
    text: str  # the text this token completed (may be "" mid-character)
    from_draft: bool
    stats: Stats
    finish_reason: str | None = None  # on the last event: "stop", "length" or "context"


def stream_generate(
    model, tokenizer, prompt: str | list[int], drafter: Drafter | None = None, **kwargs
) -> Iterator[Event]:
    """Text events for `prompt` (a string is tokenized as is) by `speculative_generate_step` with kwargs."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    stats = kwargs.pop("stats", None) or Stats()
    eos = kwargs.pop("eos_token_ids", None)
    eos = tuple(tokenizer.eos_token_ids if eos is None else eos)
    detok = tokenizer.detokenizer
    detok.reset()
    steps = speculative_generate_step(ids, model, drafter, eos_token_ids=eos, stats=stats, **kwargs)
    try:
        for step in steps:
            if step.token not in eos:
                detok.add_token(step.token)
            if step.finish_reason:
                detok.finalize()
            yield Event(step.token, detok.last_segment, step.from_draft, stats, step.finish_reason)
    finally:
        steps.close()  # at once, so the caches are consistent before the caller goes on


@dataclass
class Response:
    """A finished generation."""

    text: str
    tokens: list[int]
    from_draft: list[bool]
    stats: Stats
    finish_reason: str | None


def collect(events: Iterator[Event]) -> Response:
    """Run an event stream to its end and gather text, tokens, flags and stats."""
    evs = list(events)
    if not evs:
        raise GenerationError("nothing was generated (max_tokens is 0?)")
    return Response(
        "".join(e.text for e in evs),
        [e.token for e in evs],
        [e.from_draft for e in evs],
        evs[-1].stats,
        evs[-1].finish_reason,
    )


def generate(model, tokenizer, prompt, drafter: Drafter | None = None, **kwargs) -> Response:
    """`stream_generate` to the end, collected into a Response."""
    return collect(stream_generate(model, tokenizer, prompt, drafter, **kwargs))
