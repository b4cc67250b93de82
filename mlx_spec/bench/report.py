"""Turn benchmark records into summaries and markdown: every speed is a ratio against a named baseline."""

import os
from collections.abc import Sequence
from pathlib import Path

from .common import WITHIN, machine_line, md_table

SETS = ("humaneval", "edit", "prose", "all")
M3MAX_COLUMNS = ("Target", "Draft", "Quantization", "Token/s", "Relative Improvement")  # the M3 Max tables' layout


def improvement(tps: float, base_tps: float) -> str:
    """The tables' "Relative Improvement" of a row over the target alone: +54.08%; the baseline row is 0%."""
    return f"{100 * (tps / base_tps - 1):+.2f}%" if base_tps and tps != base_tps else "0%"


def aligned_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table padded to its columns, so it reads as well on a terminal as rendered."""
    cells = [list(header)] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    fmt = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(cells[0]), rule] + [fmt(r) for r in cells[1:]])


def _acceptance(rows: list[dict]) -> dict:
    """Acceptance pooled over prompts, from our Stats or mlx-lm's reconstructed rounds."""
    proposed = accepted = spec_rounds = 0
    by_p: list[int] = []
    by_a: list[int] = []
    for r in rows:
        s = r.get("stats")
        if not s:
            continue
        proposed += s["proposed"]
        accepted += s["accepted"]
        spec_rounds += s.get("spec_rounds", s.get("rounds", 0))
        for i, (p, a) in enumerate(zip(s["proposed_by_position"], s["accepted_by_position"])):
            if i >= len(by_p):
                by_p.append(0)
                by_a.append(0)
            by_p[i] += p
            by_a[i] += a
    return {
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_accepted": accepted / spec_rounds if spec_rounds else None,
        "acceptance_by_position": [a / p if p else 0.0 for a, p in zip(by_a, by_p)],
        "proposed_by_position": by_p,
        "spec_rounds": spec_rounds,
    }


def summarize(records: list[dict], configs: Sequence[str], baseline: str) -> dict[str, dict[str, dict]]:
    """Per prompt set and config: speed-up vs the baseline on the prompts both finished, and the rest."""
    out: dict[str, dict[str, dict]] = {}
    for set_name in SETS:
        rows = [r for r in records if set_name == "all" or r["set"] == set_name]
        if not rows:
            continue
        base = {r["prompt"]: r for r in rows if r["config"] == baseline and r["ok"]}
        out[set_name] = {}
        for c in configs:
            mine = [r for r in rows if r["config"] == c]
            ok = [r for r in mine if r["ok"] and r["prompt"] in base]
            entry: dict = {"prompts": len(mine), "errors": sum(not r["ok"] for r in mine), "compared": len(ok)}
            if ok:
                pairs = [(r, base[r["prompt"]]) for r in ok]
                tok = sum(r["n_tokens"] for r in ok)
                t = sum(r["total"] for r in ok)
                btok = sum(b["n_tokens"] for _, b in pairs)
                bt = sum(b["total"] for _, b in pairs)
                dec = sum(r["n_tokens"] - 1 for r in ok) / max(sum(r["decode_time"] for r in ok), 1e-12)
                bdec = sum(b["n_tokens"] - 1 for _, b in pairs) / max(sum(b["decode_time"] for _, b in pairs), 1e-12)
                per = [(r["n_tokens"] / r["total"]) / (b["n_tokens"] / b["total"]) for r, b in pairs]
                entry.update(
                    tokens=tok,
                    time_s=t,
                    tps=tok / t,
                    decode_tps=dec,
                    prefill_tps=sum(r["prompt_tokens"] for r in ok) / max(sum(r["ttft"] for r in ok), 1e-12),
                    speedup=(tok / t) / (btok / bt),
                    speedup_min=min(per),
                    speedup_max=max(per),
                    decode_speedup=dec / bdec,
                    draft_share=sum(r["n_from_draft"] for r in ok) / tok if tok else 0.0,
                    identical=sum(bool(r.get("identical")) for r in ok),
                    mismatches=[
                        {"prompt": r["prompt"], "position": r.get("first_mismatch")}
                        for r in ok
                        if r.get("identical") is False
                    ],
                    peak_memory_gb=max(r["peak_memory_gb"] for r in ok),
                    peak_extra_gb=max(r["peak_extra_gb"] for r in ok),
                    **_acceptance(ok),
                )
            out[set_name][c] = entry
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def spec_markdown(data: dict, baseline: str) -> str:
    """The speculative run as markdown: settings, one table per prompt set, acceptance by position, failures."""
    s, m = data["settings"], data["machine"]
    lines = [
        f"# Speculative benchmark ({data['started']}{'' if data.get('complete') else ', INCOMPLETE'})",
        "",
        f"`{' '.join(data['command'])}`",
        "",
        f"- machine: {machine_line(m)}",
        f"- target: `{s['target']}`; drafts: " + ", ".join(f"{k}=`{v}`" for k, v in s["drafts"].items()),
        f"- greedy, max {s['max_tokens']} new tokens, "
        f"{'EOS ignored' if s['ignore_eos'] else 'every config stops at EOS'}, prompts through the chat template; "
        "one untimed warm-up generation per config",
        f"- **speed-up = (tokens / end-to-end time, prefill included) of the config ÷ the same for `{baseline}` "
        "(our engine, no drafter) on the same prompts in this run**; min/max are the per-prompt ratios; "
        "decode× is the same ratio on decode time only (after the first token); prefill tok/s = prompt tokens ÷ "
        "time to the first token",
        "- identical = token ids equal to `plain`'s exactly (the lossless check); accept rate / per round = "
        "accepted ÷ proposed draft tokens / accepted per speculative round (mlx-lm-spec: rebuilt from its "
        "from_draft flags); peak GB above weights = MLX peak allocation minus what was allocated when the "
        "generation started (all loaded weights), i.e. KV caches, activations and scratch",
        "- weights in memory: target "
        + f"{data.get('target', {}).get('weights_gb', 0):.2f} GB; drafts: "
        + ", ".join(
            f"{c} {v.get('draft_weights_gb', 0):.2f} GB"
            for c, v in data.get("setup", {}).items()
            if v.get("draft_weights_gb")
        ),
        "",
    ]
    for set_name, configs in data.get("summary", {}).items():
        rows = []
        for c, e in configs.items():
            if not e.get("compared"):
                why = (
                    "setup failed (see errors)"
                    if not e["prompts"]
                    else f"{e['errors']} errors" + ("" if e["errors"] else "; no plain baseline")
                )
                rows.append((c, "-", "-", "-", "-", "-", "-", "-", "-", f"0/{e['prompts']}", why))
                continue
            rows.append(
                (
                    c,
                    f"{e['speedup']:.2f}×",
                    f"{e['speedup_min']:.2f}–{e['speedup_max']:.2f}",
                    f"{e['decode_speedup']:.2f}×",
                    f"{e['tps']:.2f}",
                    f"{e['decode_tps']:.2f}",
                    f"{e['prefill_tps']:.0f}",
                    _pct(e["draft_share"]),
                    _pct(e["acceptance_rate"])
                    + (f" / {e['mean_accepted']:.2f}" if e["mean_accepted"] is not None else ""),
                    f"{e['identical']}/{e['compared']}" + ("" if e["identical"] == e["compared"] else " **MISMATCH**"),
                    f"{e['peak_extra_gb']:.3f}" + (f", {e['errors']} errors" if e["errors"] else ""),
                )
            )
        lines += [
            f"## {set_name}",
            "",
            md_table(
                (
                    "config",
                    "speed-up vs plain",
                    "min–max",
                    "decode×",
                    "tok/s (e2e)",
                    "decode tok/s",
                    "prefill tok/s",
                    "from draft",
                    "accept rate / per round",
                    "identical",
                    "peak GB above weights / notes",
                ),
                rows,
            ),
            "",
        ]
    if "all" in data.get("summary", {}):
        pos_rows = [
            (c, " ".join(f"{x:.2f}" for x in e["acceptance_by_position"]))
            for c, e in data["summary"]["all"].items()
            if e.get("acceptance_by_position")
        ]
        if pos_rows:
            lines += [
                "## acceptance by draft position (all prompts)",
                "",
                md_table(("config", "position 1, 2, ..."), pos_rows),
                "",
            ]
    bad = [r for r in data.get("records", []) if r.get("identical") is False]
    if bad:
        lines += ["## LOSSLESS CHECK FAILED: outputs that differ from plain", ""]
        for r in bad:
            ctx = r.get("mismatch_context", {})
            lines.append(
                f"- `{r['config']}` on {r['prompt']}: first differing token {r['first_mismatch']} "
                f"(plain: {ctx.get('plain')!r} vs {ctx.get(r['config'])!r})"
            )
        lines.append("")
    if data.get("errors"):
        lines += (
            ["## errors", ""]
            + [f"- `{e['config']}`{' on ' + e['prompt'] if e['prompt'] else ''}: {e['error']}" for e in data["errors"]]
            + [""]
        )
    return "\n".join(lines)


def decode_markdown(data: dict) -> str:
    """The decode run as markdown: ours vs mlx-lm per model, load times, and the BLAS comparison if run."""
    m = data["machine"]
    lines = [
        f"# Decode benchmark ({data['started']}{'' if data.get('complete') else ', INCOMPLETE'})",
        "",
        f"`{' '.join(data['command'])}`",
        "",
        f"- machine: {machine_line(m)}",
        f"- plain greedy decoding of {data['settings']['max_tokens']} new tokens (EOS ignored) on one fixed prompt; "
        f"median of {data['settings']['repeats']} alternating repeats after one untimed warm-up per engine",
        "- **ours/mlx-lm = our engine with no drafter ÷ mlx-lm's `generate_step`, same weights folder, same process**; "
        f"target: within {WITHIN:.0%}",
        "",
    ]
    rows = []
    for r in data.get("models", []):
        if r.get("error"):
            rows.append((r["name"], "-", "-", "-", "-", "-", "-", "-", f"ERROR {r['error']}"))
            continue
        o, x = r["ours"], r["mlx_lm"]
        ok = "yes" if abs(r["decode_ratio"] - 1) <= WITHIN else "**no**"
        rows.append(
            (
                r["name"],
                f"{r['weights_gb']:.3f}",
                f"{o['decode_tps']:.2f}",
                f"{x['decode_tps']:.2f}",
                f"{r['decode_ratio']:.3f} ({ok})",
                f"{o['prefill_tps']:.1f} / {x['prefill_tps']:.1f}",
                f"{r['load_ours_s']:.2f} / {r['load_mlx_lm_s']:.2f}",
                f"{o['peak_extra_gb']:.3f} / {x['peak_extra_gb']:.3f}",
                "yes" if r["identical"] else f"**no** (first at {r['first_mismatch']})",
            )
        )
    lines += [
        md_table(
            (
                "model",
                "weights GB",
                "ours tok/s",
                "mlx-lm tok/s",
                "ours/mlx-lm",
                "prefill tok/s ours / mlx-lm",
                "load s ours / mlx-lm",
                "peak GB above weights ours / mlx-lm",
                "same tokens",
            ),
            rows,
        ),
        "",
    ]
    if cmp_ := data.get("blas_compare"):
        lines += [
            "## optimized vs reference BLAS",
            "",
            f"**Ratio of two processes launched by the same command**: this one (BLAS {m['blas_status']}) ÷ a child "
            f"with `MLX_SPEC_BLAS=reference` (BLAS {cmp_.get('child_blas_status')}); not the same process, "
            "because a loaded BLAS cannot be unloaded.",
            "",
        ]
        if cmp_.get("error"):
            lines.append(f"child failed: {cmp_['error']}")
        else:
            lines.append(
                md_table(
                    (
                        "model",
                        "ours tok/s optimized / reference",
                        "ratio",
                        "mlx-lm tok/s optimized / reference",
                        "ratio",
                    ),
                    [
                        (
                            c["name"],
                            f"{c['ours'][0]:.2f} / {c['ours'][1]:.2f}",
                            f"{c['ours_ratio']:.2f}×",
                            f"{c['mlx_lm'][0]:.2f} / {c['mlx_lm'][1]:.2f}",
                            f"{c['mlx_lm_ratio']:.2f}×",
                        )
                        for c in cmp_["models"]
                    ],
                )
            )
        lines.append("")
    if conv := data.get("convert_report"):
        lines += [
            "## conversion cost (each in a fresh subprocess)",
            "",
            conv.get("note", ""),
            "",
            md_table(
                ("source", "to", "wall s", "peak RSS GB", "output GB", "status"),
                [
                    (
                        c["source"],
                        c["to"],
                        f"{c['wall_s']:.1f}",
                        f"{c['peak_rss_gb']:.2f}",
                        f"{c.get('output_gb', 0):.2f}",
                        "ok" if c["returncode"] == 0 else f"FAILED: {c.get('stderr_tail', '')}",
                    )
                    for c in conv["runs"]
                ],
            ),
            "",
        ]
    return "\n".join(lines)


# The page of current results: the newest record of each suite in a folder of records, as docs/results.md shows it.

RECORDS = ("*.json", "*.json.gz")  # a run writes .json; the repository keeps its records gzip-compressed
PAGE_SETS = ("humaneval", "edit", "prose")


def suite_records(folder) -> list[tuple[Path, dict]]:
    """Every `bench run` record of the schema this mlx-spec reads in `folder`, oldest first; other files are skipped."""
    from .results import SCHEMA, ResultError, read

    found = []
    for path in sorted(p for pattern in RECORDS for p in Path(folder).glob(pattern)):
        try:
            data = read(path)
        except ResultError:
            continue
        if data["schema"] == SCHEMA:
            found.append((path, data))
    return sorted(found, key=lambda pd: (pd[1]["started"], pd[0].name))


def newest(records: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """The newest record of each suite name, newest first."""
    latest = {data["suite"]["name"]: (path, data) for path, data in records}  # records are oldest first
    return sorted(latest.values(), key=lambda pd: pd[1]["started"], reverse=True)


def _machine(m: dict) -> str:
    """'AMD EPYC, 2 CPUs, BLAS openblas, MLX 0.32.4 on the CPU' or '..., MLX 0.32.4 on NVIDIA H100 80GB HBM3'."""
    where = f"on {m['gpu'].split(',')[0]}" if m.get("gpu") else "on the CPU"
    return f"{m.get('cpu') or m['machine']}, {m['cpu_count']} CPUs, BLAS {m['blas_status']}, MLX {m['mlx']} {where}"


def _sampling(suite: dict) -> str:
    return "greedy" if not suite.get("temp") else f"temperature {suite['temp']}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _table_rows(data: dict) -> tuple[list[str], list[list[str]]]:
    """Per drafter row: its speed-up over the target alone, overall and per prompt set, acceptance, identical."""
    sets = [s for s in PAGE_SETS if data["suite"].get("prompts", {}).get(s)]
    header = ["target", "drafter", "speed-up", *sets, "from draft", "identical"]
    rows = []
    for s in data["summary"]:
        if s["draft"] == "none":
            continue
        drafter = s["draft"] + (f" K={s['k']}" if s.get("k") else "") + (f" {s['planner']}" if s.get("planner") else "")
        target = Path(s["target"]).name if "/" in s["target"] else s["target"]
        if s.get("status") != "ok" or not s.get("compared"):
            rows.append([target, drafter, "-", *("-" for _ in sets), "-", s.get("reason") or "not measured"])
            continue
        mine = [r for r in data["records"] if r["row"] == s["key"] and r.get("n_tokens")]
        tokens = sum(r["n_tokens"] for r in mine)
        by_set = s.get("by_set") or {}
        rows.append(
            [
                target,
                drafter,
                _x(s.get("speedup")),
                *(_x(by_set.get(name, {}).get("speedup")) for name in sets),
                _pct(sum(r.get("n_from_draft", 0) for r in mine) / tokens if tokens else None),
                f"{s['identical']}/{s['compared']}",
            ]
        )
    return header, rows


def _roofline_rows(data: dict) -> tuple[list[str], list[list[str]]]:
    """Per model: plain decoding's tokens/s against the roofline's (bandwidth / bytes read per token)."""
    header = ["model", "decode tok/s", "roofline tok/s", "share"]
    rows = [
        [s["target"], f"{s['decode_tps']:.2f}", f"{s['roofline_tps']:.2f}", _pct(s.get("roofline_share"))]
        for s in data["summary"]
        if s.get("decode_tps") is not None and s.get("roofline_tps")
    ]
    return header, rows


def results_page(folder, page=None) -> str:
    """Markdown of the newest record of each suite in `folder`; links are relative to `page`'s folder if given."""
    base = Path(page).parent if page is not None else Path(".")
    lines = [
        "# Current results",
        "",
        f"Written by `mlx-spec bench report {Path(folder).as_posix()}"
        + (f" --out {Path(page).as_posix()}`" if page is not None else "`")
        + " from the newest record of each benchmark suite there; do not edit it by hand (a test regenerates it). "
        "A speed-up is tokens per second end to end (prefill included) over the target alone's, measured in the same "
        "run on the same prompts; a prompt set's column is the same ratio on its prompts. `from draft` is the share "
        "of the output's tokens that came from accepted drafts; `identical` counts outputs equal to the target "
        "alone's token for token (greedy).",
        "",
    ]
    others = []
    for path, data in newest(suite_records(folder)):
        kind = data["suite"]["kind"]
        link = Path(os.path.relpath(path, base)).as_posix()
        if kind == "table":
            header, rows = _table_rows(data)
        elif kind == "roofline":
            header, rows = _roofline_rows(data)
        else:
            others.append(f"[`{path.name}`]({link}) ({kind})")
            continue
        done = "complete" if data.get("complete") else f"incomplete: {len(data['records'])} measurements"
        lines += [
            f"## {data['suite']['name']}",
            "",
            data["suite"].get("description", "").rstrip(".") + ".",
            "",
            f"- record [`{path.name}`]({link}), started {data['started'][:16].replace('T', ' ')} at "
            f"{data['machine']['git_rev']} ({done}), {_sampling(data['suite'])}, "
            f"at most {data['suite'].get('max_tokens')} tokens",
            f"- machine: {_machine(data['machine'])}",
            "",
            md_table(header, rows),
            "",
        ]
    if others:
        lines += ["## Other records", "", "; ".join(others) + ".", ""]
    return "\n".join(lines)
