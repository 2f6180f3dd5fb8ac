"""Probe (issue #11): rollout gradients at degenerate configurations, for every backend.

Random fuzzing (`fuzz.py`) almost never draws an exact degeneracy, which is where a derivative
divides by zero: bodies resting exactly touching (distance 0) at zero velocity, on an edge or a
corner, stacked exactly, at one pose (coincident), or 2 cm deep; with `--thin`, the same with
degenerate (tiny, positive) sizes: a 1e-5 m plate, a capsule of half-length 1e-6, a 1e-5 m disk, a
1e-4 m lens. One scene holds a box, a sphere, a capsule, a cylinder and an ellipsoid over a plane;
each configuration is a world of one vmapped program per backend and dtype. Reported per world:
the loss and the gradient of a 3-step rollout loss w.r.t. the initial velocity, the geom frictions
and the body masses are finite (their largest magnitude), and the worlds flagged `diverged`.

    .venv/bin/python experiments/degenerate_probe.py --backends newton-implicit,ncp --dtypes f32,f64
    .venv/bin/python experiments/degenerate_probe.py --thin
"""

from __future__ import annotations

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxsim_ncp as jsn
from jaxsim_ncp import math as jm

SIZES = {"box": "0.1 0.1 0.1", "sph": "0.1", "cap": "0.05 0.1", "cyl": "0.1 0.1", "ell": "0.1 0.07 0.05"}
THIN_SIZES = {"box": "0.1 0.1 1e-5", "sph": "0.1", "cap": "0.05 1e-6", "cyl": "0.1 1e-5", "ell": "0.1 0.1 1e-4"}
TYPES = {"box": "box", "sph": "sphere", "cap": "capsule", "cyl": "cylinder", "ell": "ellipsoid"}
ORDER = tuple(TYPES)

BACKENDS = {
    "newton-implicit": dict(),
    "newton-unroll": dict(grad_mode="unroll"),
    "newton-implicitfast-pyr": dict(integrator="implicitfast", cone="pyramidal"),
    "rk4": dict(integrator="rk4"),
    "ncp": dict(solver="ncp", cone="elliptic"),
    "adaptive": dict(integrator="adaptive"),
    "cfd": dict(cfd=jsn.CFD(width=0.05)),
    "smooth": dict(collision_smoothing=0.01),
}


def scene(sizes: dict[str, str]) -> str:
    bodies = "\n".join(
        f'<body name="{k}" pos="{i} 0 1"><freejoint/><geom name="{k}" type="{TYPES[k]}" size="{sizes[k]}"/></body>'
        for i, k in enumerate(ORDER)
    )
    return f'<mujoco><option timestep="0.005"/><worldbody><geom type="plane" size="5 5 0.1"/>{bodies}</worldbody></mujoco>'


def _quat(axis, angle: float) -> np.ndarray:
    return np.asarray(jm.axis_angle_to_quat(np.asarray(axis, float), np.asarray(angle)))


I = np.r_[1.0, 0, 0, 0]


def configurations() -> dict[str, dict]:
    """Each body's (position, quaternion) per configuration; every contact starts at distance 0."""
    base = {"box": ([0, 0, 0.1], I), "sph": ([1, 0, 0.1], I), "cap": ([2, 0, 0.15], I), "cyl": ([3, 0, 0.1], I),
            "ell": ([4, 0, 0.05], I)}  # fmt: skip
    r2 = np.sqrt(2)
    tilt = _quat([1, 0, 0], np.pi / 4)
    return {
        "touching": base,
        "edge": dict(base, box=([0, 0, 0.1 * r2], tilt), cyl=([3, 0, 0.1 * r2], tilt),  # a box edge, a rim
                     cap=([2, 0, 0.05], _quat([1, 0, 0], np.pi / 2)), ell=([4, 0, 0.07], _quat([1, 0, 0], np.pi / 2))),
        "corner": dict(base, box=([0, 0, 0.1 * np.sqrt(3)], np.asarray(jm.quat_mul(_quat([0, 1, 0], np.arctan(1 / r2)), tilt))),
                       cyl=([3, 0, 0.1 * r2], _quat([0, 1, 0], np.pi / 4))),
        "coincident": dict(base, sph=([0, 0, 0.1], I), cap=([3, 0, 0.1], I), ell=([3, 0, 0.1], I)),
        "stacked": dict(base, sph=([0, 0, 0.3], I), cap=([0, 0, 0.45], I), ell=([3, 0, 0.25], I)),
        "penetrating": {k: ([p[0], p[1], p[2] - 0.02], q) for k, (p, q) in base.items()},
    }  # fmt: skip


def thin_configurations() -> dict[str, dict]:
    up = _quat([1, 0, 0], np.pi / 2)
    base = {"box": ([0, 0, 1e-5], I), "sph": ([1, 0, 0.1], I), "cap": ([2, 0, 0.05], I), "cyl": ([3, 0, 1e-5], I),
            "ell": ([4, 0, 1e-4], I)}  # fmt: skip
    return {
        "touching": base,
        "edge": dict(base, box=([0, 0, 0.1], up), cyl=([3, 0, 0.1], up), ell=([4, 0, 0.1], up)),
        "coincident": dict(base, box=([3, 0, 1e-5], I), ell=([3, 0, 1e-5], I), cap=([1, 0, 0.1], I)),
        "stacked": dict(base, sph=([0, 0, 2e-5 + 0.1], I), ell=([3, 0, 2e-5 + 1e-4], I)),
        "penetrating": {k: ([p[0], p[1], p[2] - 0.02], q) for k, (p, q) in base.items()},
    }


def run(backend: str, dtype, thin: bool, steps: int = 3):
    model = jsn.load_mjcf(scene(THIN_SIZES if thin else SIZES), dtype=dtype, **BACKENDS[backend])
    configs = thin_configurations() if thin else configurations()
    qpos = jnp.asarray(np.stack([np.concatenate([np.r_[c[k][0], c[k][1]] for k in ORDER]) for c in configs.values()]),
                       dtype)  # fmt: skip
    ctrl = jnp.zeros((steps, model.nu), dtype)
    data = jsn.make_data(model)

    def loss(qvel, friction, mass, qpos0):
        m = eqx.tree_at(lambda m: (m.geom_friction, m.body_mass), model, (friction, mass))
        final, _ = jsn.rollout(m, data.replace(qpos=qpos0, qvel=qvel), ctrl)
        return jnp.sum(final.qpos**2) + jnp.sum(final.qvel**2), final

    grad = jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), in_axes=(None, None, None, 0)))
    start = time.perf_counter()
    (value, final), grads = grad(jnp.zeros(model.nv, dtype), model.geom_friction, model.body_mass, qpos)
    rows = []
    for i, name in enumerate(configs):
        g = [np.asarray(x[i]) for x in grads]
        rows.append((name, bool(np.isfinite(value[i])), all(np.isfinite(x).all() for x in g),
                     max(float(np.abs(x).max()) for x in g), bool(final.diverged[i])))  # fmt: skip
    return time.perf_counter() - start, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--dtypes", default="f32,f64")
    parser.add_argument("--thin", action="store_true", help="degenerate (tiny, positive) sizes")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    for backend in args.backends.split(","):
        for name in args.dtypes.split(","):
            seconds, rows = run(backend, {"f32": jnp.float32, "f64": jnp.float64}[name], args.thin)
            bad = [r[0] for r in rows if not (r[1] and r[2])]
            print(f"{backend:24s} {name} {seconds:6.1f}s (compile included)  non-finite: {bad or 'none'}  "
                  f"max |grad|: {', '.join(f'{r[0]} {r[3]:.2g}' for r in rows)}  "
                  f"diverged: {[r[0] for r in rows if r[4]] or 'none'}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
