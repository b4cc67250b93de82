"""The OpenAI wire format: completion objects, stream chunks, `usage`, and the speculative stats in the `mlx_spec` key.

The extra field rides along where OpenAI clients ignore it:
- every content chunk: `{"draft": [bool per token], "pos": [draft position per token, 0 for the target's own],
  "round": [round per token], "pieces": [text per token], "tokens", "rounds", "spec_rounds", "drafted",
  "accepted"}` (the counters so far), so a page can mark each token live;
- the chunk carrying `finish_reason`, and the non-streamed response: the whole `Stats` (`as_dict()`:
  prompt_tokens, prompt_cached, generation_tps, proposed (= drafted), accepted, acceptance_rate,
  mean_accepted, draft_share, acceptance_by_position, rounds, ...) plus `drafted`, `tokens_per_second`,
  `draft_flags` (every token's flag), `finish_reason` (the engine's: stop, length, context, stop_string)
  and `queued_s`.
"""

import time
from collections.abc import Sequence
from typing import Any

from .scheduler import Delta, Done
from .tools import ToolCall

EXTRA = "mlx_spec"


def usage(stats: dict) -> dict:
    """OpenAI's `usage`, with the cached prompt tokens where OpenAI reports them."""
    prompt, completion = stats.get("prompt_tokens", 0), stats.get("generation_tokens", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": stats.get("prompt_cached", 0)},
    }


def final_stats(stats: dict) -> dict:
    """The extra field of the last chunk and of the response: Stats under the names the page and clients use."""
    return dict(stats, drafted=stats.get("proposed", 0), tokens_per_second=stats.get("generation_tps", 0.0))


def live(delta: Delta) -> dict:
    """The extra field of a content chunk."""
    marks = [m for _, m in delta.pieces]
    return dict(
        delta.live,
        draft=[m.pos > 0 for m in marks],
        pos=[m.pos for m in marks],
        round=[m.round for m in marks],
        pieces=[t for t, _ in delta.pieces],
    )


def joined(earlier: dict | None, later: dict) -> dict:
    """Two content chunks' extra fields as one, for tokens whose text goes out with a later token's (held back, or
    part of a tool call): the per-token lists concatenated, the counters the later one's."""
    if not earlier:
        return later
    return {k: earlier.get(k, []) + v if isinstance(v, list) else v for k, v in later.items()}


class CompletionReply:
    """Builds the objects of one reply: `chat` (chat.completion) or `text` (text_completion)."""

    def __init__(self, id: str, model: str, chat: bool):
        self.id, self.model, self.chat, self.created = id, model, chat, int(time.time())
        self.calls = 0  # tool calls streamed so far

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(self, text, finish_reason) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def _chunk(self, choices: list[dict]) -> dict:
        return dict(self._head("chat.completion.chunk" if self.chat else "text_completion"), choices=choices)

    def first(self) -> dict:
        """The chat stream's opening chunk (the role), as OpenAI sends it."""
        c = self._chunk([self._choice("", None)])
        c["choices"][0]["delta"]["role"] = "assistant"
        return c

    def chunk(self, delta: Delta) -> dict:
        return dict(self._chunk([self._choice("".join(t for t, _ in delta.pieces), None)]), **{EXTRA: live(delta)})

    def parts(self, parts: list[str | ToolCall], delta: Delta | None) -> list[dict]:
        """A chat stream's chunks for content and calls split out of the reply (`ToolText`): the text in one, each
        call in its own `delta.tool_calls` entry, whole, numbered by `index` across the reply."""
        text = "".join(p for p in parts if isinstance(p, str))
        out = [self._chunk([self._choice(text, None)])] if text else []
        for call in (p for p in parts if isinstance(p, ToolCall)):
            entry = dict(index=self.calls, **call.openai())
            self.calls += 1
            out.append(
                self._chunk([{"index": 0, "delta": {"tool_calls": [entry]}, "logprobs": None, "finish_reason": None}])
            )
        if out and delta is not None:
            out[-1][EXTRA] = live(delta)
        return out

    @staticmethod
    def finish(done: Done, calls: Sequence[ToolCall]) -> str:
        """OpenAI's finish reason: "tool_calls" for a reply that ended by itself after calling tools."""
        return "tool_calls" if calls and done.finish_reason == "stop" else done.finish_reason

    def last(self, done: Done, finish_reason: str | None = None) -> dict:
        """The chunk with the finish reason and the whole stats."""
        choice = self._choice(None, finish_reason or done.finish_reason)
        return dict(self._chunk([choice]), **{EXTRA: final_stats(done.stats)})

    def usage_chunk(self, done: Done) -> dict:
        """`stream_options.include_usage`: one more chunk, no choices, the usage."""
        return dict(self._chunk([]), usage=usage(done.stats))

    def response(self, text: str, done: Done, calls: Sequence[ToolCall] = ()) -> dict:
        """The non-streamed reply (a chat message carries its tool calls, and no content where it has none)."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message.update(content=text.strip() or None, tool_calls=[c.openai() for c in calls])
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish(done, calls)}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": done.finish_reason}
        head = self._head("chat.completion" if self.chat else "text_completion")
        return dict(head, choices=[choice], usage=usage(done.stats), **{EXTRA: final_stats(done.stats)})
