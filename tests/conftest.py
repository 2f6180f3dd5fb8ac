"""Shared fixtures: float64 for every test (MuJoCo parity and finite differences)."""

import jax

jax.config.update("jax_enable_x64", True)
