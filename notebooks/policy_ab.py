"""A/B of one engine module (by default the draft policy, `mlx_spec/gen/policy.py`) at an older git revision
against the working tree's.

Both run in one process on the same loaded target, each drafter made afresh for every run, greedy, the
two sides' order alternating from one (prompt, row) to the next so that drift falls on both. The old side runs
with the classes of the module swapped for the old revision's (`--file`, one module or several that changed
together: their methods and class attributes; the modules' plain functions stay new). Each run keeps its
per-round trace (`Stats.trace`), so a difference can be traced to the rounds where the two sides chose
differently; pairs that chose the same in every round show the timing noise.

    python notebooks/policy_ab.py --old 8c9b72f --prompts HumanEval/7,HumanEval/7:rename \
        --rows hybrid:qwen2.5-coder-0.5b,suffix --out notebooks/runs/policy-ab.json
    python notebooks/policy_ab.py --old HEAD \
        --file mlx_spec/gen/drafters/model.py,mlx_spec/gen/drafters/head.py ...
    python notebooks/policy_ab.py --old HEAD --old-k model=6 ...   # a default draft length changed

Prints a markdown table (seconds old -> new per prompt and row, and per row the ratio of total times).
A development tool, not part of the package: the bench suites measure drafters, this measures a change.
"""

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_PLAIN = 16  # plain steps a run needs for its median step to price its drafting rounds


def revision(rev: str) -> str:
    """The short commit id of a git revision name."""
    out = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"error: {out.stderr.strip()}")
    return out.stdout.strip()


def old_module(rev: str, path: str):
    """The module at `path` (e.g. mlx_spec/gen/policy.py) as of git revision `rev`, loaded beside the current one
    (same package, so its relative imports resolve to the current modules)."""
    src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if src.returncode:
        sys.exit(f"error: {src.stderr.strip()}")
    file = Path(tempfile.mkdtemp()) / "old.py"
    file.write_text(src.stdout)
    spec = importlib.util.spec_from_file_location(path[:-3].replace("/", ".") + "_old", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def swapped(old, new):
    """Within the block, every class `new` defines that `old` defines too has the old class's methods and class
    attributes (subclasses elsewhere inherit them)."""
    missing, saved = object(), []
    for name, old_cls in vars(old).items():
        new_cls = getattr(new, name, None)
        if not (isinstance(old_cls, type) and isinstance(new_cls, type) and old_cls.__module__ == old.__name__):
            continue
        for attr, value in vars(old_cls).items():
            if attr.startswith("__") and attr != "__init__":
                continue
            saved.append((new_cls, attr, new_cls.__dict__.get(attr, missing)))
            setattr(new_cls, attr, value)
    try:
        yield
    finally:
        for cls, attr, value in reversed(saved):
            if value is missing:
                delattr(cls, attr)
            else:
                setattr(cls, attr, value)


@contextlib.contextmanager
def draft_lengths(spec: str):
    """Within the block, `registry.DEFAULT_K` has the entries of `spec` ("model=6,self=6"; "" changes nothing)."""
    from mlx_spec.gen import registry

    saved = dict(registry.DEFAULT_K)
    for item in filter(None, spec.split(",")):
        kind, _, k = item.partition("=")
        if kind not in registry.DEFAULT_K or not k.isdigit():
            sys.exit(f"error: --old-k: '{item}' is not KIND=K for a kind in {sorted(registry.DEFAULT_K)}")
        registry.DEFAULT_K[kind] = int(k)
    try:
        yield
    finally:
        registry.DEFAULT_K.clear()
        registry.DEFAULT_K.update(saved)


def load(target_name: str, prompt_ids: str):
    """(target, tokenizer, the benchmark prompts named in the comma list, EOS ids), the target warmed up."""
    from mlx_spec.bench.prompts import build
    from mlx_spec.gen.engine import speculative_generate_step
    from mlx_spec.named import load_model

    target, tok, _ = load_model(target_name)
    want = prompt_ids.split(",")
    n = 1 + max(int(w.split("/")[1].split(":")[0]) for w in want)
    prompts = [p for p in build(tok, n, n, n_prose=6) if p.id in want]
    if len(prompts) != len(want):
        sys.exit(f"error: unknown prompt(s): {sorted(set(want) - {p.id for p in prompts})}")
    list(speculative_generate_step(prompts[0].ids[:20], target, None, max_tokens=4))  # warm-up
    return target, tok, prompts, list(tok.eos_token_ids)


def run(args) -> list:
    from mlx_spec.gen.engine import Stats, speculative_generate_step
    from mlx_spec.gen.policy import Policy
    from mlx_spec.gen.registry import default_num_draft
    from mlx_spec.named import make_drafter

    args.old = revision(args.old)  # recorded as a commit, not as a name that moves (HEAD)
    files = args.file.split(",")
    pairs = [(old_module(args.old, f), importlib.import_module(f[:-3].replace("/", "."))) for f in files]
    target, tok, prompts, eos = load(args.target, args.prompts)
    out = []
    for i, p in enumerate(prompts):
        for j, row in enumerate(args.rows.split(",")):
            for name in ["old", "new"][:: -1 if (i + j) % 2 else 1]:
                with contextlib.ExitStack() as stack:
                    for old, new in pairs if name == "old" else []:
                        stack.enter_context(swapped(old, new))
                    if name == "old":
                        stack.enter_context(draft_lengths(args.old_k))
                    drafter = make_drafter(row, target, tok)
                    stats = Stats(trace=[])
                    t0 = time.perf_counter()
                    tokens = [s.token for s in speculative_generate_step(
                        p.ids, target, drafter, max_tokens=args.max_tokens, eos_token_ids=eos, stats=stats,
                        policy=Policy(default_num_draft(drafter)))]
                out.append({"prompt": p.id, "row": row, "policy": name, "total": time.perf_counter() - t0,
                            "tokens": tokens, "stats": stats.as_dict()})
                print(f"{p.id:24s} {row:28s} {name} {out[-1]['total']:6.1f} s", file=sys.stderr, flush=True)
                Path(args.out).write_text(json.dumps({"old": args.old, "file": args.file, "old_k": args.old_k,
                                                      "target": args.target, "runs": out}))
                del drafter
    return out


def plain_step(run: dict, least: int = 1):
    """(the run's median plain step in seconds, its drafting rounds); the step is None with fewer than `least`
    plain steps."""
    trace = run["stats"].get("trace") or []
    plain = sorted(t["verify_s"] for t in trace if not t["proposed"])
    return (plain[len(plain) // 2] if len(plain) >= max(least, 1) else None), [t for t in trace if t["proposed"]]


def drafting_loss(run: dict) -> float:
    """Seconds the drafting rounds cost beyond what plain steps (at this run's median) would have for their tokens:
    less noisy than the totals, since the plain steps both runs share drop out."""
    step, drafted = plain_step(run, MIN_PLAIN)
    if step is None:
        return None
    return sum(t["verify_s"] + t["draft_s"] - (t["accepted"] + 1) * step for t in drafted)


def drafting_yield(run: dict):
    """(drafting rounds, tokens they produced, their time counted in plain steps at the run's median), or None."""
    step, drafted = plain_step(run)
    if step is None:
        return None
    steps = sum(t["verify_s"] + t["draft_s"] for t in drafted) / step
    return len(drafted), sum(t["accepted"] + 1 for t in drafted), steps


def report(runs: list) -> str:
    """The markdown table: per prompt and row, old -> new seconds; per row, totals and the spread."""
    by = {(r["prompt"], r["row"], r["policy"]): r for r in runs}
    rows = list(dict.fromkeys(r["row"] for r in runs))
    prompts = list(dict.fromkeys(r["prompt"] for r in runs))
    lines = ["| prompt | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    pairs = {row: [] for row in rows}
    for p in prompts:
        cells = []
        for row in rows:
            o, n = by.get((p, row, "old")), by.get((p, row, "new"))
            if not (o and n):
                cells.append("-")
                continue
            same = [t["source"] for t in o["stats"]["trace"]] == [t["source"] for t in n["stats"]["trace"]] and \
                [t["proposed"] for t in o["stats"]["trace"]] == [t["proposed"] for t in n["stats"]["trace"]]
            pairs[row].append((o["total"], n["total"], o["tokens"] == n["tokens"]))
            lo, ln = drafting_loss(o), drafting_loss(n)
            cells.append(f"{o['total']:.1f} → {n['total']:.1f} ({o['total'] / n['total']:.2f}x"
                         + (f"; drafting {lo:+.1f} → {ln:+.1f}" if lo is not None and ln is not None else "") + ")"
                         + (" =" if same else "") + ("" if o["tokens"] == n["tokens"] else " DIFFERENT OUTPUT"))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("(seconds per reply, old → new; drafting: what the drafting rounds cost beyond plain steps at the "
                 "run's median for the same tokens, negative = saved, shown where both runs have 16 plain steps; "
                 "`=`: both sides made the same choice in every round, so the difference is timing noise)")
    lines.append("")
    for row, v in pairs.items():
        if not v:
            continue
        ratios = [o / n for o, n, _ in v]
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"- {row}: {len(v)} prompts, {sum(o for o, _, _ in v):.1f} s → {sum(n for _, n, _ in v):.1f} s "
                     f"({sum(o for o, _, _ in v) / sum(n for _, n, _ in v):.3f}x of the total; geometric mean "
                     f"{geo:.3f}x, per prompt {min(ratios):.2f}-{max(ratios):.2f}x); outputs identical: "
                     f"{sum(s for _, _, s in v)}/{len(v)}")
        for side in ("old", "new"):
            y = [t for t in (drafting_yield(r) for r in runs if r["row"] == row and r["policy"] == side) if t]
            n, tokens, steps = (sum(t[i] for t in y) for i in range(3))
            if steps:
                lines.append(f"  - {side}: {n} drafting rounds, {tokens / steps:.2f} tokens per plain step's time "
                             "(the tokens they produced over their time counted in plain steps at each run's median)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="git revision of the module to compare against")
    ap.add_argument("--file", default="mlx_spec/gen/policy.py",
                    help="the module (or comma list of modules) whose classes are compared")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompts", required=True, help="comma list of benchmark prompt ids (HumanEval/7:rename, ...)")
    ap.add_argument("--rows", required=True, help="comma list of drafter specs")
    ap.add_argument("--old-k", default="",
                    help="the old side's default draft lengths where they changed, e.g. model=6 "
                         "(`registry.DEFAULT_K`: a module constant, which the class swap does not reach)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True, help="JSON file for the runs (rewritten after each)")
    ap.add_argument("--report", action="store_true", help="only print the table of an existing --out file")
    args = ap.parse_args()
    runs = json.loads(Path(args.out).read_text())["runs"] if args.report else run(args)
    print(report(runs))


if __name__ == "__main__":
    main()
