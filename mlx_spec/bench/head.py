"""The `head` suite's additions: the suite's drafts pointed at a head folder, its training record kept beside the
measurements, and per prompt set the tokens per drafting round and the acceptance by draft position."""

import json
from pathlib import Path

from .report import aligned_table
from .suite import Suite, SuiteError, Target

HEAD = "HEAD"  # the placeholder in a suite's drafts


def point(s: Suite, head: str | None) -> dict | None:
    """Put `head` in place of HEAD in the suite's drafts (and its target, if its train.json names one); the training
    record, or None for a suite without HEAD."""
    if not any(HEAD in d for t in s.targets for d in t.drafts):
        if head is not None:
            raise SuiteError(f"{s.name}: --head is for a suite whose drafts name {HEAD} (e.g. `bench run head`)")
        return None
    if head is None:
        raise SuiteError(f"{s.name} measures a head: give its folder with --head DIR")
    folder = Path(head).expanduser()
    if not (folder / "config.json").is_file():
        raise SuiteError(f"--head {folder}: not a head folder (no config.json)")
    record = json.loads((folder / "train.json").read_text()) if (folder / "train.json").is_file() else {}
    model = record.get("target")
    s.targets = [
        Target(
            t.model if model is None else type(t.model)(model), tuple(d.replace(HEAD, str(folder)) for d in t.drafts)
        )
        for t in s.targets
    ]
    return {"folder": str(folder), **record}


def markdown(data: dict) -> str:
    """Per row and prompt set: tau and acceptance by position; then the training record and learning curve."""
    from ..named import table_name

    rows: list[list] = []
    for e in data["summary"]:
        if e["draft"] == "none":
            continue
        for name, got in (e.get("by_set") or {}).items():  # its pooled acceptance on the set (`report._acceptance`)
            spec = got.get("spec_rounds", 0)
            rows.append(
                [
                    table_name(e["draft"]),
                    name,
                    f"{1 + got['accepted'] / spec:.2f}" if spec else "-",
                    str(spec),
                    " ".join(
                        f"{a:.2f}" for a, p in zip(got["acceptance_by_position"], got["proposed_by_position"]) if p
                    )
                    or "-",
                ]
            )
    out = (
        "Per prompt set: tokens per drafting round (τ: accepted draft tokens + the target's own), drafting "
        "rounds, acceptance at draft position 1, 2, ... (accepted / proposed there)\n\n"
        + aligned_table(("Draft", "Set", "τ", "Rounds", "Acceptance by position"), rows)
        + "\n"
    )
    t = data["training"]
    if "done" in t:
        d = t["done"]
        out += (
            f"\nThe head: {t['folder']}, trained by `mlx-spec train-head` for {t['target']} on "
            f"{', '.join(t['data'])}: {d['tokens']} tokens of the target's features, {d['steps']} steps, "
            f"{d['minutes']:.1f} minutes; "
            f"draft vocabulary {t['draft_vocab']}, sequences of {t['length']}, batch {t.get('batch', 8)}.\n\n"
            "Learning curve (held-out acceptance by position of a chain, measured on the first shard, never "
            "trained on):\n\n"
            + aligned_table(
                ("Minutes", "Steps", "Acceptance by position", "τ (held out)"),
                [
                    [
                        f"{p['minutes']:.1f}",
                        str(p["steps"]),
                        " ".join(f"{a:.3f}" for a in p["acceptance"]),
                        f"{p['tau']:.2f}",
                    ]
                    for p in d["curve"]
                ],
            )
            + "\n"
        )
    return out
