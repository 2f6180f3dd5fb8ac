"""Fuzzing: random primitive scenes, batched rollouts and gradients, counts of failures.

A scene is 1-4 free primitives (sphere, capsule, box, cylinder, ellipsoid; with
``--mesh-fraction``, box-shaped mesh hulls too) over a plane with random sizes, poses,
velocities, frictions (zero included), solref/solimp and timestep; some start deeply
interpenetrating. Each scene is compiled by MuJoCo
(so masses and inertias are consistent with the sizes) and converted; scenes of one
*structure* (geom types, solver settings) share one static pytree layout, so their
models are stacked and a whole group runs as one vmapped, jitted program: one compile
per structure, not per scene.

Both solvers are fuzzed: 30% of the structures (``--ncp-fraction``) use the hard-contact
NCP (``solver="ncp"``, in the settings it supports), the rest MuJoCo's soft Newton solver,
10% of those with the adaptive integrator (``--adaptive-fraction``); 20% of all structures
add contacts from distance (``--cfd-fraction``, a random width), 10% get a small contact
capacity (``--capped-fraction``, ``max_geom_pairs`` 1 or 2). 20% of the scenes (``--planar-fraction``;
0 replays runs before 2026-12-04) start in planar motion about a world axis with float32 round-off
(1e-37 to 1e-20) in the other quaternion and velocity components.

Checked per scene: every state of the rollout and the gradient of a rollout loss with
respect to the initial velocity and the geom frictions are finite; the solver and
divergence flags (steps without solver convergence are counted per solver); for scenes that start apart (no contact with dist < 0 in MuJoCo,
no two bodies at one pose)
the mechanical energy never rises above its start by more than a tolerance. A non-finite
gradient is counted as ``nan_grad`` or as ``overflow_grad`` (+-inf: the true derivative is beyond
the dtype, `jaxsim_ncp.adjoint`).

    .venv/bin/python experiments/fuzz.py --scenes 10000 --steps 500   # the long study
    .venv/bin/python experiments/fuzz.py --scenes 64 --steps 50        # a quick look
    experiments/fuzz_parallel.sh LOG 500 450 1001:1000 1002:600 ...     # single-structure processes on a GPU
    GROUP=400 experiments/fuzz_parallel.sh LOG 500 450 3010:4000 ...    # each in groups of 400 (--one-structure)
    .venv/bin/python experiments/fuzz_recheck.py --seed 1002 --scenes 600 --only 195  # a failure in float64

`tests/test_fuzz.py` uses `make_group` and `check_group` on a few small groups.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
from jaxsim_ncp import smooth

TYPES = ("sphere", "capsule", "box", "cylinder", "ellipsoid")
MESH = "mesh"  # a box-shaped convex hull (a cube mesh scaled by the size), drawn with --mesh-fraction


@dataclasses.dataclass(frozen=True)
class Structure:
    """What must be equal for scenes to share one compiled program."""

    types: tuple[str, ...]
    condim: tuple[int, ...] = ()  # per body (default 3): static, it sets the number of constraint rows
    cone: str = "pyramidal"
    integrator: str = "euler"
    iterations: int = 10
    ls_iterations: int = 10
    grad_mode: str = "implicit"
    solver: str = "newton"  # or "ncp" (hard contact: elliptic cones, condim 1/3, euler/implicitfast, implicit gradients)
    cfd_width: float = 0.0  # > 0: contacts from distance (gradient only) out to this width
    max_geom_pairs: int | None = None  # contact capacity per narrow-phase function (None: every pair)


def _size(rng: np.random.Generator, kind: str) -> tuple[float, ...]:
    lo = 0.002 if rng.uniform() < 0.1 else 0.02  # sometimes degenerate (millimetre) sizes
    count = {"sphere": 1, "capsule": 2, "cylinder": 2, "box": 3, "ellipsoid": 3, MESH: 3}[kind]
    return tuple(float(rng.uniform(lo, 0.2)) for _ in range(count))


_CUBE = "-1 -1 -1  1 -1 -1  1 1 -1  -1 1 -1  -1 -1 1  1 -1 1  1 1 1  -1 1 1"
_EDGE = np.array([np.cos(np.pi / 8), np.sin(np.pi / 8), 0.0, 0.0])  # 45 deg about x: a box on an edge
_CORNER = np.array([0.88807383, 0.32505758, -0.32505758, 0.0])  # (1, 1, 1) / sqrt(3) to +z: on a corner


def _quat(rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=4)
    return q / np.linalg.norm(q)


def _height_above_lowest_point(kind: str, size: tuple[float, ...], quat: np.ndarray) -> float:
    """Centre height at which the geom exactly touches the plane z = 0 (its support along -z)."""
    w, x, y, z = quat
    up = np.array([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)])  # row 2 of R: world z in the geom frame
    if kind == "sphere":
        return size[0]
    if kind == "capsule":
        return size[0] + size[1] * abs(up[2])
    if kind == "cylinder":
        return size[1] * abs(up[2]) + size[0] * np.sqrt(max(0.0, 1 - up[2] ** 2))
    if kind in ("box", MESH):
        return float(np.sum(np.abs(up) * np.asarray(size)))
    return float(np.sqrt(np.sum((np.asarray(size) * up) ** 2)))  # ellipsoid


def scene_xml(rng: np.random.Generator, structure: Structure) -> str:
    """One random scene of the given structure (MJCF text).

    Each body is placed one of four ways: in the air; overlapping an earlier body deeply;
    coincident with an earlier body (same pose); or exactly touching the floor, upright,
    on an edge, on a corner or in a random orientation.
    """
    bodies, poses, assets = [], [], []
    fmt = lambda v: " ".join(f"{x:.17g}" for x in v)  # noqa: E731
    for i, kind in enumerate(structure.types):
        size = _size(rng, kind)
        mode = rng.choice(["air", "overlap", "coincident", "touching"], p=[0.35, 0.25, 0.1, 0.3]) if poses else (
            rng.choice(["air", "touching"])
        )  # fmt: skip
        quat = _quat(rng)
        if mode == "air":
            pos = np.array([rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4), rng.uniform(0.0, 0.8)])
        elif mode == "overlap":
            pos = poses[rng.integers(len(poses))][0] + rng.normal(scale=0.05, size=3)
        elif mode == "coincident":
            pos, quat = poses[rng.integers(len(poses))]
        else:
            quat = [np.array([1.0, 0, 0, 0]), _EDGE, _CORNER, quat][rng.integers(4)]
            pos = np.array([rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4), _height_above_lowest_point(kind, size, quat)])
        pos[2] = max(pos[2], -0.05)  # at most slightly through the floor
        poses.append((pos.copy(), quat))
        friction = (rng.choice([0.0, rng.uniform(0.05, 1.5)], p=[0.15, 0.85]), rng.uniform(0, 0.02), rng.uniform(0, 1e-3))
        timeconst, dampratio = rng.uniform(0.01, 0.05), rng.uniform(0.3, 1.5)
        dmin = rng.uniform(0.5, 0.95)
        solimp = (dmin, rng.uniform(dmin, 0.999), rng.uniform(1e-3, 0.02), 0.5, 2)
        condim = structure.condim[i] if structure.condim else 3
        shape = f'type="{kind}" size="{fmt(size)}"' if kind != MESH else f'type="mesh" mesh="m{i}"'
        if kind == MESH:
            assets.append(f'<mesh name="m{i}" vertex="{_CUBE}" scale="{fmt(size)}"/>')
        bodies.append(
            f'<body name="b{i}" pos="{fmt(pos)}" quat="{fmt(quat)}"><freejoint/>'
            f'<geom name="g{i}" {shape} friction="{fmt(friction)}" condim="{condim}" '
            f'solref="{timeconst:.4g} {dampratio:.4g}" solimp="{fmt(solimp)}"/></body>'
        )
    timestep = rng.uniform(0.002, 0.01)
    return f"""<mujoco><option timestep="{timestep:.4g}"/><asset>{"".join(assets)}</asset>
<worldbody><geom name="floor" type="plane" size="5 5 0.1" friction="{rng.uniform(0.1, 1.2):.3g}"/>
{"".join(bodies)}</worldbody></mujoco>"""


@dataclasses.dataclass
class Group:
    structure: Structure
    model: jsn.Model  # leaves stacked along a leading scene axis
    qpos: np.ndarray  # (n, nq)
    qvel: np.ndarray  # (n, nv)
    apart: np.ndarray  # (n,) bool: no penetrating contact at the start (MuJoCo), no coincident bodies
    seed: int = -1  # make_group's seed: make_group(structure, n, seed) draws these scenes again
    xml: tuple[str, ...] = ()  # the scenes' MJCF (`mujoco_energies`)


def structure_model(structure: Structure, mj: mujoco.MjModel, dtype=None) -> jsn.Model:
    """Our model of one scene with the structure's options."""
    return jsn.from_mujoco(
        mj, cone=structure.cone, integrator=structure.integrator, iterations=structure.iterations,
        ls_iterations=structure.ls_iterations, grad_mode=structure.grad_mode, solver=structure.solver, dtype=dtype,
        cfd=jsn.CFD(width=structure.cfd_width) if structure.cfd_width > 0 else None, max_geom_pairs=structure.max_geom_pairs,
    )


def _planar_state(rng: np.random.Generator, qpos: np.ndarray, qvel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qpos, qvel) with every free body turned about one world axis (x or y, the scene's) and
    moving in the plane normal to it, the other quaternion and velocity components float32
    round-off (+-1e-37 to 1e-20, or 0): what planar motion leaves after a few float32 steps. The
    regime of the GPU fuzz's seed-3010 NaN (`capsule_box`: a 1e-24 axis component)."""
    qpos, qvel = qpos.copy(), qvel.copy()
    k = int(rng.integers(2))
    others = np.array([a for a in range(3) if a != k])

    def round_off(size):
        return rng.choice([-1.0, 1.0], size) * 10 ** rng.uniform(-37, -20, size) * (rng.uniform(size=size) < 0.7)

    for b in range(len(qpos) // 7):
        angle = rng.uniform(-np.pi, np.pi)
        quat = np.zeros(4)
        quat[0], quat[1 + k] = np.cos(angle / 2), np.sin(angle / 2)
        quat[1 + others] = round_off(2)
        qpos[7 * b + 3:7 * b + 7] = quat
        qvel[6 * b + k] = round_off(1)[0]  # linear (world frame): in the plane
        qvel[6 * b + 3 + others] = round_off(2)  # angular (body frame = world about axis k): about the axis
    return qpos, qvel


def make_group(structure: Structure, n: int, seed: int, dtype=None, planar: float = 0.0) -> Group:
    """n random scenes of one structure, their models stacked for vmap; a share `planar` of them
    start in planar motion with float32 round-off off the plane (`_planar_state`, drawn from a
    second stream: the other scenes are the same for any share)."""
    rng = np.random.default_rng(seed)
    planar_rng = np.random.default_rng([seed, 1])
    models, qpos, qvel, apart, xmls = [], [], [], [], []
    for _ in range(n):
        xmls.append(scene_xml(rng, structure))
        mj = mujoco.MjModel.from_xml_string(xmls[-1])
        md = mujoco.MjData(mj)
        mujoco.mj_forward(mj, md)
        # apart: no penetrating contact in MuJoCo, and no two bodies at one pose (coincident box
        # meshes: MuJoCo's GJK reports no contact, yet they overlap)
        poses = np.round(np.concatenate([mj.body_pos, mj.body_quat], axis=1)[1:], 12)
        coincident = len(np.unique(poses, axis=0)) < len(poses)
        models.append(structure_model(structure, mj, dtype))
        q = md.qpos.copy()
        v = np.concatenate([np.r_[rng.normal(scale=1.0, size=3), rng.normal(scale=3.0, size=3)] for _ in structure.types])
        v = v * (rng.uniform() > 0.25)  # a quarter of the scenes start at rest
        if planar_rng.uniform() < planar:
            q, v = _planar_state(planar_rng, q, v)
            md.qpos[:] = q
            mujoco.mj_forward(mj, md)
            coincident = len(np.unique(np.round(q.reshape(-1, 7), 12), axis=0)) < len(q) // 7
        apart.append(all(md.contact[i].dist >= 0 for i in range(md.ncon)) and not coincident)
        qpos.append(q)
        qvel.append(v)
    model = jax.tree.map(lambda *xs: jnp.stack(xs), *models)
    return Group(structure, model, np.stack(qpos), np.stack(qvel), np.asarray(apart), seed, tuple(xmls))


def mujoco_energies(structure: Structure, xml: str, qpos: np.ndarray, qvel: np.ndarray, steps: int) -> tuple[np.ndarray, int]:
    """MuJoCo C (float64, Newton solver, the structure's integrator and cone) on one scene from
    (qpos, qvel): (its energy at each state, (steps + 1,) or fewer, the step of its first warning,
    -1 if none). MuJoCo resets a world whose acceleration it finds unbounded, so its energies end
    there. Started from our state just before an energy rise, it tells a rise of the integrator
    (explicit Euler's gyroscopic instability of a fast-spinning thin body: MuJoCo gains the same)
    from one of ours."""
    mj = mujoco.MjModel.from_xml_string(xml)
    integrators = {"euler": mujoco.mjtIntegrator.mjINT_EULER, "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
                   "rk4": mujoco.mjtIntegrator.mjINT_RK4, "adaptive": mujoco.mjtIntegrator.mjINT_RK4}  # (nearest MuJoCo has)
    mj.opt.integrator = integrators[structure.integrator]
    mj.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC if structure.cone == "elliptic" else mujoco.mjtCone.mjCONE_PYRAMIDAL
    mj.opt.iterations, mj.opt.ls_iterations = structure.iterations, structure.ls_iterations
    mj.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_ENERGY
    md = mujoco.MjData(mj)
    md.qpos[:], md.qvel[:] = qpos, qvel
    energies = []
    for t in range(steps + 1):  # md.energy after mj_step: at the state the step started from
        mujoco.mj_step(mj, md)
        energies.append(float(np.sum(md.energy)))
        if any(w.number for w in md.warning):
            return np.asarray(energies), t
    return np.asarray(energies), -1


def energy(model: jsn.Model, data: jsn.Data) -> jax.Array:
    """Kinetic plus gravitational potential energy at data.qpos, data.qvel (mj_energyPos + mj_energyVel)."""
    d = smooth.crb(model, smooth.com_pos(model, smooth.kinematics(model, data)))
    kinetic = 0.5 * d.qvel @ d.qM @ d.qvel
    potential = -jnp.sum(model.body_mass * (d.xipos @ model.opt.gravity))
    return kinetic + potential


def loss_of_final(final: jsn.Data) -> jax.Array:
    """The fuzz's rollout loss: |qpos[:3]|^2 + |qvel|^2 of the final state."""
    return jnp.sum(final.qpos[:3] ** 2) + jnp.sum(final.qvel**2)


def rollout_gradient(model: jsn.Model, qpos, qvel, steps: int):
    """One scene's unactuated rollout from (qpos, qvel): (final, traj, (d loss / d qvel, d loss / d geom_friction))."""
    data = jsn.make_data(model).replace(qpos=qpos)
    ctrl = jnp.zeros((steps, model.nu), model.dtype)

    def loss(v0, friction):
        m = eqx.tree_at(lambda m: m.geom_friction, model, friction)
        final, traj = jsn.rollout(m, data.replace(qvel=v0), ctrl, checkpoint=50 if steps > 50 else False)
        return loss_of_final(final), (final, traj)

    (_, (final, traj)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(qvel, model.geom_friction)
    return final, traj, grads


def rollout_check(model: jsn.Model, qpos, qvel, steps: int):
    """One scene: (all states finite, gradient finite, energies (steps+1,), diverged, gradient norm,
    steps whose solver did not converge)."""
    data = jsn.make_data(model).replace(qpos=qpos)
    final, traj, grads = rollout_gradient(model, qpos, qvel, steps)
    states_finite = jnp.all(jnp.isfinite(traj.qpos)) & jnp.all(jnp.isfinite(traj.qvel))
    grad_finite = jnp.all(jnp.isfinite(grads[0])) & jnp.all(jnp.isfinite(grads[1]))
    e0 = energy(model, data.replace(qvel=qvel))
    energies = jnp.concatenate([e0[None], jax.vmap(lambda q, v: energy(model, data.replace(qpos=q, qvel=v)))(traj.qpos, traj.qvel)])
    gnorm = jnp.sqrt(jnp.sum(grads[0] ** 2) + jnp.sum(grads[1] ** 2))
    return states_finite, grad_finite, energies, final.diverged, gnorm, jnp.sum(~traj.solver_converged)


_batched_check = jax.jit(jax.vmap(rollout_check, in_axes=(0, 0, 0, None)), static_argnums=3)


def check_group(group: Group, steps: int):
    """Run every scene of a group (one vmapped program, compiled once per structure and
    batch size); returns numpy results per scene."""
    dt = group.model.dtype
    out = _batched_check(group.model, jnp.asarray(group.qpos, dt), jnp.asarray(group.qvel, dt), steps)
    return jax.tree.map(np.asarray, out)


ENERGY_REL, ENERGY_PER_KG = 0.02, 1e-3  # `energy_gain`'s tolerance: 2% of the energy's scale, 1 mJ per kg


def energy_gain(group: Group, energies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rise above the start energy, too much) per scene. Allowed: 2% of the energy's scale plus
    1 mJ per kg (soft contact, discrete time), and only for scenes that start apart."""
    rise = energies.max(axis=1) - energies[:, 0]
    scale = np.abs(energies[:, 0]) + np.max(np.abs(energies), axis=1)
    mass = np.asarray(group.model.body_mass).sum(axis=1)
    return rise, group.apart & (rise > ENERGY_REL * scale + ENERGY_PER_KG * mass)


def random_structure(rng: np.random.Generator, ncp_fraction: float = 0.3, adaptive_fraction: float = 0.1,
                     cfd_fraction: float = 0.2, capped_fraction: float = 0.0, mesh_fraction: float = 0.0,
                     kinds: tuple[str, ...] | None = None) -> Structure:
    # meshes among the types (no draw at fraction 0: --mesh-fraction 0 replays earlier seeds)
    if kinds is None:
        kinds = TYPES + (MESH,) if mesh_fraction > 0 and rng.uniform() < mesh_fraction else TYPES
    n = int(rng.integers(1, 5))
    cfd_width = float(rng.uniform(0.01, 0.2)) if rng.uniform() < cfd_fraction else 0.0
    # a small contact capacity: overflowing worlds are flagged, never NaN (no draw at fraction 0, so
    # --capped-fraction 0 replays the structures of seeds drawn before this option existed)
    if capped_fraction > 0 and rng.uniform() < capped_fraction:
        return dataclasses.replace(random_structure(rng, ncp_fraction, adaptive_fraction, cfd_fraction, kinds=kinds),
                                   max_geom_pairs=int(rng.integers(1, 3)))
    if rng.uniform() < ncp_fraction:  # the hard-contact NCP, in the settings it supports
        return Structure(
            cfd_width=cfd_width,
            types=tuple(str(t) for t in rng.choice(kinds, size=n)),
            condim=tuple(int(c) for c in rng.choice([1, 3], p=[0.2, 0.8], size=n)),
            cone="elliptic",
            integrator=str(rng.choice(["euler", "implicitfast"])),
            iterations=30,
            solver="ncp",
        )
    adaptive = rng.uniform() < adaptive_fraction
    return Structure(
        types=tuple(str(t) for t in rng.choice(kinds, size=n)),
        condim=tuple(int(c) for c in rng.choice([1, 3, 4, 6], p=[0.1, 0.6, 0.15, 0.15], size=n)),
        cone=str(rng.choice(["pyramidal", "elliptic"])),
        integrator="adaptive" if adaptive else str(rng.choice(["euler", "implicitfast", "rk4"])),
        grad_mode=str(rng.choice(["implicit", "unroll"], p=[0.8, 0.2])),
        cfd_width=cfd_width,
    )


def run_structure(rng: np.random.Generator, args: argparse.Namespace) -> Structure:
    """A run's next random structure, drawn with its options (`add_structure_arguments`)."""
    return random_structure(rng, args.ncp_fraction, args.adaptive_fraction, args.cfd_fraction, args.capped_fraction,
                            args.mesh_fraction)


def next_group(rng: np.random.Generator, n: int, args: argparse.Namespace, dtype=None,
               structure: Structure | None = None) -> Group:
    """The next group of a run (`main`'s draws, in order): a random structure (unless given), then
    n scenes of it."""
    structure = run_structure(rng, args) if structure is None else structure
    return make_group(structure, n, seed=int(rng.integers(2**31)), dtype=dtype, planar=args.planar_fraction)


def add_structure_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that shape `random_structure`'s draws (`next_group`)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ncp-fraction", type=float, default=0.3, help="share of structures using solver='ncp'")
    parser.add_argument("--adaptive-fraction", type=float, default=0.1, help="share of Newton structures using integrator='adaptive'")
    parser.add_argument("--cfd-fraction", type=float, default=0.2, help="share of structures with contacts from distance")
    parser.add_argument("--capped-fraction", type=float, default=0.1, help="share of structures with a contact capacity (max_geom_pairs 1-2)")
    parser.add_argument("--mesh-fraction", type=float, default=0.1, help="share of structures that may draw mesh geoms (0: replay earlier seeds)")
    parser.add_argument("--planar-fraction", type=float, default=0.2,
                        help="share of scenes starting in planar motion with float32 round-off off the plane (0: replay earlier runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--group", type=int, default=64, help="scenes per structure (one compile each)")
    add_structure_arguments(parser)
    parser.add_argument("--one-structure", action="store_true",
                        help="every group draws new scenes of the first structure (one compile; counts after each group)")
    parser.add_argument("--x64", action="store_true", help="float64 (default float32, what users run)")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", args.x64)
    rng = np.random.default_rng(args.seed)
    counts = collections.Counter()
    start = time.time()
    done = 0
    first = None
    draw = lambda n: next_group(rng, n, args, structure=first if args.one_structure else None)  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the next group is built while this one runs
        pending = pool.submit(draw, min(args.group, args.scenes))
        while pending is not None:
            group = pending.result()
            first, n = group.structure, len(group.qpos)
            rest = args.scenes - done - n
            pending = pool.submit(draw, min(args.group, rest)) if rest > 0 else None
            done = _check_and_count(group, args.steps, counts, done, args.scenes, start)
            if not args.one_structure:
                release_compiled()
    print("TOTAL", dict(counts))


def release_compiled() -> None:
    """Drop every compiled program (JAX keeps them all). On the CPU each group's programs hold
    ~1900 memory mappings (~5300 with XLA's default MLIR fusion emitters) until released, and at
    Linux's default vm.max_map_count of 65530 a run of new structures ended after about a dozen
    groups in "LLVM ERROR: Unable to allocate section memory"."""
    jax.clear_caches()


def _check_and_count(group: Group, steps: int, counts: collections.Counter, done: int, scenes: int, start: float) -> int:
    """Run one group, add its counts, print its failures and the running totals; returns scenes done."""
    structure, n = group.structure, len(group.qpos)
    print(f"{structure}: {n} scenes", flush=True)
    states_ok, grad_ok, energies, diverged, gnorm, unconverged = check_group(group, steps)
    rise, energy_bad = energy_gain(group, energies)
    counts.update(scenes=n, steps=n * steps, nan_state=int((~states_ok).sum()), nan_grad=int((~grad_ok & np.isnan(gnorm)).sum()),
                  overflow_grad=int((~grad_ok & np.isinf(gnorm)).sum()),
                  diverged=int(diverged.sum()), apart=int(group.apart.sum()), energy_rise=int(energy_bad.sum()),
                  **{f"{structure.solver}_scenes": n, f"{structure.solver}_unconverged_steps": int(unconverged.sum())})
    for i in np.nonzero(~states_ok | ~grad_ok | energy_bad)[0]:
        print(f"  FAIL {structure} scene {i} (make_group seed {group.seed}): states {states_ok[i]} grad {grad_ok[i]} |grad| {gnorm[i]:.3g} "
              f"energy rise {rise[i]:.3g} unconverged steps {unconverged[i]}", flush=True)
    done += n
    print(f"{done}/{scenes} scenes, {time.time() - start:.0f} s: {dict(counts)}", flush=True)
    return done


if __name__ == "__main__":
    main()
