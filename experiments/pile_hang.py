"""Issue #11's hang: a vmapped rollout of a 27-box pile, run many times, each under a watchdog.

Scene: a 3x3x3 grid of boxes (half-size 0.1 m, 1 kg) dropped on a plane, timestep 0.005,
iterations = ls_iterations = 10, stepped 60 times in MuJoCo so the pile is in contact;
then `jax.jit(jax.vmap(rollout))` in float32 with 2 steps. Each batch size runs in its
own child process: one compile, then `--runs` executions with fresh inputs; a run that
does not return within `--timeout` seconds counts as a hang (the child is killed).

    .venv/bin/python experiments/pile_hang.py                    # batches 1 4 8 16, 20 runs each
    .venv/bin/python experiments/pile_hang.py --vendor-linalg    # jax.scipy's LAPACK calls, unchunked

Cause (jaxlib 0.10, CPU): a LAPACK kernel (potrf, trsm, getrf) whose batch reaches 2e5 flops of
work splits it into chunks, schedules them on XLA's intra-op pool and blocks the calling pool
thread until they finish; two such calls running at once on a 2-thread pool wait forever.
`jaxsim_ncp/linalg.py` hands LAPACK only batches below that work, which jaxlib runs on the
calling thread. (`--vendor-linalg` hung in 4 of 6 runs when the issue was filed; with mujoco 4.0
the settled pile has 108 contacts instead of ~157 and on 2026-11-28 it completed 40 of 40 runs
at batches 4 and 8: the race depends on how the step's independent parts get scheduled.)
"""

from __future__ import annotations

import argparse
import selectors
import subprocess
import sys
import time

CHILD = r"""
import sys, time
import numpy as np, mujoco, jax, jax.numpy as jnp
import jaxsim_ncp as jsn
from jaxsim_ncp import linalg

batch, runs, vendor = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if vendor:
    import jax.scipy.linalg as jsl
    linalg.cho_factor = lambda a: jnp.linalg.cholesky(a)
    linalg.cho_solve = lambda lower, b: jsl.cho_solve((lower, True), b)
bodies = "".join(
    f'<body pos="{(i - 1) * 0.22} {(j - 1) * 0.22} {0.1 + k * 0.21}"><freejoint/>'
    '<geom type="box" size="0.1 0.1 0.1" mass="1"/></body>'
    for i in range(3) for j in range(3) for k in range(3))
xml = ('<mujoco><option timestep="0.005" iterations="10" ls_iterations="10"/><worldbody>'
       f'<geom type="plane" size="5 5 0.1"/>{bodies}</worldbody></mujoco>')
mj = mujoco.MjModel.from_xml_string(xml)
md = mujoco.MjData(mj)
for _ in range(60):
    mujoco.mj_step(mj, md)
model = jsn.from_mujoco(mj, dtype=jnp.float32)
data = jsn.make_data(model).replace(qpos=jnp.asarray(md.qpos, jnp.float32))
ctrl = jnp.zeros((batch, 2, model.nu), jnp.float32)
qvel = jnp.broadcast_to(jnp.asarray(md.qvel, jnp.float32), (batch, model.nv))
fn = jax.jit(jax.vmap(lambda v, u: jsn.rollout(model, data.replace(qvel=v), u)[0].qpos)).lower(qvel, ctrl).compile()
print(f"READY ncon={md.ncon} slots={model.constraints.ncon}", flush=True)
for r in range(runs):
    t = time.perf_counter()
    fn(qvel + 1e-3 * r, ctrl).block_until_ready()
    print(f"RUN {time.perf_counter() - t:.4f}", flush=True)
"""


def run_batch(batch: int, runs: int, timeout: float, vendor: bool) -> tuple[int, list[float], str]:
    """(completed runs, their times, note) for one batch size in a child process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(batch), str(runs), "1" if vendor else "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    times, note = [], ""
    deadline = time.time() + 600  # compile
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        if not sel.select(timeout=max(0.0, deadline - time.time())):
            proc.kill()
            note = "HANG (killed)" if note.startswith("READY") or times else "compile timeout"
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("READY"):
            note = line.strip()
            deadline = time.time() + timeout
        elif line.startswith("RUN"):
            times.append(float(line.split()[1]))
            deadline = time.time() + timeout
    proc.wait()
    return len(times), times, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a single run may take")
    parser.add_argument("--vendor-linalg", action="store_true", help="use jax.scipy's LAPACK kernels (the old code)")
    args = parser.parse_args()
    for batch in args.batches:
        done, times, note = run_batch(batch, args.runs, args.timeout, args.vendor_linalg)
        median = sorted(times)[len(times) // 2] if times else float("nan")
        print(f"batch {batch:3d}: {done}/{args.runs} runs completed, median {median:.3f} s  [{note}]", flush=True)


if __name__ == "__main__":
    main()
