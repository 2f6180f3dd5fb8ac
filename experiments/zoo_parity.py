"""Load every MJCF model under a folder and step it beside MuJoCo (float64).

For each file MuJoCo compiles: load it here (or report the refusal), run 30 steps of small random
controls from its first keyframe with `rollout`, the same with `mj_step`, and print the largest
|qpos - qpos_MuJoCo| after 1, 10 and 30 steps with the compile-and-run time. Peak memory per model is
what `/usr/bin/time -v` or a watchdog around one call reports (compile memory grows with the model).

    pip download dm-control --no-deps -d /tmp/dmc && unzip -q /tmp/dmc/*.whl -d /tmp/dmc/x
    python experiments/zoo_parity.py /tmp/dmc/x/dm_control suite/dog.xml ...   # or no names: every file

Results of a run: experiments/results/zoo_dm_control.md.
"""

from __future__ import annotations

import pathlib
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

jax.config.update("jax_enable_x64", True)
import jaxsim_ncp as jsn  # noqa: E402

STEPS = 30


def compare(path: pathlib.Path) -> str:
    m = mujoco.MjModel.from_xml_path(str(path))
    if m.nv == 0:
        return "no degrees of freedom"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = jsn.from_mujoco(m)
    d = mujoco.MjData(m)
    if m.nkey:
        mujoco.mj_resetDataKeyframe(m, d, 0)
    ctrl = np.random.default_rng(0).uniform(-0.3, 0.3, (STEPS, m.nu))
    limited = m.actuator_ctrllimited.astype(bool)[None]
    ctrl = np.where(limited, np.clip(ctrl, m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]), ctrl)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel), act=jnp.asarray(d.act),
                                        mocap_pos=jnp.asarray(d.mocap_pos), mocap_quat=jnp.asarray(d.mocap_quat))  # fmt: skip
    start = time.time()
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    jax.block_until_ready(traj)
    seconds = time.time() - start
    errors = []
    for t in range(STEPS):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        errors.append(float(np.abs(np.asarray(traj.qpos[t]) - d.qpos).max()))
    return (f"nv={m.nv:3d} contacts={d.ncon:3d} |dqpos| after 1/10/{STEPS} steps: "
            f"{errors[0]:.1e} / {errors[9]:.1e} / {errors[-1]:.1e}; compile+run {seconds:.0f} s")  # fmt: skip


def main(root: str, names: list[str]) -> None:
    base = pathlib.Path(root)
    paths = [base / n for n in names] if names else sorted(base.rglob("*.xml"))
    for path in paths:
        try:
            mujoco.MjModel.from_xml_path(str(path))
        except Exception:  # an include fragment or an asset file: not a model
            continue
        try:
            line = compare(path)
        except Exception as err:  # noqa: BLE001 - a refusal or a failure, reported by name
            line = f"{type(err).__name__}: {str(err)[:200]}"
        print(f"{str(path.relative_to(base)):60s} {line}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
