"""The `quant-quality` suite's measures (Tables 6-7 of the PTQ paper): memory, speed and duplicate content words.

The paper rates generated text by its duplicate content words: the words left after removing stop
words, counted each time one repeats a word already used in the same completion. The stop words
are the `stop-words` package's English list.
"""

import re
from functools import lru_cache

from .common import md_table

WORD = re.compile(r"[a-z][a-z']*")


@lru_cache(maxsize=1)
def _stop_words() -> frozenset:
    from stop_words import get_stop_words

    return frozenset(get_stop_words("en"))


def duplicate_content_words(text: str) -> int:
    """How many content words (stop words removed) of `text` repeat one used before in it."""
    stop = _stop_words()
    seen, dupes = set(), 0
    for w in WORD.findall(text.lower()):
        if w in stop:
            continue
        dupes += w in seen
        seen.add(w)
    return dupes


def summarize(data: dict, rows: list[dict]) -> list[dict]:
    """Each row (a target at one temperature and top-k): its speed range and mean duplicate content words."""
    for e in rows:
        recs = [r for r in data["records"] if r["row"] == e["key"]]
        if not recs:
            continue
        tps = [r["e2e_tps"] for r in recs]
        e.update(
            temp=next((r.get("temp") for r in data["rows"] if r["key"] == e["key"]), None),
            top_k=next((r.get("top_k") for r in data["rows"] if r["key"] == e["key"]), None),
            tps_min=min(tps),
            tps_max=max(tps),
            duplicates_mean=sum(r["duplicate_content_words"] for r in recs) / len(recs),
            peak_extra_gb=max(r["peak_extra_gb"] for r in recs),
        )
    return rows


def markdown(data: dict) -> str:
    """Per model (Tables 6-7): memory, min-max tokens/s, duplicate content words; then duplicates by temp x top-k."""
    per_model: dict[str, list[dict]] = {}
    for e in data["summary"]:
        per_model.setdefault(e["target"], []).append(e)
    main, grids = [], []
    for target, rows in per_model.items():
        done = [e for e in rows if "duplicates_mean" in e]
        m = data["models"].get(target, {})
        if not done:
            why = next((e["reason"] for e in rows if e["status"] != "ok"), "not measured yet")
            main.append([target, m.get("quantization", ""), "", f"unavailable: {why}" if why else "", ""])
            continue
        memory = m["weights_gb"] + max(e["peak_extra_gb"] for e in done)
        dupes = sum(e["duplicates_mean"] for e in done) / len(done)
        main.append(
            [
                target,
                m["quantization"],
                f"{memory:.2f}",
                f"({min(e['tps_min'] for e in done):.2f}, {max(e['tps_max'] for e in done):.2f})",
                f"{dupes:.1f}",
            ]
        )
        temps = sorted({e["temp"] for e in done})
        ks = sorted({e["top_k"] for e in done})
        cell = {(e["temp"], e["top_k"]): e["duplicates_mean"] for e in done}
        grids += [
            f"**{target}**: mean duplicate content words by temperature (rows) and top-k (columns)",
            "",
            md_table(
                ["temp", *(f"top-k {k}" for k in ks)],
                [[f"{t:g}", *(f"{cell[(t, k)]:.1f}" if (t, k) in cell else "" for k in ks)] for t in temps],
            ),
            "",
        ]
    head = md_table(
        [
            "Model",
            "Quantization",
            "Memory GB (weights + peak above them)",
            "(min, max) tokens/s",
            "Duplicate content words (mean)",
        ],
        main,
    )
    return head + "\n\n" + "\n".join(grids)
