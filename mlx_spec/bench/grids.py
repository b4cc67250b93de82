"""The grid views of the sweep suites: speed-up by K and N (ngram), accepted tokens by method and K (compression)."""

from .report import aligned_table


def _n(entry: dict) -> int:
    return int(entry["draft"].partition(":")[2] or 0)


def sweep_markdown(data: dict) -> str:
    """ANPD §4.4's view: per target and prompt set, speed-up by K (columns) and N (rows), the bound beside each."""
    from ..named import short_name

    parts = [
        "Speed-up over the target alone by K (most drafted per round, fixed) and N (longest n-gram), "
        "with ANPD's bound (α·K)+1 in brackets, α = accepted / drafted tokens:",
        "",
    ]
    entries = [e for e in data["summary"] if e.get("k") is not None]
    for target in dict.fromkeys(e["target"] for e in entries):
        mine = [e for e in entries if e["target"] == target]
        ks = sorted({e["k"] for e in mine})
        ns = sorted({_n(e) for e in mine})
        for name in dict.fromkeys(x for e in mine for x in e["by_set"]):
            cells = {(e["k"], _n(e)): e["by_set"].get(name, {}) for e in mine}
            rows = [
                [f"N={n}"]
                + [
                    (
                        f"{c['speedup']:.2f}× ({c['bound']:.2f})"
                        if c.get("bound")
                        else f"{c['speedup']:.2f}×"
                        if c.get("speedup")
                        else ""
                    )
                    for c in (cells.get((k, n), {}) for k in ks)
                ]
                for n in ns
            ]
            parts += [f"**{short_name(target)}, {name}**", "", aligned_table(["", *(f"K={k}" for k in ks)], rows), ""]
    return "\n".join(parts)


def compression_markdown(data: dict) -> str:
    """The compression paper's Table 1 / Figure 2 view: per method, accepted tokens per round and speed-up at each K."""
    from ..named import short_name

    parts = [
        "Drafts made from the target by each of `convert`'s methods: accepted tokens per round (of K, the "
        "paper's Figure 2) and speed-up over the target alone, by K:",
        "",
    ]
    entries = [e for e in data["summary"] if e.get("k") is not None]
    ks = sorted({e["k"] for e in entries})
    for target in dict.fromkeys(e["target"] for e in entries):
        mine = [e for e in entries if e["target"] == target]
        rows = []
        for method in dict.fromkeys(e["draft"].rpartition("@")[2] for e in mine):
            cells = {e["k"]: e for e in mine if e["draft"].rpartition("@")[2] == method}
            row = [method, cells[ks[0]].get("draft_quant") or "" if ks[0] in cells else ""]
            for k in ks:
                e = cells.get(k, {})
                if e.get("status") == "unavailable":
                    row.append(f"unavailable: {e.get('reason')}")
                elif e.get("mean_accepted") is not None:
                    row.append(f"{e['mean_accepted']:.2f} of {k} · {e['speedup']:.2f}×")
                else:
                    row.append("")
            rows.append(row)
        parts += [
            f"**{short_name(target)}**",
            "",
            aligned_table(["Method", "Draft weights", *(f"K={k}: accepted · speed-up" for k in ks)], rows),
            "",
        ]
    return "\n".join(parts)


GRIDS = {"ngram": sweep_markdown, "compression": compression_markdown}
