"""Every model in the `mujoco-mjx` package's test_data: does it load, and does it follow MuJoCo?

For each MJCF file: load it with `jsn.from_mujoco` (or record the refusal and its
reason), start from the first keyframe (else qpos0) with a random velocity and random
controls, then step MuJoCo C and jaxsim_ncp side by side in float64 with the model's
own options (solver iterations included: the MJX humanoids ship `iterations=1`), and
report the largest qpos/qvel difference over the steps, how many steps stay within 1e-6
(relative to the state's size: a chaotic scene drifts apart later, not at once; the same count
for MuJoCo against itself with qvel perturbed by 1e-14 says how chaotic the scene is), and the
relative forward qacc and sensordata differences at the start. Where qacc differs by more
than 1e-8, MuJoCo's forward pass is repeated with its convex-collision tolerance tightened
(ccd_tolerance 1e-12, 1000 iterations), which tells a difference in MuJoCo's convex
collision approximation from one elsewhere. (Barkour's feet on its height field differed by
5.6e-5 before collision/ccd.py repeated MuJoCo's EPA; now 3.7e-15.)

    python experiments/mjx_test_data.py [--steps 100] [--only humanoid]   # --only: update those rows

Writes experiments/results/mjx_test_data.csv.
"""

from __future__ import annotations

import argparse
import csv
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402

import jaxsim_ncp as jsn  # noqa: E402

TEST_DATA = pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data"
RESULTS = pathlib.Path(__file__).parent / "results"


def compare(path: pathlib.Path, steps: int, seed: int = 0) -> dict:
    row = {"model": str(path.relative_to(TEST_DATA))}
    try:
        m = mujoco.MjModel.from_xml_path(str(path))
    except ValueError as err:
        return row | {"status": "mujoco cannot compile", "detail": str(err).splitlines()[0]}
    try:
        model = jsn.from_mujoco(m)
    except Exception as err:  # noqa: BLE001  (the refusal is the result)
        return row | {"status": "refused", "detail": f"{type(err).__name__}: {err}"}
    rng = np.random.default_rng(seed)
    d = mujoco.MjData(m)
    if m.nkey:
        mujoco.mj_resetDataKeyframe(m, d, 0)
    d.qvel[:] = 0.5 * rng.normal(size=m.nv)
    ctrl = 0.3 * rng.normal(size=(steps, m.nu))
    d.ctrl[:] = ctrl[0] if steps else 0
    data = jsn.make_data(model).replace(
        qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel), act=jnp.asarray(d.act), ctrl=jnp.asarray(d.ctrl)
    )
    if m.nmocap:
        data = data.replace(mocap_pos=jnp.asarray(d.mocap_pos), mocap_quat=jnp.asarray(d.mocap_quat))
    mujoco.mj_forward(m, d)
    out = jax.jit(jsn.forward)(model, data)
    qacc_err = float(np.max(np.abs(np.asarray(out.qacc) - d.qacc), initial=0) / max(1.0, np.max(np.abs(d.qacc), initial=0)))
    qacc_err_tight = None
    if qacc_err > 1e-8:
        tight = mujoco.MjModel.from_xml_path(str(path))
        tight.opt.ccd_tolerance, tight.opt.ccd_iterations = 1e-12, 1000
        d_tight = mujoco.MjData(tight)
        d_tight.qpos[:], d_tight.qvel[:], d_tight.act[:], d_tight.ctrl[:] = d.qpos, d.qvel, d.act, d.ctrl
        d_tight.mocap_pos[:], d_tight.mocap_quat[:] = d.mocap_pos, d.mocap_quat
        mujoco.mj_forward(tight, d_tight)
        qacc_err_tight = float(np.max(np.abs(np.asarray(out.qacc) - d_tight.qacc)) / max(1.0, np.max(np.abs(d_tight.qacc))))
    sensor_err = float(np.max(np.abs(np.asarray(out.sensordata) - d.sensordata), initial=0) / max(1.0, np.max(np.abs(d.sensordata), initial=0)))

    @jax.jit
    def states(data, ctrl):  # only qpos/qvel per step: a full Data per step does not fit for the big scenes
        def body(dd, u):
            dd = jsn.step(model, dd.replace(ctrl=u))
            return dd, (dd.qpos, dd.qvel)

        return jax.lax.scan(body, data, ctrl)[1]

    qpos, qvel = states(data, jnp.asarray(ctrl))
    # MuJoCo against itself with qvel perturbed by 1e-14 (relative): how long a chaotic scene
    # follows any trajectory at all
    d_near = mujoco.MjData(m)
    d_near.qpos[:], d_near.qvel[:], d_near.act[:] = d.qpos, d.qvel * (1 + 1e-14), d.act
    d_near.mocap_pos[:], d_near.mocap_quat[:] = d.mocap_pos, d.mocap_quat
    err, within, self_within = [], steps, steps
    for t in range(steps):
        d.ctrl[:] = d_near.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        mujoco.mj_step(m, d_near)
        err.append(max(np.max(np.abs(np.asarray(qpos[t]) - d.qpos), initial=0), np.max(np.abs(np.asarray(qvel[t]) - d.qvel), initial=0)))
        size = max(1.0, np.max(np.abs(d.qpos), initial=0), np.max(np.abs(d.qvel), initial=0))
        if within == steps and err[-1] > 1e-6 * size:
            within = t
        self_err = max(np.max(np.abs(d_near.qpos - d.qpos), initial=0), np.max(np.abs(d_near.qvel - d.qvel), initial=0))
        if self_within == steps and self_err > 1e-6 * size:
            self_within = t
    return row | {
        "status": "loaded", "nv": m.nv, "iterations": m.opt.iterations, "ls_iterations": m.opt.ls_iterations,
        "qacc_rel_err": qacc_err, "qacc_rel_err_tight_ccd": qacc_err_tight, "sensordata_rel_err": sensor_err, "max_state_err": float(max(err, default=0.0)),
        "steps_within_1e-6": within, "mujoco_self_steps_within_1e-6": self_within,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--only", default="", help="substring of the model path")
    args = parser.parse_args()
    rows = []
    for path in sorted(TEST_DATA.rglob("*.xml")):
        if args.only not in str(path):
            continue
        row = compare(path, args.steps)
        rows.append(row)
        print({k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        jax.clear_caches()
    RESULTS.mkdir(exist_ok=True)
    keys = ["model", "status", "nv", "iterations", "ls_iterations", "qacc_rel_err", "qacc_rel_err_tight_ccd", "sensordata_rel_err", "max_state_err",
            "steps_within_1e-6", "mujoco_self_steps_within_1e-6", "detail"]  # fmt: skip
    csv_path = RESULTS / "mjx_test_data.csv"
    if args.only and csv_path.exists():  # a partial run updates its rows of the full table
        with open(csv_path, newline="") as f:
            old = {r["model"]: r for r in csv.DictReader(f)}
        rows = sorted((old | {r["model"]: r for r in rows}).values(), key=lambda r: r["model"])
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)
    loaded = [r for r in rows if r["status"] == "loaded"]
    follow = sum(  # rows of an older full run carry only max_state_err
        int(r["steps_within_1e-6"]) == args.steps if r.get("steps_within_1e-6") else float(r["max_state_err"]) <= 1e-6
        for r in loaded
    )
    print(f"{len(loaded)} of {len(rows)} load; {follow} follow MuJoCo to 1e-6 (relative) over {args.steps} steps")


if __name__ == "__main__":
    main()
