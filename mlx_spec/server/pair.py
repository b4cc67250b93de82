"""The served model pair: the target and draft weights loaded once, a new drafter per session, prompts to ids.

A request may name another drafter for its reply (`"draft"` in the body): one that builds nothing (none, ngram,
suffix, self, hybrid), the loaded draft model alone or in a hybrid, or one the server was told to allow
(`--allow-draft`, built at start), unless the server was started with --fixed-draft. Nothing loads or builds per
request: a load would stall every other request, and a page could fill the memory.
"""

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlx_spec.errors import MlxSpecError
from mlx_spec.gen import registry
from mlx_spec.gen.cache import context_limit
from mlx_spec.gen.session import Session
from mlx_spec.named import Log, load_model, make_drafter, short_name

from .errors import bad_request
from .tools import Syntax, syntax

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

FREE = ("none", "suffix", "ngram", "hybrid", "hybrid:none", "self")  # drafters that load and build no weights


def _quiet(_msg: str) -> None:
    pass


@dataclass
class Pair:
    """Loaded weights shared by every session; each session gets its own drafter (its own draft cache)."""

    model_spec: str
    draft_spec: registry.Spec
    target: "nn.Module"
    tokenizer: "TokenizerWrapper"
    loaded: dict[str, tuple] = field(default_factory=dict)  # {draft model spec: (model, tokenizer)}
    num_draft: int | None = None
    adaptive: bool = True
    fixed: bool = False  # requests may not switch the drafter (serve --fixed-draft)
    allowed: tuple[str, ...] = ()  # more drafters requests may name (serve --allow-draft), canonical specs
    _drafters: "weakref.WeakKeyDictionary" = field(default_factory=weakref.WeakKeyDictionary, repr=False)

    @classmethod
    def load(
        cls,
        model: str,
        draft: registry.Spec,
        *,
        num_draft: int | None = None,
        adaptive: bool = True,
        fixed: bool = False,
        allow: Sequence[registry.Spec] = (),
        log: Log = _quiet,
    ) -> "Pair":
        """Load by name; the drafts first, so an unavailable draft fails before the (bigger) target loads. allow: more
        drafters requests may name, their models loaded and each built once now."""
        draft = registry.parse(draft)  # a malformed spec fails before anything loads
        allowed = tuple(registry.parse(a) for a in allow)
        if fixed and allowed:
            raise MlxSpecError("--allow-draft lets requests switch the drafter, which --fixed-draft forbids")
        names = dict.fromkeys(d.model for d in (draft, *allowed) if d.model)
        loaded = {name: load_model(name, log)[:2] for name in names}
        target, tokenizer, _ = load_model(model, log)
        pair = cls(
            model,
            draft,
            target,
            tokenizer,
            loaded,
            num_draft,
            adaptive=adaptive,
            fixed=fixed,
            allowed=tuple(map(str, allowed)),
        )
        drafter = pair.new_session().drafter  # built now: an incompatible draft fails at start, not per request
        if drafter is not None and drafter.left_out:
            log(drafter.left_out)
        for spec in allowed:  # and each allowed one: what it shares (a quantized copy) is built before any request
            make_drafter(spec, target, tokenizer, loaded=loaded)
        return pair

    @property
    def own_draft(self) -> str:
        """The server's drafter, as a canonical spec."""
        return str(registry.parse(self.draft_spec))

    def new_session(self) -> Session:
        """A fresh conversation with its own drafter (the server's) over the shared weights."""
        spec = self.own_draft
        drafter = make_drafter(self.draft_spec, self.target, self.tokenizer, loaded=self.loaded)
        session = Session(self.target, self.tokenizer, drafter, num_draft=self.num_draft, adaptive=self.adaptive)
        self._drafters[session] = (spec, {spec: drafter})
        return session

    def choices(self) -> list[str]:
        """The drafter specs a request may name: the server's own first."""
        own = self.own_draft
        if self.fixed:
            return [own]
        specs = [own, *FREE] + [s for m in self.loaded for s in (m, f"hybrid:{m}")] + list(self.allowed)
        return list(dict.fromkeys(str(registry.parse(s)) for s in specs))

    def check_draft(self, spec) -> str | None:
        """A request's `draft` as a canonical spec (None: the server's own), or a 400 saying what it may be."""
        if spec is None:
            return None
        if not isinstance(spec, str) or not spec:
            raise bad_request('\'draft\' must be a drafter spec such as "suffix" or "none"', param="draft")
        try:
            parsed = registry.parse(spec)
        except MlxSpecError as e:
            raise bad_request(f"'draft': {e}", param="draft") from None
        choices = self.choices()
        if str(parsed) not in choices:
            why = (
                "its drafter is fixed (--fixed-draft)"
                if self.fixed
                else "it loads or builds no drafter per request (start it with --allow-draft SPEC to allow one)"
            )
            raise bad_request(
                f"'draft': this server cannot draft with {spec!r}: {why}; it can use {', '.join(choices)}",
                param="draft",
                code="draft_unavailable",
            )
        return str(parsed)

    def use(self, session: Session, spec: str | None) -> None:
        """Give the session the drafter `spec` (None: the server's own), built once per session and kept."""
        spec = spec or self.own_draft
        current, built = self._drafters.setdefault(session, (None, {}))
        if spec == current:
            return
        if spec not in built:
            built[spec] = make_drafter(spec, self.target, self.tokenizer, loaded=self.loaded)
        session.set_drafter(built[spec], self.num_draft)
        self._drafters[session] = (spec, built)

    @property
    def context(self) -> int | None:
        """The target's context length, if its config states one."""
        return context_limit(self.target)

    @property
    def name(self) -> str:
        """The model id the API reports: a folder by its last part, anything else as given."""
        return short_name(self.model_spec)

    def info(self) -> dict:
        """What the page shows about the pair (short names for the eye, the specs as given)."""
        drafters = [
            {"spec": s, "name": short_name(s), "k": self.num_draft or registry.default_num_draft(s)}
            for s in self.choices()
        ]
        return {
            "target": self.model_spec,
            "draft": self.own_draft,
            "target_name": self.name,
            "draft_name": short_name(self.draft_spec),
            "drafter": registry.parse(self.draft_spec).kind,
            "num_draft": self.num_draft,
            "context": self.context,
            "adaptive": self.adaptive,
            "switchable": not self.fixed,
            "drafters": drafters,
        }

    def chat_ids(self, messages: list[dict], tools: list[dict] | None = None, open_call: bool = False) -> list[int]:
        """The conversation through the tokenizer's chat template, with the tools' schemas where given (plain
        role-tagged lines without a template). open_call: the reply starts inside a tool call (its start marker ends
        the prompt). A 400 when the template rejects the messages, or has no tool support and tools are given."""
        tok = self.tokenizer
        if tools and self.tool_syntax is None:
            raise bad_request(
                f"{self.name}'s chat template has no tool support mlx-lm can parse, so it cannot be sent 'tools'",
                param="tools",
                code="tools_unsupported",
            )
        if not getattr(tok, "chat_template", None):
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
            return list(tok.encode(text))
        try:
            ids = list(tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True))
        except Exception as e:  # the template's own checks (e.g. roles out of order) raise jinja errors
            raise bad_request(f"the chat template rejects these messages: {e}", param="messages") from None
        if open_call and self.tool_syntax is not None:
            ids += tok.encode(self.tool_syntax.start, add_special_tokens=False)
        return ids

    @property
    def tool_syntax(self) -> Syntax | None:
        """The target's tool-call markers and parser (mlx-lm's), or None where its template has none."""
        return syntax(self.tokenizer)

    def text_ids(self, prompt: str) -> list[int]:
        """A raw prompt, tokenized as is."""
        return list(self.tokenizer.encode(prompt))
