"""Training drafters on this machine: `head.py` trains an EAGLE-3 head for a target (`mlx-spec train-head`)."""
