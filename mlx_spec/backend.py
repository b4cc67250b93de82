"""Process-wide settings of MLX's backends that speculation needs, applied when `mlx_spec` is imported.

MLX's CUDA backend runs attention over several query positions through cuDNN, whose execution plans it caches by
the exact shapes of the queries and keys (`build_sdpa_cache_key` in mlx/backend/cuda/scaled_dot_product_attention.cpp).
A verify pass attends over a cache that is longer every round, so every round built a new plan: 50-120 ms a round
against 6 ms for the pass itself on an H100 (notebooks/NOTEBOOK.md §24). Without cuDNN, MLX runs those passes with
its own kernels, which serve every length. The variable is read once, at MLX's first attention call; a value the
user set is kept. Metal and the CPU backend do not read it.
"""

import os

CUDNN_SDPA = "MLX_CUDA_USE_CUDNN_SDPA"


def setup() -> None:
    os.environ.setdefault(CUDNN_SDPA, "0")
