"""mlx-spec: lossless speculative decoding on MLX. Importing it first puts a fast BLAS under MLX on Linux."""

from . import backend as _backend
from . import blas as _blas

_blas.setup()  # must run before anything imports mlx.core
_backend.setup()  # before MLX's first attention call: cuDNN plans per shape are not for a pass a round

__version__ = "0.1.0"
