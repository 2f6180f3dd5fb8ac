"""Tendons (fixed, spatial through sites, pulleys, wrapping around spheres and cylinders): lengths, moment arms, passive forces, armature,
tendon actuators, limits, friction loss and tendon equalities against MuJoCo (float64),
and gradients of a rollout through them against central finite differences."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from models import TENDON_WRAP, TENDONS
from test_parity import INTEGRATORS, mujoco_rollout, qpos_qvel, random_state, rel_err, to_data


def dense_ten_J(m: mujoco.MjModel, d: mujoco.MjData) -> np.ndarray:
    J = np.zeros((m.ntendon, m.nv))
    for t in range(m.ntendon):
        adr, nnz = m.ten_J_rowadr[t], m.ten_J_rownnz[t]
        J[t, m.ten_J_colind[adr : adr + nnz]] = d.ten_J[adr : adr + nnz]
    return J


@functools.cache
def compiled(integrator: str, xml: str = TENDONS):
    m = mujoco.MjModel.from_xml_string(xml)
    m.opt.integrator = INTEGRATORS[integrator]
    return m, jsn.from_mujoco(m)


def test_tendon_forward_matches_mujoco():
    m, model = compiled("euler")
    forward = jax.jit(jsn.forward)
    rng = np.random.default_rng(0)
    kinds, clamped = set(), False
    for _ in range(4):
        d = random_state(m, rng, speed=1.0)
        d.qpos[:] = 0.6 * rng.normal(size=m.nq)
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d))
        assert rel_err(out.site_xpos, d.site_xpos) < 1e-12
        assert rel_err(out.ten_length, d.ten_length) < 1e-12
        assert rel_err(out.ten_J, dense_ten_J(m, d)) < 1e-12
        assert rel_err(out.ten_velocity, d.ten_velocity) < 1e-12
        assert rel_err(out.qfrc_passive, d.qfrc_passive) < 1e-10
        full_M = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, full_M)
        assert rel_err(out.qM, full_M) < 1e-12 and rel_err(out.qfrc_bias, d.qfrc_bias) < 1e-12  # tendon armature
        assert rel_err(out.actuator_length, d.actuator_length) < 1e-12
        assert rel_err(out.actuator_velocity, d.actuator_velocity) < 1e-12
        assert rel_err(out.actuator_force, d.actuator_force) < 1e-12  # the cable's total is clamped
        assert rel_err(out.qfrc_actuator, d.qfrc_actuator) < 1e-10
        clamped |= bool(np.isclose(abs(d.actuator_force[0] + d.actuator_force[1]), [1.5, 1.2]).any())
        assert rel_err(out.qacc, d.qacc) < 1e-8
        # the rows MuJoCo made (same order: equality, friction, limits) and their forces
        mask = np.asarray(out.efc_mask)
        assert mask.sum() == d.nefc
        assert rel_err(np.asarray(out.efc_pos)[mask], d.efc_pos) < 1e-12
        assert rel_err(np.asarray(out.efc_force)[mask], d.efc_force) < 1e-6
        kinds |= {int(t) for t in d.efc_type}
    limit = int(mujoco.mjtConstraint.mjCNSTR_LIMIT_TENDON)
    assert clamped  # the cable's actuatorfrcrange scaled its two motors at some state
    assert {int(mujoco.mjtConstraint.mjCNSTR_EQUALITY), int(mujoco.mjtConstraint.mjCNSTR_FRICTION_TENDON), limit} <= kinds


@pytest.mark.parametrize("integrator", ["euler", "implicitfast"])
def test_tendon_trajectory_matches_mujoco(integrator):
    m, model = compiled(integrator)
    rng = np.random.default_rng(1)
    d = random_state(m, rng, speed=1.0)
    data = to_data(model, d)
    ctrl = rng.normal(size=(150, m.nu))
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    final, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    assert np.max(np.abs(np.concatenate([traj.qpos, traj.qvel], axis=1) - ref)) < 1e-6
    assert not bool(final.diverged)


def test_tendon_gradients_match_finite_differences():
    """d(loss)/d(tendon stiffness, damping, armature, pulley divisor, site position, qvel) of a 20-step rollout."""
    _, model = compiled("euler")
    data = jsn.make_data(model).replace(qvel=jnp.array([1.0, -0.5, 0.8, 0.1, 0.6]))
    ctrl = jnp.tile(jnp.array([0.5, 0.4, 0.2, -0.3]), (20, 1))
    where = lambda m: (m.tendon_stiffness, m.tendon_damping, m.tendon_armature, m.wrap_prm, m.site_pos)  # noqa: E731

    def loss(params, qvel):
        mdl = eqx.tree_at(where, model, params)
        final, traj = jsn.rollout(mdl, data.replace(qvel=qvel), ctrl)
        return jnp.sum(final.qpos**2) + jnp.sum(traj.ten_length**2) * 0.1

    params = where(model)
    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    _, (g_params, g_qvel) = value_and_grad(params, data.qvel)
    flat, unravel = jax.flatten_util.ravel_pytree((params, data.qvel))
    grad = jax.flatten_util.ravel_pytree((g_params, g_qvel))[0]
    f = lambda x: value_and_grad(*unravel(x))[0]  # noqa: E731  (one compiled program for both)
    rng = np.random.default_rng(2)
    for i in rng.choice(len(flat), size=8, replace=False):
        e = jnp.zeros_like(flat).at[i].set(1e-6)
        fd = (f(flat + e) - f(flat - e)) / 2e-6
        np.testing.assert_allclose(grad[i], fd, rtol=1e-4, atol=1e-7)
    assert np.all(np.isfinite(np.asarray(grad)))


def test_ncp_holds_tendon_limits_hard():
    """solver="ncp": a tendon limit is a unilateral unit like a joint limit. A motor pulls the
    cable past its upper range and the coupling tendon is flung towards its limit: both stay
    inside their ranges (to the solver's tolerance) and every step converges."""
    m = mujoco.MjModel.from_xml_string(TENDONS.replace('frictionloss="0.05"', ""))  # no dry friction in the NCP
    model = jsn.from_mujoco(m, solver="ncp", timestep=0.01)
    data = jsn.make_data(model).replace(qvel=jnp.array([3.0, -2.0, 1.0, 0.5, 2.0]))
    final, traj = jax.jit(jsn.rollout)(model, data, jnp.tile(jnp.array([1.0, 0.0, 0.0, 0.5]), (100, 1)))
    length = np.asarray(traj.ten_length)
    assert np.all(np.asarray(traj.solver_converged)) and not bool(final.diverged)
    assert length[:, 0].max() <= 0.6 + 1e-5 and length[:, 1].max() <= 0.95 + 1e-5
    assert length[:, 1].max() > 0.95 - 1e-3  # the cable does reach its limit


def test_wrapping_matches_mujoco():
    """Spheres and a cylinder, with side sites outside and inside the geoms: over random
    configurations every segment wraps or not as in MuJoCo, with its length and moment arms;
    a short trajectory (stiffness, damping, a limit and a motor on wrapped tendons) follows."""
    m, model = compiled("euler", TENDON_WRAP)
    forward = jax.jit(jsn.forward)
    rng = np.random.default_rng(3)
    wrapped_counts = set()
    for _ in range(6):
        d = random_state(m, rng, speed=1.0)
        d.qpos[:] = 0.5 * rng.normal(size=m.nq)
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d))
        assert rel_err(out.ten_length, d.ten_length) < 1e-10
        assert rel_err(out.ten_J, dense_ten_J(m, d)) < 1e-8  # inside wraps: MuJoCo 4 converges its root differently
        assert rel_err(out.qacc, d.qacc) < 1e-8
        wrapped_counts.add(tuple(d.ten_wrapnum))
    assert len(wrapped_counts) > 1  # the configurations switch segments between wrapped and straight
    d = random_state(m, rng, speed=1.0)
    data = to_data(model, d)
    ctrl = rng.normal(size=(100, m.nu))
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    assert np.max(np.abs(np.concatenate([traj.qpos, traj.qvel], axis=1) - ref)) < 1e-6


def test_wrapped_tendon_gradients_match_finite_differences():
    """d ten_length / d (qpos, wrapping radii) through sphere and cylinder wraps (inside and outside side sites)."""
    m, model = compiled("euler", TENDON_WRAP)
    qpos = jnp.asarray(np.random.default_rng(4).normal(size=m.nq) * 0.3)

    def lengths(x):
        q, size = x[: m.nq], x[m.nq :]
        mdl = eqx.tree_at(lambda mm: mm.geom_size, model, model.geom_size.at[:, 0].set(size))
        return jsn.forward(mdl, jsn.make_data(mdl).replace(qpos=q)).ten_length

    x = jnp.concatenate([qpos, model.geom_size[:, 0]])
    jac = jax.jit(jax.jacrev(lengths))(x)
    assert np.any(np.abs(np.asarray(jac)[:, m.nq + np.array([1, 3, 5])]) > 1e-3)  # the wraps depend on the radii
    f = jax.jit(lengths)
    for i in range(len(x)):
        e = jnp.zeros_like(x).at[i].set(1e-6)
        np.testing.assert_allclose(jac[:, i], (f(x + e) - f(x - e)) / 2e-6, rtol=1e-5, atol=1e-7)


SIDE_SITES_OUTSIDE = """
<mujoco>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <geom name="ball" type="sphere" size="0.1" pos="0.05 -0.02 0.03" euler="17 -29 40"/>
    <geom name="drum" type="cylinder" size="0.1 0.5" pos="0.05 -0.02 0.03" euler="17 -29 40"/>
    <body name="a" mocap="true"><site name="a"/></body>
    <body name="b" mocap="true"><site name="b"/></body>
    <body name="s" mocap="true"><site name="s"/></body>
  </worldbody>
  <tendon>
    <spatial name="on_ball"><site site="a"/><geom geom="ball" sidesite="s"/><site site="b"/></spatial>
    <spatial name="on_drum"><site site="a"/><geom geom="drum" sidesite="s"/><site site="b"/></spatial>
  </tendon>
</mujoco>
"""


def test_side_sites_outside_the_geom_follow_mujoco_4():
    """MuJoCo 4.0's side-site rule (the path winds around the geom as the polyline through the
    side site does; the older half-plane rule disagrees in about a quarter of these cases): over
    random end points (close to the surface and far) and side sites outside, in and out of the
    wrapping plane, sphere and cylinder lengths and wrap points match MuJoCo; the length's
    gradient w.r.t. the end points matches finite differences where the path wraps."""
    m = mujoco.MjModel.from_xml_string(SIDE_SITES_OUTSIDE)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    rng = np.random.default_rng(5)
    center, radius = m.geom_pos[0], 0.1

    def outside(lo, hi, n):
        v = rng.normal(size=(n, 3))
        return center + v / np.linalg.norm(v, axis=1, keepdims=True) * rng.uniform(lo, hi, size=(n, 1)) * radius

    n = 300
    mocap = np.stack([outside(1.02, 4.0, n), outside(1.02, 4.0, n), outside(1.05, 4.0, n)], axis=1)
    mocap[: n // 3, :2] = outside(1.001, 1.05, n // 3)[:, None]  # ends close to the surface (long arcs)
    mocap[: n // 3, 1] = outside(1.001, 1.05, n // 3)
    ref_len, wraps = [], 0
    for pos in mocap:
        d.mocap_pos[:] = pos
        mujoco.mj_forward(m, d)
        ref_len.append(d.ten_length.copy())
        wraps += int(np.sum(d.ten_wrapnum == 4))
    assert 0.3 * 2 * n < wraps < 0.95 * 2 * n  # both wrapped and straight paths

    def length(ends, side):
        length = jsn.forward(model, jsn.make_data(model).replace(mocap_pos=jnp.concatenate([ends, side[None]]))).ten_length
        return length, length

    # one program: the lengths and their Jacobian w.r.t. the two end points, every configuration
    jac_and_length = jax.jit(jax.vmap(jax.jacfwd(length, has_aux=True)))
    jac, ours = jac_and_length(jnp.asarray(mocap[:, :2]), jnp.asarray(mocap[:, 2]))
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref_len), rtol=0, atol=1e-10)
    eps = 1e-6
    for i in range(6):  # central differences, every end-point coordinate of every configuration at once
        step = np.zeros((n, 2, 3))
        step[:, i // 3, i % 3] = eps
        plus = np.asarray(jac_and_length(jnp.asarray(mocap[:, :2] + step), jnp.asarray(mocap[:, 2]))[1])
        minus = np.asarray(jac_and_length(jnp.asarray(mocap[:, :2] - step), jnp.asarray(mocap[:, 2]))[1])
        fd = (plus - minus) / (2 * eps)
        same_path = np.abs(plus + minus - 2 * np.asarray(ours)) < 1e-9  # no wrap switch within +-eps
        np.testing.assert_allclose(np.asarray(jac)[:, :, i // 3, i % 3][same_path], fd[same_path], atol=1e-6)


ARMATURE_ON_ROTATIONS = """
<mujoco>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <site name="w" pos="0 0 2"/>
    <body name="a" pos="0 0 1">
      <joint type="ball"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
      <site name="sa" pos="0.2 0.02 0.03"/>
      <body name="b" pos="0.3 0 0">
        <joint type="hinge" axis="0 1 0"/>
        <geom type="box" size="0.1 0.03 0.02"/>
        <site name="sb" pos="0.1 0 0.02"/>
      </body>
    </body>
    <body name="f" pos="1 0 1">
      <freejoint/>
      <geom type="box" size="0.1 0.1 0.05"/>
      <site name="sf" pos="0.05 0.05 0.05"/>
    </body>
  </worldbody>
  <tendon>
    <spatial armature="0.3"><site site="w"/><site site="sa"/><site site="sb"/></spatial>
    <spatial armature="0.7"><site site="w"/><site site="sf"/></spatial>
  </tendon>
</mujoco>
"""


def test_tendon_armature_on_ball_and_free_joints_matches_mujoco():
    """Armature's bias force a J^T (dJ/dt qvel) where the configuration moves on quaternions."""
    m = mujoco.MjModel.from_xml_string(ARMATURE_ON_ROTATIONS)
    model = jsn.from_mujoco(m)
    forward = jax.jit(jsn.forward)
    rng = np.random.default_rng(0)
    for _ in range(3):
        d = random_state(m, rng)
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d))
        full_M = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, full_M)
        assert rel_err(out.qM, full_M) < 1e-12 and rel_err(out.qfrc_bias, d.qfrc_bias) < 1e-12
        assert rel_err(out.qacc, d.qacc) < 1e-12
