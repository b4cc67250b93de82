"""The target's hidden states that a learned drafter reads: a view of the target whose read blocks hand over their
outputs of each pass (the model is unchanged; where no drafter reads, the plain model runs and nothing is kept)."""

from collections.abc import Sequence

import mlx.core as mx

from ..errors import UnsupportedError
from ..make.layers import Watched, per_model, with_blocks
from ..models.base import text_of
from . import recurrent


class Taps:
    """Runs the target and returns, beside its logits, the outputs of blocks `reads` side by side (B, L, n * d)."""

    def __init__(self, model, reads: Sequence[int]):
        base = recurrent.recording(model)
        text = text_of(base)
        text.need_body("a drafter reading hidden states")
        blocks = text.blocks
        if max(reads) >= len(blocks):
            raise UnsupportedError(f"the drafter reads block {max(reads)} of a target with {len(blocks)}")
        self.reads = tuple(reads)
        self.out: list[mx.array] = []
        self.model = with_blocks(
            base, [Watched(b, self._keep) if i in reads else b for i, b in enumerate(blocks)], text.path
        )

    def _keep(self, x, y) -> None:
        self.out.append(y)

    def __call__(self, x: mx.array, cache: list | None) -> tuple[mx.array, mx.array]:
        self.out = []
        logits = self.model(x, cache=cache)
        states, self.out = mx.concatenate(self.out, axis=-1), []
        return logits, states


_VIEWS: dict[tuple, Taps] = {}


def taps(model, reads: Sequence[int]) -> Taps:
    """The `Taps` of `model` for blocks `reads` (made once per model and blocks)."""
    return per_model(_VIEWS, model, (id(model), tuple(reads)), lambda: Taps(model, reads))


def reads(parts) -> tuple[int, ...]:
    """The blocks any of `parts` reads, in order."""
    return tuple(sorted({i for p in parts for i in p.reads}))


def pick(states: mx.array, have: Sequence[int], want: Sequence[int]) -> mx.array:
    """Of states (..., len(have) * d) side by side for blocks `have`, those of blocks `want`."""
    if tuple(have) == tuple(want):
        return states
    d = states.shape[-1] // len(have)
    return mx.concatenate([states[..., have.index(i) * d : (have.index(i) + 1) * d] for i in want], axis=-1)


def show(parts, at: int, states: mx.array, have: Sequence[int]) -> None:
    """Give each part that reads the states (n, len(have) * d) of context positions at..at+n-1."""
    for p in parts:
        if p.reads:
            p.see(at, pick(states, have, p.reads))
