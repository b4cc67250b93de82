"""The conformance harness: the installed mlx-lm's model types, a tiny seeded model of each (configs in
`conformance_models`), and what mlx-spec generates with each drafter against mlx-lm's greedy, alone and batched."""

import ast
import functools
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import mlx_spec  # noqa: F401, I001  (first: puts the fast BLAS under MLX)  # isort: skip
import mlx.core as mx
import mlx_lm.models
from conformance_models import CONFIGS, SCALE, SEEDS
from mlx.utils import tree_map

from mlx_spec.errors import MlxSpecError
from mlx_spec.gen.apart import apart
from mlx_spec.gen.cache import new_cache, prefill_cache
from mlx_spec.gen.engine import Engine
from mlx_spec.gen.generate import speculative_generate_step
from mlx_spec.gen.planner import Planner
from mlx_spec.gen.registry import NO_SOURCE, default_num_draft
from mlx_spec.gen.registry import build as build_drafter
from mlx_spec.gen.rows import Row
from mlx_spec.gen.stats import Stats

PATTERN = [5, 17, 42]  # a prompt that repeats this gives the lookups something to copy
SHORT = PATTERN * 2  # 6 tokens: inside a window of 8, the generation crosses it
LONG = PATTERN * 8  # 24 tokens: already past the window
PROMPTS = {"short": SHORT, "long": LONG}
MAX_TOKENS = 12
DRAFTERS = ("ngram", "suffix", "hybrid:none", "hybrid", "self", "quant-self")
LOOKUPS = ("ngram", "suffix", "hybrid:none", "hybrid")  # they draft from the context: a repeating one must be drafted
NEVER_REFUSED = ("hybrid:none", "hybrid")  # hybrid runs wherever plain decoding does (issue 55)
TIE = 1e-3  # a top-2 logit gap below this may flip with the order of a sum: a seed to change, not a failure to chase


def installed_types() -> list[str]:
    """The model types of the installed mlx-lm: its modules whose source defines both `Model` and `ModelArgs` (read,
    not imported: some modules exit on import when an optional package is missing)."""
    out = []
    for m in pkgutil.iter_modules(mlx_lm.models.__path__):
        spec = importlib.util.find_spec(f"mlx_lm.models.{m.name}")
        tree = ast.parse(Path(spec.origin).read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        if {"Model", "ModelArgs"} <= names:
            out.append(m.name)
    return sorted(out)


class Vocab:
    """What the drafter registry reads of a tokenizer: the ids of a vocabulary of `n` (the prompts are ids)."""

    name_or_path, eos_token_ids = "conformance", []

    def __init__(self, n: int):
        self.n = n

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(self.n)}

    def encode(self, text: str) -> list[int]:
        return [b % self.n for b in text.encode()]


@functools.lru_cache(maxsize=4)
def model(kind: str, **override):
    """A tiny model of `kind` with seeded random weights, scaled so that its next-token distributions are peaked;
    `override` replaces config fields (`vocab_size` the wrapped text model's too)."""
    config = {**CONFIGS[kind], **override}
    if "vocab_size" in override and "text_config" in config:
        config["text_config"] = {**config["text_config"], "vocab_size": override["vocab_size"]}
    module = importlib.import_module(f"mlx_lm.models.{kind}")
    mx.random.seed(SEEDS.get(kind, 0))
    m = module.Model(module.ModelArgs.from_dict(config))
    scale = SCALE.get(kind, 4.0)

    def random(w):  # a matrix a model initialises to zeros (talkie's lm_head) is drawn like a Linear's
        w = w if mx.any(w).item() else mx.random.uniform(-1, 1, w.shape) * w.shape[-1] ** -0.5
        return w * scale

    m.update(tree_map(lambda w: random(w) if w.ndim > 1 else w, m.parameters()))
    mx.eval(m.parameters())
    return m


def vocab(m) -> Vocab:
    from mlx_spec.gen.load import vocab_width

    return Vocab(vocab_width(m))


@functools.lru_cache(maxsize=8)
def reference(kind: str, prompt: str) -> tuple[list[int], list[float]]:
    """mlx-lm's greedy tokens after PROMPTS[prompt] (`generate_step`), and each one's top-2 logit gap."""
    from mlx_lm.generate import generate_step

    toks, gaps = [], []
    for tok, logprobs in generate_step(mx.array(PROMPTS[prompt]), model(kind), max_tokens=MAX_TOKENS):
        top = mx.sort(logprobs)[-2:].tolist()
        toks.append(int(tok))
        gaps.append(top[1] - top[0])
    return toks, gaps


def differs(kind: str, prompt: str, got: list[int]) -> str | None:
    """Where `got` first differs from mlx-lm's tokens (None: equal), flagging a near-tie."""
    want, gaps = reference(kind, prompt)
    if got == want:
        return None
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    gap = gaps[i] if i < len(gaps) else TIE
    hint = "its logits saturate: lower its SCALE or raise its soft cap" if gap == 0 else f"give {kind} another seed"
    tie = f" (a near-tie: gap {gap:.1e}; {hint})" if gap < TIE else ""
    mine, theirs = (x[i] if i < len(x) else "end" for x in (got, want))
    return f"{prompt} prompt, token {i}: {mine}, mlx-lm {theirs}{tie}"


def plain(kind: str, prompt: str) -> list[int]:
    """mlx-spec's greedy tokens without a drafter."""
    return [s.token for s in speculative_generate_step(PROMPTS[prompt], model(kind), None, max_tokens=MAX_TOKENS)]


class Refused(Exception):
    """The drafter was refused, in one line, before the first token."""


class Alone(Refused):
    """The rows cannot share a pass of this target (`gen.apart`): the server runs each alone, and says why once."""


def _drafter(m, spec: str):
    try:
        return build_drafter(spec, m, vocab(m))
    except MlxSpecError as e:
        raise Refused(str(e)) from None


def alone(kind: str, spec: str, prompt: str) -> tuple[list[int], Stats]:
    """mlx-spec's greedy tokens with the drafter `spec`, every round drafting, and the run's stats."""
    m, stats = model(kind), Stats()
    steps = speculative_generate_step(
        PROMPTS[prompt], m, _drafter(m, spec), max_tokens=MAX_TOKENS, adaptive=False, stats=stats
    )
    try:
        first = next(steps)
    except MlxSpecError as e:
        raise Refused(str(e)) from None
    return [first.token] + [s.token for s in steps], stats


def batched(kind: str, spec: str) -> dict[str, tuple[list[int], Stats]]:
    """Both prompts as two rows of one engine, as the server runs two requests, each with its own drafter."""
    m = model(kind)
    engine, rows = Engine(m, Planner(adaptive=False)), {}
    for name, prompt in PROMPTS.items():
        drafter = _drafter(m, spec)
        cache = new_cache(m)
        prefill_cache(m, cache, prompt[:-1], None, drafter.parts)
        row = Row.start(m, prompt, MAX_TOKENS, drafter=drafter, k_max=default_num_draft(drafter), stats=Stats())
        try:
            engine.add(row, cache)
        except MlxSpecError as e:
            raise (Alone if apart(m) is not None else Refused)(str(e)) from None
        rows[name] = row
    out: dict[int, list[int]] = {id(r): [] for r in rows.values()}
    while engine.rows:
        running = engine.rows
        for i, steps in engine.round().items():
            out[id(running[i])] += [s.token for s in steps]
        for r in [r for r in engine.rows if r.done]:
            engine.remove(r)
    return {name: (out[id(r)], r.stats) for name, r in rows.items()}


def problems(kind: str, spec: str, runs: dict[str, tuple[list[int], Stats]], together: bool = False) -> list[str]:
    """What is wrong with a drafter's runs (prompt name -> tokens, stats): a token unlike mlx-lm's, a silent fallback
    to plain decoding, a lookup that drafted nothing on a repeating prompt, rows that never shared a pass."""
    out = []
    for prompt, (toks, stats) in runs.items():
        where = differs(kind, prompt, toks)
        if where:
            out.append(where)
        if stats.fallback:
            out.append(f"{prompt} prompt: fell back to plain decoding: {stats.fallback}")
        elif spec in LOOKUPS and not stats.proposed and not (stats.left_out or "").startswith(NO_SOURCE):
            out.append(f"{prompt} prompt: drafted nothing from a prompt that repeats itself")
        if together and stats.widest < 2:
            out.append(f"{prompt} prompt: the rows never shared a pass")
    return out
