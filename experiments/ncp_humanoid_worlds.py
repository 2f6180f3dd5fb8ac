"""The humanoid at dt = 0.05 with hard contact over many worlds: how often a step penetrates.

`ncp_humanoid_dt.py` follows one control sequence per amplitude; its maximum is set by the
worst step of one chaotic trajectory. This runs `--worlds` control sequences (uniform in
`amplitude` x the control range, redrawn every step, seeds 0..worlds-1) from the "squat"
keyframe as one vmapped rollout (float64, implicitfast, `solver="ncp"`) and measures each
state's penetration with MuJoCo's own collision (the deepest `contact.dist` below zero).
Prints the share of steps deeper than 1 mm, the deepest, the median over worlds of each
world's deepest, the same for steps that start from a state within 0.1 mm (what one step
does from a clean state), and the share of unconverged solves.

    .venv/bin/python experiments/ncp_humanoid_worlds.py --amplitude 0.3 --ncp-passes 4   # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contact import humanoid_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--amplitude", type=float, default=0.3)
    parser.add_argument("--ncp-passes", type=int, default=4)
    parser.add_argument("--worlds", type=int, default=12)
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--options", default="{}", help="JSON overrides for from_mujoco, e.g. '{\"ncp_nonlinear_gap\": false}'")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import mujoco

    import jaxsim_ncp as jsn

    m = mujoco.MjModel.from_xml_path(str(humanoid_path()))
    m.opt.timestep = args.dt
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    qpos0 = np.array(m.key_qpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "squat")])
    steps = int(round(args.duration / args.dt))
    model = jsn.from_mujoco(m, solver="ncp", integrator="implicitfast", ncp_passes=args.ncp_passes,
                            **json.loads(args.options))
    data = jsn.make_data(model).replace(qpos=jnp.asarray(qpos0))
    lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
    amp = args.amplitude
    ctrl = np.stack([np.random.default_rng([s, int(amp * 1000)]).uniform(lo, hi, (steps, m.nu)) * amp
                     for s in range(args.worlds)])  # fmt: skip
    traj = jax.jit(jax.vmap(lambda u: jsn.rollout(model, data, u)[1]))(jnp.asarray(ctrl))
    d = mujoco.MjData(m)
    depth = np.zeros((args.worlds, steps))
    for b in range(args.worlds):
        for k, q in enumerate(np.asarray(traj.qpos[b])):
            d.qpos[:] = q
            mujoco.mj_forward(m, d)
            depth[b, k] = -1e3 * min([0.0] + [d.contact[i].dist for i in range(d.ncon)])
    before = np.concatenate([np.zeros((args.worlds, 1)), depth[:, :-1]], axis=1)
    fresh = depth[before < 0.1]
    print(f"humanoid dt={args.dt} amplitude={amp} ncp_passes={args.ncp_passes} {args.options}: {args.worlds} worlds x {steps} steps; "
          f"steps > 1 mm {np.mean(depth > 1):.3f}, deepest {depth.max():.1f} mm, median of each world's deepest "
          f"{np.median(depth.max(axis=1)):.2f} mm; from a state within 0.1 mm: > 1 mm {np.mean(fresh > 1):.3f}, "
          f"deepest {fresh.max():.2f} mm; unconverged {np.mean(~np.asarray(traj.solver_converged)):.3f}; max |qvel| {np.abs(np.asarray(traj.qvel)).max():.1f}")


if __name__ == "__main__":
    main()
