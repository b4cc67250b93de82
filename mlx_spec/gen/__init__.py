"""Generating: sampling, verification, the draft-length policy, the engine, the session, drafters, loading a model folder."""
