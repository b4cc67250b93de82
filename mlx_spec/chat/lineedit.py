"""Reading the user's lines: prompt_toolkit with a history file on a terminal, plain input() otherwise."""

import sys
from collections.abc import Callable

from mlx_spec.make.paths import home

HISTORY_FILE = "chat_history"  # under the cache home, beside the models


def line_reader() -> Callable[[str], str]:
    """A function prompt -> line; it raises KeyboardInterrupt on Ctrl-C and EOFError on Ctrl-D, like input()."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return input  # piped input: no line editor to draw
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, History, InMemoryHistory

    history: History
    try:
        home().mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(home() / HISTORY_FILE))
    except OSError:  # a read-only cache home still gets a chat, just without saved history
        history = InMemoryHistory()
    return PromptSession(history=history).prompt
