"""`mlx-spec bench compare A.json B.json`: the change per row between two suite runs.

Before and after a change on one machine, or one laptop against another: rows are matched by
their key (target and draft as the suite names them), so both runs must come from suites that
share rows; a row only one run has is listed as such.
"""

from pathlib import Path

from .common import machine_line
from .report import aligned_table
from .results import ResultError, check_current, read

COLUMNS = ("Target", "Draft", "Token/s A", "Token/s B", "Change", "Speed-up A", "Speed-up B", "Acceptance A → B")


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def compare(a_path, b_path) -> str:
    """A markdown report: both machines, then one line per row with tokens/s, the change, and the speed-ups."""
    a, b = read(a_path), read(b_path)
    if a["schema"] != b["schema"]:
        raise ResultError(
            f"{a_path} has schema {a['schema']} and {b_path} has {b['schema']}: only runs with the same schema compare"
        )
    a, b = check_current(a, a_path), check_current(b, b_path)
    rows_a = {e["key"]: e for e in a["summary"]}
    rows_b = {e["key"]: e for e in b["summary"]}
    keys = list(rows_a) + [k for k in rows_b if k not in rows_a]
    if not set(rows_a) & set(rows_b):
        raise ResultError(f"{a_path} and {b_path} share no row (suites {a['suite']['name']} and {b['suite']['name']})")
    lines: list[list[str]] = []
    for k in keys:
        ea, eb = rows_a.get(k), rows_b.get(k)
        e = ea or rows_b[k]
        draft = "N/A" if e["draft"] == "none" else e["draft"]
        ta = ea.get("tokens_per_second") if ea else None
        tb = eb.get("tokens_per_second") if eb else None
        change = (
            f"{100 * (tb / ta - 1):+.1f}%" if ta and tb else ("only in A" if not eb else "only in B" if not ea else "-")
        )
        sa = ea.get("speedup") if ea and ea["draft"] != "none" else None
        sb = eb.get("speedup") if eb and eb["draft"] != "none" else None
        lines.append(
            [
                e["target"],
                draft,
                f"{ta:.2f}" if ta else _why(ea),
                f"{tb:.2f}" if tb else _why(eb),
                change,
                f"{sa:.2f}×" if sa else "-",
                f"{sb:.2f}×" if sb else "-",
                f"{_pct(ea.get('acceptance_rate') if ea else None)} → {_pct(eb.get('acceptance_rate') if eb else None)}"
                if e["draft"] != "none"
                else "-",
            ]
        )
    head = [
        f"# `{Path(a_path).name}` (A) against `{Path(b_path).name}` (B)",
        "",
        f"- A: suite `{a['suite']['name']}`, {a['started']}: {machine_line(a['machine'])}",
        f"- B: suite `{b['suite']['name']}`, {b['started']}: {machine_line(b['machine'])}",
        "",
        "Change = B's tokens/s over A's; Speed-up = over the target alone in the same run (ratios travel "
        "between machines better than tokens/s).",
        "",
    ]
    return "\n".join(head) + aligned_table(COLUMNS, lines) + "\n"


def _why(e) -> str:
    if e is None:
        return "-"
    return f"unavailable: {e.get('reason')}" if e.get("status") != "ok" else "not measured"
