"""Shared fixtures: float64 for every test (MuJoCo parity and finite differences).

The suite is compile-bound (most programs run a few steps once): XLA's CPU backend
optimizations are turned down unless XLA_FLAGS is set (the NCP gradient test compiles
in 86 s instead of 119 s, the parity file runs in 139 s instead of 161 s; results
are unchanged, only the generated code is less optimized).
"""

import os

if not os.environ.get("DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering (render.py), before anything imports mujoco
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

import jax  # noqa: E402
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop each module's compiled executables when it ends.

    A pytest-xdist worker otherwise accumulates every program the suite compiles; with
    the whole suite in two workers one of them crashed (SIGSEGV inside XLA's compile)
    near the end of the run, in a test that passes on its own.
    """
    yield
    jax.clear_caches()
