"""`bench report --rounds`: the time each drafting source saved (+) or lost (-) against plain steps, from a run's
per-round traces.

A round saves (tokens it produced x a plain step) - (its verify + drafting time). The plain step is the median
plain step of the same target's plain row (drafter `none`) on the same prompt, so a row's total says which of its
sources paid for their rounds and which cost more than decoding plainly would have.
"""

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .common import md_table
from .results import key


@dataclass(frozen=True)
class Round:
    """One round of a trace: where its draft came from ("" for a plain step), what it got and what it cost."""

    source: str
    accepted: int
    seconds: float  # the whole round: drafting and its verify pass

    @property
    def tokens(self) -> int:
        return self.accepted + 1 if self.source else 1  # a drafted round also keeps the target's own next token


def trace_rounds(record: dict) -> list[Round]:
    """A record's rounds from its compact trace (SCHEMA.md): the one place that reads the trace's layout, both the
    current one ([source, proposed, accepted, seconds, size, behind]) and the one before it ([source, proposed,
    accepted, verify_s, draft_s, catch_up_s, behind], 7 or 9 fields: the records notebooks/NOTEBOOK.md §1-23 quote)."""
    trace = (record.get("stats") or {}).get("trace") or []  # mlx-lm's own rows have none
    return [Round(t[0], t[2], t[3] + t[4]) if len(t) in (7, 9) else Round(t[0], t[2], t[3]) for t in trace]


@dataclass
class Savings:
    """Rounds, tokens and seconds saved by one source."""

    rounds: int = 0
    tokens: int = 0
    saved_s: float = 0.0

    def add(self, rounds: int, tokens: int, saved_s: float) -> None:
        self.rounds, self.tokens, self.saved_s = self.rounds + rounds, self.tokens + tokens, self.saved_s + saved_s

    def __str__(self) -> str:
        return f"{self.rounds}r/{self.tokens}t {self.saved_s:+.1f}s"


def price(rounds: Sequence[Round], step: float) -> dict[str, Savings]:
    """Per source ("plain" for plain steps): its rounds, their tokens, and the seconds they saved at `step` a token."""
    out: dict[str, Savings] = defaultdict(Savings)
    for r in rounds:
        out[r.source or "plain"].add(1, r.tokens, r.tokens * step - r.seconds)
    return dict(out)


def _cells(per: dict[str, Savings]) -> str:
    return "  ".join(f"{source} {t}" for source, t in sorted(per.items()))


def report(data: dict, rows: Sequence[str] | None = None, prompt_set: str | None = None) -> str:
    """A result's rounds priced, as markdown: one line a drafted measurement, then the totals per row and source.

    rows: only these rows (their drafter label, e.g. `hybrid:qwen2.5-coder-0.5b`); prompt_set: only its prompts.
    """
    by_key = {row["key"]: row for row in data["rows"]}
    one_target = len({row["target"] for row in data["rows"]}) == 1
    plain: dict[tuple, list[float]] = defaultdict(list)  # (plain row, prompt) -> its plain steps, repeats pooled
    for r in data["records"]:
        plain[(r["row"], r["prompt"])] += [x.seconds for x in trace_rounds(r) if not x.source]
    lines: list[list[str]] = []
    totals: defaultdict[str, defaultdict[str, Savings]] = defaultdict(lambda: defaultdict(Savings))  # row, source
    for r in data["records"]:
        row = by_key[r["row"]]
        label = r["row"][len(row["target"]) + 1 :]
        steps = plain.get((key(row["target"], "none"), r["prompt"]))
        if (
            row["draft"] == "none"
            or not steps
            or (rows and label not in rows)
            or (prompt_set and r.get("set") != prompt_set)
        ):
            continue
        step = statistics.median(steps)
        per = price(trace_rounds(r), step)
        if not per:
            continue
        name = label if one_target else r["row"]
        for source, t in per.items():
            totals[name][source].add(t.rounds, t.tokens, t.saved_s)
        lines.append([r["prompt"], name, f"{step:.3f}", _cells(per)])
    if not lines:
        return "No drafted measurement with a per-round trace and a plain row to price it against."
    total = [[name, _cells(per)] for name, per in totals.items()]
    return (
        "Time saved (+) or lost (-) against plain steps, by drafting source: rounds/tokens and seconds.\n\n"
        + md_table(["Row", "By source"], total)
        + "\n\n"
        + md_table(["Prompt", "Row", "Plain step s", "By source"], lines)
        + "\n"
    )
