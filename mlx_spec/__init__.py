"""mlx-spec: lossless speculative decoding on MLX. Importing it first puts a fast BLAS under MLX on Linux."""

from . import blas as _blas

_blas.setup()  # must run before anything imports mlx.core

__version__ = "0.1.0"
