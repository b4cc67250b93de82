"""Put an optimized BLAS under MLX on Linux before MLX loads.

The Linux `mlx[cpu]` wheel links the netlib *reference* BLAS, which is ~50x slower on
float32 matmuls than OpenBLAS. Opening OpenBLAS with RTLD_GLOBAL before `mlx.core` is
imported makes the dynamic linker bind MLX's `cblas_*`/`sgemm_` symbols to it, with no
LD_PRELOAD for the user to know about. No maintained library does this, hence by hand.
macOS needs nothing: MLX uses Accelerate there.
"""

import ctypes
import ctypes.util
import os
import sys

ENV_VAR = "MLX_SPEC_BLAS"  # a path to a BLAS .so, or "reference" to keep MLX's own

# Debian/Ubuntu multiarch locations first, then whatever the loader can find.
_CANDIDATES = [
    f"/usr/lib/{arch}-linux-gnu/{flavour}/libopenblas.so.0"
    for arch in ("x86_64", "aarch64")
    for flavour in ("openblas-pthread", "openblas-openmp", "openblas-serial")
] + [
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
    "/usr/local/lib/libopenblas.so.0",
]

HINT = (
    "mlx-spec: no optimized BLAS found, so MLX uses the reference BLAS (float32 decoding ~3x slower); "
    "install one with `apt-get install libopenblas0-pthread` or point MLX_SPEC_BLAS at a libopenblas.so"
)

# What setup() did: status is one of "openblas", "none", "disabled", "late", "not-linux".
status = "not-run"
path = None


def _try_load(candidate):
    try:
        lib = ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return hasattr(lib, "cblas_sgemm") and hasattr(lib, "sgemm_")


def setup():
    """Load an optimized BLAS globally if MLX is not loaded yet; return the status string."""
    global status, path
    if status != "not-run":
        return status
    choice = os.environ.get(ENV_VAR, "")
    if not sys.platform.startswith("linux"):
        status = "not-linux"
    elif choice.lower() in ("reference", "0", "off", "none"):
        status = "disabled"
    elif "mlx.core" in sys.modules:
        status = "late"  # MLX already bound its symbols; only a fresh process can change them
    else:
        found = ctypes.util.find_library("openblas")
        candidates = ([choice] if choice else []) + _CANDIDATES + ([found] if found else [])
        for c in candidates:
            if (os.path.exists(c) or c == found) and _try_load(c):
                path = c
                break
        status = "openblas" if path else "none"
    return status


def hint():
    """A one-line hint when MLX computes on the CPU backend of Linux with no optimized BLAS loaded, else None."""
    if status not in ("none", "late"):
        return None
    import mlx.core as mx  # setup() has run: importing MLX now changes nothing it did

    return HINT if mx.default_device() == mx.cpu else None
