"""Shared fixtures: float64 for every test (MuJoCo parity and finite differences).

The suite is compile-bound (most programs run a few steps once): XLA's CPU backend
optimizations are turned down unless XLA_FLAGS is set (the NCP gradient test compiles
in 86 s instead of 119 s, the parity file runs in 139 s instead of 161 s; results
are unchanged, only the generated code is less optimized). Programs that run long
loops (convex narrow phases over hundreds of poses, 100-step convex rollouts) take
`OPTIMIZED` as their jit's `compiler_options` instead: there the faster code pays
for the slower compile (cylinder-cylinder gradients: 12 s compile + 15 s run at
level 0, 16 s + 2 s at level 1).
XLA's newer MLIR fusion emitters are off too (`--xla_cpu_use_fusion_emitters=false`):
kernel generation dominates these compiles, and the older emitters produce the same
results in less time (a 10-step contact rollout: 7.2 s -> 3.8-5.4 s; the ellipsoid
scene's forward: 19-21 s -> 15-17 s).
XLA's while-loop invariant code motion is off as well: in programs of nested loops (a gradient
through Diffrax's checkpointed while loop around the Newton solver's loops) it was the largest
HLO pass (the adaptive toss gradient: 28.6 s -> 15.2 s to compile; the mesh manifold scene's
collide JVP 24 -> 19.5 s, its run time unchanged). Hoisting changes no value, only where it is
computed.
Two more cut XLA's own overhead (the sphere-capsule fuzz program: 25.5 s -> 20.0 s of CPU to compile,
the mesh collide gradient 33 -> 27 s, same executables): the HLO verifier that re-checks the whole
module between passes is skipped (`hlo-verifier` in the disabled passes; it only checks), and LLVM
code generation runs in one piece (`--xla_cpu_parallel_codegen_split_count=1`): splitting the module
for parallel code generation costs more than it gains when both cores already run a test each.

Python's garbage collector runs less often (`gc.set_threshold`): tracing a gradient through
contact allocates millions of short-lived objects, and the default thresholds made the
collector walk the whole heap again and again (the NCP fuzz program traced in 22 s, 16 s now).

JAX's persistent compilation cache is on, in one directory per test run shared by
the xdist workers: a program another worker (or an earlier module, whose in-memory
executables were released) already compiled is loaded instead of compiled again.
"""

import os

if not os.environ.get("DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering (render.py), before anything imports mujoco
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
    " --xla_disable_hlo_passes=while-loop-invariant-code-motion,hlo-verifier --xla_cpu_parallel_codegen_split_count=1",
)

import gc  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import pytest

jax.config.update("jax_enable_x64", True)
gc.set_threshold(100_000, 50, 100)  # defaults (700, 10, 10)

# the controller creates the directory before xdist spawns the workers, which inherit it, and
# removes it when the run ends (about 140 MB for the whole suite)
_OWN_CACHE = "JAXSIM_NCP_TEST_COMPILATION_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["JAXSIM_NCP_TEST_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="jaxsim_ncp_xla_cache_")
jax.config.update("jax_compilation_cache_dir", os.environ["JAXSIM_NCP_TEST_COMPILATION_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def pytest_sessionfinish(session):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAXSIM_NCP_TEST_COMPILATION_CACHE"], ignore_errors=True)


OPTIMIZED = {"xla_backend_optimization_level": 1, "xla_llvm_disable_expensive_passes": True}


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop each module's compiled executables when it ends.

    A pytest-xdist worker otherwise accumulates every program the suite compiles; with
    the whole suite in two workers one of them crashed (SIGSEGV inside XLA's compile)
    near the end of the run, in a test that passes on its own.
    """
    yield
    jax.clear_caches()
