"""Suite result files: one versioned JSON per run (see SCHEMA.md), appended row by row, resumable.

The file is rewritten whole and atomically after every measurement (a temporary file, then a
rename), so an interrupted run, a crash or a full disk leave the last complete version in place;
`--resume FILE` continues it and never redoes a finished measurement.
"""

import errno
import gzip
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import MlxSpecError
from .common import _command, git_revision

SCHEMA = "mlx-spec.bench/1"  # bump the number when a field changes meaning or goes away (SCHEMA.md)


class ResultError(MlxSpecError):
    """A result file that cannot be read, resumed or compared."""


def key(*parts) -> str:
    """A measurement's identity in `done`: its row, prompt and repeat."""
    return "|".join(str(p) for p in parts)


def read(path) -> dict:
    """A result file (or its gzip, `.json.gz`), checked to be one: one line if it is missing, not JSON, or not ours."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        data = json.loads(gzip.decompress(raw) if p.suffix == ".gz" else raw)  # the repository's records are .json.gz
    except FileNotFoundError:
        raise ResultError(f"no result file {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultError(f"{p} is not a result file (not readable JSON: {e})") from None
    if not isinstance(data, dict) or "schema" not in data:
        raise ResultError(f"{p} is not a result file of `mlx-spec bench run` (no 'schema' field)")
    return data


def read_current(path) -> dict:
    """A result file of the schema this mlx-spec writes (older ones: one line saying so)."""
    return check_current(read(path), path)


def check_current(data: dict, path) -> dict:
    """`data` (read from `path`) if it has the schema this mlx-spec writes; one line saying so if not."""
    if data["schema"] != SCHEMA:
        raise ResultError(f"{path} has schema {data['schema']}; this mlx-spec reads {SCHEMA}")
    return data


class ResultFile:
    """A run's JSON: the suite, the machine, the rows, every measurement so far; and its markdown beside it."""

    def __init__(self, path: Path, data: dict):
        self.path = Path(path)
        self.md_path = self.path.with_suffix(".md")
        self.data = data
        self.done = {r["key"] for r in data["records"]}

    @classmethod
    def create(cls, out, suite: dict, machine: dict) -> "ResultFile":
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{suite['name']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
        data = {
            "schema": SCHEMA,
            "suite": suite,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": _command(),
            "complete": False,
            "machine": machine,
            "models": {},
            "rows": [],
            "records": [],
            "summary": [],
        }
        f = cls(path, data)
        f.flush()
        return f

    @classmethod
    def resume(cls, path, suite: dict) -> "ResultFile":
        """Continue a run of the same suite; its finished measurements stay as they are."""
        data = read(path)
        if data["schema"] != SCHEMA:
            raise ResultError(f"{path} has schema {data['schema']}, this mlx-spec writes {SCHEMA}: start a new run")
        mine = {k: v for k, v in suite.items() if k != "path"}
        theirs = {k: v for k, v in data.get("suite", {}).items() if k != "path"}
        if mine != theirs:
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise ResultError(f"{path} was a run of a different suite ({', '.join(changed)} differ): start a new run")
        data.setdefault("resumed", []).append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": _command(), "git_rev": git_revision()}
        )  # the code may differ from the start's
        return cls(path, data)

    def add(self, record: dict) -> None:
        self.data["records"].append(record)
        self.done.add(record["key"])
        self.flush()

    def set_row(self, row: dict) -> None:
        """Add a row, or replace the one with its key where it stands (the suite's order is the table's)."""
        rows = self.data["rows"]
        at = next((i for i, r in enumerate(rows) if r["key"] == row["key"]), None)
        if at is None:
            rows.append(row)
        else:
            rows[at] = row

    def records(self, row_key: str | None = None) -> list[dict]:
        return [r for r in self.data["records"] if row_key is None or r["row"] == row_key]

    def flush(self) -> None:
        """Rewrite the JSON atomically; a full disk is one line, and the last complete file stays."""
        self.data["machine"]["loadavg_end"] = os.getloadavg()
        self._write(self.path, json.dumps(self.data, indent=1, default=str))

    def publish(self, render: Callable[[dict], str]) -> str:
        """The JSON and its page, rendered from the data as written (the load average the page shows included)."""
        self.data["machine"]["loadavg_end"] = os.getloadavg()
        md = render(self.data)
        self._write(self.path, json.dumps(self.data, indent=1, default=str))
        self._write(self.md_path, md)
        return md

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else str(e)
            raise ResultError(
                f"cannot write {path}: {why}; the results written before are kept there "
                f"(resume with --resume {self.path})"
            ) from None
