"""Drafters: one interface (base.py); model, n-gram, self and hybrid drafters."""
