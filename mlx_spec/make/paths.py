"""Where mlx-spec keeps downloads and conversions, and the small file-system helpers around it."""

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ConvertError, SourceError

HOME_ENV = "MLX_SPEC_HOME"
DEFAULT_HOME = Path.home() / ".cache" / "mlx-spec"  # one documented place for everything we fetch or make


def home() -> Path:
    """The cache root: $MLX_SPEC_HOME, else ~/.cache/mlx-spec."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_folder(folder: Path) -> str:
    """sha256 over a model folder's weight and config files, in name order."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(folder).iterdir() if p.suffix in (".safetensors", ".json") and p.is_file())
    if not files:
        raise SourceError(f"{folder}: no safetensors or config files to hash")
    for p in files:
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def ensure_free_space(where: Path, need_bytes: int, what: str) -> None:
    """Fail early, before writing anything, when `where` lacks `need_bytes` of free disk."""
    where = Path(where)
    probe = where if where.exists() else next((p for p in where.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    if free < need_bytes:
        raise ConvertError(
            f"not enough disk space for {what}: need {need_bytes / 1e9:.2f} GB at {probe}, {free / 1e9:.2f} GB free"
        )


@contextlib.contextmanager
def atomic_dir(out: Path, force: bool = False):
    """Yield a temp folder beside `out`; on success rename it to `out`, on any error delete it.

    An interrupted run leaves at most a hidden `.tmp-*` folder, never a half-written `out`.
    """
    out = Path(out)
    if out.exists() and not force:
        raise ConvertError(f"output folder {out} already exists (pass --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_file(out: Path) -> Path:
    """A temp path beside `out`; the caller writes it and then calls `.replace(out)`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # mkstemp makes 0600; the result should read like any file the user writes
    return Path(name)
