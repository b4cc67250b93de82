"""Recorded rounds: per prompt the target's greedy continuation and, at every position of it, a draft model's top
guesses, so any plan's acceptance is known without running a model (`replay.py`); the corpus they are recorded on.

Under greedy decoding a draft model's k-token draft at output position i matches the target's for as long as its
greedy token agrees with the target's at i, i + 1, ...: one pass of the draft model over prompt + continuation gives
every position's greedy token, so the accepted length of any draft is the run of agreement from i, capped at k.
Table lookups (suffix, n-gram) are functions of the token history, so the replay recomputes them with the drafters
themselves and a recording need not hold them.
"""

import gzip
import itertools
import json
import os
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import MlxSpecError

CORPORA_DIR = Path(__file__).parent / "corpora"
FORMAT = 1  # the recording's layout version
TOP = 4  # guesses kept per position: the greedy token and the next three (a tree's breadth)


@dataclass(frozen=True)
class CorpusPrompt:
    """One prompt of a corpus: a user message (`text`) or a conversation (`messages`), and tools for the template."""

    id: str
    kind: str
    text: str = ""
    messages: tuple[dict, ...] = ()
    tools: tuple[dict, ...] = ()

    def ids(self, tokenizer) -> list[int]:
        """Token ids after the tokenizer's chat template (plain encoding if it has none)."""
        messages = list(self.messages) or [{"role": "user", "content": self.text}]
        if not getattr(tokenizer, "chat_template", None):
            return list(tokenizer.encode("\n\n".join(m["content"] for m in messages)))
        kw = {"tools": list(self.tools)} if self.tools else {}
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kw))


def corpus(name_or_path: str) -> list[CorpusPrompt]:
    """The prompts of a corpus: a name in `corpora/` or a TOML file; a bad file is refused in one line."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CORPORA_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(CORPORA_DIR.glob("*.toml")))
        raise MlxSpecError(f"no corpus '{name_or_path}' (known: {known}, or a .toml file)")
    data = tomllib.loads(path.read_text())
    out = []
    for i, p in enumerate(data.get("prompt", [])):
        if not p.get("id") or not p.get("kind") or bool(p.get("text")) == bool(p.get("messages")):
            raise MlxSpecError(f"{path}: prompt {i} needs an id, a kind and either text or messages")
        tools = tuple(json.loads(t) for t in p.get("tools", ()))
        out.append(CorpusPrompt(p["id"], p["kind"], p.get("text", ""), tuple(p.get("messages", ())), tools))
    if len({p.id for p in out}) != len(out):
        raise MlxSpecError(f"{path}: prompt ids must be unique")
    return out


@dataclass
class Recorded:
    """One prompt's recording: `target` continues `prompt`; sources[name]["top"][i]: that model's TOP guesses for
    target[i] given prompt + target[:i], the greedy one first."""

    id: str
    kind: str
    prompt: list[int]
    target: list[int]
    sources: dict[str, dict] = field(default_factory=dict)
    measured: dict = field(default_factory=dict)  # the generating run: its drafter, and per round (source,
    # proposed, accepted, seconds, verify size, catch-up tokens) as the engine traced it on the recording machine

    def greedy(self, source: str) -> list[int]:
        """The source's greedy token at each output position."""
        return [t[0] for t in self.sources[source]["top"]]


@dataclass
class Recording:
    """A corpus recorded for one target: its prompts in corpus order, and what made them."""

    target: str
    tokens: int  # the most tokens a continuation holds
    corpus: str
    sources: dict[str, str] = field(default_factory=dict)  # source name -> the model spec that drafted
    shares: dict[str, float] = field(default_factory=dict)  # its weights' bytes over the target's (the engine's prior)
    prompts: list[Recorded] = field(default_factory=list)
    format: int = FORMAT

    def save(self, path: str | Path) -> None:
        """Write atomically (a temporary file renamed over the old one): an interrupted write loses nothing."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with gzip.open(tmp, "wt") as f:
            json.dump(asdict(self), f, separators=(",", ":"))
        os.replace(tmp, path)


def load(path: str | Path) -> Recording:
    """A recording written by `Recording.save`; a missing or foreign file is refused in one line."""
    try:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise MlxSpecError(f"cannot read the recording {path}: {e}") from None
    if data.get("format") != FORMAT:
        raise MlxSpecError(f"{path}: not a recording of format {FORMAT}")
    prompts = [Recorded(**p) for p in data.pop("prompts")]
    return Recording(**data, prompts=prompts)


def guesses(drafter, prompt: list[int], target: list[int]) -> list[list[int]]:
    """A model drafter's TOP guesses at each output position, from one pass over prompt + target[:-1], over the
    vocabulary it drafts from there (its subset head holds the prompt and the output so far)."""
    import mlx.core as mx
    import numpy as np

    from ..gen.cache import new_cache

    drafter.reset(prompt)
    h = drafter.forward(mx.array([prompt + target[:-1]]), new_cache(drafter.model))[0, len(prompt) - 1 :]
    logits = np.array(drafter.full(h).astype(mx.float32))  # (N, V)
    head = drafter.head if drafter.subset else None
    allowed = None
    if head is not None:
        allowed = np.zeros(logits.shape[-1], dtype=bool)
        allowed[[i for i in np.array(head.ids()).tolist() if i < logits.shape[-1]]] = True
    out = []
    for i, row in enumerate(logits):
        if allowed is not None:
            row = np.where(allowed, row, -np.inf)
            if target[i] < allowed.size:
                allowed[target[i]] = True  # fed once the target produced it
        best = int(np.argmax(row))  # the first of equal maxima, as mx.argmax takes it
        rest = [int(t) for t in np.argsort(-row, kind="stable")[: TOP + 1] if t != best][: TOP - 1]
        out.append([best, *rest])
    return out


def record(
    prompts: Sequence[CorpusPrompt],
    target,
    tokenizer,
    drafters: dict[str, Callable[[], object]],
    tokens: int,
    out: str | Path,
    recording: Recording,
    generator=None,
    log: Callable[[str], None] = lambda _m: None,
) -> Recording:
    """Record each prompt not in `out` yet, kinds in turn (resumable: the file is rewritten after every prompt): the
    target's greedy continuation of at most `tokens` through `generator` (a lossless drafter, or plain) with the
    run's rounds (what `check` compares), and the guesses of each model drafter (`drafters`: name -> a fresh
    drafter, so no prompt's vocabulary reaches the next one's head)."""
    done = {r.id for r in recording.prompts}
    for p in (p for p in interleaved(prompts) if p.id not in done):
        ids = p.ids(tokenizer)
        continuation, measured = _generated(target, tokenizer, ids, tokens, generator)
        sources = {name: {"top": guesses(make(), ids, continuation)} for name, make in drafters.items()}
        recording.prompts.append(Recorded(p.id, p.kind, ids, continuation, sources, measured))
        recording.save(out)
        log(f"{len(recording.prompts)}/{len(prompts)} {p.id}: {len(ids)} prompt tokens, {len(continuation)} generated")
    return recording


def _generated(target, tokenizer, ids: list[int], tokens: int, generator) -> tuple[list[int], dict]:
    """One prompt's continuation through the engine, and its rounds: (source, proposed, accepted, seconds, verify
    size, catch-up tokens)."""
    from ..gen.generate import speculative_generate_step
    from ..gen.stats import Stats

    stats, eos = Stats(trace=[]), tuple(tokenizer.eos_token_ids)
    steps = speculative_generate_step(ids, target, generator, max_tokens=tokens, eos_token_ids=eos, stats=stats)
    continuation = [s.token for s in steps]
    keys = ("source", "proposed", "accepted", "seconds", "size", "behind")
    trace = [[round(e[k], 6) if k == "seconds" else e[k] for k in keys] for e in stats.trace or []]
    return continuation, {"drafter": getattr(generator, "name", "none"), "rounds": trace}


def interleaved(prompts: Sequence[CorpusPrompt]) -> list[CorpusPrompt]:
    """One prompt of each kind in turn: a recording cut short still holds every kind."""
    kinds: dict[str, list[CorpusPrompt]] = {}
    for p in prompts:
        kinds.setdefault(p.kind, []).append(p)
    return [p for group in itertools.zip_longest(*kinds.values()) for p in group if p is not None]


def record_named(
    target: str, draft: str, corpus_name: str, tokens: int, out: str | Path, log: Callable[[str], None], limit: int = 0
) -> Recording:
    """`record` by names: the target and its draft model loaded once, the continuation generated losslessly with
    `hybrid:DRAFT`; an `out` recorded before with the same target, draft and length is resumed; limit > 0: the
    corpus's first `limit` prompts, kinds in turn."""
    from ..models.base import params_bytes
    from ..named import load_model, make_drafter

    if tokens < 1:
        raise MlxSpecError(f"--tokens must be >= 1, got {tokens}")
    prompts = corpus(corpus_name)
    if limit > 0:
        prompts = interleaved(prompts)[:limit]
    recording = Recording(target, tokens, corpus_name, {"model": draft})
    if Path(out).exists():
        old = load(out)
        if (old.target, old.tokens, old.sources) != (target, tokens, recording.sources):
            raise MlxSpecError(f"{out} holds a recording of another target, draft or length: choose another --out")
        recording = old
    model, tok, _ = load_model(target, log)
    loaded = {draft: load_model(draft, log)[:2]}
    generator = make_drafter(f"hybrid:{draft}", model, tok, loaded=loaded, log=log)
    fresh = {"model": lambda: make_drafter(draft, model, tok, loaded=loaded, log=log)}
    recording.shares = {"model": params_bytes(loaded[draft][0]) / params_bytes(model)}
    return record(prompts, model, tok, fresh, tokens, out, recording, generator, log)
