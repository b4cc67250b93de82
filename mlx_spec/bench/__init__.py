"""Benchmarks (a face): `python -m mlx_spec.bench decode|spec`; `app` is the typer app to mount as `mlx-spec bench`."""

from .cli import app

__all__ = ["app"]
