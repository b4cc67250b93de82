"""mlx-spec: lossless speculative decoding on MLX, its public API the way mlx-lm offers its own.

    from mlx_spec import load, generate
    model, tokenizer, drafter = load("qwen2.5-coder-1.5b", "hybrid:qwen2.5-coder-0.5b")
    print(generate(model, tokenizer, "def fib(n):", drafter, max_tokens=64).text)

Importing it has two side effects, and only these: on Linux it opens an optimized BLAS for MLX to bind to
(`blas.setup`, before anything imports `mlx.core`), and it sets MLX_CUDA_USE_CUDNN_SDPA=0 unless the user set it
(`backend.setup`: MLX's CUDA attention without cuDNN's per-shape plans). The API's names load on first use, so
`import mlx_spec` loads neither MLX nor a model.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from . import backend as _backend
from . import blas as _blas

_blas.setup()  # must run before anything imports mlx.core
_backend.setup()  # before MLX's first attention call: cuDNN plans per shape are not for a pass a round

from .version import __version__  # noqa: E402  (after the BLAS and backend setup, as every import here)

# name -> the module that defines it. Loaded on first access (PEP 562), so the import stays light and the package's
# root loads none of its layers until asked.
_API = {
    "load": "mlx_spec.named",
    "generate": "mlx_spec.gen.stream",
    "stream_generate": "mlx_spec.gen.stream",
    "convert": "mlx_spec.make.resolve",
    "Session": "mlx_spec.gen.session",
}
__all__ = ["load", "generate", "stream_generate", "convert", "Session", "__version__"]

if TYPE_CHECKING:
    from .gen.session import Session
    from .gen.stream import generate, stream_generate
    from .make.resolve import convert
    from .named import load


def __getattr__(name: str):
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'mlx_spec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
