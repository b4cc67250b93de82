"""Benchmark suites: named, declarative TOML files (`suites/`), read and checked before anything loads.

A suite says what to measure, never how: models, drafters, prompt set, token budget, sampling.
A user copies one (`mlx-spec bench list` shows where they are), edits it and runs it by path.
Every mistake in a file is one line naming the file and the field, raised before a model loads.
"""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MlxSpecError
from .roofline import BANDWIDTH_GB

SUITES_DIR = Path(__file__).parent / "suites"
PROMPT_SETS = ("humaneval", "edit", "prose", "prefix", "ptq")
# table: the M3 Max layout (target alone, then each draft); roofline: plain decoding against the memory roofline;
# ngram: ANPD's sweep of the n-gram drafter's K and N (its rows come from `sweeps`, at fixed K: adaptive = false);
# compression: drafts made from the target by each of convert's methods, at each K of `k`;
# quality: plain sampling of each target over `temps` x `top_ks` (memory, speed, duplicate content words)
# predict: the speed-up a draft would give each target, from costs measured here and the first target's acceptance
# cluster: plain sharded decoding against each draft over `mlx.launch`'s ranks at each simulated link latency
KINDS = ("table", "roofline", "ngram", "compression", "quality", "predict", "cluster")
TOP = {
    "description",
    "kind",
    "max_tokens",
    "repeats",
    "temp",
    "top_p",
    "top_k",
    "num_draft",
    "adaptive",
    "prompts",
    "targets",
    "sweeps",
    "k",
    "methods",
    "temps",
    "top_ks",
    "bandwidth_gb",
    "latencies_us",
}
TARGET = {"model", "drafts"}
SWEEP = {"k", "n"}


class SuiteError(MlxSpecError):
    """A suite that does not exist or a suite file with a mistake in it."""


@dataclass(frozen=True)
class ModelRef:
    """A model spec with an optional draft method of `convert`: `qwen2.5-coder-1.5b@int8`, `...@layers-half`."""

    spec: str
    quant: str | None = None  # a key of make.convert.draft_methods(); None: as the source is

    @classmethod
    def parse(cls, text: str, where: str) -> "ModelRef":
        from .variants import methods

        spec, sep, quant = text.rpartition("@") if "@" in text else (text, "", "")
        if sep and quant not in methods():
            raise SuiteError(f"{where}: unknown method '{quant}' in '{text}' (convert offers {', '.join(methods())})")
        if not spec.strip():
            raise SuiteError(f"{where}: empty model name in '{text}'")
        return cls(spec.strip(), quant or None)

    def __str__(self) -> str:
        return f"{self.spec}@{self.quant}" if self.quant else self.spec


@dataclass(frozen=True)
class Target:
    model: ModelRef
    drafts: tuple[str, ...]  # drafter specs as `generate --draft` takes them, model drafts as MODEL[@QUANT]


@dataclass
class Suite:
    name: str
    path: Path
    kind: str
    description: str = ""
    max_tokens: int = 64
    repeats: int = 1
    temp: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    num_draft: int | None = None
    adaptive: bool = True  # the planner picks each round's length; false: always K (what a K sweep measures)
    sweeps: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # ngram: (K values, N values)
    ks: tuple[int, ...] = ()  # compression: the fixed K of each row
    methods: tuple[str, ...] = ()  # compression: convert's draft methods to measure (default: all of them)
    temps: tuple[float, ...] = ()  # quality: the temperatures ...
    top_ks: tuple[int, ...] = ()  # ... and top-k values of its grid
    bandwidth_gb: float = BANDWIDTH_GB  # roofline: GB read per pass of the bandwidth measurement
    latencies_us: tuple[float, ...] = ()  # cluster: the simulated link latencies, µs waited after each collective
    prompts: dict[str, int] = field(default_factory=lambda: {"humaneval": 1, "edit": 1, "prose": 1})
    targets: list[Target] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "description": self.description,
            "max_tokens": self.max_tokens,
            "repeats": self.repeats,
            "temp": self.temp,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "num_draft": self.num_draft,
            "adaptive": self.adaptive,
            "prompts": dict(self.prompts),
            "sweeps": [{"k": list(k), "n": list(n)} for k, n in self.sweeps],
            "k": list(self.ks),
            "methods": list(self.methods),
            "temps": list(self.temps),
            "top_ks": list(self.top_ks),
            "targets": [{"model": str(t.model), "drafts": list(t.drafts)} for t in self.targets],
        }
        if self.kind == "cluster":
            d["latencies_us"] = list(self.latencies_us)
        if self.bandwidth_gb != BANDWIDTH_GB:  # only when set, so runs made before the field existed still resume
            d["bandwidth_gb"] = self.bandwidth_gb
        return d

    def rows(self, target: Target) -> list[dict]:
        """Each row after the target alone (quality suites: every row), in order: its drafter spec (`draft`),
        and where the row sets its own, its K (`k`) and sampling (`temp`, `top_k`)."""
        if self.kind == "compression":
            return [{"draft": f"{target.model.spec}@{m}", "k": k} for m in self.methods for k in self.ks]
        if self.kind == "ngram":
            grid = dict.fromkeys((f"ngram:{n}", k) for ks, ns in self.sweeps for n in ns for k in ks)
            return [{"draft": d, "k": k} for d, k in grid]
        if self.kind == "quality":
            return [{"draft": None, "temp": t, "top_k": k} for t in self.temps for k in self.top_ks]
        return [split_k(d) for d in target.drafts]


# how a row's K is used beside the planner's default (at most K): an ablation's rows (`suites/ablation.toml`)
PLANNERS = ("", "fixed", "onoff")


def split_k(draft: str) -> dict:
    """A table row from a drafts entry: 'DRAFT' or 'DRAFT K=n' (the row drafts n tokens a round: mlx-lm's
    speculative decoding always, our engine at most); 'DRAFT K=n fixed': our engine always n, no planner;
    'DRAFT K=n onoff': our engine n or none, as its planner finds pays."""
    head, sep, k = draft.rpartition(" K=")
    k, _, planner = k.partition(" ")
    if sep and k.isdigit() and int(k) >= 1 and planner in PLANNERS:
        return {"draft": head.strip(), "k": int(k), **({"planner": planner} if planner else {})}
    return {"draft": draft}


def retarget(targets: list[Target], model: str) -> list[Target]:
    """The targets' rows, all on `model` (each draft once, in order)."""
    drafts = tuple(dict.fromkeys(d for t in targets for d in t.drafts))
    return [Target(ModelRef.parse(model, "--model"), drafts)]


def builtin() -> list[Path]:
    """The suites that come with mlx-spec, by name."""
    return sorted(SUITES_DIR.glob("*.toml"))


def find(name_or_path: str) -> Path:
    """A built-in suite by name, or a suite file by path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.parent != Path("."):
        if not p.is_file():
            raise SuiteError(f"no suite file {p}")
        return p
    match = SUITES_DIR / f"{name_or_path}.toml"
    if not match.is_file():
        names = ", ".join(x.stem for x in builtin())
        raise SuiteError(f"unknown suite '{name_or_path}' (built in: {names}; or give a path to a .toml file)")
    return match


def _number(data: dict, key: str, kind, lo, where: str, default):
    if key not in data:
        return default
    v = data[key]
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise SuiteError(f"{where}: '{key}' must be {'a number' if kind is float else 'an integer'}, got {v!r}")
    if v < lo:
        raise SuiteError(f"{where}: '{key}' must be at least {lo}, got {v}")
    return v


def _unknown(data: dict, known: set, where: str) -> None:
    extra = sorted(set(data) - known)
    if extra:
        raise SuiteError(f"{where}: unknown field '{extra[0]}' (known: {', '.join(sorted(known))})")


def load(name_or_path: str) -> Suite:
    """Read and check a suite; every mistake is one line that names the file and the field."""
    path = find(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SuiteError(f"suite file {path}: {e}") from None
    where = f"suite file {path}"
    _unknown(data, TOP, where)
    kind = data.get("kind")
    if kind not in KINDS:
        raise SuiteError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    s = Suite(name=path.stem, path=path, kind=kind, description=str(data.get("description", "")))
    s.max_tokens = _number(data, "max_tokens", int, 1, where, s.max_tokens)
    s.repeats = _number(data, "repeats", int, 1, where, s.repeats)
    s.temp = _number(data, "temp", float, 0.0, where, s.temp)
    s.top_p = _number(data, "top_p", float, 0.0, where, s.top_p)
    s.top_k = _number(data, "top_k", int, 0, where, s.top_k)
    s.num_draft = _number(data, "num_draft", int, 1, where, None)
    s.bandwidth_gb = _number(data, "bandwidth_gb", float, 0.001, where, s.bandwidth_gb)
    if "adaptive" in data:
        if not isinstance(data["adaptive"], bool):
            raise SuiteError(f"{where}: 'adaptive' must be true or false, got {data['adaptive']!r}")
        s.adaptive = data["adaptive"]
    _kind_fields(data, kind, where)
    s.sweeps = _sweeps(data, kind, where)
    s.ks, s.methods = _compression(data, kind, where)
    s.temps, s.top_ks = _quality(data, kind, where)
    if kind == "cluster":
        if not _numbers(data.get("latencies_us"), float, 0.0):
            raise SuiteError(f"{where}: 'latencies_us' must be a list of latencies >= 0, e.g. [50, 100, 300]")
        s.latencies_us = tuple(float(x) for x in data["latencies_us"])
    if s.top_p > 1.0:
        raise SuiteError(f"{where}: 'top_p' must be at most 1, got {s.top_p}")
    s.prompts = _prompts(data.get("prompts", s.prompts), where)
    s.targets = _targets(data.get("targets"), kind, s.temp, where)
    return s


def _prompts(prompts, where: str) -> dict[str, int]:
    """The [prompts] table's count per prompt set, each within what the set has."""
    if not isinstance(prompts, dict):
        raise SuiteError(f"{where}: 'prompts' must be a table like {{ humaneval = 2, edit = 1, prose = 1 }}")
    _unknown(prompts, set(PROMPT_SETS), f"{where}, [prompts]")
    counts = {k: _number(prompts, k, int, 0, f"{where}, [prompts]", 0) for k in PROMPT_SETS}
    from .prompts import PREFIXES, PROSE_QUESTIONS, PTQ_PROMPTS

    for name, have in (("prose", len(PROSE_QUESTIONS)), ("prefix", len(PREFIXES)), ("ptq", len(PTQ_PROMPTS))):
        if counts[name] > have:
            raise SuiteError(f"{where}, [prompts]: '{name}' can be at most {have}, got {counts[name]}")
    if not sum(counts.values()):
        raise SuiteError(f"{where}: 'prompts' asks for no prompt at all")
    return counts


def _targets(targets, kind: str, temp: float, where: str) -> list[Target]:
    """The [[targets]] tables: each a model and the drafts this kind of suite takes."""
    if not isinstance(targets, list) or not targets:
        raise SuiteError(f"{where}: needs at least one [[targets]] table with a 'model'")
    out = []
    for i, t in enumerate(targets, 1):
        tw = f"{where}, [[targets]] #{i}"
        if not isinstance(t, dict):
            raise SuiteError(f"{tw}: must be a table")
        _unknown(t, TARGET, tw)
        if kind not in ("table", "predict", "cluster") and t.get("drafts"):
            why = {
                "ngram": "its rows come from 'sweeps'",
                "compression": "its drafts are made from the target",
                "roofline": "it measures plain decoding",
                "quality": "it measures plain sampling",
            }[kind]
            raise SuiteError(f"{tw}: a {kind} suite has no 'drafts' ({why})")
        if not isinstance(t.get("model"), str):
            raise SuiteError(f"{tw}: 'model' must be a model name, e.g. \"qwen2.5-coder-1.5b@int8\"")
        drafts = t.get("drafts", [])
        if not isinstance(drafts, list) or not all(isinstance(d, str) and d.strip() for d in drafts):
            raise SuiteError(
                f'{tw}: \'drafts\' must be a list of drafter names, e.g. ["ngram", "qwen2.5-coder-0.5b@int4"]'
            )
        for d in drafts:
            if " K=" in d and "k" not in split_k(d):
                raise SuiteError(
                    f"{tw}: '{d}': K must be an integer >= 1, then nothing, 'fixed' or 'onoff', as in \"MODEL K=3\""
                )
            d = split_k(d)["draft"]
            if (d.startswith("mlx-lm-spec:") or d == "mlx-lm") and (temp or kind != "table"):
                raise SuiteError(f"{tw}: '{d}' (mlx-lm's own decoding) runs greedy table suites only")
            if "@" in d:
                ModelRef.parse(d.removeprefix("hybrid:").removeprefix("mlx-lm-spec:"), tw)
        out.append(Target(ModelRef.parse(t["model"], tw), tuple(d.strip() for d in drafts)))
    return out


KIND_FIELDS = {
    "roofline": ("bandwidth_gb",),
    "ngram": ("sweeps",),
    "compression": ("k", "methods"),
    "quality": ("temps", "top_ks"),
    "cluster": ("latencies_us",),
}


def _kind_fields(data: dict, kind: str, where: str) -> None:
    """A field of another kind of suite is a mistake, not something to ignore."""
    for other, names in KIND_FIELDS.items():
        for name in names:
            if other != kind and name in data:
                raise SuiteError(f"{where}: '{name}' belongs to {other} suites, not {kind}")


def _numbers(v, kind, lo: float, hi: float = float("inf")) -> bool:
    """Whether v is a non-empty list of `kind` (int or float: ints welcome) values in [lo, hi]."""
    ok = (int,) if kind is int else (int, float)
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(x, ok) and not isinstance(x, bool) and lo <= x <= hi for x in v)
    )


def _sweeps(data: dict, kind: str, where: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    from ..gen.registry import NGRAM_N

    raw = data.get("sweeps")
    if kind != "ngram":
        return []
    if not isinstance(raw, list) or not raw:
        raise SuiteError(f"{where}: an ngram suite needs [[sweeps]] tables with 'k' and 'n' lists")
    out = []
    for i, sw in enumerate(raw, 1):
        sw_where = f"{where}, [[sweeps]] #{i}"
        if not isinstance(sw, dict):
            raise SuiteError(f"{sw_where}: must be a table with 'k' and 'n' lists")
        _unknown(sw, SWEEP, sw_where)
        for name, lo, hi in (("k", 1, 64), ("n", NGRAM_N[0], NGRAM_N[1])):
            if not _numbers(sw.get(name), int, lo, hi):
                raise SuiteError(
                    f"{sw_where}: '{name}' must be a list of integers in [{lo}, {hi}], got {sw.get(name)!r}"
                )
        out.append((tuple(sw["k"]), tuple(sw["n"])))
    return out


def _compression(data: dict, kind: str, where: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    from .variants import methods as all_methods

    if kind != "compression":
        return (), ()
    if not _numbers(data.get("k"), int, 1):
        raise SuiteError(f"{where}: 'k' must be a list of draft lengths >= 1, e.g. k = [5, 10]")
    known = all_methods()
    methods = data.get("methods", list(known))
    if not isinstance(methods, list) or not methods:
        raise SuiteError(f"{where}: 'methods' must be a list of convert's methods ({', '.join(known)})")
    for m in methods:
        if m not in known:
            raise SuiteError(f"{where}: 'methods' has '{m}', which convert does not offer ({', '.join(known)})")
    return tuple(data["k"]), tuple(methods)


def _quality(data: dict, kind: str, where: str) -> tuple[tuple[float, ...], tuple[int, ...]]:
    if kind != "quality":
        return (), ()
    if not _numbers(data.get("temps"), float, 1e-6):
        raise SuiteError(f"{where}: 'temps' must be a list of temperatures > 0, e.g. temps = [0.2, 0.6, 1.0]")
    if not _numbers(data.get("top_ks"), int, 1):
        raise SuiteError(f"{where}: 'top_ks' must be a list of integers >= 1, e.g. top_ks = [1, 20, 200]")
    return tuple(float(t) for t in data["temps"]), tuple(data["top_ks"])
