"""mlx-spec's version: the installed package's (pyproject's), or `0.0.0+checkout` for a checkout run from
`PYTHONPATH` without installing it (the way the GPU machine runs it)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mlx-spec")
except PackageNotFoundError:
    __version__ = "0.0.0+checkout"
