"""`mlx-spec bench ab OLD`: two revisions of mlx-spec timed in one run, interleaved, on the same prompts.

Each side is a checkout (a folder, or a git revision of this repository exported to a temporary folder) with its own
worker process (`ab_worker.py`), which imports that checkout's engine. Every prompt runs every row on both sides, the
side that goes first alternating (`firsts`), so the machine's drift falls on both alike; plain decoding is always a row.
"""

import gzip
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError
from .common import RunFile, git_revision, machine_info, md_table, median

SIDES = ("old", "new")
WORKER = Path(__file__).with_name("ab_worker.py")
# What a revision's worker needs: the package (its recipes inside it), and the recipes' folder of older revisions.
EXPORTED = ("mlx_spec", "convert")


@dataclass
class Side:
    """One side of the A/B: the checkout its worker imports and what the user called it."""

    name: str  # "old" or "new"
    label: str  # the revision or folder as given (the working tree for the default new side)
    root: Path  # a folder holding mlx_spec/


def _repo() -> Path:
    return Path(__file__).resolve().parents[2]  # mlx_spec/bench/ab.py -> the checkout's root


def checkout(name: str, spec: str | None, tmp: Path) -> Side:
    """The side `spec` names: None for this checkout's working tree, a folder holding `mlx_spec/`, or a git revision
    of this repository (its package and recipes exported under `tmp`)."""
    if spec is None:
        return Side(name, f"working tree @ {git_revision()}", _repo())
    folder = Path(spec).expanduser()
    if (folder / "mlx_spec" / "__init__.py").is_file():
        return Side(name, spec, folder.resolve())
    rev = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"], cwd=_repo(), capture_output=True, text=True
    ).stdout.strip()
    if not rev:
        raise MlxSpecError(f"{name} side '{spec}': neither a folder holding mlx_spec/ nor a git revision of {_repo()}")
    paths = [
        p
        for p in EXPORTED
        if subprocess.run(["git", "cat-file", "-e", f"{rev}:{p}"], cwd=_repo(), capture_output=True).returncode == 0
    ]
    tar = subprocess.run(["git", "archive", "--format=tar", rev, *paths], cwd=_repo(), capture_output=True)
    if tar.returncode:
        raise MlxSpecError(f"{name} side '{spec}': git archive failed: {tar.stderr.decode().strip()}")
    root = tmp / f"{name}-{rev[:12]}"
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(root, filter="data")
    return Side(name, f"{spec} ({rev[:12]})", root)


class Worker:
    """A side's worker process: one JSON request line in, one reply line out."""

    def __init__(self, side: Side, target: str):
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER.read_text(), target],
            cwd=side.root,  # `python -c` puts the working folder first on sys.path: the side's mlx_spec
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._read()
        imported = Path(ready["ready"]).resolve()
        if side.root not in imported.parents:
            self.close()
            raise MlxSpecError(f"{side.name} side: its worker imported {imported}, not the checkout {side.root}")
        self.imported = str(imported)

    def _read(self) -> dict:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            code = self.proc.wait()
            raise MlxSpecError(f"{self.side.name} side ({self.side.label}): its worker exited ({code}); see above")
        return json.loads(line)

    def ask(self, ids: list[int], draft: str, max_tokens: int) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "draft": draft, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class AbSettings:
    """What `bench ab` measures."""

    old: str
    new: str | None = None  # None: this checkout's working tree
    target: str = "qwen2.5-coder-1.5b"
    drafts: tuple[str, ...] = ("suffix", "hybrid:qwen2.5-coder-0.5b")
    humaneval: int = 5
    edit: int = 5
    prose: int = 0
    max_tokens: int = 128
    repeats: int = 1


def run_ab(s: AbSettings, out: str, log: Callable[[str], None] = lambda _m: None) -> RunFile:
    """Both sides over every prompt and row, alternating which goes first; the record is rewritten after each
    measurement, so an interrupted run keeps what it measured."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from ..make.resolve import resolve
    from .prompts import WARMUP_PROMPT, build, chat_ids

    tokenizer = load_tokenizer(resolve(s.target, log))
    prompts = build(tokenizer, s.humaneval, s.edit, n_prose=s.prose)
    rows = ["none", *[d for d in s.drafts if d != "none"]]
    run = RunFile("ab", Path(out), {"settings": vars(s), "machine": machine_info(), "records": []})
    with tempfile.TemporaryDirectory(prefix="mlx-spec-ab-") as tmp:
        sides = [checkout("old", s.old, Path(tmp)), checkout("new", s.new, Path(tmp))]
        workers: list[Worker] = []
        try:
            for side in sides:
                log(f"{side.name}: {side.label}, loading {s.target}")
                workers.append(Worker(side, s.target))
            run.data["sides"] = {w.side.name: {"label": w.side.label, "imported": w.imported} for w in workers}
            warm = chat_ids(tokenizer, WARMUP_PROMPT)
            for w in workers:  # first passes of each shape and every draft model loaded, outside the timings
                for d in rows:
                    w.ask(warm, d, 16)
            for rep in range(s.repeats):
                for p, first in zip(prompts, firsts([p.set for p in prompts], len(rows), rep)):
                    for d, f in zip(rows, first):
                        for w in workers[f:] + workers[:f]:
                            r = w.ask(p.ids, d, s.max_tokens)
                            run.data["records"].append(
                                {"side": w.side.name, "prompt": p.id, "set": p.set, "draft": d, "repeat": rep, **r}
                            )
                            log(f"{w.side.name} {p.id} {d}: " + (r.get("error") or f"{_tps(r):.2f} tok/s"))
                        run.flush()
                        run.write_markdown(render(run.data))
            run.data["complete"] = True
        finally:
            for w in workers:
                w.close()
            run.flush()
            run.write_markdown(render(run.data))
    return run


def firsts(sets: list[str], rows: int, repeat: int = 0) -> list[list[int]]:
    """Which side goes first (0 old, 1 new) for each prompt of `sets` and each row: alternating from prompt to prompt
    within a set, and from row to row, so that every row of every set has each side first as often as the other,
    give or take one. (Alternating over the whole run instead put one side first for a row's every prompt of a set
    where the rows were odd in number and the sets took turns, and for a row's every prompt where they were even.)"""
    seen: dict[str, int] = {}
    out = []
    for name in sets:
        i = seen[name] = seen.get(name, -1) + 1
        out.append([(i + d + repeat) % 2 for d in range(rows)])
    return out


def read(path) -> dict | None:
    """The record at `path` (.json or .json.gz) if `bench ab` wrote it, else None."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        data = json.loads(gzip.decompress(raw) if p.suffix == ".gz" else raw)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == "ab" else None


def _tps(r: dict) -> float:
    """Tokens per second end to end, prefill included."""
    return len(r["tokens"]) / r["total"] if r.get("total") else 0.0


def render(data: dict) -> str:
    """The page: per row and prompt set, each side's tokens/s, new over old, its spread per prompt, and equality."""
    s, sides = data["settings"], data.get("sides", {})
    recs = [r for r in data["records"] if "error" not in r]
    by = {(r["side"], r["prompt"], r["draft"], r["repeat"]): r for r in recs}
    lines = [
        "# `bench ab`: two revisions in one run, interleaved",
        "",
        f"`{' '.join(data['command'])}`",
        "",
        *[f"- {name}: {sides[name]['label']}" for name in SIDES if name in sides],
        f"- target {s['target']}, {s['max_tokens']} new tokens, greedy; the side that runs first alternates",
        "",
        "Tokens/s end to end (prefill included) over the prompts both sides finished; new / old is the ratio of the "
        "sums, its spread the per-prompt ratios; identical: each side's tokens against its own plain decoding.",
        "",
    ]
    table = []
    drafts = list(dict.fromkeys(r["draft"] for r in recs))
    for d in drafts:
        sets = list(dict.fromkeys(r["set"] for r in recs if r["draft"] == d))
        for group in [*sets, "all"] if len(sets) > 1 else sets:
            keys = {
                k[1:]
                for k in by
                if k[2] == d and (group == "all" or by[k]["set"] == group) and k[0] == "old" and ("new", *k[1:]) in by
            }
            if not keys:
                continue
            tps = {side: _sum_tps([by[(side, *k)] for k in keys]) for side in SIDES}
            ratios = [_tps(by[("new", *k)]) / _tps(by[("old", *k)]) for k in keys if _tps(by[("old", *k)])]
            same = {side: sum(_identical(by, side, k) for k in keys) for side in SIDES}
            agree = sum(by[("new", *k)]["tokens"] == by[("old", *k)]["tokens"] for k in keys)
            table.append(
                [
                    d,
                    group,
                    f"{tps['new']:.2f}",
                    f"{tps['old']:.2f}",
                    f"**{tps['new'] / tps['old']:.3f}x**" if tps["old"] else "-",
                    f"{min(ratios):.2f}-{max(ratios):.2f} (median {median(ratios):.2f})" if ratios else "-",
                    f"{same['new']}/{len(keys)}, {same['old']}/{len(keys)}",
                    f"{agree}/{len(keys)}",
                ]
            )
    header = [
        "Draft",
        "Set",
        "new tok/s",
        "old tok/s",
        "new / old",
        "per prompt",
        "identical (new, old)",
        "sides equal",
    ]
    lines.append(md_table(header, table))
    errors = [r for r in data["records"] if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} measurement(s) failed:"]
        lines += [f"- {r['side']} {r['prompt']} {r['draft']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def _sum_tps(recs: list[dict]) -> float:
    total = sum(r["total"] for r in recs)
    return sum(len(r["tokens"]) for r in recs) / total if total else 0.0


def _identical(by: dict, side: str, key: tuple) -> bool:
    plain = by.get((side, key[0], "none", key[2]))
    return plain is not None and plain["tokens"] == by[(side, *key)]["tokens"]
