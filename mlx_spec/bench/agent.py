"""The `agent` suite kind: its suite file, and its record's summary and page (what `bench report` rebuilds).

The run itself (`agent_run.py`) starts servers through a `host.Host`, which the server's face gives it when it
registers the kind with the runner. A record's `records` hold one entry per (configuration, turn): `config`
(`none`: the target alone on mlx-spec's server, a drafter spec, or `mlx_lm.server`), `session`, `turn`, `set` (the
turn's kind: its session's format), `seq` (the order the requests were sent in), `prompt_tokens`, `cached_tokens`,
`n_tokens`, `ttft` (request sent to the first streamed text), `total` (request sent to the stream's end), `decode_tps`
(tokens after the first over the time between the first and the last streamed text), `text`, `calls`, `identical`
(the reply equals the target alone's on mlx-spec's server: text and calls), `finish`, `stats`.
"""

import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .agent_sessions import FORMATS, SessionSpec
from .common import page_head
from .report import aligned_table
from .suite import ModelRef, SuiteError, _number, _unknown, find

PLAIN = "none"  # the target alone on mlx-spec's server: the baseline of every ratio
MLX_LM_SERVER = "mlx_lm.server"  # mlx-lm's own server on the same model folder, its prompt cache on
TOP = {"description", "kind", "max_tokens", "mlx_lm_server", "prefix_cache_gb", "targets", "sessions"}
SESSION = {"format", "file", "turns", "lines", "context"}
CACHED = 0.5  # a turn counts as cached where the server had at least this share of its prompt (not a system prompt)
PREFIX_CACHE_GB = 1.0  # per server: one 16k-token conversation of a 1.5B float32 target, and the shared prefix


@dataclass
class AgentSuite:
    name: str
    path: Path
    description: str = ""
    kind: str = "agent"
    max_tokens: int = 128  # per turn
    mlx_lm_server: bool = True  # also replay every turn against `python -m mlx_lm.server`
    prefix_cache_gb: float = PREFIX_CACHE_GB
    model: str = ""
    drafts: tuple[str, ...] = ()
    sessions: list[SessionSpec] = field(default_factory=list)

    @property
    def configs(self) -> list[str]:
        """Every configuration in the order of a turn's first round: plain first, then each drafter, mlx-lm."""
        return [PLAIN, *self.drafts, *([MLX_LM_SERVER] if self.mlx_lm_server else [])]

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "description": self.description,
            "max_tokens": self.max_tokens,
            "mlx_lm_server": self.mlx_lm_server,
            "prefix_cache_gb": self.prefix_cache_gb,
            "targets": [{"model": self.model, "drafts": list(self.drafts)}],
            "sessions": [vars(s) for s in self.sessions],
        }


def is_agent(name_or_path: str) -> bool:
    """Whether a suite (by name or path) is of the agent kind; one whose file does not parse is left to its loader."""
    try:
        return tomllib.loads(find(name_or_path).read_text()).get("kind") == "agent"
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, SuiteError):
        return False


def _int(data: dict, key: str, where: str, default: int, lo: int) -> int:
    return _number(data, key, int, lo, where, default)


def load(name_or_path: str, model: str | None = None) -> AgentSuite:
    """Read and check an agent suite; every mistake is one line naming the file and the field."""
    path = find(name_or_path)
    where = f"suite file {path}"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SuiteError(f"{where}: {e}") from None
    _unknown(data, TOP, where)
    s = AgentSuite(path.stem, path, str(data.get("description", "")))
    s.max_tokens = _int(data, "max_tokens", where, s.max_tokens, 1)
    s.mlx_lm_server = data.get("mlx_lm_server", True)
    if not isinstance(s.mlx_lm_server, bool):
        raise SuiteError(f"{where}: 'mlx_lm_server' must be true or false")
    gb = data.get("prefix_cache_gb", PREFIX_CACHE_GB)
    if not isinstance(gb, int | float) or isinstance(gb, bool) or gb < 0:
        raise SuiteError(f"{where}: 'prefix_cache_gb' must be a number of at least 0, got {gb!r}")
    s.prefix_cache_gb = float(gb)
    targets = data.get("targets")
    if not isinstance(targets, list) or len(targets) != 1 or not isinstance(targets[0], dict):
        raise SuiteError(f"{where}: an agent suite needs exactly one [[targets]] table with 'model' and 'drafts'")
    t = targets[0]
    _unknown(t, {"model", "drafts"}, f"{where}, [[targets]]")
    if not isinstance(t.get("model"), str) or "@" in t["model"]:
        raise SuiteError(f"{where}, [[targets]]: 'model' must be a model name or folder (no @method)")
    drafts = t.get("drafts")
    if not isinstance(drafts, list) or not drafts or not all(isinstance(d, str) and d.strip() for d in drafts):
        raise SuiteError(f"{where}, [[targets]]: 'drafts' must be a non-empty list of drafter names")
    if any(d.strip() in (PLAIN, MLX_LM_SERVER, "") or " K=" in d or "@" in d for d in drafts):
        raise SuiteError(f"{where}, [[targets]]: 'drafts' are drafters the server takes ('none' is always measured)")
    s.model = model or t["model"]
    ModelRef.parse(s.model, where)
    s.drafts = tuple(d.strip() for d in drafts)
    sessions = data.get("sessions")
    if not isinstance(sessions, list) or not sessions:
        raise SuiteError(f"{where}: needs [[sessions]] tables with 'format' and 'file'")
    for i, x in enumerate(sessions, 1):
        sw = f"{where}, [[sessions]] #{i}"
        if not isinstance(x, dict):
            raise SuiteError(f"{sw}: must be a table")
        _unknown(x, SESSION, sw)
        if x.get("format") not in FORMATS:
            raise SuiteError(f"{sw}: 'format' must be one of {', '.join(FORMATS)}, got {x.get('format')!r}")
        if not isinstance(x.get("file"), str):
            raise SuiteError(f"{sw}: 'file' must name a standard-library module, e.g. \"textwrap\"")
        turns, lines, context = _int(x, "turns", sw, 2, 1), _int(x, "lines", sw, 0, 0), _int(x, "context", sw, 0, 0)
        s.sessions.append(SessionSpec(x["format"], x["file"], turns, lines, context))
    return s


# --------------------------------------------------------------------------- the record's summary and page


def _ratio(base: list[dict], mine: list[dict]) -> float | None:
    """Wall time of `base` over `mine` on the turns both answered (above 1: `mine` is faster)."""
    b = {r["prompt"]: r["total"] for r in base}
    pairs = [(b[r["prompt"]], r["total"]) for r in mine if r["prompt"] in b and r["total"] > 0]
    return sum(x for x, _ in pairs) / sum(y for _, y in pairs) if pairs else None


def _median(values: list) -> float | None:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def _by_session(mine: list[dict], plain: list[dict]) -> dict:
    """Per session (the same task at each context): median prompt tokens, the cached turns' median TTFT (turns
    whose prompt the server had mostly cached: at least CACHED of it; a shared system prompt alone does not count),
    median decode tokens/s and its ratio to plain's."""
    out = {}
    for session in dict.fromkeys(r["session"] for r in mine):
        m = [r for r in mine if r["session"] == session]
        decode = _median([r.get("decode_tps") or None for r in m])
        base = _median([r.get("decode_tps") or None for r in plain if r["session"] == session])
        cached = [r for r in m if (r.get("cached_tokens") or 0) >= CACHED * (r.get("prompt_tokens") or 0) > 0]
        out[session] = {
            "turns": len(m),
            "prompt_tokens_median": _median([r.get("prompt_tokens") for r in m]),
            "cached_turns": len(cached),
            "cached_ttft_median": _median([r["ttft"] for r in cached]),
            "decode_tps_median": decode,
            "decode_vs_plain": decode / base if decode and base else None,
        }
    return out


def summarize(data: dict) -> list[dict]:
    """Per configuration and turn kind: wall-time speed-up over plain and over mlx_lm.server on the same turns,
    median TTFT, decode tokens/s, and how many replies equal plain's; per session (`_by_session`): prompt tokens,
    the cached turns' TTFT, decode tokens/s and its ratio to plain's."""
    records = data["records"]
    kinds = list(dict.fromkeys(r["set"] for r in records))
    by = {c: [r for r in records if r["config"] == c] for c in dict.fromkeys(r["config"] for r in records)}

    def of(config: str, kind: str) -> list[dict]:
        return [r for r in by.get(config, []) if kind == "all" or r["set"] == kind]

    target = data["suite"]["targets"][0]["model"]
    out = []
    for config, mine in by.items():
        proposed = sum(r["stats"].get("proposed", 0) for r in mine)
        entry: dict = {
            "key": f"{target}|{config}",  # the fields `bench compare` reads of a row
            "target": target,
            "draft": config,
            "status": "ok",
            "tokens_per_second": sum(r["n_tokens"] for r in mine) / max(sum(r["total"] for r in mine), 1e-12),
            "speedup": _ratio(of(PLAIN, "all"), mine),
            "acceptance_rate": sum(r["stats"].get("accepted", 0) for r in mine) / proposed if proposed else None,
            "config": config,
            "turns": len(mine),
            "by_kind": {},
            "by_session": _by_session(mine, by.get(PLAIN, [])),
        }
        for kind in kinds + ["all"]:
            m = of(config, kind)
            if not m:
                continue
            decode = [r["decode_tps"] for r in m if r.get("decode_tps")]
            compared = [r for r in m if r.get("identical") is not None]
            entry["by_kind"][kind] = {
                "turns": len(m),
                "wall_s": sum(r["total"] for r in m),
                "vs_plain": _ratio(of(PLAIN, kind), m),
                "vs_mlx_lm": _ratio(of(MLX_LM_SERVER, kind), m),
                "ttft_median": statistics.median(r["ttft"] for r in m),
                "decode_tps_median": statistics.median(decode) if decode else None,
                "identical": sum(bool(r["identical"]) for r in compared),
                "compared": len(compared),
            }
        out.append(entry)
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


SESSION_NOTE = (
    "- per session, medians over its turns: prompt tokens as the server counted them; cached TTFT over the turns "
    "whose prompt the server had mostly cached (`cached_tokens` at least half the prompt); decode vs plain: the "
    "row's decode tok/s over plain's on the same session"
)


def session_table(data: dict) -> str:
    """Session | Draft | prompt tokens, cached turns' TTFT, decode tokens/s and its ratio to plain's: the same task
    at each context, side by side (issue 46's 16k targets)."""
    rows = []
    for session in dict.fromkeys(r["session"] for r in data["records"]):
        for e in data["summary"]:
            x = e["by_session"].get(session)
            if x is None:
                continue
            rows.append(
                [
                    session,
                    e["config"],
                    _f(x["prompt_tokens_median"], 0),
                    _f(x["cached_ttft_median"]),
                    _f(x["decode_tps_median"]),
                    "-" if e["config"] == PLAIN else _x(x["decode_vs_plain"]),
                ]
            )
    head = ["Session", "Draft", "prompt tokens", "cached TTFT s", "decode tok/s", "decode vs plain"]
    return aligned_table(head, rows)


def render(data: dict) -> str:
    """The record's page: Target | Draft | per turn kind the wall-time speed-up over plain and over mlx_lm.server,
    TTFT, decode tokens/s, replies equal to plain's."""
    data["summary"] = summarize(data)
    s = data["suite"]
    target = s["targets"][0]["model"]
    kinds = [k for k in dict.fromkeys(r["set"] for r in data["records"])]
    has_mlx = any(r["config"] == MLX_LM_SERVER for r in data["records"])
    head = ["Target", "Draft"]
    for k in kinds:
        head += [f"{k} vs plain"] + ([f"{k} vs mlx_lm.server"] if has_mlx else [])
    head += ["TTFT s (median)", "decode tok/s (median)", "same as plain"]
    rows = []
    for e in data["summary"]:
        row = [Path(target).name, e["config"]]
        for k in kinds:
            x = e["by_kind"].get(k, {})
            row += [_x(x.get("vs_plain"))] + ([_x(x.get("vs_mlx_lm"))] if has_mlx else [])
        a = e["by_kind"]["all"]
        row += [
            f"{a['ttft_median']:.2f}",
            "-" if a["decode_tps_median"] is None else f"{a['decode_tps_median']:.2f}",
            "-" if e["config"] == PLAIN else f"{a['identical']}/{a['compared']}",
        ]
        rows.append(row)
    configs = [PLAIN, *s["targets"][0]["drafts"], *([MLX_LM_SERVER] if s["mlx_lm_server"] else [])]
    sessions = ", ".join(
        f"{x['format']} {x['file']} ({x['turns']} turns"
        + (f", ~{x['context']} tokens of other modules' source" if x.get("context") else "")
        + ")"
        for x in s["sessions"]
    )
    lines = [
        *page_head(data).splitlines(),
        f"- sessions: {sessions}; at most {s['max_tokens']} tokens a turn, greedy, streamed; configurations "
        f"{', '.join(configs)}, each on its own server (its own prefix cache), turn by turn, the order rotating",
        "- a speed-up is the wall time (request sent to the stream's end, measured by the client) of the baseline "
        "over the row's on the same turns; TTFT: request sent to the first streamed text; `same as plain`: replies "
        "equal to the target alone's on mlx-spec's server (text and tool calls)",
    ]
    if data.get("mlx_lm_blas") is not None:
        lines.append(f"- mlx_lm.server's BLAS: {data['mlx_lm_blas'] or 'none preloaded'}")
    if not data.get("complete"):
        lines += ["", "**Incomplete run**: the rows below cover what was measured."]
    lines += ["", aligned_table(head, rows), "", SESSION_NOTE, "", session_table(data)]
    return "\n".join(lines) + "\n"
