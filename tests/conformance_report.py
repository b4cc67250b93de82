"""Print the conformance table of the installed mlx-lm's model types (all, or those named): whether each loads, whether
plain mlx-spec equals mlx-lm, and each drafter alone and batched: ok, refused (its one line) or FAIL (what went wrong).

    python tests/conformance_report.py [TYPE ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import conformance as c  # noqa: E402
from conformance_models import CANNOT_LOAD, CONFIGS  # noqa: E402


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:160]


def cell(run) -> str:
    """ok, refused: its line, or FAIL: the first problem or error of `run()` (a list of problems)."""
    try:
        found = run()
    except c.Alone as e:
        return f"alone: {e}"
    except c.Refused as e:
        return f"refused: {e}"
    except Exception as e:
        return f"FAIL: {first_line(e)}"
    return f"FAIL: {found[0]}" if found else "ok"


def row(kind: str) -> list[str]:
    if kind in CANNOT_LOAD:
        return [kind, f"no: {CANNOT_LOAD[kind]}"] + [""] * (1 + 2 * len(c.DRAFTERS))
    if kind not in CONFIGS:
        return [kind, "FAIL: no configuration in tests/conformance_models.py"] + [""] * (1 + 2 * len(c.DRAFTERS))
    try:
        c.model(kind)
    except Exception as e:
        return [kind, f"FAIL: {first_line(e)}"] + [""] * (1 + 2 * len(c.DRAFTERS))
    out = [kind, "yes", cell(lambda: [d for p in c.PROMPTS if (d := c.differs(kind, p, c.plain(kind, p)))])]
    for spec in c.DRAFTERS:
        out.append(cell(lambda s=spec: c.problems(kind, s, {p: c.alone(kind, s, p) for p in c.PROMPTS})))
        out.append(cell(lambda s=spec: c.problems(kind, s, c.batched(kind, s), together=True)))
    c.model.cache_clear()
    c.reference.cache_clear()
    return out


def main(kinds: list[str]) -> None:
    head = ["type", "loads", "plain == mlx-lm"] + [f"{d} {w}" for d in c.DRAFTERS for w in ("alone", "batched")]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for kind in kinds or c.installed_types():
        print("| " + " | ".join(x.replace("|", "/") for x in row(kind)) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
