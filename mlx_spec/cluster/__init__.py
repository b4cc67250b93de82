"""Generating with the target sharded across machines (MLX's distributed backend under `mlx.launch`): rank 0
decides each round, every rank runs the sharded passes."""

from .agree import Agreed
from .group import Cluster, ClusterError

__all__ = ["Agreed", "Cluster", "ClusterError"]
