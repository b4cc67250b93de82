"""`mlx-spec chat`: a terminal chat over a speculative Session."""
