"""`mlx-spec draft-search`: which drafter pays best for a target on this machine, measured, then saved.

draft-model-generation-compression concludes that the best draft balances size against acceptance;
where that balance lies depends on the machine (on this project's Linux CPU float32 is fast and
MLX's int4 slow, on Metal int4 is fast), so it is measured here instead of guessed:

1. Candidates: drafts made from the target by `convert`'s methods at a few strengths (a ladder of
   `make.convert.draft_methods()` names), every cached recipe that shares the target's tokenizer,
   and the drafters that need no draft model (ngram, suffix, self with importance-ranked layers, quant-self).
   They are measured on the calibration passages, or (`--prompt-set humaneval,edit`) on the benchmark's own
   requests, which is where a coder model's drafter should be chosen.
2. A cheap estimate for each, cheapest first: one short calibration prompt drafted at a fixed
   K = 5, giving the average accepted tokens per round and the cost per draft token, and from
   them (with a plain step timed in the same process) an estimated speed-up.
3. The most promising ones measured in full while the time budget lasts: every calibration prompt,
   average accepted tokens at K = 5 (Figure 2 of the paper), and the end-to-end speed-up of the
   engine (adaptive, as users run it) against plain decoding run right after it on the same prompt.
4. The best one measured is recommended; a converted draft is saved as a user recipe (and its
   folder) so that `mlx-spec chat --draft NAME` uses it. The hybrid (n-gram + suffix + a draft model) of
   the first draft model that beats plain decoding is measured right after it (even where suffix alone is
   faster), and that of the fastest draft model at the end, while time allows.

Drafts converted for the search are cached (`bench.variants.variant_folder`), so a rerun reuses them.
Algorithms return data; the CLI prints.
"""

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import MlxSpecError
from .common import free

K = 5  # draft length of the acceptance measurement (the paper's Figure 2)
DEFAULT_LADDER = (
    "int8",
    "int4",
    "mxfp4",
    "nf4",
    "layers-half",
    "layers-half-importance",
    "layers-quarter",
    "prune-0.25",
)
QUANT_SELF = ("int4", "int8")
DEFAULT_PROMPTS = 3
DEFAULT_MAX_TOKENS = 48
QUICK_TOKENS = 24  # tokens drafted for a candidate's cheap estimate
FULL_RESERVE = 4  # full measurements the estimates leave time for (the top 3 and a hybrid), at most half the budget
PROMPT_TOKENS = 256  # each calibration prompt is cut to this many tokens
PROMPT_SETS = ("humaneval", "edit", "prose")  # bench prompt sets that may stand in for the calibration text
MODEL_KINDS = ("variant", "recipe", "learned")  # candidates that are a draft model or head, which a hybrid can wrap
TRAIN = "train-head"  # the method of the candidate that is a head the search trains first
BUILD_S_PER_GB = 60.0  # assumed conversion time per GB of target weights, before one is measured

Log = Callable[[str], None]


class DraftSearchError(MlxSpecError):
    pass


@dataclass
class Candidate:
    name: str  # row label: a method ('int4'), a recipe, or a drafter spec ('ngram', 'quant-self:int4')
    kind: str  # "variant" (made from the target), "recipe", "drafter", "learned" (MTP, a head) or "hybrid"
    spec: str = ""  # the drafter spec the engine runs (a folder for model drafts)
    method: str | None = None  # the draft_methods() name of a variant, or TRAIN
    size_gb: float = 0.0  # weights the draft adds in memory
    status: str = "pending"
    estimate: float | None = None  # estimated speed-up from the quick run
    accepted: float | None = None  # average accepted tokens per round at K
    draft_ms: float | None = None  # milliseconds per drafted token
    tokens_per_s: float | None = None  # end-to-end, adaptive engine
    speedup: float | None = None  # over plain decoding on the same prompts, same run
    spread: list[float] = field(default_factory=list)  # per-prompt speed-ups
    by_set: dict[str, float] = field(default_factory=dict)  # mean speed-up per prompt set ('humaneval', 'edit', ...)
    identical: bool | None = None  # every greedy output equal to plain decoding's


@dataclass
class SearchResult:
    target: str
    candidates: list[Candidate]
    plain_tokens_per_s: float
    recommended: str | None  # a candidate name, or None: plain decoding
    saved: str | None = None  # what `--draft` to pass to use it
    notes: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)  # what was measured on: calibration passages or set prompts
    sets: list[str] = field(default_factory=list)  # each prompt's set: 'calibration', 'humaneval', 'edit', 'prose'

    def table(self) -> str:
        from .common import md_table

        def f(x, fmt):
            return format(x, fmt) if x is not None else "-"

        rows = [
            [
                c.name,
                c.kind,
                f(c.size_gb, ".2f"),
                f(c.accepted, ".2f"),
                f(c.draft_ms, ".0f"),
                f(c.tokens_per_s, ".2f"),
                f(c.speedup, ".2f") + ("x" if c.speedup is not None else ""),
                (f"{min(c.spread):.2f}-{max(c.spread):.2f}" if c.spread else "-"),
                f(c.estimate, ".2f"),
                c.status,
            ]
            for c in self.candidates
        ]
        head = [
            "method",
            "kind",
            "size GB",
            f"avg accepted (K={K})",
            "ms / draft token",
            "tokens/s",
            "speed-up",
            "min-max",
            "estimate",
            "status",
        ]
        sets = list(dict.fromkeys(self.sets))
        if len(sets) > 1:  # a column per set, where the search mixed them
            head[7:7] = [f"{s} speed-up" for s in sets]
            for row, c in zip(rows, self.candidates):
                row[7:7] = [f(c.by_set.get(s), ".2f") + ("x" if s in c.by_set else "") for s in sets]
        return md_table(head, rows)

    def margins(self) -> dict[str, tuple]:
        """Per prompt set: (the recommended drafter's speed-up over the best *other single* drafter measured - 1,
        that drafter's name): what combining drafters gained over the best single method, on each kind of prompt."""
        best = next((c for c in self.candidates if c.name == self.recommended), None)
        if best is None:
            return {}
        out = {}
        for s in dict.fromkeys(self.sets):
            others = [
                c for c in self.candidates if c is not best and c.kind != "hybrid" and c.identical and s in c.by_set
            ]
            if s in best.by_set and others:
                rival = max(others, key=lambda c: c.by_set[s])
                out[s] = (best.by_set[s] / rival.by_set[s] - 1, rival.name)
        return out


def minimum_seconds(step_s: float, prompts: int, max_tokens: int) -> float:
    """The time one candidate needs: its quick estimate, then K-fixed, adaptive and plain runs on every prompt."""
    return step_s * (QUICK_TOKENS + 3 * prompts * max_tokens) * 1.3


class Search:
    """One search: the loaded target, the calibration prompts, the clock."""

    def __init__(
        self,
        target: str,
        *,
        calibration=None,
        prompt_sets: Sequence[str] = (),
        budget_minutes: float = 60.0,
        prompts: int = DEFAULT_PROMPTS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        methods: Sequence[str] = DEFAULT_LADDER,
        train_minutes: float = 0.0,
        train_steps: int | None = None,
        log: Log = lambda _m: None,
    ):
        """prompt_sets: measure on the benchmark's prompts of these sets (interleaved, chat-templated) instead of
        the calibration text: the context drafters (suffix, n-gram) accept almost nothing on prose passages and
        are the best single drafters on code, so a coder model's drafter is best chosen on code requests.
        train_minutes: where no EAGLE-3 head for the target is stored, train one for this long as a candidate
        (at most half the budget; 0: the search only says how). train_steps: train that head for this many steps
        instead, whatever they take (a budget that does not hang on the machine's speed)."""
        from ..make.convert import draft_methods
        from ..make.importance import calibration_texts

        if budget_minutes <= 0:
            raise DraftSearchError(f"--budget-minutes must be > 0, got {budget_minutes}")
        if prompts < 1 or max_tokens < 1:
            raise DraftSearchError("--prompts and --max-tokens must be >= 1")
        unknown = [m for m in methods if m not in draft_methods()]
        if unknown:
            raise DraftSearchError(f"unknown method(s) {', '.join(unknown)} (known: {', '.join(draft_methods())})")
        bad = [p for p in prompt_sets if p not in PROMPT_SETS]
        if bad:
            raise DraftSearchError(f"unknown prompt set {bad[0]} (known: {', '.join(PROMPT_SETS)})")
        if prompt_sets and calibration is not None:
            raise DraftSearchError("give --calibration or --prompt-set, not both")
        if not 0 <= train_minutes <= budget_minutes / 2:
            raise DraftSearchError(
                f"--train-minutes must be between 0 and half the budget ({budget_minutes / 2:g}), got {train_minutes:g}"
            )
        self.train_minutes, self.train_steps = train_minutes, train_steps
        self.notes: list[str] = []
        self.prompt_sets = list(dict.fromkeys(prompt_sets))
        self.texts = [] if self.prompt_sets else calibration_texts(calibration)  # clear errors: missing, empty, binary
        self.target_spec, self.methods, self.log = target, list(methods), log
        self.prompts_n, self.max_tokens = prompts, max_tokens
        self.deadline = time.monotonic() + budget_minutes * 60
        self.budget_minutes = budget_minutes

    # ------------------------------------------------------------------ setup
    def load(self) -> None:
        from ..gen.cache import context_limit
        from ..named import load_model

        try:
            self.model, self.tokenizer, self.folder = load_model(self.target_spec, self.log)
        except MlxSpecError as e:
            raise DraftSearchError(f"cannot load the target '{self.target_spec}': {e}") from None
        if self.prompt_sets:
            self.prompts, self.prompt_names, self.prompt_kinds = self._set_prompts()
        else:
            ids = [self.tokenizer.encode(t)[:PROMPT_TOKENS] for t in self.texts]
            self.prompts = [p for p in ids if len(p) >= 2][: self.prompts_n]
            self.prompt_names = [f"calibration/{i}" for i in range(len(self.prompts))]
            self.prompt_kinds = ["calibration"] * len(self.prompts)
        if not self.prompts:
            raise DraftSearchError("the calibration text gives no prompt of at least 2 tokens")
        limit = context_limit(self.model)
        for ids, name in zip(self.prompts, self.prompt_names):  # said now, not after an hour of measuring
            if limit is not None and len(ids) + self.max_tokens > limit:
                raise DraftSearchError(
                    f"prompt {name} has {len(ids)} tokens: with --max-tokens {self.max_tokens} it "
                    f"does not fit the target's context of {limit}"
                )
        self.eos = list(getattr(self.tokenizer, "eos_token_ids", None) or [])
        self.run(None, self.prompts[0], 4)  # warm-up
        _, seconds, stats = self.run(None, self.prompts[0], QUICK_TOKENS)
        self.step_s = stats.generation_time / max(1, stats.generation_tokens - 1)
        need = minimum_seconds(self.step_s, len(self.prompts), self.max_tokens)
        if need > self.budget_minutes * 60:
            raise DraftSearchError(
                f"--budget-minutes {self.budget_minutes:g} is too small: one candidate needs about "
                f"{need / 60:.1f} minutes here (plain decoding at {1 / self.step_s:.1f} tokens/s, "
                f"{len(self.prompts)} prompts x {self.max_tokens} tokens)"
            )

    def _set_prompts(self):
        """(ids, names, sets) of the first prompts of the chosen benchmark sets, one of each set in turn."""
        from .prompts import PROSE_QUESTIONS, build

        per_set = -(-self.prompts_n // len(self.prompt_sets))  # ceil: the interleaving is cut to prompts_n
        n = {s: per_set if s in self.prompt_sets else 0 for s in PROMPT_SETS}
        n["prose"] = min(n["prose"], len(PROSE_QUESTIONS))
        try:
            chosen = build(self.tokenizer, n["humaneval"], n["edit"], n_prose=n["prose"])[: self.prompts_n]
        except MlxSpecError as e:
            raise DraftSearchError(f"--prompt-set: {e}") from None
        return [p.ids for p in chosen], [p.id for p in chosen], [p.set for p in chosen]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, drafter, prompt: list[int], max_tokens: int, *, adaptive: bool = True, k: int | None = None):
        """(tokens, seconds, stats) of one greedy generation, prompt processing included; with adaptive off,
        every round drafts k tokens (the acceptance of k-token drafts: the paper's measure)."""
        from ..gen.generate import Stats, speculative_generate_step

        stats = Stats(trace=[])
        t0 = time.perf_counter()
        out = [
            s.token
            for s in speculative_generate_step(
                prompt,
                self.model,
                drafter,
                max_tokens=max_tokens,
                eos_token_ids=self.eos,
                adaptive=adaptive,
                num_draft=k,
                stats=stats,
            )
        ]
        return out, time.perf_counter() - t0, stats

    # ------------------------------------------------------------------ candidates
    def candidates(self) -> list[Candidate]:
        """Every candidate, cheapest to try first."""
        from ..make.recipes import all_recipes
        from ..make.resolve import is_cached, recipe_path

        out = [Candidate(spec, "drafter", spec) for spec in ("ngram", "suffix", "self:importance")]
        out += [Candidate(f"quant-self:{f}", "drafter", f"quant-self:{f}") for f in QUANT_SELF]
        for recipe in all_recipes():
            folder = recipe_path(recipe.name)
            if folder.resolve() == Path(self.folder).resolve():
                continue
            if not is_cached(recipe):
                self.notes.append(f"recipe {recipe.name} not tried: not fetched (`mlx-spec fetch {recipe.name}`)")
            elif self._same_tokenizer(folder):
                out.append(Candidate(recipe.name, "recipe", str(folder)))
        out += self._learned()  # before the variants: a head is what prose may need, and it was asked for
        return out + [Candidate(m, "variant", method=m) for m in self.methods]

    def _learned(self) -> list[Candidate]:
        """The target's own MTP layers, the heads trained for it, or one to train (`train_minutes`)."""
        from ..models import mtp
        from ..train.job import heads_for

        out = [Candidate("mtp", "learned", "mtp")] if mtp.has_mtp(self.folder) else []
        heads = heads_for(str(self.target_spec))
        out += [Candidate(f"eagle3:{h.name}", "learned", f"eagle3:{h}") for h in heads]
        if not heads and (self.train_minutes or self.train_steps):
            out.append(Candidate(f"eagle3:{TRAIN}", "learned", method=TRAIN))
        elif not heads:
            self.notes.append(
                f"no EAGLE-3 head for {self.target_spec}: `mlx-spec train-head --target "
                f"{self.target_spec}` trains one (or --train-minutes M, here)"
            )
        return out

    def _same_tokenizer(self, folder: Path) -> bool:
        from mlx_lm.utils import load_tokenizer

        from ..gen.load import check_tokenizers

        try:
            check_tokenizers(self.tokenizer, load_tokenizer(folder))  # the tokenizer only: no weights read
            return True
        except (MlxSpecError, OSError, ValueError):
            return False

    def drafter(self, c: Candidate):
        from ..bench.variants import cached_variant, variant_folder
        from ..named import load_model, make_drafter

        if c.method == TRAIN and not c.spec:
            c.spec = f"eagle3:{self.train()}"
        if c.kind == "variant" and not c.spec and c.method is not None:
            if cached_variant(str(self.folder), c.method) is None:
                # Converting needs the target's weights again plus the format's temporaries (the 1.5B float32 to
                # mxfp4 peaks at 17 GB): the loaded target goes while it runs, so the two never add up.
                del self.model
                free()
                try:
                    c.spec = str(variant_folder(str(self.folder), c.method, self.log))
                finally:
                    self.model = load_model(str(self.folder), self.log)[0]
            else:
                c.spec = str(variant_folder(str(self.folder), c.method, self.log))
        return make_drafter(c.spec, self.model, self.tokenizer, log=self.log)

    def train(self) -> Path:
        """Train a head for the target for `train_minutes` or `train_steps` (the benchmark's prompts kept out of its
        text)."""
        from ..train.job import default_out, run
        from .prompts import PROSE_QUESTIONS, build

        held = [p.text for p in build(self.tokenizer, 164, 0, n_prose=len(PROSE_QUESTIONS))]
        out = default_out(str(self.target_spec))
        budget = f"{self.train_steps} steps" if self.train_steps else f"{self.train_minutes:g} minutes"
        self.log(f"training an EAGLE-3 head for {budget} into {out}")
        minutes = None if self.train_steps else self.train_minutes
        return run(
            self.model,
            self.tokenizer,
            str(self.target_spec),
            out,
            held=held,
            minutes=minutes,
            max_steps=self.train_steps,
            log=self.log,
        )

    # ------------------------------------------------------------------ measuring
    def quick(self, c: Candidate) -> None:
        """The cheap estimate: one prompt at K fixed."""
        from ..named import draft_model
        from .common import params_gb

        drafter = self.drafter(c)
        own = draft_model(drafter, self.model)
        c.size_gb = 0.0 if own is None or c.spec.startswith(("ngram", "self")) else params_gb(own)
        _, _, stats = self.run(drafter, self.prompts[0], QUICK_TOKENS, adaptive=False, k=K)
        c.accepted = stats.mean_accepted
        # Steady state: the rounds after the first (whose catch-up, the draft's prompt, a reply longer than this
        # short run amortizes). A round's time beyond a plain step is put down to its drafted tokens.
        rounds = [r for r in stats.trace if r["proposed"]]
        rounds = rounds[1:] or rounds
        seconds, drafted = sum(r["seconds"] for r in rounds), sum(r["proposed"] for r in rounds)
        c.draft_ms = 1000 * max(0.0, seconds - len(rounds) * self.step_s) / max(1, drafted)
        tokens = sum(r["accepted"] + 1 for r in rounds)
        c.estimate = (tokens / seconds) * self.step_s if seconds else None
        c.status = "estimated"

    def full(self, c: Candidate) -> None:
        """Every prompt: acceptance at K fixed, then the adaptive engine and plain decoding back to back."""
        drafter = self.drafter(c)  # loaded again: keeping every candidate's draft would not fit in memory
        accepted, rounds, ratios, spec_s, spec_tokens, same = 0, 0, [], 0.0, 0, True
        for prompt in self.prompts:
            out_k, _, st = self.run(drafter, prompt, self.max_tokens, adaptive=False, k=K)
            accepted, rounds = accepted + st.accepted, rounds + st.spec_rounds
            out_a, t_spec, _ = self.run(drafter, prompt, self.max_tokens)
            out_p, t_plain, _ = self.run(None, prompt, self.max_tokens)
            same = same and out_k == out_p and out_a == out_p
            ratios.append(t_plain / t_spec)
            spec_s, spec_tokens = spec_s + t_spec, spec_tokens + len(out_a)
            self._plain_s += t_plain
            self._plain_tokens += len(out_p)
        c.accepted = accepted / rounds if rounds else 0.0
        c.speedup = sum(ratios) / len(ratios)
        c.spread, c.identical = ratios, same
        for s in dict.fromkeys(self.prompt_kinds):
            mine = [r for r, k in zip(ratios, self.prompt_kinds) if k == s]
            c.by_set[s] = sum(mine) / len(mine)
        c.tokens_per_s = spec_tokens / spec_s
        c.status = "measured" if same else "WRONG OUTPUT"

    def cost_of(self, c: Candidate, full: bool) -> float:
        """Seconds this step is expected to take (building a variant that is not cached yet included)."""
        from .common import params_gb
        from .variants import cached_variant

        seconds = 0.0
        if (
            c.kind == "variant"
            and not c.spec
            and c.method is not None
            and cached_variant(str(self.folder), c.method) is None
        ):
            seconds += BUILD_S_PER_GB * params_gb(self.model)
        if c.method == TRAIN and not c.spec:
            seconds += self.train_minutes * 60
        if full:
            return seconds + minimum_seconds(self.step_s, len(self.prompts), self.max_tokens)
        return seconds + self.step_s * QUICK_TOKENS * 2

    # ------------------------------------------------------------------ the search
    def search(self, progress=None) -> SearchResult:
        self._plain_s, self._plain_tokens = 0.0, 0
        self.notes = []
        cands = self.cands = self.candidates()
        notes = self.notes
        # Estimating stops while several full measurements still fit: uncached drafts cost minutes each to build,
        # and a search that spent its budget building them would measure a single candidate in full.
        one = minimum_seconds(self.step_s, len(self.prompts), self.max_tokens)
        reserve = min(FULL_RESERVE * one, max(one, self.budget_minutes * 60 / 2))
        for c in cands:
            if self.left() - reserve < self.cost_of(c, full=False):
                c.status = "skipped: budget"
                continue
            try:
                self.quick(c)
            except MlxSpecError as e:
                c.status = f"failed: {e}"
            free()  # the candidate's draft weights go before the next one loads
            if progress:
                progress(c)
        ranked = sorted((c for c in cands if c.estimate is not None), key=lambda c: -(c.estimate or 0.0))
        for c in ranked:
            if self.left() < self.cost_of(c, full=True) and c is not ranked[0]:
                break
            self.full(c)
            free()
            if progress:
                progress(c)
            if c.kind in MODEL_KINDS and _pays(c) and not any(x.kind == "hybrid" for x in cands):
                # The first draft model that pays gets its hybrid measured at once, even where a context drafter
                # (suffix) beats it alone: copy-heavy prompts make the hybrid the likeliest winner, and the weaker
                # candidates after it must not use up its time.
                self._hybrid(c, progress)
        models = [c for c in cands if c.kind in MODEL_KINDS and _pays(c)]
        if models:  # and that of the best-paying draft model, if it is another one
            self._hybrid(max(models, key=lambda c: c.speedup or 0.0), progress)
        best = self._best(cands)
        result = self.result(best)
        if best is None:
            notes.append("no candidate was faster than plain decoding on this machine: use no --draft")
        return result

    def _hybrid(self, inner: Candidate, progress=None) -> None:
        """Measure the hybrid (n-gram + suffix + `inner`, a draft model) if it is not yet and time allows."""
        name = f"hybrid:{inner.name}"
        if inner.kind not in MODEL_KINDS or any(c.name == name for c in self.cands):
            return
        if self.left() < self.cost_of(inner, full=True):
            if (note := f"{name} not measured: budget") not in self.notes:  # asked early, and again at the end
                self.notes.append(note)
            return
        hybrid = Candidate(name, "hybrid", f"hybrid:{inner.spec}", size_gb=inner.size_gb)
        self.cands.append(hybrid)
        self.full(hybrid)
        free()
        if progress:
            progress(hybrid)

    def result(self, best: Candidate | None = None) -> SearchResult:
        """The search so far (every candidate, measured or not) with `best` recommended."""
        plain_tps = self._plain_tokens / self._plain_s if self._plain_s else 1 / self.step_s
        return SearchResult(
            str(self.target_spec),
            self.cands,
            plain_tps,
            best.name if best else None,
            notes=self.notes,
            prompts=list(self.prompt_names),
            sets=list(self.prompt_kinds),
        )

    @staticmethod
    def _best(cands: list[Candidate]) -> Candidate | None:
        ok = [c for c in cands if _pays(c)]
        return max(ok, key=lambda c: c.speedup or 0.0) if ok else None


def _pays(c: Candidate) -> bool:
    """Measured lossless and faster than plain decoding."""
    return c.speedup is not None and bool(c.identical) and c.speedup > 1.0


def save(search: Search, result: SearchResult, name: str | None = None) -> str | None:
    """Make the recommendation usable as `--draft X`; returns X. A converted draft becomes a user recipe whose
    folder is the search's own conversion (nothing is converted twice)."""
    from ..make.convert import draft_methods
    from ..make.paths import atomic_dir
    from ..make.recipes import find, write_user_recipe
    from ..make.resolve import recipe_path

    best = next((c for c in result.candidates if c.name == result.recommended), None)
    if best is None:
        return None
    if best.kind in ("drafter", "recipe", "learned"):
        result.saved = best.name if best.kind == "recipe" else best.spec
        return result.saved
    if best.kind == "hybrid":
        inner = next(c for c in result.candidates if f"hybrid:{c.name}" == best.name)
    else:
        inner = best
    if inner.kind in ("recipe", "learned"):
        result.saved = f"hybrid:{inner.name if inner.kind == 'recipe' else inner.spec}"
        return result.saved
    options = dict(draft_methods()[inner.method])
    if (fraction := options.pop("keep_fraction", None)) is not None:
        options["keep_layers"] = max(1, round(len(search.model.layers) * fraction))
    recipe_name = name or f"{Path(str(search.folder)).name}-draft"
    target_recipe = search.target_spec if find(search.target_spec) else None
    write_user_recipe(
        recipe_name,
        f"draft-search: {inner.method} of {search.target_spec}",
        options,
        base=target_recipe,
        source=None if target_recipe else str(search.folder),
    )
    dest = recipe_path(recipe_name)
    with atomic_dir(dest, force=True) as tmp:
        shutil.copytree(inner.spec, tmp, dirs_exist_ok=True)
    result.saved = recipe_name if best is inner else f"hybrid:{recipe_name}"
    return result.saved


def result_path(out) -> Path:
    return Path(out) / f"draft-search-{time.strftime('%Y%m%d-%H%M%S')}.json"


def write_json(result: SearchResult, path: Path, *, partial: bool = False) -> Path:
    """Write (atomically) the result; `partial` marks a search still running, rewritten after every candidate."""
    from ..make.paths import atomic_file
    from .common import machine_info

    tmp = atomic_file(path)
    tmp.write_text(
        json.dumps({"kind": "draft-search", "partial": partial, "machine": machine_info(), **asdict(result)}, indent=1)
    )
    tmp.replace(path)
    return path
