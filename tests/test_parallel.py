"""Batches of worlds split over devices (`jsn.batched`), on 4 CPU devices
(`JAX_NUM_CPU_DEVICES=4`, kept by `jsn.use_cpu_cores`, in a child process: the suite's own process
has one).

Checked (Newton solver): a batch that does not divide over the devices; each device's worlds are
bit-identical to the same slice run on one device, and to the same call again; a bad world is
flagged without touching the others; a device's worlds in tiles are each bit-identical to running
alone; gradients (through the tiles) with respect to batched inputs and to a parameter all worlds
share match central finite differences; a donated state's buffers are reused."""

import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.extend
import jax.numpy as jnp
import mujoco
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp.workflows import mjx_limits

CHILD = textwrap.dedent(
    """
    import equinox as eqx, jax, jax.numpy as jnp, numpy as np
    import jaxsim_ncp as jsn

    assert jsn.use_cpu_cores() == 4  # the count JAX_NUM_CPU_DEVICES chose is kept, not one per core
    assert jsn.use_cpu_cores(4) == 4  # before JAX starts: set again
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 4, jax.devices()
    model = jsn.load_mjcf('''<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="2 2 .1"/>
      <body pos="0 0 .12"><freejoint/><geom type="sphere" size=".1" mass="1"/></body>
      <body pos=".4 0 .3"><freejoint/><geom type="box" size=".08 .08 .08" mass=".5"/></body></worldbody></mujoco>''')
    data = jsn.make_data(model)
    T, rng = 8, np.random.default_rng(0)

    def run(friction, qvel):
        m = eqx.tree_at(lambda m: m.geom_friction, model, model.geom_friction.at[:, 0].set(friction))
        final, traj = jsn.rollout(m, data.replace(qvel=qvel), jnp.zeros((T, 0)))
        return final.qpos, traj.qvel, final.diverged, final.warning

    qvel = jnp.asarray(rng.normal(size=(6, model.nv)))
    clean_world_3 = qvel[3]
    qvel = qvel.at[3, 0].set(jnp.nan)  # a bad world, flagged and frozen without touching the others
    friction = jnp.asarray(0.7)
    mesh = jax.make_mesh((4,), ("worlds",))  # explicit axes (JAX's default); `advance` below: jsn.world_mesh()
    on_devices = jsn.batched(run, mesh, in_axes=(None, 0))
    qpos, traj_qvel, diverged, warning = out = on_devices(friction, qvel)
    assert qpos.shape == (6, model.nq) and list(np.asarray(diverged)) == [False, False, False, True, False, False]
    assert np.all(np.isfinite(np.asarray(qpos))) and np.all(np.asarray(warning)[[0, 1, 2, 4, 5]] == 0)
    # 6 worlds over 4 devices (padded to 8): each device's worlds are bit-identical to its slice
    # run on one device, the bad world's neighbour to a run next to a clean world
    one_device = jax.jit(jax.vmap(run, in_axes=(None, 0)))
    for k in range(3):
        for a, b in zip(out, one_device(friction, qvel[2 * k : 2 * k + 2])):
            np.testing.assert_array_equal(a[2 * k : 2 * k + 2], b)
    for a, b in zip(out, on_devices(friction, qvel)):  # and again: the same bits
        np.testing.assert_array_equal(a, b)
    clean = one_device(friction, qvel[2:4].at[1].set(clean_world_3))
    for a, b in zip(out, clean):
        np.testing.assert_array_equal(a[2], b[0])
    assert not clean[2][1]

    # a device's worlds in tiles (lax.map) of one: each world as it runs alone (vmapped)
    tiled = jsn.batched(run, mesh, in_axes=(None, 0), tile=1)
    for a, b in zip(tiled(friction, qvel), zip(*(one_device(friction, qvel[k : k + 1]) for k in range(6)))):
        np.testing.assert_array_equal(a, np.concatenate(b))

    # gradients (through the tiles): per-world velocities (batched) and the shared friction (summed
    # over the worlds)
    def loss(friction, qvel):
        qpos, traj_qvel, _, _ = tiled(friction, qvel)
        return jnp.sum(qpos[:, :3] ** 2) + jnp.sum(traj_qvel[:, :, :3] ** 2)

    qvel = qvel.at[3].set(clean_world_3)
    g_friction, g_qvel = jax.jit(jax.grad(loss, argnums=(0, 1)))(friction, qvel)
    assert g_friction.shape == () and g_qvel.shape == qvel.shape
    direction = jnp.asarray(rng.normal(size=qvel.shape))
    fd = [float(loss(friction + e, qvel + e * direction)) for e in (1e-6, -1e-6)]
    np.testing.assert_allclose((fd[0] - fd[1]) / 2e-6, g_friction + jnp.sum(g_qvel * direction), rtol=1e-6)
    fd = [float(loss(friction + e, qvel)) for e in (1e-6, -1e-6)]  # the shared parameter alone
    np.testing.assert_allclose((fd[0] - fd[1]) / 2e-6, g_friction, rtol=1e-6)

    # a simulation carried from call to call: a donated state's buffers are reused
    advance = jsn.batched(lambda d: jsn.rollout(model, d, jnp.zeros((T, 0)))[0], donate_argnums=0)
    state = advance(jax.vmap(lambda v: data.replace(qvel=v))(qvel[:4]))  # now on the devices
    after = advance(state)
    assert state.qpos.is_deleted() and not after.qpos.is_deleted()
    print("ok")
    """
)


def test_batches_split_over_four_devices_match_one_device_and_finite_differences():
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="4")  # with the suite's XLA flags (conftest)
    result = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-4000:]


def test_bad_batches_are_refused_with_the_cause():
    # the CPU device count is fixed once JAX has started (this process: one device)
    assert len(jax.devices("cpu")) == 1 and jsn.use_cpu_cores(1) == 1
    assert 1 <= jsn.parallel.usable_cores() <= os.cpu_count()
    with pytest.raises(RuntimeError, match=r"use_cpu_cores\(2\): JAX's CPU backend already started with 1 device"):
        jsn.use_cpu_cores(2)
    with pytest.raises(ValueError, match="count >= 1, got 0"):
        jsn.use_cpu_cores(0)
    with pytest.raises(ValueError, match="tile must be a count of worlds >= 0, got -1"):
        jsn.batched(lambda x: x, tile=-1)
    with pytest.raises(ValueError, match="no axis 'worlds'"):
        jsn.batched(lambda x: x, jsn.world_mesh(axis="batch"))
    with pytest.raises(ValueError, match="in_axes must be 0 or None"):
        jsn.batched(lambda x: x, in_axes=1)(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"one leading size \(the number of worlds\), got \[2, 3\]"):
        jsn.batched(lambda x, y: x + y.sum())(jnp.zeros(2), jnp.zeros((3, 1)))


def _scan_lengths(jaxpr) -> list[int]:
    """Lengths of every scan (a `lax.map` of tiles) in a jaxpr, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn.params["length"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _scan_lengths(sub)
    return found


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="tiles are for CPU devices")
def test_cpu_tiles_are_sized_by_a_worlds_state():
    tile, budget = jsn.parallel.CPU_TILE, jsn.parallel.CPU_TILE_BYTES
    assert jsn.parallel.cpu_tile(1) == tile and jsn.parallel.cpu_tile(budget // 16) == 16
    assert jsn.parallel.cpu_tile(budget // 16 + 1) == 8 and jsn.parallel.cpu_tile(10 * budget) == 1
    # the humanoid's worlds keep the largest tile, four humanoids' (624 kB each in float32) get 16
    mjx_data = pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data" / "humanoid"
    for name, expected in (("humanoid.xml", tile), ("04_humanoids.xml", 16)):
        mj = mujoco.MjModel.from_xml_path(str(mjx_data / name))
        model = jsn.from_mujoco(mj, dtype=jnp.float32, **mjx_limits(mj))
        assert jsn.tile_for(model) == expected, name
    assert jsn.tile_for(model, jsn.parallel.world_mesh(jax.devices("cpu"))) == 16  # a mesh's own platform
    # by default a CPU device sizes its tiles by the batched arguments: 16 worlds of budget / 4 bytes
    # each run as 4 tiles of 4; a shared argument does not count
    run = jsn.batched(lambda x, shared: x * shared, in_axes=(0, None))
    worlds = jax.ShapeDtypeStruct((16, budget // 16), jnp.float32)
    assert _scan_lengths(jax.make_jaxpr(run)(worlds, jnp.zeros(budget // 16, jnp.float32)).jaxpr) == [4]
    assert _scan_lengths(jax.make_jaxpr(jsn.batched(lambda x: 2 * x, tile=0))(worlds).jaxpr) == []
    assert jsn.batched(lambda x: 2 * x)(jnp.zeros((0, 3))).shape == (0, 3)  # no worlds: no tiles
