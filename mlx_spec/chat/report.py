"""What the chat prints about speed: the line after each reply, /stats, and the /compare table."""

from dataclasses import dataclass

from mlx_spec.bench.common import first_mismatch
from mlx_spec.bench.report import M3MAX_COLUMNS, aligned_table, improvement
from mlx_spec.gen.stats import Stats

COLUMNS = M3MAX_COLUMNS


def stats_line(stats: Stats, plain_step_s: float | None, drafting: bool) -> str:
    """One line after a reply: speed, drafts, acceptance, and the speed-up over plain decoding.

    plain_step_s: the session's estimate of one plain target step (seconds), from its own
    measurements; None when nothing was measured yet.
    """
    head = f"{stats.generation_tps:.1f} tok/s"
    if not drafting:
        return f"[{head} · plain decoding (drafter off)]"
    parts = [head, f"{100 * stats.draft_share:.0f}% of tokens from drafts"]
    if stats.proposed:
        parts += [f"acceptance {100 * stats.acceptance_rate:.0f}%", f"mean accepted {stats.mean_accepted:.2f}"]
    else:  # the planner found no round worth drafting, or the drafter had nothing confident to offer
        parts.append("no draft tokens proposed")
    if plain_step_s and stats.generation_tps:
        plain_tps = 1.0 / plain_step_s
        parts.append(
            f"{stats.generation_tps / plain_tps:.2f}x vs plain ~{plain_tps:.1f} tok/s (est. from measured target steps)"
        )
    return "[" + " · ".join(parts) + "]"


def stats_detail(stats: Stats) -> str:
    """/stats: per-position acceptance and where the time of the last reply went."""
    lines = [
        f"last reply: {stats.generation_tokens} tokens, {stats.rounds} target passes "
        f"({stats.spec_rounds} speculative), finish: {stats.finish_reason or 'interrupted'}"
    ]
    if stats.proposed_by_position:
        cells = [
            f"{i + 1}: {a}/{p} ({100 * a / p:.0f}%)" if p else f"{i + 1}: -"
            for i, (a, p) in enumerate(zip(stats.accepted_by_position, stats.proposed_by_position))
        ]
        lines.append("acceptance by draft position: " + "  ".join(cells))
    else:
        lines.append("acceptance by draft position: nothing was drafted")
    lines.append(
        f"time: generation {stats.generation_time:.3f} s (waiting on the device {stats.wait_time:.3f} s), "
        f"prompt {stats.prompt_time:.3f} s ({stats.prefill_tokens} new of {stats.prompt_tokens} tokens)"
    )
    for note in (stats.left_out, stats.fallback):
        if note:
            lines.append(f"note: {note}")
    return "\n".join(lines)


@dataclass
class CompareRow:
    """One line of the /compare table."""

    target: str
    draft: str  # "N/A" for plain decoding
    quantization: str  # the draft's, "N/A" for plain decoding (as in the tables)
    tps: float


def compare_table(plain: CompareRow, spec: CompareRow) -> str:
    """The two rows in the M3 Max layout, plain first; improvement relative to the plain row."""
    return aligned_table(
        COLUMNS,
        [[r.target, r.draft, r.quantization, f"{r.tps:.2f}", improvement(r.tps, plain.tps)] for r in (plain, spec)],
    )


def identity_line(plain: list[int], spec: list[int], greedy: bool) -> str:
    """Whether the two replies are token-identical, and what that means."""
    at = first_mismatch(plain, spec)
    if not greedy:
        same = "identical" if at is None else f"different from token {at}"
        return f"sampling (temp > 0): the replies are {same}; only greedy replies must be token-identical"
    if at is None:
        return f"greedy: the two replies are token-identical ({len(spec)} tokens)"
    return f"greedy: the replies DIFFER from token {at} of {len(spec)} (speculative greedy must equal plain: a bug)"
