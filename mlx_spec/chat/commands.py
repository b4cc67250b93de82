"""The chat's slash commands: each takes the chat, its argument and a print function, and keeps the chat going."""

from collections.abc import Callable

from mlx_spec.errors import MlxSpecError
from mlx_spec.gen.sampling import validate

from . import report
from .conversation import Chat
from .interrupt import drain

Echo = Callable[[str], None]


class CommandError(MlxSpecError):
    """A slash command the chat cannot carry out; printed as one line, the chat goes on."""


def _number(arg: str, kind, what: str):
    try:
        return kind(arg)
    except ValueError:
        raise CommandError(f"{what} needs a number, got '{arg}'") from None


def draft(chat: Chat, arg: str, echo: Echo) -> None:
    if arg == "":
        echo(f"drafter: {chat.draft_name}, K {chat.session.num_draft}" if chat.drafting else "drafter: off")
    elif arg == "off":
        chat.draft_off()
        echo("drafter off: plain decoding (/draft on brings it back)")
    elif arg == "on":
        if not chat.draft_on():
            raise CommandError("no drafter to turn back on: use /draft SPEC")
        echo(f"drafter on: {chat.draft_name}")
    else:
        chat.set_draft(arg)
        echo(
            f"drafter: {chat.draft_name}"
            + (f", K {chat.session.num_draft}" if chat.drafting else "")
            + " (the conversation is kept)"
        )


def k(chat: Chat, arg: str, echo: Echo) -> None:
    n = _number(arg, int, "/k")
    if n < 1:
        raise CommandError(f"/k must be >= 1, got {n}")
    chat.set_k(n)
    echo(f"K = {n} (most draft tokens per round; an n-gram source keeps the K it was built with until /draft)")


def temp(chat: Chat, arg: str, echo: Echo) -> None:
    t = _number(arg, float, "/temp")
    s = chat.settings
    validate(t, s.top_p, s.top_k)
    s.temp = t
    echo(f"temperature {t}" + (" (greedy)" if t == 0 else ""))


def top_p(chat: Chat, arg: str, echo: Echo) -> None:
    p = _number(arg, float, "/top-p")
    s = chat.settings
    validate(s.temp, p, s.top_k)
    s.top_p = p
    echo(f"top-p {p}" + (" (off)" if p in (0, 1) else ""))


def stats(chat: Chat, arg: str, echo: Echo) -> None:
    if chat.last is None:
        raise CommandError("no reply yet")
    echo(report.stats_detail(chat.last.stats))


def compare(chat: Chat, arg: str, echo: Echo) -> None:
    last = chat.last
    if last is None:
        raise CommandError("no reply to compare yet")
    if last.draft == "none":
        raise CommandError("the last reply was plain decoding already: /draft on, ask again, then /compare")
    stops = "" if chat.sharded else " (Ctrl-C stops)"
    echo(f"regenerating the last reply ({len(last.tokens)} tokens) with plain decoding ...{stops}")
    seen, stopped = drain(chat.compare(), stoppable=not chat.sharded)
    if stopped or not seen:
        echo("compare stopped")
        return
    echo(report.compare_table(*chat.rows(seen[-1].stats.generation_tps)))
    echo(report.identity_line([ev.token for ev in seen], last.tokens, greedy=chat.settings.temp == 0))


def reset(chat: Chat, arg: str, echo: Echo) -> None:
    chat.reset()
    echo("conversation cleared")


def save(chat: Chat, arg: str, echo: Echo) -> None:
    if not arg:
        raise CommandError("/save needs a file name, e.g. /save chat.json")
    try:
        out = chat.save(arg)
    except OSError as e:
        raise CommandError(f"cannot write {arg}: {e.strerror or e}") from None
    echo(f"saved {len(chat.messages)} messages with their stats to {out}")


def help_(chat: Chat, arg: str, echo: Echo) -> None:
    width = max(len(f"/{name} {usage}") for name, (_, usage, _) in COMMANDS.items())
    echo("\n".join(f"  {f'/{name} {usage}':<{width}}  {text}" for name, (_, usage, text) in COMMANDS.items()))
    echo("  Ctrl-C stops a reply (what was shown stays in the conversation); Ctrl-D exits.")


COMMANDS: dict[str, tuple[Callable, str, str]] = {
    "draft": (
        draft,
        "off|on|SPEC",
        "switch the drafter (ngram, self[:L], hybrid[:D], a model); keeps the conversation",
    ),
    "k": (k, "N", "most draft tokens per round"),
    "temp": (temp, "T", "sampling temperature (0: greedy)"),
    "top-p": (top_p, "P", "nucleus sampling threshold (0: off)"),
    "stats": (stats, "", "acceptance by draft position and draft/verify time of the last reply"),
    "compare": (compare, "", "regenerate the last reply with plain decoding and compare speed and tokens"),
    "reset": (reset, "", "start a new conversation"),
    "save": (save, "FILE", "write the transcript with each reply's stats as JSON"),
    "help": (help_, "", "this list"),
}


# Commands that only read the chat and write to rank 0's screen or disk: under --shard the other ranks skip them.
LOCAL = ("stats", "save", "help")


def dispatch(chat: Chat, line: str, echo: Echo) -> None:
    """Run one '/command arg' line; user errors become one printed line."""
    name, _, arg = line[1:].strip().partition(" ")
    entry = COMMANDS.get(name.lower())
    if entry is None:
        echo(f"unknown command /{name} (/help lists them)")
        return
    try:
        entry[0](chat, arg.strip(), echo)
    except MlxSpecError as e:
        echo(f"error: {e}")
