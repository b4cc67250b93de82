"""Stop strings: release generated text token by token, hold back what may begin a stop string, cut at one."""

from collections.abc import Sequence
from typing import NamedTuple


class Mark(NamedTuple):
    """Where a token came from: its position in its round's draft (1 = first; 0: the target's own token) and the
    round that produced it."""

    pos: int
    round: int


Piece = tuple[str, Mark]  # a token's text and its mark


class StopText:
    """Feeds token texts in; gives back the pieces safe to send, each still tied to its token's mark.

    Without stop strings every piece goes out at once. With them, the longest tail of the text that
    could still grow into a stop string waits; once a stop string appears, the text is cut where it
    starts and `hit` is set (the reply ends there, as OpenAI's `stop` does).
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.text = ""  # everything generated so far
        self.sent = 0  # characters of `text` already released
        self.pending: list[tuple[int, Mark]] = []  # (end offset in `text`, mark) of tokens not yet released
        self.hit = False
        self.matched: str | None = None  # the stop string that ended the reply

    def add(self, text: str, mark: Mark) -> list[Piece]:
        """One token's text in, the pieces now safe to release out."""
        before = len(self.text)
        self.text += text
        self.pending.append((len(self.text), mark))
        if not self.stops:
            return self._release(len(self.text))
        longest = max(len(s) for s in self.stops)
        start = max(0, before - longest + 1)  # a stop string must end in the new text
        found = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if found:
            self.hit = True
            at, self.matched = min(found)
            return self._release(at, cut=True)
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self._release(len(self.text) - hold)

    def flush(self) -> list[Piece]:
        """At the end of the reply: whatever was held back (it never became a stop string)."""
        return [] if self.hit else self._release(len(self.text))

    def _release(self, upto: int, cut: bool = False) -> list[Piece]:
        """Pieces of the pending tokens ending at or before `upto`; with `cut`, the token spanning it is cut."""
        out = []
        while self.pending and (self.pending[0][0] <= upto or cut):
            end, mark = self.pending.pop(0)
            piece = self.text[self.sent : min(end, upto)]
            self.sent += len(piece)
            out.append((piece, mark))
            if end >= upto:
                break
        if cut:  # the tokens of the stop string itself are not part of the reply
            self.pending.clear()
            self.text = self.text[:upto]
            if out and not out[-1][0]:
                out.pop()
        return out
