"""The humanoid at a large timestep: hard contact (``solver="ncp"``) vs MuJoCo's soft contact.

Issue #12's criterion: the mjx test humanoid (``mujoco/mjx/test_data/humanoid/humanoid.xml``,
nq=28, nv=27, 4 foot-floor pairs) at dt = 0.05 for 2 s stays finite and stable with
penetration <= 1 mm. From the "squat" keyframe, with random controls uniform in
``amplitude`` x the control range (redrawn every step; amplitude 0: passive), for each
amplitude in ``--amplitudes``:

  * ours: ``rollout`` with ``solver="ncp"`` (``integrator=--integrator``, implicitfast by
    default, ``ncp_passes=--ncp-passes``), float64 unless ``--f32``; penetration is
    measured independently of our solver: MuJoCo's own collision (``mj_forward``) on each
    of our states, the deepest ``contact.dist`` below zero;
  * MuJoCo C (soft contact, same integrator and dt, iterations=100, ls_iterations=50) on
    the same controls, and MuJoCo C with contact disabled: whether the smooth dynamics
    alone stay bounded at that step (they do not at large amplitudes: the actuated joints
    outrun any integrator at dt = 0.05, so there is no stable reference).

Printed and appended to ``--csv`` (``experiments/results/ncp_humanoid_dt.csv``): per
amplitude and simulator, finite, max penetration (mm), root height range (m), max |qvel|
and, for ours, the fraction of converged steps and max iterations.

    .venv/bin/python experiments/ncp_humanoid_dt.py                      # ~1 min on 2 cores
    .venv/bin/python experiments/ncp_humanoid_dt.py --dt 0.1 --amplitudes 0 0.2
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import pathlib
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contact import humanoid_path  # noqa: E402

FIELDS = ("timestamp", "dtype", "dt", "steps", "integrator", "ncp_passes", "amplitude", "simulator",
          "finite", "max_penetration_mm", "root_z_min", "root_z_max", "max_abs_qvel", "converged_frac", "niter_max")  # fmt: skip


def penetration_mm(m, qpos) -> float:
    """Deepest penetration (mm, >= 0) of MuJoCo's own collision at each configuration."""
    import mujoco

    d = mujoco.MjData(m)
    deepest = 0.0
    for q in qpos:
        d.qpos[:] = q
        mujoco.mj_forward(m, d)
        deepest = min([deepest] + [d.contact[i].dist for i in range(d.ncon)])
    return -1e3 * deepest


def mujoco_rollout(m, qpos0, ctrl, contact: bool):
    """MuJoCo C from qpos0 with ctrl[t] at step t: (qpos per step, max |qvel|)."""
    import mujoco

    d = mujoco.MjData(m)
    d.qpos[:] = qpos0
    if not contact:
        m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    qs, vmax = [], 0.0
    for u in ctrl:
        d.ctrl[:] = u
        mujoco.mj_step(m, d)
        qs.append(d.qpos.copy())
        vmax = max(vmax, float(np.max(np.abs(d.qvel))) if np.all(np.isfinite(d.qvel)) else np.inf)
    if not contact:
        m.opt.disableflags &= ~int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    return np.array(qs), vmax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--amplitudes", type=float, nargs="+", default=[0.0, 0.2, 0.3, 0.5, 1.0])
    parser.add_argument("--integrator", choices=("euler", "implicitfast"), default="implicitfast")
    parser.add_argument("--ncp-passes", type=int, default=4)
    parser.add_argument("--f32", action="store_true", help="float32 (default float64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results" / "ncp_humanoid_dt.csv")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_enable_x64", not args.f32)
    import jax.numpy as jnp
    import mujoco

    import jaxsim_ncp as jsn

    m = mujoco.MjModel.from_xml_path(str(humanoid_path()))
    m.opt.timestep = args.dt
    m.opt.integrator = getattr(mujoco.mjtIntegrator, "mjINT_" + args.integrator.upper())
    m.opt.iterations, m.opt.ls_iterations = 100, 50
    qpos0 = np.array(m.key_qpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "squat")])
    steps = int(round(args.duration / args.dt))
    model = jsn.from_mujoco(m, solver="ncp", integrator=args.integrator, ncp_passes=args.ncp_passes)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(qpos0, model.dtype))
    rollout = jax.jit(lambda u: jsn.rollout(model, data, u)[1])
    lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    dtype = "float32" if args.f32 else "float64"
    rows = []
    print(f"humanoid, dt={args.dt}, {steps} steps, {args.integrator}, {dtype}, ncp_passes={args.ncp_passes}")
    print(f"{'amplitude':>9} | {'simulator':<18} | finite | pen. mm | root z min..max | max|qvel| | conv  | niter")
    for amp in args.amplitudes:
        ctrl = np.random.default_rng([args.seed, int(amp * 1000)]).uniform(lo, hi, (steps, m.nu)) * amp
        traj = rollout(jnp.asarray(ctrl, model.dtype))
        qs, vs = np.asarray(traj.qpos, np.float64), np.asarray(traj.qvel)
        finite = bool(np.all(np.isfinite(qs)))
        results = [("ours ncp (hard)", qs, finite, float(np.max(np.abs(vs))),
                    float(np.mean(np.asarray(traj.solver_converged))), int(np.max(np.asarray(traj.solver_niter))))]  # fmt: skip
        for name, contact in (("MuJoCo C (soft)", True), ("MuJoCo C, no contact", False)):
            q, vmax = mujoco_rollout(m, qpos0, ctrl, contact)
            results.append((name, q, bool(np.all(np.isfinite(q))), vmax, None, None))
        for name, q, fin, vmax, conv, niter in results:
            pen = penetration_mm(m, q) if fin and name != "MuJoCo C, no contact" else float("nan")
            row = dict(timestamp=stamp, dtype=dtype, dt=args.dt, steps=steps, integrator=args.integrator,
                       ncp_passes=args.ncp_passes, amplitude=amp, simulator=name, finite=fin,
                       max_penetration_mm=f"{pen:.4g}", root_z_min=f"{np.min(q[:, 2]):.4g}", root_z_max=f"{np.max(q[:, 2]):.4g}",
                       max_abs_qvel=f"{vmax:.4g}", converged_frac="" if conv is None else f"{conv:.4g}",
                       niter_max="" if niter is None else niter)  # fmt: skip
            rows.append(row)
            print(f"{amp:9.2f} | {name:<18} | {str(fin):6} | {row['max_penetration_mm']:>7} | "
                  f"{row['root_z_min']:>7}..{row['root_z_max']:<7} | {row['max_abs_qvel']:>9} | "
                  f"{row['converged_frac']:5} | {row['niter_max']}")  # fmt: skip
    new = not args.csv.exists()
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)
    print(f"rows appended to {args.csv}")


if __name__ == "__main__":
    main()
