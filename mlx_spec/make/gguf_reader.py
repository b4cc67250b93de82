"""Read a GGUF file's header (metadata and tensor infos) and say whether we can convert it."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import SourceError, UnsupportedError

_ALIGNMENT = 32  # GGUF's default when general.alignment is absent

# GGUF metadata value types -> struct format; 8 = string and 9 = array are handled apart.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")


@dataclass
class TensorInfo:
    """One tensor's header entry; `shape` is in GGUF order (fastest-varying dimension first)."""

    name: str
    shape: tuple[int, ...]
    qtype: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def np_shape(self) -> tuple[int, ...]:
        """The row-major (numpy / HF) shape: GGUF lists dimensions in reverse."""
        return tuple(reversed(self.shape))

    @property
    def type_name(self) -> str:
        """The GGML type's name, e.g. Q4_K."""
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type#{self.qtype}"


@dataclass
class GGUFFile:
    """The parsed header of a GGUF file: metadata fields and tensor infos (no tensor data)."""

    path: Path
    size: int
    version: int
    fields: dict = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)

    def get(self, key: str, default=None):
        """A metadata value; `{arch}` in the key is replaced by the architecture."""
        return self.fields.get(key.replace("{arch}", self.architecture), default)

    @property
    def architecture(self) -> str:
        """`general.architecture`, or "" when missing."""
        return str(self.fields.get("general.architecture", ""))


class _Truncated(Exception):
    pass


def read_header(path: Path) -> GGUFFile:
    """Parse metadata and tensor infos with a small struct reader.

    gguf.GGUFReader builds one numpy view per array element, which takes ~10 s on a
    262k-token vocabulary; this reads the same header in well under a second.
    """
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such GGUF file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 4 or head[:4] != b"GGUF":
        raise SourceError(f"{path}: not a GGUF file (missing GGUF magic bytes)")
    if len(head) < 24:
        raise SourceError(f"{path}: truncated GGUF file ({size} bytes)")
    version = struct.unpack_from("<I", head, 4)[0]
    if version & 0xFFFF == 0 and version:
        raise UnsupportedError(f"{path}: big-endian GGUF files are not supported")
    if version not in (2, 3):
        raise UnsupportedError(f"{path}: GGUF version {version} is not supported (need 2 or 3)")
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        return _parse(path, buf, size, version)
    except _Truncated as e:
        raise SourceError(f"{path}: truncated or corrupt GGUF header ({e})") from None
    except (struct.error, ValueError, IndexError, UnicodeDecodeError, OverflowError) as e:
        raise SourceError(f"{path}: corrupt GGUF header ({e})") from None
    finally:
        del buf


def _parse(path: Path, buf: np.ndarray, size: int, version: int) -> GGUFFile:  # noqa: C901  # the header's grammar: readers nested to share one cursor
    pos = 8

    def take(fmt: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise _Truncated(f"header ends at byte {size}")
        value = struct.unpack_from(fmt, buf, pos)[0]  # type: ignore[arg-type]  # numpy declares buffers from 3.12
        pos += n
        return value

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > size:
            raise _Truncated(f"a {n}-byte string runs past byte {size}")
        s = bytes(buf[pos : pos + n]).decode("utf-8", errors="replace")
        pos += n
        return s

    def value(vtype: int):
        nonlocal pos
        if vtype in _SCALAR:
            return take(_SCALAR[vtype])
        if vtype == 8:
            return string()
        if vtype == 9:
            etype, count = take("<I"), take("<Q")
            if etype in _SCALAR and etype != 7:
                dt = np.dtype(_SCALAR[etype])
                if pos + count * dt.itemsize > size:
                    raise _Truncated(f"an array of {count} runs past byte {size}")
                arr = np.frombuffer(buf, dtype=dt, count=count, offset=pos).copy()
                pos += count * dt.itemsize
                return arr
            if count > size:
                raise _Truncated(f"array count {count} exceeds the file size")
            return [value(etype) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {vtype}")

    n_tensors, n_kv = take("<Q"), take("<Q")
    if n_tensors > size or n_kv > size:
        raise _Truncated(f"{n_tensors} tensors / {n_kv} keys cannot fit in {size} bytes")
    out = GGUFFile(path=path, size=size, version=version)
    for _ in range(n_kv):
        key = string()
        out.fields[key] = value(take("<I"))
    raw = []
    for _ in range(n_tensors):
        name = string()
        n_dims = take("<I")
        if n_dims > 8:
            raise ValueError(f"tensor {name} has {n_dims} dimensions")
        shape = tuple(int(take("<Q")) for _ in range(n_dims))
        raw.append((name, shape, take("<I"), take("<Q")))
    align = int(out.fields.get("general.alignment", _ALIGNMENT)) or _ALIGNMENT
    data_start = -(-pos // align) * align
    for name, shape, qtype, offset in raw:
        out.tensors.append(
            TensorInfo(name, shape, qtype, data_start + offset, _tensor_nbytes(path, name, shape, qtype))
        )
    return out


def _tensor_nbytes(path: Path, name: str, shape: tuple[int, ...], qtype: int) -> int:
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise UnsupportedError(f"{path}: tensor {name} has unknown GGML type id {qtype}") from None
    if not shape or shape[0] % block:
        raise SourceError(f"{path}: tensor {name} has shape {list(shape)}, not whole blocks of {block}")
    return math.prod(shape) // block * type_size


def check_bounds(info: GGUFFile) -> None:
    """Fail fast on a cut-off download instead of crashing midway through dequantizing."""
    for t in info.tensors:
        if t.offset + t.nbytes > info.size:
            raise SourceError(
                f"{info.path}: truncated: tensor {t.name} needs bytes up to {t.offset + t.nbytes:,} "
                f"but the file has {info.size:,}"
            )


@functools.cache
def _dequantizable(qtype: int) -> bool:
    """Whether the installed gguf package can dequantize this type (tried on one zero block)."""
    if qtype == GGMLQuantizationType.F64:
        return True
    try:
        qt = GGMLQuantizationType(qtype)
        quants.dequantize(np.zeros((1, GGML_QUANT_SIZES[qt][1]), np.uint8), qt)
        return True
    except (NotImplementedError, KeyError, ValueError):
        return False


def problems(info: GGUFFile) -> list[str]:
    """Why this file cannot be converted (empty when it can)."""
    out = []
    if int(info.get("split.count", 1)) > 1:
        out.append("it is one part of a split GGUF; merge the parts first (llama-gguf-split --merge)")
    if info.architecture not in SUPPORTED_ARCHITECTURES:
        out.append(
            f"architecture {info.architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    bad = sorted({t.type_name for t in info.tensors if not _dequantizable(t.qtype)})
    if bad:
        out.append(f"tensor type {', '.join(bad)} is not supported (the gguf package cannot dequantize it)")
    return out
