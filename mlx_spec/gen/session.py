"""A conversation: the target cache, the drafter with its state, the planner and the token history, across turns."""

from collections.abc import Generator
from typing import NamedTuple

from .cache import cache_tokens, copy_prefix, new_cache, prefill_cache, rewind
from .drafters.base import Drafter, Kept
from .planner import Planner
from .registry import default_num_draft
from .stream import Event, stream_generate
from .verify import common_prefix


class Snapshot(NamedTuple):
    """Copies of the caches holding a conversation's first tokens: the target's, and each drafter state that a
    drafter keeps over them (`Drafter.fork`: a draft model's cache, a suffix or n-gram table), by its key."""

    tokens: list[int]
    cache: list
    kept: dict[str | int, Kept]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache) + sum(k.nbytes for k in self.kept.values())


class Session:
    """Turn after turn over one growing conversation, each prefilling only what the caches do not hold yet."""

    def __init__(
        self,
        model,
        tokenizer,
        drafter: Drafter | None = None,
        *,
        num_draft: int | None = None,
        adaptive: bool = True,
        planner: Planner | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.reset()
        self.planner = planner if planner is not None else Planner(adaptive)  # a sharded target's: rank 0's plans
        self.accept: dict = {}  # the conversation's acceptance of each draft source, kept across turns
        self.set_drafter(drafter, num_draft)

    @property
    def nbytes(self) -> int:
        """Bytes of the caches the conversation holds: the target's and its own draft models'."""
        parts = self.drafter.parts if self.drafter is not None else ()
        return sum(c.nbytes for c in self.cache) + sum(p.nbytes for p in parts)

    def set_drafter(self, drafter: Drafter | None, num_draft: int | None = None) -> None:
        """Switch drafters (None: plain decoding); the conversation, cache and planner's measurements stay."""
        self.drafter: Drafter | None = drafter
        self.num_draft = num_draft or default_num_draft(drafter)

    def reset(self) -> None:
        """Forget the conversation (the drafter's own state is rebuilt on its next reset)."""
        self.cache: list = new_cache(self.model)
        self.tokens: list[int] = []  # what the target cache holds, token by token
        self._given: tuple[Snapshot, int] | None = None  # a kept prefix adopted, its draft caches not given yet

    def snapshot(self, n: int) -> Snapshot | None:
        """Copies of the caches' first `n` tokens (a draft model's where its cache holds them too); None where the
        target's layers cannot be copied (a sliding window, a recurrent layer)."""
        cache = copy_prefix(self.cache, n) if n <= len(self.tokens) else None
        if cache is None:
            return None
        parts = self.drafter.parts if self.drafter is not None else ()
        kept = {k.key: k for p in parts if (k := p.fork(self.tokens[:n])) is not None}
        return Snapshot(self.tokens[:n], cache, kept)

    def adopt(self, snap: Snapshot, n: int) -> None:
        """Start over from the first `n` tokens of `snap` (a kept prefix); the drafter's caches follow at the next
        turn, once the turn's drafter is known."""
        cache = copy_prefix(snap.cache, n, own=False)
        assert cache is not None  # a snapshot's layers are ones that copy
        self.cache, self.tokens = cache, list(snap.tokens[:n])
        self._given = (snap, n)

    def _reuse(self, ids: list[int]) -> None:
        """Trim the target cache to the longest prefix it shares with `ids` (keeping >= 1 token to feed)."""
        if self._given is not None:  # the drafters' copies of an adopted prefix
            (snap, n), self._given = self._given, None
            for p in self.drafter.parts if self.drafter is not None else ():
                for k in snap.kept.values():
                    p.adopt(k, n)
        held = cache_tokens(self.cache)
        if held is None or held != len(self.tokens):  # an interrupted update we could not rewind
            self.reset()
        keep = min(common_prefix(self.tokens, ids), len(ids) - 1)
        if keep < len(self.tokens) and not rewind(self.cache, keep):
            self.reset()  # a sliding-window cache past its window, a recurrent layer's history that does not reach
        self.tokens = self.tokens[:keep]

    def prefill(self, prompt_ids: list[int], step: int | None = None) -> Generator[tuple[bool, int], None, None]:
        """Make the cache hold `prompt_ids` but its last for a generation elsewhere (given back with `restore`), `step`
        tokens (default: all) an iteration, each yielding (done, tokens cached before); closed early, it forgets all."""
        ids = list(prompt_ids)
        self._reuse(ids)
        cached = len(self.tokens)
        rest, parts = ids[cached:-1], self.drafter.parts if self.drafter is not None else ()
        step = step or max(1, len(rest))
        try:
            for i in range(0, len(rest), step):
                prefill_cache(self.model, self.cache, rest[i : i + step], None, parts)
                if i + step < len(rest):
                    yield False, cached
        except BaseException:
            self.reset()
            raise
        self.tokens = ids[:-1]
        yield True, cached

    def restore(self, cache: list, tokens: list[int]) -> None:
        """Take back a cache holding `tokens` (a batch's row, extracted): the next turn reuses it."""
        self.cache, self.tokens = cache, list(tokens)

    def generate(self, prompt_ids: list[int], **kwargs) -> Generator[Event, None, None]:
        """Events for the next reply to the whole conversation `prompt_ids` (kwargs: `stream_generate`'s)."""
        ids = list(prompt_ids)
        self._reuse(ids)
        out: list[int] = []
        try:
            kwargs.setdefault("num_draft", self.num_draft)
            kwargs.update(prompt_cache=self.cache, planner=self.planner, accept=self.accept)
            for ev in stream_generate(self.model, self.tokenizer, ids, self.drafter, **kwargs):
                out.append(ev.token)
                yield ev
        finally:
            held, full = cache_tokens(self.cache), ids + out  # the engine leaves a prefix of `full` cached
            if held is None or held > len(full):  # an interrupted update that could not be rewound
                self.reset()
            else:
                self.tokens = full[:held]
