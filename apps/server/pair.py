"""The served model pair: the target and draft weights loaded once, a new drafter per session, prompts to ids."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mlx_spec.gen import registry
from mlx_spec.gen.engine import context_limit
from mlx_spec.gen.session import Session
from mlx_spec.named import Log, load_model, make_drafter, short_name


def _quiet(_msg: str) -> None:
    pass


@dataclass
class Pair:
    """Loaded weights shared by every session; each session gets its own drafter (its own draft cache)."""

    model_spec: str
    draft_spec: registry.Spec
    target: object
    tokenizer: object
    loaded: Dict[str, Tuple] = field(default_factory=dict)  # {draft model spec: (model, tokenizer)}
    num_draft: Optional[int] = None
    adaptive: bool = True

    @classmethod
    def load(cls, model: str, draft: registry.Spec, *, num_draft: Optional[int] = None,
             log: Log = _quiet) -> "Pair":
        """Load by name; the draft first, so an unavailable draft fails before the (bigger) target loads."""
        draft = registry.parse(draft)  # a malformed spec fails before anything loads
        name = draft.model
        loaded = {name: load_model(name, log)[:2]} if name else {}
        target, tokenizer, _ = load_model(model, log)
        pair = cls(model, draft, target, tokenizer, loaded, num_draft)
        pair.new_session()  # builds one drafter now: an incompatible draft fails at start, not per request
        return pair

    def new_session(self) -> Session:
        """A fresh conversation with its own drafter over the shared weights."""
        drafter = make_drafter(self.draft_spec, self.target, self.tokenizer, loaded=self.loaded)
        return Session(self.target, self.tokenizer, drafter, num_draft=self.num_draft, adaptive=self.adaptive)

    @property
    def context(self) -> Optional[int]:
        """The target's context length, if its config states one."""
        return context_limit(self.target)

    @property
    def name(self) -> str:
        """The model id the API reports: a folder by its last part, anything else as given."""
        return short_name(self.model_spec)

    def info(self) -> dict:
        """What the page shows about the pair (short names for the eye, the specs as given)."""
        return {"target": self.model_spec, "draft": str(registry.parse(self.draft_spec)), "target_name": self.name,
                "draft_name": short_name(self.draft_spec), "drafter": registry.parse(self.draft_spec).kind,
                "num_draft": self.num_draft, "context": self.context, "adaptive": self.adaptive}

    def chat_ids(self, messages: List[dict]) -> List[int]:
        """The conversation through the tokenizer's chat template (plain role-tagged lines without one)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            return list(tok.apply_chat_template(messages, add_generation_prompt=True))
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return list(tok.encode(text))

    def text_ids(self, prompt: str) -> List[int]:
        """A raw prompt, tokenized as is."""
        return list(self.tokenizer.encode(prompt))
