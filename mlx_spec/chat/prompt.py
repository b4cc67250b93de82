"""The conversation as the model saw it: exact token ids, extended turn by turn through the chat template."""

from dataclasses import dataclass, field


def render(tokenizer, messages: list[dict]) -> str:
    """The conversation as text, ready for the assistant's turn: the model's chat template, if it has one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # A base model has no template: a plain transcript it can continue.
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))  # the template writes its own BOS, if any


@dataclass
class Seen:
    """The token ids the model has seen (its own replies as generated), and the template text they stand for.

    A reply's tokens are often not the canonical tokenization of its text: tokenizing the whole
    conversation again would change the prefix, and the session would trim its caches back to
    the start of the last reply and prefill it again. So the next prompt is these ids plus only
    the text the template adds; if the template rewrote earlier turns, everything is tokenized afresh.
    """

    ids: list[int] = field(default_factory=list)
    text: str = ""

    def prompt(self, tokenizer, messages: list[dict]) -> tuple[list[int], str]:
        """(ids, text) of the prompt for the assistant's next reply to `messages`."""
        text = render(tokenizer, messages)
        if self.text and text.startswith(self.text):
            return self.ids + encode(tokenizer, text[len(self.text) :]), text
        return encode(tokenizer, text), text

    def extend(self, prompt_ids: list[int], prompt_text: str, tokens: list[int], tokenizer) -> None:
        """The model saw the prompt and then generated `tokens`."""
        self.ids, self.text = prompt_ids + tokens, prompt_text + tokenizer.decode(tokens)
