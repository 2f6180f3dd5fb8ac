"""One convex pair's contact derivative against central differences, over sampled deep poses.

    python experiments/pair_fd.py --pair cylinder cylinder --mode crossed --seed 0 --poses 128

Per pose, a loss over the pair's contact slots (dist, pos and frame, random weights) is
differentiated along a random direction of geom 1's position (reverse mode, one jit(vmap) over
all poses and their perturbations, float64) and compared with central differences at 1e-5 and
1e-7. A pose is reported where the gradient is off the 1e-7 difference by more than 1e-4
(relative above 1); "smooth" says whether the two differences agree.

Modes (the test's sizes, `tests/test_collision_primitives.padded_sizes`):
- crossed: the sides of geom 1 (capsule or cylinder) and geom 2 (cylinder, or a box's edge)
  crossed at 30-150 degrees, 1-15 cm deep (--depth): the contact normal is pinned by both kinks
  (the cross product of the axes), where s(n) of `convex` (1) peaks with a kink;
- random: geom 2 at a random rotation, its centre 0.3-0.9 of the bounding radii away.
"""

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_collision_primitives import NAMES, OPTIMIZED, padded_sizes, rbound, random_quat, rotation, unit  # noqa: E402

from jaxsim_ncp.collision import FUNCTIONS  # noqa: E402
from jaxsim_ncp.collision.base import GeomFrame  # noqa: E402

TYPES = {name: kind for kind, name in NAMES.items()}
EPS = (0.0, 1e-5, -1e-5, 1e-7, -1e-7)


def crossed_pose(pair, s1, s2, rng, depths=(0.01, 0.15)):
    """(p1, R1, p2, R2): geom 1's side (along its z axis) crossed with geom 2's side or, for a box,
    its x edge at (y, z) = (+half, +half), both touching lines a random depth (in `depths`) apart."""
    mat1 = rotation(random_quat(rng))
    a1 = mat1[:, 2]
    angle = np.radians(rng.uniform(30, 150))
    a2 = np.cos(angle) * a1 + np.sin(angle) * unit(np.cross(a1, rng.normal(size=3)))
    n = unit(np.cross(a1, a2))  # from geom 1 to geom 2
    depth = rng.uniform(*depths)
    p1 = rng.normal(size=3) * 0.05
    touch1 = p1 + rng.uniform(-0.8, 0.8) * s1[1] * a1 + (s1[0] - depth) * n  # on geom 2's surface
    if pair[1] == TYPES["box"]:
        tilt = np.radians(rng.uniform(10, 80))  # -n in the box's frame: (0, cos, sin), the edge's quadrant
        y2 = -np.cos(tilt) * n + np.sin(tilt) * np.cross(a2, n)
        mat2 = np.stack([a2, y2, np.cross(a2, y2)], 1)
        return p1, mat1, touch1 - mat2 @ np.array([rng.uniform(-0.8, 0.8) * s2[0], s2[1], s2[2]]), mat2
    x2 = unit(np.cross(a2, rng.normal(size=3)))
    mat2 = np.stack([x2, np.cross(a2, x2), a2], 1)
    return p1, mat1, touch1 + s2[0] * n - rng.uniform(-0.8, 0.8) * s2[1] * a2, mat2


def random_pose(pair, s1, s2, rng, depths=None):
    p1 = rng.normal(size=3) * 0.05
    offset = unit(rng.normal(size=3)) * (rbound(pair[0], s1) + rbound(pair[1], s2)) * rng.uniform(0.3, 0.9)
    return p1, rotation(random_quat(rng)), p1 + offset, rotation(random_quat(rng))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, default=["cylinder", "cylinder"], choices=sorted(TYPES))
    parser.add_argument("--mode", choices=["crossed", "random"], default="crossed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--poses", type=int, default=128)
    parser.add_argument("--depth", nargs=2, type=float, default=[0.01, 0.15], help="crossed: the depths' range (m)")
    parser.add_argument("--ccd", nargs=2, type=float, metavar=("TOLERANCE", "ITERATIONS"),
                        help="start from MuJoCo's GJK/EPA contact (replayed, as float64 simulations do)")
    parser.add_argument("--save", help="write the poses' contact positions, float64 and float32 (forward), to this .npz")
    args = parser.parse_args()
    pair = tuple(TYPES[name] for name in args.pair)
    if pair not in FUNCTIONS:
        raise SystemExit(f"no narrow phase for {args.pair} (geom types in ascending order)")
    try:
        s1, s2 = padded_sizes(pair)
    except KeyError:
        raise SystemExit(f"no test sizes for {args.pair} (box-box: tests/test_collision_box.py)") from None
    rng = np.random.default_rng(args.seed)
    sample = crossed_pose if args.mode == "crossed" else random_pose
    poses = [sample(pair, s1, s2, rng, args.depth) for _ in range(args.poses)]
    directions = [unit(rng.normal(size=3)) for _ in poses]
    fn, slots = FUNCTIONS[pair]
    ccd = (args.ccd[0], int(args.ccd[1])) if args.ccd else None
    weights = (rng.normal(size=slots), rng.normal(size=(slots, 3)), rng.normal(size=(slots, 3, 3)))

    rows = [(p1 + e * d, m1, p2, m2) for (p1, m1, p2, m2), d in zip(poses, directions) for e in EPS]
    count = len(rows)
    stacked = [jnp.asarray(np.stack([row[k] for row in rows])) for k in range(4)]
    g1 = GeomFrame(stacked[0], stacked[1], jnp.broadcast_to(jnp.asarray(s1), (count, 3)))
    g2 = GeomFrame(stacked[2], stacked[3], jnp.broadcast_to(jnp.asarray(s2), (count, 3)))

    def loss(g1, g2, w):
        col = fn(g1, g2, jnp.zeros(())) if ccd is None else fn(g1, g2, jnp.zeros(()), ccd)  # ccd: convex pairs only
        terms = w[0] * col.dist + jnp.sum(w[1] * col.pos, -1) + jnp.sum(w[2] * col.frame, (-1, -2))
        return jnp.sum(jnp.where(col.valid, terms, 0.0)), col

    w = jax.tree.map(lambda a: jnp.broadcast_to(jnp.asarray(a), (count, *a.shape)), weights)
    grad_fn = jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)), compiler_options=OPTIMIZED)
    (value, col), grad = grad_fn(g1, g2, w)
    value, grad_pos = np.asarray(value), np.asarray(grad.pos)
    dist, valid = np.asarray(col.dist), np.asarray(col.valid)
    wrong = 0
    for i, d in enumerate(directions):
        base = len(EPS) * i
        g = grad_pos[base] @ d
        fd5 = (value[base + 1] - value[base + 2]) / 2e-5
        fd7 = (value[base + 3] - value[base + 4]) / 2e-7
        if abs(g - fd7) > 1e-4 * max(1.0, abs(fd7)):
            wrong += 1
            smooth = abs(fd5 - fd7) < 1e-4 * max(1.0, abs(fd7))
            print(f"pose {i}: gradient {g:.6f}, differences {fd5:.6f} (1e-5) {fd7:.6f} (1e-7), smooth {smooth}, "
                  f"dist {dist[base][valid[base]]}")
    print(f"{' '.join(args.pair)} {args.mode} seed {args.seed}: {wrong} of {len(poses)} poses off their differences")
    if args.save:  # the float32 forward value (no MuJoCo replay: the polish's own contact) beside float64's
        base = slice(0, count, len(EPS))
        g1_32, g2_32 = jax.tree.map(lambda a: jnp.asarray(a[base], jnp.float32), (g1, g2))
        col32 = jax.jit(jax.vmap(fn, in_axes=(0, 0, None)))(g1_32, g2_32, jnp.zeros((), jnp.float32))
        np.savez(args.save, pos64=np.asarray(col.pos)[base], valid64=valid[base],
                 pos32=np.asarray(col32.pos), valid32=np.asarray(col32.valid))


if __name__ == "__main__":
    main()
