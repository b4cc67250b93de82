"""Sessions kept between requests: a conversation's next turn takes back its own session; a new conversation starts
from a copy of the kept prefix it shares with others (`prefixes.py`), or else from the idle session sharing most."""

from collections.abc import Callable

from mlx_spec.gen.session import Session
from mlx_spec.gen.verify import common_prefix

from .prefixes import MIN_SHARED, PrefixCache

IDLE_EXTRA = 2  # sessions kept beyond max_concurrency, so a few paused conversations keep their caches


class SessionPool:
    """At most `limit` sessions in all; idle ones are ordered least recently used first. A session carries its
    drafter's state (a draft model's cache, n-gram and suffix tables) and its acceptance of each source, which
    continue with the conversation; `prefixes` keeps what several conversations share (None: nothing is kept)."""

    def __init__(self, new_session: Callable[[], Session], limit: int, prefixes: PrefixCache | None = None):
        self.new_session, self.limit, self.prefixes = new_session, limit, prefixes
        self.idle: list[Session] = []
        self.total = 0

    def acquire(self, ids: list[int]) -> Session:
        """The idle session whose conversation `ids` continues; else a session (new while under the limit, else the
        least recently used) holding a copy of the kept prefix sharing most, the prefix kept first where an idle
        session is the one to share it; else the idle session sharing most, trimmed to what it shares."""
        best, shared = None, 0
        for s in self.idle:
            n = common_prefix(s.tokens, ids)
            if n > shared:
                best, shared = s, n
        kept, n = self.prefixes.find(ids) if self.prefixes is not None else (None, 0)
        goes_on = best is not None and shared == len(best.tokens)  # `ids` continue its conversation
        if best is not None and goes_on and shared >= n:
            return self._take(best)
        if best is not None and not goes_on and self.prefixes is not None:
            m = min(shared, len(ids) - 1)
            snap = best.snapshot(m) if m >= MIN_SHARED and m > n else None  # a second conversation shares it: keep it
            if snap is not None and self.prefixes.add(snap):
                kept, n = snap, m
        if kept is not None:
            session = self._take(best) if best is not None and goes_on else self._fresh() or self._take(self.idle[0])
            session.adopt(kept, n)
            return session
        return self._take(best) if best is not None else self._fresh() or self._take(self.idle[0])

    def _fresh(self) -> Session | None:
        """A new session while under the limit (or while every session is busy)."""
        if self.total < self.limit or not self.idle:
            self.total += 1
            return self.new_session()
        return None

    def _take(self, session: Session) -> Session:
        self.idle.remove(session)
        return session

    def release(self, session: Session) -> None:
        """Back to the pool as the most recently used."""
        self.idle.append(session)

    def drop(self, session: Session) -> None:
        """Free a session that is not coming back (its caches go with it)."""
        self.total -= 1
