"""Which device MLX computes on: its backend (Metal, CUDA or the CPU), the GPU or CPU's name, the NVIDIA driver;
whether it builds kernels per input shape; the peak memory MLX allocated on it during a run."""

import functools
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import mlx.core as mx

from . import blas as _blas

BACKENDS = {"metal": "Metal", "cuda": "CUDA", "cpu": "CPU"}  # as info() records them -> as a line prints them


@dataclass(frozen=True)
class Device:
    """The device of MLX's default stream: what a run's speed depends on."""

    kind: str  # "gpu" or "cpu": MLX's default device type
    backend: str  # "metal", "cuda" or "cpu": the MLX backend that computes there
    name: str  # the chip MLX reports: "NVIDIA H100 80GB HBM3", "Apple M3 Max", "AMD EPYC"
    driver: str | None = None  # the NVIDIA driver's version on CUDA, else None
    blas: str | None = None  # on the CPU backend, the BLAS under MLX: "OpenBLAS", "reference BLAS", "Accelerate"

    def __str__(self) -> str:
        """One line: 'gpu (CUDA, NVIDIA H100 80GB HBM3, driver 580.159.04)', 'cpu (AMD EPYC, OpenBLAS)'."""
        parts = [BACKENDS[self.backend]] if self.kind == "gpu" else []
        parts += [p for p in (self.name, self.driver and f"driver {self.driver}", self.blas) if p]
        return f"{self.kind} ({', '.join(parts)})"


def info() -> Device:
    """The device MLX's default stream runs on now (mx.set_default_device changes it)."""
    dev = mx.default_device()
    name = str(mx.device_info(dev).get("device_name") or "unknown")
    if dev.type == mx.cpu:
        return Device("cpu", "cpu", name, blas=_blas_name())
    if mx.cuda.is_available():
        return Device("gpu", "cuda", name, driver=nvidia_driver())
    return Device("gpu", "metal", name)


def describe() -> str:
    """`info()` as one line, for a face to print."""
    return str(info())


def builds_per_shape() -> bool:
    """Whether the device in use builds kernels per input shape (MLX's GPU backends: Metal, CUDA)."""
    return mx.default_device().type == mx.DeviceType.gpu


class Peak:
    """MLX's peak allocation above what was in use when made, without resetting the process-wide peak (the caller's)."""

    def __init__(self):
        self.base, self.peak0, self.seen = mx.get_active_memory(), mx.get_peak_memory(), 0

    def gb(self) -> float:
        self.seen = max(self.seen, mx.get_active_memory())
        peak = mx.get_peak_memory()
        top = peak if peak > self.peak0 else self.seen  # a new process-wide peak happened during the run
        return max(0, top - self.base) / 1e9


def _blas_name() -> str:
    if sys.platform == "darwin":
        return "Accelerate"
    return "OpenBLAS" if _blas.status == "openblas" else "reference BLAS"


@functools.lru_cache(maxsize=1)
def nvidia_driver() -> str | None:
    """The NVIDIA driver's version as `nvidia-smi` prints it ('580.159.04'); None where it cannot say."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[0].strip() if out.strip() else ""
    return first if re.fullmatch(r"\d+(\.\d+)*", first) else None  # its errors go to stdout too
