"""`mlx-spec chat`: load the pair, then read lines, stream replies with their stats line, run slash commands."""

import contextlib
import math
import sys

import mlx.core as mx

from mlx_spec.cluster import Agreed, Cluster, ClusterError
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


def _quiet(text: str) -> None:
    """What a rank other than 0 prints under --shard: nothing (rank 0 speaks for the group)."""


def turn(chat: Chat, text: str, echo=_echo, show=_show) -> None:
    """Stream the reply to `text`, then its stats line; Ctrl-C stops the reply and keeps what was shown."""
    try:
        seen, _ = drain(chat.ask(text), show, stoppable=not chat.sharded)
    except ClusterError:
        raise
    except MlxSpecError as e:  # e.g. the conversation outgrew the model's context
        echo(f"error: {e}")
        return
    if not seen:
        echo("\n[stopped before the first token; the message was dropped]")
        return
    stopped = seen[-1].finish_reason is None
    echo("\n[stopped: the partial reply stays in the conversation]" if stopped else "")
    reply = chat.last
    assert reply is not None  # `ask` recorded the reply it streamed
    echo(report.stats_line(reply.stats, reply.plain_step_s, reply.draft != "none"))


def run_line(chat: Chat, line: str, echo=_echo, show=_show) -> None:
    """One line typed at the prompt: a slash command or a message."""
    if line.startswith("/"):
        commands.dispatch(chat, line, echo)
    elif line:
        turn(chat, line, echo, show)


def follow(chat: Chat, cluster: Cluster) -> None:
    """A rank other than 0 under --shard: run the lines rank 0 read, as it runs them, printing nothing, until it
    ends (Ctrl-D there) or the group breaks."""
    while (data := cluster.send(None, wait=math.inf)) is not None:
        line = data.decode()
        if line.startswith("/") and line[1:].partition(" ")[0].lower() in commands.LOCAL:
            continue
        run_line(chat, line, _quiet, None)


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
    shard: str | None = None,
) -> None:
    """The chat loop, until Ctrl-D (or end of input). User errors before the chat starts raise MlxSpecError.

    shard: the target split over the ranks `mlx.launch` started ("tensor" or "pipeline"). Rank 0 reads the lines and
    sends each to the other ranks before it runs it; every rank runs it, rank 0's planner deciding each round; only
    rank 0 prints. A reply runs to its end (the ranks run every round together): Ctrl-C ends the chat."""
    validate(temp, top_p, top_k)
    cluster = Cluster.join(shard) if shard is not None else None
    if cluster is None:
        if seed is not None:
            mx.random.seed(seed)
        target, tokenizer, drafter = pair.load(model, draft, log=log)
    else:
        target, tokenizer, drafter = pair.load_sharded(cluster, model, draft, log=log)
        cluster.agree_seed(seed)  # every rank samples alike; and no rank starts before all have loaded
    planner = Agreed(adaptive=adaptive, cluster=cluster) if cluster is not None else None
    session = Session(target, tokenizer, drafter, num_draft=num_draft, adaptive=adaptive, planner=planner)
    loader = pair.DraftLoader(target, tokenizer, log=log, sharded=cluster is not None)
    settings = Settings(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, num_draft=num_draft)
    name = str(draft) if drafter is not None else "none"
    chat = Chat(session, model, name, settings, loader, system=system, sharded=cluster is not None)
    if cluster is not None and not cluster.lead:
        with cluster.guard():
            return follow(chat, cluster)
    with cluster.guard() if cluster is not None else contextlib.nullcontext():
        _loop(chat, cluster)


def _loop(chat: Chat, cluster: Cluster | None) -> None:
    """Rank 0's (or the only) prompt: read a line, send it to the other ranks, run it."""
    read = line_reader()
    session = chat.session
    k = f", K {session.num_draft}" if chat.drafting else ""
    where = f"{cluster.size} ranks ({cluster.shard}-sharded)" if cluster is not None else describe()
    stop = "Ctrl-C ends the chat on every rank" if cluster is not None else "Ctrl-C stops a reply"
    _echo(
        f"chat with {short_name(chat.model_name)} on {where}, drafter {chat.draft_name}{k}. "
        f"/help lists commands; {stop}, Ctrl-D exits."
    )
    while True:
        try:
            line = read(PROMPT).strip()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: drop the line, ask again
            continue
        except EOFError:
            _echo("")
            if cluster is not None:
                cluster.send(None)
            return
        if cluster is not None:
            if not line:
                continue
            cluster.send(line.encode())
        try:
            run_line(chat, line)
        except KeyboardInterrupt:  # a Ctrl-C that landed between a reply and the prompt
            if cluster is not None:  # the other ranks are inside the same round: the group ends with it
                _echo("\n[Ctrl-C: a sharded chat ends on every rank]")
                raise SystemExit(130) from None
            _echo("\n[interrupted]")
