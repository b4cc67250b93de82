"""The speculative benchmark: every drafter config on HumanEval and code-edit prompts, as ratios of plain decoding."""

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import (
    RunFile,
    first_mismatch,
    free,
    machine_info,
    mlx_lm_spec_stream,
    mlx_lm_stream,
    ours_stream,
    params_gb,
    rounds_from_flags,
    time_stream,
)
from .prompts import WARMUP_PROMPT, Prompt, build, chat_ids
from .report import spec_markdown, summarize

if TYPE_CHECKING:
    import mlx.nn as nn

    from ..gen.drafters.base import Drafter

BASELINE = "plain"  # our engine with no drafter: every speed ratio divides by it
CONFIGS = (
    "plain",
    "mlx-lm",
    "mlx-lm-spec",
    "model-f32",
    "model-f32-fullhead",
    "model-int8",
    "model-int4",
    "ngram",
    "suffix",
    "self",
    "quant-self",
    "hybrid",
)
FULL_HEAD = "-fullhead"  # a model config drafting with its whole output head (no vocabulary subset)
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFTS = {"f32": "qwen2.5-coder-0.5b", "int8": "qwen2.5-coder-0.5b-int8", "int4": "qwen2.5-coder-0.5b-int4"}
DEFAULT_MAX_TOKENS = 128
DEFAULT_MLX_K = 3  # mlx-lm's num_draft_tokens: its fastest fixed K for the Qwen 1.5B/0.5B pair on this CPU
WARMUP_TOKENS = 8

Log = Callable[[str], None]


@dataclass
class SpecSettings:
    """Everything that decides what the speculative benchmark measures."""

    target: str = DEFAULT_TARGET
    drafts: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_DRAFTS))
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    humaneval: int = 20
    edit: int = 20
    prose: int = 6
    humaneval_file: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    num_draft: int | None = None  # None: each drafter kind's default (gen.registry.DEFAULT_K)
    mlx_k: int = DEFAULT_MLX_K
    self_spec: str | None = None  # None: 'self' (half the target's layers)
    hybrid_spec: str | None = None  # None: 'hybrid:<f32 draft>'
    adaptive: bool = True
    ignore_eos: bool = False  # False: every config stops at the tokenizer's EOS, like a user's run


class Config:
    """One benchmarked way to generate: builds its drafter once, then streams (token, from_draft) per prompt."""

    def __init__(self, name: str, bench: "SpecBench"):
        self.name, self.bench = name, bench
        self.drafter: Drafter | None = None
        self.draft_model: nn.Module | None = None
        self.k: int | None = None  # draft tokens per round; None: no drafter
        self.setup: dict = {}

    def prepare(self) -> None:
        """Load what this config needs (drafter, draft model); raises if it cannot run."""
        from ..gen.drafters.self_draft import SelfDrafter
        from ..gen.load import check_tokenizers
        from ..gen.registry import default_num_draft
        from ..gen.registry import parse as parse_spec
        from ..named import load_model, make_drafter

        s, b = self.bench.settings, self.bench
        t0 = time.perf_counter()
        spec = None
        if self.name.startswith("model-"):
            spec = s.drafts[self.name.removeprefix("model-").removesuffix(FULL_HEAD)]
        elif self.name in ("ngram", "suffix"):
            spec = self.name
        elif self.name == "self":
            spec = s.self_spec or "self"
        elif self.name == "quant-self":
            spec = "quant-self"  # int4, QSpec's draft precision
        elif self.name == "hybrid":
            spec = s.hybrid_spec or f"hybrid:{s.drafts['f32']}"
        elif self.name == "mlx-lm-spec":
            shared = next((c for c in b.configs.values() if c.setup.get("model_spec") == s.drafts["f32"]), None)
            if shared is not None:  # the same weights: mlx-lm makes its own caches, so one copy serves both
                self.draft_model = _drafter_model(shared.drafter)
                self.setup["shares_weights_with"] = shared.name
            else:
                self.draft_model, draft_tok, _ = load_model(s.drafts["f32"], b.log)
                check_tokenizers(b.tokenizer, draft_tok)
            self.k = s.mlx_k
            spec = s.drafts["f32"]
        elif self.name not in (BASELINE, "mlx-lm"):
            raise ValueError(f"unknown config '{self.name}' (known: {', '.join(CONFIGS)})")
        if spec is not None and self.name != "mlx-lm-spec":
            self.k = s.num_draft or default_num_draft(spec)  # the same defaults as `mlx-spec generate`
            inner = spec.removeprefix("hybrid:")
            if parse_spec(inner).kind == "model" and inner not in b.loaded:
                model, tok, _ = load_model(inner, b.log)
                b.loaded[inner] = (model, tok)  # one copy of each draft serves every config using it
            self.drafter = make_drafter(
                spec, b.target, b.tokenizer, loaded=b.loaded, log=b.log, subset_head=not self.name.endswith(FULL_HEAD)
            )
        own = self.draft_model if self.draft_model is not None else _drafter_model(self.drafter)
        if own is b.target:
            own = None  # self drafting: no weights of its own
        self.setup.update(
            spec=spec,
            k=self.k,
            adaptive=s.adaptive if self.drafter is not None else None,
            setup_s=time.perf_counter() - t0,
            model_spec=spec.removeprefix("hybrid:") if own is not None and spec is not None else None,
            # draft weights this config adds to the target's in memory
            draft_weights_gb=params_gb(own) if own is not None and "shares_weights_with" not in self.setup else 0.0,
        )
        if isinstance(self.drafter, SelfDrafter):
            self.setup["layers"] = list(self.drafter.layers)

    def stream(self, ids: list[int], max_tokens: int, stats):
        """A fresh (token, from_draft) generator for one prompt."""
        b, s = self.bench, self.bench.settings
        if self.name == "mlx-lm":
            return mlx_lm_stream(ids, b.target, max_tokens)
        if self.name == "mlx-lm-spec":
            return mlx_lm_spec_stream(ids, b.target, self.draft_model, max_tokens, s.mlx_k)
        kwargs = dict(max_tokens=max_tokens, eos_token_ids=b.eos, adaptive=s.adaptive)
        if self.k:
            kwargs["num_draft"] = self.k
        return ours_stream(ids, b.target, self.drafter, stats=stats, **kwargs)


def _drafter_model(drafter):
    """The draft model a model or hybrid drafter runs, else None."""
    inner = drafter.parts[-1] if drafter is not None else None
    return None if getattr(inner, "name", "") == "self" else getattr(inner, "model", None)  # self: the target's own


class SpecBench:
    """Loads the target, prepares each config, and runs every config on every prompt."""

    def __init__(self, settings: SpecSettings, out: str, log: Log = lambda _m: None):
        self.settings, self.log = settings, log
        if BASELINE not in settings.configs:
            settings.configs = [BASELINE] + list(settings.configs)  # the ratios need it
        self.run = RunFile("spec", Path(out), {"machine": machine_info(), "settings": asdict(settings)})
        self.configs: dict[str, Config] = {}
        self.records: list[dict] = []
        self.target: Any = None  # the model and its tokenizer, set by `load`
        self.tokenizer: Any = None
        self.loaded: dict[str, tuple] = {}  # draft spec -> (model, tokenizer), shared across configs

    def load(self) -> None:
        from ..named import load_model

        t0 = time.perf_counter()
        self.target, self.tokenizer, folder = load_model(self.settings.target, self.log)
        self.eos = () if self.settings.ignore_eos else tuple(self.tokenizer.eos_token_ids)
        self.run.data["target"] = {
            "spec": self.settings.target,
            "folder": str(folder),
            "layers": len(self.target.layers),
            "load_s": time.perf_counter() - t0,
            "weights_gb": params_gb(self.target),
        }
        self.run.data["setup"] = {}
        self.run.data["errors"] = []
        # mlx-lm-spec last, so it can borrow a draft model another config has loaded already.
        for name in sorted(self.settings.configs, key=lambda c: c == "mlx-lm-spec"):
            cfg = Config(name, self)
            try:
                cfg.prepare()
                self._warm(cfg)
                self.configs[name] = cfg
                self.run.data["setup"][name] = cfg.setup
                self.log(f"ready: {name} {cfg.setup}")
            except Exception as e:  # a config that cannot start is an error row, never the end of the run
                self._error(name, None, e)
            self.run.flush()

    def _warm(self, cfg: Config) -> None:
        """One short untimed generation, so first-call costs (allocation, kernels, page-in) are not timed."""
        from ..gen.stats import Stats

        ids = chat_ids(self.tokenizer, WARMUP_PROMPT)
        time_stream(lambda: cfg.stream(ids, WARMUP_TOKENS, Stats()), WARMUP_TOKENS, self.eos)

    def _error(self, config: str, prompt: str | None, e: BaseException) -> None:
        msg = f"{type(e).__name__}: {e}"
        self.log(f"ERROR {config}{' on ' + prompt if prompt else ''}: {msg}")
        self.run.data["errors"].append(
            {"config": config, "prompt": prompt, "error": msg, "traceback": traceback.format_exc(limit=8)}
        )

    def run_prompt(self, i: int, n: int, p: Prompt) -> None:
        """Every ready config on one prompt (order rotated per prompt), then the lossless check against plain."""
        from ..gen.stats import Stats

        names = [c for c in self.settings.configs if c in self.configs]
        order = names[i % len(names) :] + names[: i % len(names)]
        rows: dict[str, dict] = {}
        for name in order:
            cfg, stats = self.configs[name], Stats()
            row: dict[str, Any] = {
                "set": p.set,
                "prompt": p.id,
                "config": name,
                "prompt_tokens": len(p.ids),
                "ok": False,
            }
            try:
                stream = partial(cfg.stream, p.ids, self.settings.max_tokens, stats)
                t = time_stream(stream, self.settings.max_tokens, self.eos)
                row.update(ok=True, **t.as_dict())
                if name == "mlx-lm-spec":
                    row["stats"] = rounds_from_flags(t.from_draft, self.settings.mlx_k, self.settings.max_tokens)
                elif name != "mlx-lm":
                    row["stats"] = stats.as_dict()
            except Exception as e:
                self._error(name, p.id, e)
                row["error"] = f"{type(e).__name__}: {e}"
            rows[name] = row
        base = rows.get(BASELINE)
        for name, row in rows.items():
            if row["ok"] and base and base["ok"]:
                pos = first_mismatch(base["tokens"], row["tokens"])
                row["identical"] = pos is None
                row["first_mismatch"] = pos
                if pos is not None:
                    row["mismatch_context"] = {
                        "plain": self.tokenizer.decode(base["tokens"][max(0, pos - 8) : pos + 8]),
                        name: self.tokenizer.decode(row["tokens"][max(0, pos - 8) : pos + 8]),
                    }
            self.records.append(row)
            self.log(_progress(i, n, row))
        if base and base["ok"]:
            self.run.data.setdefault("outputs", {})[p.id] = self.tokenizer.decode(base["tokens"])

    def execute(self, prompts: list[Prompt]) -> str:
        """Run all prompts, flushing after each; returns the markdown report."""
        self.run.data["prompts"] = [{"set": p.set, "id": p.id, "tokens": len(p.ids), "text": p.text} for p in prompts]
        self.run.data["records"] = self.records
        try:
            for i, p in enumerate(prompts):
                self.run_prompt(i, len(prompts), p)
                self._publish()
            self.run.data["complete"] = True
        finally:
            md = self._publish()
        return md

    def _publish(self) -> str:
        self.run.data["summary"] = summarize(self.records, self.settings.configs, BASELINE)
        self.run.flush()
        md = spec_markdown(self.run.data, BASELINE)
        self.run.write_markdown(md)
        return md

    def close(self) -> None:
        self.configs.clear()
        self.target = None
        free()


def _progress(i: int, n: int, row: dict) -> str:
    head = f"[{i + 1}/{n}] {row['prompt']:<24} {row['config']:<12}"
    if not row["ok"]:
        return f"{head} ERROR {row.get('error', '')}"
    drafted = 100 * row["n_from_draft"] / row["n_tokens"] if row["n_tokens"] else 0.0
    same = {True: "identical", False: f"MISMATCH at token {row.get('first_mismatch')}", None: "no baseline"}
    return (
        f"{head} {row['n_tokens']:>4} tok  {row['total']:6.2f} s  {row['decode_tps']:6.2f} tok/s  "
        f"{drafted:5.1f}% drafted  {same[row.get('identical')]}"
    )


def run_spec(settings: SpecSettings, out: str, log: Log = lambda _m: None) -> RunFile:
    """Load, warm up, run every config on every prompt; returns the run (JSON and markdown written)."""
    bench = SpecBench(settings, out, log)
    try:
        bench.load()
        prompts = build(bench.tokenizer, settings.humaneval, settings.edit, settings.humaneval_file, settings.prose)
        log(
            f"{len(prompts)} prompts x {len(bench.configs)} configs, max {settings.max_tokens} tokens; "
            f"writing {bench.run.json_path}"
        )
        bench.execute(prompts)
    except KeyboardInterrupt:
        log(f"interrupted: the prompts finished so far are in {bench.run.json_path} and {bench.run.md_path}")
        raise
    finally:
        bench.close()
    return bench.run


__all__ = ["SpecSettings", "run_spec", "CONFIGS", "BASELINE"]
