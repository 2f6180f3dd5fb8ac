"""`jsn.batched` across processes: two processes of two CPU devices each, joined by
`jax.distributed` on this machine (the multi-host recipe of the README, without a cluster).

Each process passes its own 4 of the 8 worlds (`jax.make_array_from_process_local_data`) and checks
that the rollout's results for them are bit-identical to running them in this process alone, and
that the gradient with respect to a shared parameter (the sphere's friction, summed over all 8
worlds, i.e. over both processes) and to the per-world initial velocities matches a single-process
`vmap` over all 8 worlds.

    .venv/bin/python experiments/multihost_check.py          # prints one line per process, "ok"
"""

from __future__ import annotations

import os
import subprocess
import sys

N_PROCESSES, LOCAL_WORLDS, STEPS = 2, 4, 10
SCENE = """<mujoco><option timestep="0.005"/><worldbody><geom type="plane" size="2 2 .1"/>
  <body pos="0 0 .1"><freejoint/><geom type="sphere" size=".1" mass="1"/></body>
  <body pos=".3 0 .1"><freejoint/><geom type="box" size=".08 .08 .08" mass=".5"/></body></worldbody></mujoco>"""


def worker(pid: int, port: int) -> None:
    import equinox as eqx
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=N_PROCESSES, process_id=pid)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import jaxsim_ncp as jsn

    model = jsn.load_mjcf(SCENE)
    data = jsn.make_data(model)

    def run(friction, qvel):
        m = eqx.tree_at(lambda m: m.geom_friction, model, model.geom_friction.at[:, 0].set(friction))
        final, traj = jsn.rollout(m, data.replace(qvel=qvel), jnp.zeros((STEPS, 0)))
        return final.qpos, traj.qvel

    def loss(run_batch, friction, qvel):
        qpos, qvels = run_batch(friction, qvel)
        return jnp.sum(qpos[:, :3] ** 2) + jnp.sum(qvels[:, :, :3] ** 2)

    def own_rows(array):  # this process's worlds of a global array, in order
        shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start)
        return np.concatenate([np.asarray(s.data) for s in shards])

    rng = np.random.default_rng(0)
    all_qvel = (0.5 * rng.normal(size=(N_PROCESSES * LOCAL_WORLDS, model.nv))).astype(np.float32)
    mine = all_qvel[pid * LOCAL_WORLDS : (pid + 1) * LOCAL_WORLDS]
    friction = jnp.asarray(0.6, jnp.float32)

    mesh = jax.make_mesh((jax.device_count(),), ("worlds",))  # every process's devices
    on_devices = jsn.batched(run, mesh, in_axes=(None, 0))
    qvel = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("worlds")), mine)
    qpos, _ = on_devices(friction, qvel)  # global arrays are arguments, never closed over
    local = own_rows(qpos)

    with jax.default_device(jax.local_devices()[0]):  # this process alone, its worlds in slices of 2
        one_device = jax.jit(jax.vmap(run, in_axes=(None, 0)))
        alone = np.concatenate([np.asarray(one_device(friction, jnp.asarray(mine[k : k + 2]))[0]) for k in (0, 2)])
        g_ref = jax.grad(lambda f, v: loss(jax.vmap(run, in_axes=(None, 0)), f, v), argnums=(0, 1))(friction, jnp.asarray(all_qvel))
    g_friction, g_qvel = jax.jit(jax.grad(lambda f, v: loss(on_devices, f, v), argnums=(0, 1)))(friction, qvel)
    g_qvel_mine = own_rows(g_qvel)

    assert np.array_equal(local, alone), np.abs(local - alone).max()
    np.testing.assert_allclose(np.asarray(g_friction.addressable_shards[0].data), g_ref[0], rtol=1e-4)
    np.testing.assert_allclose(g_qvel_mine, np.asarray(g_ref[1])[pid * LOCAL_WORLDS : (pid + 1) * LOCAL_WORLDS], rtol=1e-4, atol=1e-6)
    print(f"process {pid}: devices {jax.local_devices()} of {jax.device_count()}; its worlds bit-identical to a "
          f"run alone; d loss / d friction {float(g_friction.addressable_shards[0].data):.6g} "
          f"(one process, all worlds: {float(g_ref[0]):.6g}); ok", flush=True)  # fmt: skip


def main() -> None:
    if len(sys.argv) == 3:
        return worker(int(sys.argv[1]), int(sys.argv[2]))
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2")
    port = str(12000 + os.getpid() % 5000)
    procs = [subprocess.Popen([sys.executable, __file__, str(pid), port], env=env) for pid in range(N_PROCESSES)]
    codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        sys.exit(f"failed: exit codes {codes}")


if __name__ == "__main__":
    main()
