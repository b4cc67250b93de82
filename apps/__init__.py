"""Faces for people (the top-level `apps/` folder, installed as `mlx_spec_apps`): the terminal chat and the web chat."""
