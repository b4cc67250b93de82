"""`python -m mlx_spec.bench`: the benchmark commands."""

from .cli import main

main()
