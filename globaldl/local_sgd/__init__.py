"""Fewer rounds: local steps between exchanges of compressed model deltas (local SGD, DiLoCo)."""
