"""Probe: every primitive and convex pair function's gradient at float32 round-off poses (issue #11).

Both geoms are turned about one world axis, with float32 round-off (1e-20 to 3e-38, or 0) in
their other quaternion components, as planar motion leaves them after a few float32 steps; the
gradient of a loss that masks invalid contact slots (as the pipeline does: a zero cotangent for a
pair that is apart) must be finite. This found `capsule_box`'s size / axis-component quotient,
whose textbook derivative overflowed (57 of 128 poses non-finite; `math.quotient` fixed it), in
the GPU fuzz's seed-3010 NaN.

    .venv/bin/python experiments/roundoff_probe.py --poses 512
"""

from __future__ import annotations

import argparse
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np

from jaxsim_ncp import math as jm
from jaxsim_ncp.collision import driver
from jaxsim_ncp.collision.base import GeomFrame
from jaxsim_ncp.collision.primitives import CAPSULE, CYLINDER, HFIELD, PLANE, SPHERE
from jaxsim_ncp.collision.mesh import MESH


def _frames(rng: np.random.Generator, geom_type: int, n: int, centre, axis: np.ndarray | None = None) -> GeomFrame:
    """n random frames of one geom type turned about a world axis (random, or `axis` per pose);
    with `axis` given, the positions' components along it are round-off: both geoms of a pair then
    move in one plane, as in a planar scene (parallel edges, coplanar faces)."""
    planar = axis is not None
    axis = rng.integers(0, 3, n) if axis is None else axis
    angle = rng.uniform(-np.pi, np.pi, n)
    quat = np.zeros((n, 4))
    quat[:, 0], quat[np.arange(n), 1 + axis] = np.cos(angle / 2), np.sin(angle / 2)
    off_axis = np.ones((n, 4), bool)
    off_axis[:, 0] = off_axis[np.arange(n), 1 + axis] = False
    round_off = rng.choice([1e-20, 1e-25, 1e-30, 3e-38], (n, 4)) * rng.choice([-1, 1], (n, 4))
    quat = np.where(off_axis & (rng.uniform(size=(n, 4)) < 0.7), round_off, quat)
    size = rng.uniform(0.03, 0.3, (n, 3))
    if geom_type == SPHERE:
        size[:, 1:] = 0
    if geom_type in (CAPSULE, CYLINDER):
        size[:, 2] = 0
    pos = np.zeros((n, 3)) if geom_type == PLANE else centre + rng.uniform(-0.15, 0.15, (n, 3))
    if planar and geom_type != PLANE:
        pos[np.arange(n), axis] = rng.choice([0.0, 1e-30, -1e-25, 1e-20], n)
    mat = jax.vmap(jm.quat_to_mat)(jnp.asarray(quat, jnp.float32))
    return GeomFrame(jnp.asarray(pos, jnp.float32), mat, jnp.asarray(size, jnp.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poses", type=int, default=512, help="random poses per pair function")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--planar", action="store_true", help="both geoms of a pose turned about one axis, in one plane")
    args = parser.parse_args()
    rng, n = np.random.default_rng(args.seed), args.poses
    for types, (fn, slots) in sorted(driver.FUNCTIONS.items()):
        if MESH in types or HFIELD in types:
            continue
        if "ccd" in inspect.signature(fn).parameters:
            fn = functools.partial(fn, ccd=(1e-6, 35))
        axis = rng.integers(0, 3, n) if args.planar else None
        g1, g2 = _frames(rng, types[0], n, np.array([0, 0, 0.1]), axis), _frames(rng, types[1], n, np.array([0.05, 0, 0.2]), axis)
        weights = jnp.asarray(rng.normal(size=(n, slots)), jnp.float32)

        def loss(a, b, w):
            col = fn(a, b, jnp.zeros((), jnp.float32))
            w = jnp.where(col.valid, w, 0.0)
            return jnp.sum(w * col.dist) + jnp.sum(w[:, None] * col.pos) + jnp.sum(w[:, None, None] * col.frame)

        grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(g1, g2, weights)
        finite = np.all(np.stack([np.all(np.isfinite(np.asarray(x)).reshape(n, -1), axis=1) for x in jax.tree.leaves(grads)]), axis=0)
        name = getattr(fn, "func", fn).__name__
        print(f"{types} {name}: non-finite gradients in {int((~finite).sum())} of {n} poses", flush=True)


if __name__ == "__main__":
    main()
