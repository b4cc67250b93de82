"""A chat: the messages, each reply with its stats, the session that keeps the caches, and the current drafter."""

import json
import os
from collections.abc import Generator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlx_spec import named
from mlx_spec.gen.session import Session
from mlx_spec.gen.stats import Stats
from mlx_spec.gen.stream import Event
from mlx_spec.make.paths import atomic_file

from . import pair
from .prompt import Seen
from .report import CompareRow


@dataclass
class Settings:
    """What /k, /temp and /top-p change; the rest is fixed by the command line."""

    max_tokens: int
    temp: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    num_draft: int | None = None  # None: each drafter kind's default K


@dataclass
class Reply:
    """One assistant reply as generated: its tokens, which came from drafts, and what it measured."""

    text: str
    tokens: list[int]
    from_draft: list[bool]
    stats: Stats
    draft: str  # the drafter spec in use ("none": plain decoding)
    draft_quantization: str  # of the network that drafted ("N/A": none, e.g. n-gram drafting)
    plain_step_s: float | None  # the session's estimate of one plain target step at the end of the reply
    prompt_ids: list[int]  # what the reply answered: the whole conversation before it
    interrupted: bool = False

    def as_dict(self) -> dict:
        """JSON-ready: everything but the token lists."""
        return {
            "draft": self.draft,
            "draft_quantization": self.draft_quantization,
            "interrupted": self.interrupted,
            "tokens": len(self.tokens),
            "draft_tokens": sum(self.from_draft),
            "plain_step_s_est": self.plain_step_s,
            "stats": self.stats.as_dict(),
        }


@dataclass
class Chat:
    """The conversation and its session. Replies are generators of events, so the face decides when to stop.

    A reply stopped early (Ctrl-C) is KEPT as the assistant's partial reply, as shown on screen,
    so the caches, which hold exactly what was shown, are reused by the next turn. A turn stopped
    before its first token is dropped, user message and all.
    """

    session: Session
    model_name: str
    draft_name: str  # spec of the current drafter ("none" when off)
    settings: Settings
    loader: pair.DraftLoader
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)  # one per assistant message, in order
    parked: tuple | None = None  # (drafter, spec) put aside by /draft off, for /draft on
    draft_quantization: str = "N/A"
    seen: Seen = field(default_factory=Seen)
    sharded: bool = False  # the target is split over ranks that run every round together: a reply runs to its end

    def __post_init__(self):
        self.draft_quantization = named.quantization(named.draft_model(self.session.drafter, self.session.model))
        self.reset()

    # ------------------------------------------------------------------ conversation

    def reset(self) -> None:
        """Forget the conversation and the caches (not the drafter or the settings)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.replies = []
        self.seen = Seen()
        self.session.reset()

    def _events(self, ids: list[int], max_tokens: int) -> Generator[Event, None, None]:
        s = self.settings
        return self.session.generate(ids, max_tokens=max_tokens, temp=s.temp, top_p=s.top_p, top_k=s.top_k)

    def plain_step_s(self) -> float | None:
        """Seconds per plain target step as the session's planner measured it (None before any)."""
        return self.session.planner.costs.plain_step()

    def ask(self, text: str) -> Generator[Event, None, None]:
        """Events of the reply to `text`; when the generator ends or is closed, the reply is recorded."""
        tok = self.session.tokenizer
        self.messages.append({"role": "user", "content": text})
        prompt_ids, prompt_text = self.seen.prompt(tok, self.messages)
        events = self._events(prompt_ids, self.settings.max_tokens)
        tokens, flags, last = [], [], None
        try:
            for ev in events:
                tokens.append(ev.token)
                flags.append(ev.from_draft)
                last = ev
                yield ev
        finally:
            events.close()  # at once: the session's caches are consistent before anything else runs
            if last is None:
                self.messages.pop()
            else:
                said = tokens[:-1] if last.finish_reason == "stop" else tokens  # the template writes the end of turn
                content = tok.decode(said)
                self.messages.append({"role": "assistant", "content": content})
                self.seen.extend(prompt_ids, prompt_text, tokens, tok)
                self.replies.append(
                    Reply(
                        content,
                        tokens,
                        flags,
                        last.stats,
                        self.draft_name,
                        self.draft_quantization,
                        self.plain_step_s(),
                        prompt_ids,
                        interrupted=last.finish_reason is None,
                    )
                )

    @property
    def last(self) -> Reply | None:
        return self.replies[-1] if self.replies else None

    # ------------------------------------------------------------------ drafters

    @property
    def drafting(self) -> bool:
        return self.session.drafter is not None

    def _switch(self, drafter, spec: str) -> None:
        if self.drafting:
            self.parked = (self.session.drafter, self.draft_name)
        self.session.set_drafter(drafter, self.settings.num_draft)
        self.draft_name = spec if drafter is not None else "none"
        self.draft_quantization = named.quantization(named.draft_model(drafter, self.session.model))

    def set_draft(self, spec: str) -> None:
        """Switch to the drafter `spec` ('none' for plain decoding), keeping the conversation."""
        self._switch(self.loader.build(spec), spec)

    def draft_off(self) -> None:
        self._switch(None, "none")

    def draft_on(self) -> bool:
        """Back to the drafter /draft off (or a switch) put aside; False if there is none."""
        if not self.drafting and self.parked is not None:
            self._switch(*self.parked)
        return self.drafting

    def set_k(self, k: int) -> None:
        self.settings.num_draft = k
        self.session.set_drafter(self.session.drafter, k)

    # ------------------------------------------------------------------ /compare

    def compare(self) -> Generator[Event, None, None]:
        """Events of the last reply regenerated with plain decoding, as many tokens as it had; the drafter stays."""
        last = self.last
        if last is None:
            raise ValueError("no reply to compare yet")
        keep = self.session.drafter, self.session.num_draft
        self.session.set_drafter(None)
        events = self._events(last.prompt_ids, len(last.tokens))
        try:
            yield from events
        finally:
            events.close()
            self.session.set_drafter(*keep)

    def rows(self, plain_tps: float) -> tuple:
        """(plain row, speculative row) of the /compare table for the last reply."""
        name = f"{named.table_name(self.model_name)} {named.quantization(self.session.model)}"
        last = self.last
        if last is None:
            raise ValueError("no reply to compare yet")
        return (
            CompareRow(name, "N/A", "N/A", plain_tps),
            CompareRow(name, named.table_name(last.draft), last.draft_quantization, last.stats.generation_tps),
        )

    # ------------------------------------------------------------------ /save

    def transcript(self) -> dict:
        """The conversation with each reply's stats, as JSON-ready data."""
        replies = iter(self.replies)
        messages = [dict(m, **next(replies).as_dict()) if m["role"] == "assistant" else dict(m) for m in self.messages]
        return {
            "model": self.model_name,
            "draft": self.draft_name,
            "settings": asdict(self.settings),
            "messages": messages,
        }

    def save(self, path: str) -> Path:
        """Write the transcript as JSON atomically (a temp file beside it, then a rename)."""
        out = Path(path).expanduser()
        tmp = atomic_file(out)
        try:
            tmp.write_text(json.dumps(self.transcript(), indent=2, ensure_ascii=False))
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out
