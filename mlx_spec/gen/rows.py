"""A generation as the engine runs it (a row): its context, budget and stats, and the one finish rule."""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import GenerationError
from .acceptance import SourceStats
from .cache import context_limit
from .drafters.base import Drafter
from .sampling import GREEDY, Sampler
from .stats import Stats


class Step(NamedTuple):
    """One generated token, as the target alone would have produced it."""

    token: int
    from_draft: bool  # this token was a draft token the target accepted
    finish_reason: str | None  # on the last token: "stop" (EOS), "length" (max_tokens), "context" (it is full)


@dataclass
class Row:
    """One generation: `context` is the prompt and the tokens so far, its last not consumed by the target yet."""

    context: list[int]
    drafter: Drafter | None = None
    sampler: Sampler = GREEDY
    budget: int = 0  # tokens it may produce in all
    at_limit: str = "length"  # the finish reason when the budget runs out: "length" or "context"
    eos: frozenset = frozenset()
    k_max: int = 1  # the most draft tokens a round gives it
    stats: Stats = field(default_factory=Stats)
    accept: dict[str, SourceStats] = field(default_factory=dict)  # its acceptance of each source
    caps: dict[str, int] = field(default_factory=dict)  # the most tokens each of its sources drafts
    pace: float = 1.0  # tokens its rounds yield, the mean over them
    paced: int = 0
    done: bool = False
    started: float = field(default_factory=time.perf_counter)  # prompt time runs from here to the first token
    first_at: float | None = None

    def __post_init__(self) -> None:
        if self.drafter is not None:
            self.stats.left_out = self.drafter.left_out

    @classmethod
    def start(cls, model, prompt: Sequence[int], max_tokens: int, **fields) -> "Row":
        """A row after `prompt`: at most `max_tokens` or the context's room; an empty or too long prompt is refused."""
        if max_tokens < 0:
            raise GenerationError(f"--max-tokens must be >= 0, got {max_tokens}")
        if not prompt:
            raise GenerationError("the prompt is empty")
        limit = context_limit(model)
        if limit is not None and len(prompt) >= limit:
            raise GenerationError(f"the prompt has {len(prompt)} tokens but the model's context is {limit}")
        if limit is not None and limit - len(prompt) < max_tokens:
            return cls(list(prompt), budget=limit - len(prompt), at_limit="context", **fields)
        return cls(list(prompt), budget=max_tokens, **fields)

    @property
    def parts(self) -> Sequence[Drafter]:
        return self.drafter.parts if self.drafter is not None else ()

    @property
    def room(self) -> int:
        """Draft tokens the row may still use: one token of its budget is always the target's."""
        return self.budget - self.stats.generation_tokens - 1

    def offered(self, tokens: float) -> None:
        """A round offered it `tokens` expected tokens: its pace follows."""
        self.paced += 1
        self.pace += (tokens - self.pace) / self.paced

    def deliver(self, tokens: list[int], drafted: int) -> list[Step]:
        """The round's tokens (the first `drafted` drafted) as Steps, the last with its finish: where a row ends."""
        steps, now, first = [], time.perf_counter(), self.first_at is None
        if self.first_at is None:
            self.first_at, self.stats.prompt_time = now, now - self.started
        for j, tok in enumerate(tokens):
            self.stats.generation_tokens += 1
            self.stats.from_draft += j < drafted
            finish = (
                "stop" if tok in self.eos else (self.at_limit if self.stats.generation_tokens >= self.budget else None)
            )
            self.context.append(tok)
            steps.append(Step(tok, j < drafted, finish))
            if finish:
                self.done, self.stats.finish_reason = True, finish
                break
        if first:
            self.stats.first_tokens = len(steps)
        self.stats.generation_time = time.perf_counter() - self.first_at
        return steps
