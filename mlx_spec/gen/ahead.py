"""The plain step queued ahead: every place's next plain step, queued on the round's lazy tokens before the host
reads them (as mlx-lm's `generate_step` queues step n + 1 before reading token n)."""

from typing import NamedTuple

import mlx.core as mx


class Queued(NamedTuple):
    """A queued plain step: its lazy tokens (places,), logits (places, V) and the target's states that drafters read
    (places, 1, n * d), if any reads them."""

    tokens: mx.array
    logits: mx.array
    states: mx.array | None = None


class Ahead:
    """The step queued ahead of the engine's next round, if any. None is queued while a row is on its way in: a row
    joins between two rounds, with no step queued for the others to undo."""

    def __init__(self):
        self.step: Queued | None = None
        self.joining = False

    @property
    def queued(self) -> bool:
        return self.step is not None

    def wanted(self, plain: bool, rows) -> bool:
        """Whether a plain round queues the next step: no row is joining and every row has room for it."""
        return plain and not self.joining and all(r.room > 0 for r in rows)

    def queue(self, run, tokens: mx.array, owners) -> Queued:
        """The next plain step of every place (`owners`, None for an empty one) on `tokens` (places,), through `run`
        (the target's pass: logits and states), sampled per row and queued; the caller installs it (`step`)."""
        logits, states = run(tokens[:, None])
        logits = logits[:, -1]  # (places, V)
        if all(r is None or r.sampler.temp == 0 for r in owners):
            nxt = mx.argmax(logits, axis=-1)
        else:
            nxt = mx.concatenate(
                [
                    r.sampler.draw(x[None], len(r.context) + 1) if r is not None else mx.zeros((1,), dtype=mx.uint32)
                    for r, x in zip(owners, logits)
                ]
            )
        step = Queued(nxt.astype(mx.uint32), logits, states)
        mx.async_eval(step.tokens)
        return step

    def drop(self, cache) -> None:
        """Undo the queued step for every place of `cache` (`JointCache`)."""
        if self.step is not None:
            cache.rewind([1] * len(cache.owners))
            self.step = None

    def keep(self, live: mx.array) -> None:
        """Keep the step of the places `live` only (the cache was packed to them)."""
        if self.step is not None:
            tokens, logits, states = self.step
            self.step = Queued(tokens[live], logits[live], states[live] if states is not None else None)
