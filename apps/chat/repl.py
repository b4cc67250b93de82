"""`mlx-spec chat`: load the pair, then read lines, stream replies with their stats line, run slash commands."""

import sys

import mlx.core as mx

from mlx_spec.device import describe
from mlx_spec.errors import MlxSpecError
from mlx_spec.gen.sampling import validate
from mlx_spec.gen.session import Session
from mlx_spec.named import Log, short_name

from . import commands, pair, report
from .conversation import Chat, Settings
from .interrupt import drain
from .lineedit import line_reader

PROMPT = ">>> "


def _echo(text: str) -> None:
    print(text, flush=True)


# Control characters a model may emit (ESC, CR, ...) would move the cursor or clear the screen:
# show them as U+FFFD; the conversation keeps the text as generated.
_CONTROLS = {c: "\ufffd" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def _show(ev) -> None:
    sys.stdout.write(ev.text.translate(_CONTROLS))
    sys.stdout.flush()


def turn(chat: Chat, text: str) -> None:
    """Stream the reply to `text`, then its stats line; Ctrl-C stops the reply and keeps what was shown."""
    try:
        seen, _ = drain(chat.ask(text), _show)
    except MlxSpecError as e:  # e.g. the conversation outgrew the model's context
        _echo(f"error: {e}")
        return
    if not seen:
        _echo("\n[stopped before the first token; the message was dropped]")
        return
    stopped = seen[-1].finish_reason is None
    _echo("\n[stopped: the partial reply stays in the conversation]" if stopped else "")
    reply = chat.last
    assert reply is not None  # `ask` recorded the reply it streamed
    _echo(report.stats_line(reply.stats, reply.plain_step_s, reply.draft != "none"))


def run(
    *,
    model: str,
    draft,
    system: str | None = None,
    num_draft: int | None = None,
    max_tokens: int,
    temp: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    adaptive: bool,
    log: Log,
) -> None:
    """The chat loop, until Ctrl-D (or end of input). User errors before the chat starts raise MlxSpecError."""
    validate(temp, top_p, top_k)
    if seed is not None:
        mx.random.seed(seed)
    target, tokenizer, drafter = pair.load(model, draft, log=log)
    session = Session(target, tokenizer, drafter, num_draft=num_draft, adaptive=adaptive)
    loader = pair.DraftLoader(target, tokenizer, log=log)
    settings = Settings(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, num_draft=num_draft)
    chat = Chat(session, model, str(draft) if drafter is not None else "none", settings, loader, system=system)
    read = line_reader()
    k = f", K {session.num_draft}" if chat.drafting else ""
    _echo(
        f"chat with {short_name(model)} on {describe()}, drafter {chat.draft_name}{k}. "
        "/help lists commands; Ctrl-C stops a reply, Ctrl-D exits."
    )
    while True:
        try:
            line = read(PROMPT).strip()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: drop the line, ask again
            continue
        except EOFError:
            _echo("")
            return
        try:
            if line.startswith("/"):
                commands.dispatch(chat, line, _echo)
            elif line:
                turn(chat, line)
        except KeyboardInterrupt:  # a Ctrl-C that landed between a reply and the prompt
            _echo("\n[interrupted]")
