"""Sessions kept between requests: a new request takes the idle one sharing the longest prefix with its prompt."""

from collections.abc import Callable

from mlx_spec.gen.session import Session
from mlx_spec.gen.verify import common_prefix

IDLE_EXTRA = 2  # sessions kept beyond max_concurrency, so a few paused conversations keep their caches


class SessionPool:
    """At most `limit` sessions in all; idle ones are ordered least recently used first.

    Not mlx-lm's `LRUPromptCache`, which keeps target caches by prompt prefix: a session also carries its drafter's
    state (a draft model's cache, n-gram and suffix tables) and its acceptance of each source, which continue with
    the conversation too."""

    def __init__(self, new_session: Callable[[], Session], limit: int):
        self.new_session, self.limit = new_session, limit
        self.idle: list[Session] = []
        self.total = 0

    def acquire(self, ids: list[int]) -> Session:
        """The idle session whose cache shares the most of `ids`, else a new one while under the limit,
        else the least recently used (its cache is trimmed to whatever it shares)."""
        best, shared = None, 0
        for s in self.idle:
            n = common_prefix(s.tokens, ids)
            if n > shared:
                best, shared = s, n
        if best is None:
            if self.total < self.limit or not self.idle:
                self.total += 1
                return self.new_session()
            best = self.idle[0]
        self.idle.remove(best)
        return best

    def release(self, session: Session) -> None:
        """Back to the pool as the most recently used."""
        self.idle.append(session)

    def drop(self, session: Session) -> None:
        """Free a session that is not coming back (its caches go with it)."""
        self.total -= 1
