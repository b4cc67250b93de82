"""Generating: sampling, verification, the planner, the engine, the session, drafters, loading a model folder."""
