"""Each step's Jacobian d qvel+ / d qvel along a fuzz scene's float32 trajectory, taken in float32
and in float64 from the same states (issue #11: the NCP's float32 implicit derivative).

A float32 rollout gradient that is orders of magnitude above float64's (seed 7016, group
1663471682, scene 164: 5.6e14 against 416) comes from steps whose float32 derivative is wrong;
this lists them with their solver status:

    .venv/bin/python experiments/ncp_step_jacobian.py --seed 7016 --scenes 400 --make-group-seed 1663471682 \\
        --only 164 --planar-fraction 0 --steps 500

For each step t: the forward solve's convergence and scaled residual (float32), |J32|, |J64| (spectral
norms) and |J32 - J64| / |J64|. Steps where the relative error exceeds `--bad` are printed;
the summary counts them by convergence.

`--save-problems FILE --at 434 479 298` writes the NCP Problems those float32 steps differentiate (the
last solve of each step), stacked, as `tests/data/ncp_centering_stall.npz` holds them.
"""

from __future__ import annotations

import argparse
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import fuzz_recheck
import jaxsim_ncp as jsn


def _trajectory(model: jsn.Model, qpos, qvel, steps: int):
    data = jsn.make_data(model).replace(qpos=qpos, qvel=qvel)
    _, traj = jax.jit(lambda d: jsn.rollout(model, d, jnp.zeros((steps, model.nu), model.dtype)))(data)
    return data, traj


def step_jacobians(model: jsn.Model, start: jsn.Data, qpos, qvel, time):
    """d qvel+ / d qvel at each state (qpos[t], qvel[t], time[t]) (one vmapped program)."""

    def one(q, v, t):
        data = start.replace(qpos=q, time=t)
        return jax.jacrev(lambda v: jsn.step(model, data.replace(qvel=v)).qvel)(v)

    return jax.jit(jax.vmap(one))(qpos, qvel, time)


def save_problems(model: jsn.Model, start: jsn.Data, qpos, qvel, time, steps: list[int], path: str) -> None:
    """The Problem of the last centering (`ncp.solve`'s relax: the derivative's) of each step in `steps`."""
    from jaxsim_ncp.solver import ncp

    captured, iterate = [], ncp._iterate

    def recording(step_fn, x, p, *args, **kwargs):
        if step_fn is ncp._centering_step:  # the relaxation: p is the differentiated problem
            jax.debug.callback(lambda p: captured.append(jax.tree.map(np.asarray, p)), p)
        return iterate(step_fn, x, p, *args, **kwargs)

    ncp._iterate = recording
    try:
        problems = []
        for t in steps:
            captured.clear()
            jax.block_until_ready(step_jacobians(model, start, qpos[t : t + 1], qvel[t : t + 1], time[t : t + 1]))
            problems.append(captured[-1])
    finally:
        ncp._iterate = iterate
    fields = {k: np.stack([getattr(p, k) for p in problems]) for k in ncp.Problem._fields if getattr(problems[0], k) is not None}
    np.savez_compressed(path, **fields, step=np.asarray(steps))
    print(f"saved the Problems of steps {steps} to {path}")


def _with_kappa_grad(model: jsn.Model, kappa_grad: float | None) -> jsn.Model:
    if kappa_grad is None:
        return model
    return eqx.tree_at(lambda m: m.opt, model, dataclasses.replace(model.opt, kappa_grad=kappa_grad))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fuzz_recheck.add_group_arguments(parser)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--bad", type=float, default=0.5, help="relative Jacobian error that counts a step as bad")
    parser.add_argument("--kappa-grad", type=float, nargs="+", default=[None],
                        help="the derivative's relaxation(s) to compare (default: the model's); the trajectory keeps the model's")
    parser.add_argument("--quiet", action="store_true", help="the summary line only")
    parser.add_argument("--save-problems", default=None, help="write the differentiated NCP Problems of the --at steps here")
    parser.add_argument("--at", type=int, nargs="+", default=[], help="steps for --save-problems")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    g32 = fuzz_recheck.chosen_group(args, jnp.float32)
    g64 = fuzz_recheck.chosen_group(args, jnp.float64)
    for k, scene in enumerate(args.only):
        m32, m64 = (jax.tree.map(lambda x: x[k], g.model) for g in (g32, g64))
        start, traj = _trajectory(m32, jnp.asarray(g32.qpos[k], jnp.float32), jnp.asarray(g32.qvel[k], jnp.float32), args.steps)
        # the states each step starts from: the initial one, then the trajectory's
        qpos = jnp.concatenate([start.qpos[None], traj.qpos[:-1]])
        qvel = jnp.concatenate([start.qvel[None], traj.qvel[:-1]])
        time = jnp.concatenate([start.time[None], traj.time[:-1]])
        if args.save_problems:
            save_problems(m32, start, qpos, qvel, time, args.at, args.save_problems)
            continue
        start64 = jax.tree.map(lambda x: x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x, start)
        cast = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
        for kappa_grad in args.kappa_grad:
            j32 = np.asarray(step_jacobians(_with_kappa_grad(m32, kappa_grad), start, qpos, qvel, time), np.float64)
            j64 = np.asarray(step_jacobians(_with_kappa_grad(m64, kappa_grad), start64, cast(qpos), cast(qvel), cast(time)))
            _report(scene, kappa_grad or m32.opt.kappa_grad, j32, j64, traj, args)


def _report(scene, kappa_grad, j32, j64, traj, args) -> None:
    """One summary line (and each bad step unless --quiet): float32 against float64 Jacobians."""
    n32, n64 = np.linalg.norm(j32, 2, axis=(1, 2)), np.linalg.norm(j64, 2, axis=(1, 2))
    rel = np.linalg.norm(j32 - j64, 2, axis=(1, 2)) / np.maximum(n64, 1e-12)
    converged, residual = np.asarray(traj.solver_converged), np.asarray(traj.solver_residual)
    bad = ~np.isfinite(rel) | (rel > args.bad)
    print(f"scene {scene}, kappa_grad {kappa_grad:g}: {args.steps} steps, {int((~converged).sum())} unconverged (float32); "
          f"bad steps (rel > {args.bad}): {int(bad.sum())}, of them unconverged {int((bad & ~converged).sum())}; "
          f"log10 prod |J| float32 {np.log10(n32).sum():.1f}, float64 {np.log10(n64).sum():.1f}")
    for t in [] if args.quiet else np.nonzero(bad)[0]:
        print(f"  step {t}: converged {converged[t]} residual {residual[t]:.2g} |J32| {n32[t]:.4g} |J64| {n64[t]:.4g} rel {rel[t]:.3g}")


if __name__ == "__main__":
    main()
