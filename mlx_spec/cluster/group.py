"""A rank's place in the group: joining, loading the sharded target (and the drafter as it runs on one), sharing rank
0's integers, and the one error that names the rank when the group breaks."""

import contextlib
import math
import os
import secrets
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import gather_last_axis

from ..errors import MlxSpecError
from ..gen import registry
from ..models.base import text_of

SHARDS = ("tensor", "pipeline")  # mlx-lm's two ways to split a model: its weights in every layer, or its layers
# Seconds a rank waits for the others' round decision before it takes the group for broken: the ranks do the same work
# each round, so they arrive within a round's skew of each other (milliseconds); the issue asks for under 10 s.
ROUND_LIMIT = 8.0


class ClusterError(MlxSpecError):
    """The group broke (a rank failed, a link dropped, ranks diverged) or cannot run what was asked."""


@dataclass(frozen=True)
class Cluster:
    """This process's rank in a distributed group (`mlx.launch` sets it up) and how the target is split over it."""

    group: mx.distributed.Group
    shard: str = "tensor"
    # What a wait past its limit does with the group's error (None: print it and end the process); a server answers
    # 503 from then on instead.
    on_broke: Callable[[str], None] | None = None

    @classmethod
    def join(cls, shard: str = "tensor") -> "Cluster":
        """Join the group `mlx.launch` started (a group of one where it started none)."""
        if shard not in SHARDS:
            raise ClusterError(f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
        return cls(mx.distributed.init(), shard)

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    @property
    def lead(self) -> bool:
        """Whether this rank decides the rounds and prints (rank 0)."""
        return self.rank == 0

    def load(self, folder: str | Path):
        """(model, tokenizer) of a model folder, split over the group by mlx-lm's `sharded_load`, its output layer
        gathering its own logits where mlx-lm split it (`whole_head`)."""
        from mlx_lm.utils import sharded_load

        groups = (None, self.group) if self.shard == "tensor" else (self.group, None)  # (pipeline, tensor)
        with self.guard():
            try:
                model, tok = sharded_load(str(folder), *groups)[:2]
            except ValueError as e:  # mlx-lm's word for a model without that kind of sharding
                raise ClusterError(f"{folder}: cannot shard by {self.shard}: {e}") from None
        whole_head(model)
        return model, tok

    def drafter(self, spec: registry.DrafterSpec, folder: str | Path) -> registry.DrafterSpec:
        """`spec` as it runs over the target of `folder` sharded: 'mtp' reads the target's own checkpoint (the sharded
        loader records no folder); a drafter reading the target's states is refused under a pipeline."""
        inner = spec.inner if spec.kind == "hybrid" else spec
        if inner is None or inner.kind not in registry.LEARNED:
            return spec
        if self.shard != "tensor":  # a tensor group's blocks end in an all_sum: their outputs are whole on every rank
            raise ClusterError(
                f"--shard {self.shard}: '{spec}' reads the target's hidden states, and a pipeline leaves each block's "
                "on the one rank that runs it (gathering them is not built); use --shard tensor"
            )
        if inner.kind == "mtp" and not inner.arg:
            inner = registry.DrafterSpec("mtp", str(folder))
            return registry.DrafterSpec("hybrid", str(inner), inner) if spec.kind == "hybrid" else inner
        return spec

    def share(self, values: Sequence[int], n: int, limit: float = math.inf) -> list[int]:
        """Rank 0's `n` integers on every rank (one all_sum: the other ranks add zeros), on the default stream, so it
        runs in order with the sharded passes queued before it; waiting over `limit` seconds ends the process."""
        mine = mx.array(list(values) if self.lead else [0] * n, dtype=mx.int32)
        if mine.size != n:
            raise ClusterError(f"rank {self.rank}: {mine.size} values to share, the group expects {n}")
        with Deadline(self, limit):
            return cast(list[int], mx.distributed.all_sum(mine, group=self.group).tolist())  # an int32 vector's

    def send(self, data: bytes | None, wait: float = math.inf, limit: float = ROUND_LIMIT) -> bytes | None:
        """Rank 0's bytes on every rank (None: rank 0 has nothing more to send), in two collectives: their length
        (the other ranks wait up to `wait` seconds for it: rank 0 may be idle), then the bytes (up to `limit`)."""
        n = self.share([-1 if data is None else len(data)], 1, wait)[0]
        if n < 0:
            return None
        return bytes(self.share(list(data or b""), n, limit)) if n else b""

    def agree_seed(self, seed: int | None) -> int:
        """Rank 0's seed (its random pick where none was given; int32, as shared), seeding MLX's generator alike on
        every rank."""
        seed = self.share([seed % 2**31 if seed is not None else secrets.randbits(31)], 1)[0]
        mx.random.seed(seed)
        return seed

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Errors inside name this rank; a lost peer (MLX's ring raises when a socket closes) becomes one clear
        error, so no rank goes on or waits on a group that broke."""
        try:
            yield
        except ClusterError:
            raise
        except MlxSpecError as e:
            raise ClusterError(f"rank {self.rank}: {e}") from None
        except RuntimeError as e:
            if "[ring]" not in str(e) and "peer" not in str(e):
                raise
            raise ClusterError(f"{self.broke()} ({e})") from None

    def broke(self) -> str:
        """What this rank says when the group broke under it."""
        others = [r for r in range(self.size) if r != self.rank]
        who = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {others}"
        return f"rank {self.rank}: the group broke: {who} failed or its link dropped"


class Gathered(nn.Module):
    """An output layer split by vocabulary over the group whose logits come back whole on every rank (one all_gather
    a call)."""

    def __init__(self, layer: nn.Module, group: mx.distributed.Group):
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "group", group)  # not a module attribute

    def __call__(self, x: mx.array) -> mx.array:
        return gather_last_axis(self.layer(x), self.group)  # (..., V / ranks) on each rank -> (..., V)


def whole_head(model) -> None:
    """Where mlx-lm split a sharded model's output layer (Qwen3.5's untied head, gathered in the model's own call),
    gather it in the layer instead: the target's logits are the same, and the MTP and DFlash drafters, which borrow
    that layer, get every token's logit."""
    text = text_of(model).lm
    group = getattr(text, "sharding_group", None)
    if group is not None and isinstance(getattr(text, "lm_head", None), nn.Module):
        text.lm_head = Gathered(text.lm_head, group)
        text.sharding_group = None  # gathered once, in the layer


class Deadline:
    """A wait on the group that ends the process with the group's error after `limit` seconds (inf: never): MLX's
    ring cannot time out a collective, and one waiting on a dead peer may wait forever."""

    def __init__(self, cluster: Cluster, limit: float = ROUND_LIMIT):
        self.cluster, self.limit = cluster, limit
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "Deadline":
        if self.limit != math.inf:
            self._timer = threading.Timer(self.limit, self._expire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        broke = f"{self.cluster.broke()} (no word from the group in {self.limit:g} s)"
        if self.cluster.on_broke is not None:
            return self.cluster.on_broke(broke)
        print(f"error: {broke}", file=sys.stderr, flush=True)
        os._exit(1)
