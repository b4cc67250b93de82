"""Prefixes many conversations share (a system prompt and tool schemas), their caches kept under a byte bound, LRU.

As mlx-lm's `LRUPromptCache` (a request starts from a copy of the entry sharing most, trimmed), but an entry is a
`Snapshot`: the draft models' caches travel with the target's, so a hit costs a drafter nothing.
"""

from collections import OrderedDict

from mlx_spec.gen.session import Snapshot
from mlx_spec.gen.verify import common_prefix

from .defaults import PREFIX_CACHE_BYTES

MIN_SHARED = 64  # fewer shared tokens are a chat template's header: one prefill chunk redoes them faster than a copy


class PrefixCache:
    """Snapshots by their tokens, least recently used first, their `nbytes` summing to at most `max_bytes`."""

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES):
        self.max_bytes, self.nbytes = max_bytes, 0
        self.entries: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, ids: list[int]) -> tuple[Snapshot | None, int]:
        """The kept prefix sharing the most of `ids` (now the most recently used), and how many tokens it gives:
        at most all but the last of `ids`, which the turn feeds; (None, 0) if none shares MIN_SHARED tokens."""
        best, shared = None, 0
        for key in self.entries:
            n = min(common_prefix(key, ids), len(ids) - 1)
            if n > shared:
                best, shared = key, n
        if best is None or shared < MIN_SHARED:
            return None, 0
        self.entries.move_to_end(best)
        return self.entries[best], shared

    def add(self, snap: Snapshot) -> bool:
        """Keep `snap` as the most recently used, dropping the kept prefixes of it (a copy trimmed serves them) and the
        least recently used past the bound; False (nothing kept) where it alone exceeds the bound."""
        key, size = tuple(snap.tokens), snap.nbytes
        if size > self.max_bytes:
            return False
        for k in [k for k in self.entries if len(k) <= len(key) and key[: len(k)] == k]:
            self.nbytes -= self.entries.pop(k).nbytes
        self.entries[key], self.nbytes = snap, self.nbytes + size
        while self.nbytes > self.max_bytes:
            self.nbytes -= self.entries.popitem(last=False)[1].nbytes
        return True

    def stats(self) -> dict:
        """What /health shows."""
        return {"prefixes": len(self.entries), "bytes": self.nbytes, "max_bytes": self.max_bytes}
