"""Shared fixtures: float64 for every test (MuJoCo parity and finite differences)."""

import jax
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
