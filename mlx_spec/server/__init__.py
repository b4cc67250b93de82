"""`mlx-spec serve`: an OpenAI-compatible server and a web chat page that shows speculation at work."""
