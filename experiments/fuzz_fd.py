"""Are the fuzz's gradients right, not only finite? Random scenes against central differences (float64).

`fuzz.py` counts non-finite gradients; this checks their values. For each random scene of a
structure (`fuzz.random_structure`, `fuzz.make_group`: 1-4 free primitives over a plane, deep
overlaps, coincident bodies, edges and corners, zero frictions) it takes the rollout loss of
`fuzz.rollout_gradient` (final |qpos[:3]|^2 + |qvel|^2 over `--steps` steps) and compares the
gradient's directional derivative g . u along a random unit direction u (initial velocity and the
geoms' sliding frictions together) with central differences of the same rollout at two step
sizes, eps = 1e-4 and 1e-6 (float64):

  * *smooth*: the two differences agree (relative 1e-4): the loss is differentiable there at the
    scale of eps (no contact appearing or vanishing, no stick-slip switch inside the interval);
  * *agree*: smooth, and g . u is within `--rtol` of the eps = 1e-6 difference;
  * *wrong*: smooth, and it is not. Printed with its group's number G in the run and its index K,
    so `fuzz_fd.py --seed SEED --replay G --only K` checks it again and prints it.

The general convex pairs (ellipsoids, and the cylinder pairs MuJoCo 4 sends to multiccd; `convex.py`)
are valued by our own GJK/EPA and polish here, converged to round-off as in float32. A float64 model
replays MuJoCo's GJK/EPA for the value and differentiates the exact contact: where MuJoCo's EPA
stops short of the exact contact (deep interpenetration), central differences of its value are not
the exact derivative (an ellipsoid on a cylinder after 1 step: g . u 2.6971 against differences of
2.7420 with MuJoCo's value, 2.6968 against 2.6968 with ours; deep capsule-cylinder pairs after 3
steps: up to 86% apart).
`--mujoco-ccd` shows it (`experiments/results/fuzz_fd.md`).

A state exactly on a contact switch (the fuzz places bodies exactly touching the floor: dist 0 to
round-off) has no derivative, and there the gradient program and the forward program can take
different sides: their own float64 round-off (XLA fuses and orders the two programs differently)
puts a rim point at -1e-17 in one and +1e-17 in the other, and the contact exists in one only.
Central differences, all from the forward program, are smooth there, but they are not the
derivative of the trajectory the gradient program followed. Such scenes (the gradient program's
loss differs from the forward program's at the same inputs by more than 1e-8 relative) are counted
as `boundary`, not compared.

Where a solver stops at its iteration limit the implicit gradient is taken at a point that is not
the solution; such scenes are counted apart (`unconverged`). A converged solve stops within
the solver's `tolerance` of the solution, and differences of the truncated solve (which depends on
the warm start, given no derivative) can be a percent from the solution's derivative at MuJoCo's
default 1e-8: `--tolerance` (default 1e-12) sets it. The adaptive integrator's step sizes are chosen
under stop_gradient (Diffrax's controller): its gradient is the solver steps', which tends to the
ODE's as rtol -> 0, while differences also see the step sizes move (percents at rtol 1e-5).
Contacts from distance are left out (their gradient differs from the forward's on purpose,
`cfd.py`). The NCP's gradient is that of its relaxed problem at `kappa_grad`, not of the hard
forward pass: with `--ncp-fraction` > 0 its scenes are compared the same way and reported in their
own rows (a bias of the relaxation, not a defect, shows as *wrong* there).

    .venv/bin/python experiments/fuzz_fd.py --scenes 256 --group 32 --steps 5
    .venv/bin/python experiments/fuzz_fd.py --seed 3 --replay 2 --only 7   # group 2's scene 7 again
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fuzz  # noqa: E402
import jaxsim_ncp as jsn  # noqa: E402
from jaxsim_ncp.integrate import adaptive  # noqa: E402

EPS = (1e-4, 1e-6)
SMOOTH_RTOL = 1e-4
PRIMAL_RTOL = 1e-8  # the gradient program's own loss against the forward program's


def _loss(model: jsn.Model, qpos, qvel, friction, steps: int):
    """The fuzz's rollout loss at initial velocity qvel and geom frictions, and the count of steps
    whose solver did not converge."""
    m = eqx.tree_at(lambda m: m.geom_friction, model, friction)
    data = jsn.make_data(m).replace(qpos=qpos, qvel=qvel)
    final, traj = jsn.rollout(m, data, jnp.zeros((steps, m.nu), m.dtype))
    return fuzz.loss_of_final(final), jnp.sum(~traj.solver_converged)


def _directional(model: jsn.Model, qpos, qvel, u_v, u_f, steps: int):
    """One scene: (g . u, (loss(x + eps u) - loss(x - eps u)) / 2 eps for each eps, unconverged steps,
    relative gap between the gradient program's loss and the forward program's)."""
    friction = model.geom_friction
    loss_and_grad = jax.value_and_grad(_loss, argnums=(2, 3), has_aux=True)
    (value, unconverged), (g_v, g_f) = loss_and_grad(model, qpos, qvel, friction, steps)
    along = jnp.sum(g_v * u_v) + jnp.sum(g_f * u_f)
    signs = jnp.array([1.0, -1.0])
    eps = jnp.asarray(EPS)
    shifts = jnp.concatenate([jnp.zeros(1), (signs[None, :] * eps[:, None]).reshape(-1)])
    values = jax.vmap(lambda e: _loss(model, qpos, qvel + e * u_v, friction + e * u_f, steps)[0])(shifts)
    pairs = values[1:].reshape(len(EPS), 2)
    primal_gap = jnp.abs(value - values[0]) / (jnp.abs(values[0]) + 1e-30)
    return along, (pairs[:, 0] - pairs[:, 1]) / (2 * eps), unconverged, primal_gap


_batched = jax.jit(jax.vmap(_directional, in_axes=(0, 0, 0, 0, 0, None)), static_argnums=5)


def _directions(group: fuzz.Group, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A random unit direction per scene (by its index in the group) over (qvel, the sliding
    frictions of every geom)."""
    nv = group.qvel.shape[1]
    ngeom = np.shape(group.model.geom_friction)[1]
    u = np.stack([np.random.default_rng([group.seed, 2, int(k)]).normal(size=nv + ngeom) for k in index])
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    u_f = np.zeros((len(index), ngeom, 3))
    u_f[:, :, 0] = u[:, nv:]
    return u[:, :nv], u_f


def check_group(group: fuzz.Group, steps: int, rtol: float, index: np.ndarray) -> dict[str, np.ndarray]:
    """Per scene: g . u, the two differences, smooth, agree, relative error, unconverged steps, and
    consistent (the two programs' losses agree, `PRIMAL_RTOL`)."""
    u_v, u_f = _directions(group, index)
    along, fd, unconverged, primal_gap = jax.tree.map(np.asarray, _batched(
        group.model, jnp.asarray(group.qpos), jnp.asarray(group.qvel), jnp.asarray(u_v), jnp.asarray(u_f), steps))
    scale = np.abs(fd[:, 1]) + 1e-9
    smooth = np.abs(fd[:, 0] - fd[:, 1]) <= SMOOTH_RTOL * scale
    rel = np.abs(along - fd[:, 1]) / scale
    return dict(along=along, fd=fd, smooth=smooth, rel=rel, agree=smooth & (rel <= rtol), unconverged=unconverged,
                consistent=primal_gap <= PRIMAL_RTOL, primal_gap=primal_gap)


def _label(structure: fuzz.Structure) -> str:
    return f"{structure.solver}/{structure.integrator}/{structure.grad_mode}"


def report(group: fuzz.Group, number: int, index: np.ndarray, out: dict[str, np.ndarray], counts: dict,
           show_all: bool = False) -> None:
    """Add one group's counts under its solver/integrator/grad-mode label; print its wrong scenes
    (every scene with show_all)."""
    c = counts.setdefault(_label(group.structure), collections.Counter())
    converged = out["unconverged"] == 0
    boundary = converged & ~out["consistent"]
    compared = converged & out["consistent"] & out["smooth"]
    wrong = compared & ~out["agree"]
    c.update(scenes=len(converged), unconverged=int((~converged).sum()), boundary=int(boundary.sum()),
             smooth=int(compared.sum()), agree=int((compared & out["agree"]).sum()), wrong=int(wrong.sum()),
             apart=int(group.apart.sum()), wrong_apart=int((wrong & group.apart).sum()))
    c.setdefault("rel", []).extend(out["rel"][compared].tolist())
    for i in np.arange(len(converged)) if show_all else np.flatnonzero(wrong):
        print(f"  {'WRONG' if wrong[i] else 'scene'} group {number} scene {index[i]} {group.structure}"
              f"{' (starts apart)' if group.apart[i] else ''}: "
              f"g.u {out['along'][i]:.9g} fd(1e-4) {out['fd'][i, 0]:.9g} fd(1e-6) {out['fd'][i, 1]:.9g} "
              f"rel {out['rel'][i]:.2e} smooth {out['smooth'][i]} unconverged steps {out['unconverged'][i]} "
              f"primal gap {out['primal_gap'][i]:.1e}", flush=True)


def summary(counts: dict) -> None:
    """A row per solver/integrator/grad mode; `smooth` counts the compared scenes (converged, consistent,
    smooth), `apart` and `w.apart` the scenes that start apart and the wrong ones among them."""
    names = ("scenes", "unconverged", "boundary", "smooth", "agree", "wrong", "apart", "wrong_apart")
    print(f"{'solver/integrator/grad':34s} {'scenes':>6s} {'unconv':>6s} {'bound.':>6s} {'smooth':>6s} {'agree':>6s}"
          f" {'wrong':>6s} {'apart':>6s} {'w.apart':>7s} {'median rel':>10s} {'max rel':>9s}")
    for label, c in sorted(counts.items()):
        rel = np.asarray(c["rel"] or [0.0])
        print(f"{label:34s}" + "".join(f" {c[k]:{7 if k == 'wrong_apart' else 6}d}" for k in names)
              + f" {np.median(rel):10.2e} {np.max(rel):9.2e}", flush=True)


def _use_own_ccd() -> None:
    """Every narrow-phase function with a `ccd` argument gets ccd=None: the value of a convex pair is
    then our own converged GJK/EPA and polish, as in float32, and its derivative that value's."""
    import inspect

    from jaxsim_ncp.collision import driver

    for pair, (fn, slots) in list(driver.FUNCTIONS.items()):
        if "ccd" in inspect.signature(fn).parameters:
            own = lambda g1, g2, margin, _fn=fn: _fn(g1, g2, margin, ccd=None)  # noqa: E731
            driver.FUNCTIONS[pair] = (own, slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=128)
    parser.add_argument("--group", type=int, default=32, help="scenes per structure (one compile each)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rtol", type=float, default=1e-3, help="g . u against the eps = 1e-6 difference")
    parser.add_argument("--all-apart", action="store_true",
                        help="only scenes that start apart (no penetrating contact, no coincident bodies): each group is "
                             "drawn 4x larger and its overlapping scenes dropped")
    parser.add_argument("--kinds", nargs="*", default=None, help="geom types to draw from (default: fuzz.TYPES)")
    parser.add_argument("--mujoco-ccd", action="store_true",
                        help="convex pairs' values from MuJoCo's GJK/EPA (as float64 models run them), within "
                             "ccd_tolerance of the exact contact: their differences are then not the exact derivative's")
    parser.add_argument("--tolerance", type=float, default=1e-12,
                        help="the solver's tolerance (MuJoCo's default 1e-8 stops where differences of the truncated "
                             "solve can be a few percent from the solution's derivative)")
    parser.add_argument("--adaptive-tol", type=float, default=None,
                        help="rtol = atol of the adaptive integrator's step-size controller (default: the model's 1e-5); "
                             "its gradient tends to the ODE's as this goes to 0")
    parser.add_argument("--adaptive-constant", action="store_true",
                        help="the adaptive integrator's solver at a constant step (one per timestep, no controller): "
                             "its gradient is then the discretization's own, as the fixed-step integrators'")
    parser.add_argument("--replay", type=int, default=None, help="check only this group of the run (its number G)")
    parser.add_argument("--only", type=int, nargs="*", default=None, help="with --replay: its scenes to check and print")
    fuzz.add_structure_arguments(parser)
    parser.set_defaults(ncp_fraction=0.0, cfd_fraction=0.0, planar_fraction=0.0)
    args = parser.parse_args()
    if not args.mujoco_ccd:
        _use_own_ccd()
    rng = np.random.default_rng(args.seed)
    counts: dict = {}
    start, done, number = time.time(), 0, 0
    while done < args.scenes:
        # the solvers get room to converge: an implicit gradient is only right at the solution
        structure = fuzz.random_structure(rng, args.ncp_fraction, args.adaptive_fraction, 0.0, args.capped_fraction,
                                          args.mesh_fraction, kinds=tuple(args.kinds) if args.kinds else None)
        structure = dataclasses.replace(structure, iterations=max(structure.iterations, 50), ls_iterations=50)
        n, seed = min(args.group, args.scenes - done), int(rng.integers(2**31))
        if args.replay is None or args.replay == number:
            group = fuzz.make_group(structure, 4 * n if args.all_apart else n, seed=seed, planar=args.planar_fraction)
            index = np.flatnonzero(group.apart)[:n] if args.all_apart else np.arange(n)
            index = index if args.only is None else np.asarray(args.only)
            opt = dataclasses.replace(group.model.opt, tolerance=args.tolerance)
            if opt.adaptive is not None and args.adaptive_constant:
                opt = dataclasses.replace(opt, adaptive=adaptive.settings(stepsize_controller=diffrax.ConstantStepSize()))
            elif opt.adaptive is not None and args.adaptive_tol is not None:
                opt = dataclasses.replace(opt, adaptive=adaptive.settings(rtol=args.adaptive_tol, atol=args.adaptive_tol,
                                                                          max_steps=4096))
            model = eqx.tree_at(lambda m: m.opt, group.model, opt)
            group = dataclasses.replace(group, model=jax.tree.map(lambda x: x[index], model),
                                        qpos=group.qpos[index], qvel=group.qvel[index], apart=group.apart[index])
            print(f"group {number}: {structure}: {len(index)} scenes", flush=True)
            report(group, number, index, check_group(group, args.steps, args.rtol, index), counts,
                   show_all=args.only is not None)
            fuzz.release_compiled()
            print(f"{done + n}/{args.scenes} scenes, {time.time() - start:.0f} s", flush=True)
        done, number = done + n, number + 1
    summary(counts)


if __name__ == "__main__":
    main()
