"""Forward throughput on all the cores of a CPU: `jsn.batched` (a device per core, each device's worlds
in tiles) against `jax.jit(jax.vmap(rollout))` and MJX's, interleaved calls in one process.

    .venv/bin/python experiments/bench_cores.py --model humanoid --batch 1024 --devices 2 --tiles 0 128

--devices sets JAX's CPU device count (`jsn.use_cpu_cores`) before JAX starts; ours runs through
`batched` over the first n devices for each n of --meshes (default: all) and each tile of --tiles
(0: a device's worlds all at once), MJX on one device in tiles for each of --mjx-tiles. Prints the mean of the fastest third of --repeats calls, the
median, the process CPU time per call and the ratio to MJX's `jax.jit(jax.vmap(...))`. MJX is not run
through `batched`: its Cholesky (jaxlib's batched potrf) deadlocks when two CPU devices run it at once.
"""

import argparse
import importlib
import pathlib
import resource
import sys
import time

import jax

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="humanoid")
parser.add_argument("--batch", type=int, default=1024)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--devices", type=int, default=None, help="CPU devices (default: one per core)")
parser.add_argument("--meshes", type=int, nargs="*", default=None, help="device counts for batched (default: all)")
parser.add_argument("--tiles", type=int, nargs="*", default=[128])
parser.add_argument("--mjx-tiles", type=int, nargs="*", default=[], help="MJX on one device in tiles (lax.map)")
parser.add_argument("--repeats", type=int, default=9)
args = parser.parse_args()

import jaxsim_ncp as jsn  # noqa: E402

jsn.use_cpu_cores(args.devices)

import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from jaxsim_ncp.math import map_chunks  # noqa: E402
from jaxsim_ncp.types import make_data  # noqa: E402
from jaxsim_ncp.workflows import _mjx_rollout, bench_model_path, from_mujoco, mjx_limits  # noqa: E402

rollout = importlib.import_module("jaxsim_ncp.forward").rollout
out = pathlib.Path(__file__).parent / "results"
mj = mujoco.MjModel.from_xml_path(bench_model_path(args.model, out))
model = from_mujoco(mj, **mjx_limits(mj))
data = make_data(model)
ours = lambda u: rollout(model, data, u)[0].qpos  # noqa: E731
run, d0, _ = _mjx_rollout(mj)
fns = {"mjx jit(vmap)": jax.jit(jax.vmap(lambda u: run(d0, u)[0].qpos)), "ours jit(vmap)": jax.jit(jax.vmap(ours))}
for tile in args.mjx_tiles:
    tiled = lambda u, t=tile: map_chunks(jax.vmap(lambda v: run(d0, v)[0].qpos), (u,), t)  # noqa: E731
    fns[f"mjx jit, tiles of {tile}"] = jax.jit(tiled)
for n in args.meshes or [jax.device_count()]:
    for tile in args.tiles:
        fns[f"ours batched {n} dev tile {tile}"] = jsn.batched(ours, jsn.world_mesh(jax.devices()[:n]), tile=tile)

ctrl = jnp.zeros((args.batch, args.steps, model.nu), model.dtype)
print(f"{args.model}, B = {args.batch}, {args.steps} steps, {jax.device_count()} CPU devices, {model.dtype.name}")
for name, fn in fns.items():
    begin = time.perf_counter()
    jax.block_until_ready(fn(ctrl))
    print(f"  {name}: compile + first call {time.perf_counter() - begin:.1f} s", flush=True)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


wall = {name: [] for name in fns}
cpu = {name: [] for name in fns}
for _ in range(args.repeats):
    for name, fn in fns.items():
        c, t = cpu_seconds(), time.perf_counter()
        jax.block_until_ready(fn(ctrl))
        wall[name].append(time.perf_counter() - t)
        cpu[name].append(cpu_seconds() - c)
fastest = {name: np.mean(sorted(w)[: max(1, len(w) // 3)]) for name, w in wall.items()}
mjx_fast, mjx_median = fastest["mjx jit(vmap)"], np.median(wall["mjx jit(vmap)"])
for name in fns:
    print(f"{name:32s} {1e3 * fastest[name]:8.1f} ms (median {1e3 * np.median(wall[name]):8.1f}), "
          f"{args.batch * args.steps / fastest[name]:9.4g} steps/s, CPU {1e3 * np.median(cpu[name]):7.0f} ms/call, "
          f"x MJX {mjx_fast / fastest[name]:.2f} (median {mjx_median / np.median(wall[name]):.2f})", file=sys.stdout)  # fmt: skip
