"""Fluid forces (option/density, viscosity, wind): both of MuJoCo's models against MuJoCo, and
gradients w.r.t. the medium against central finite differences (float64). The swimmers are
driven by thrusters (site transmissions: a wrench in the site's frame) and by actuators on a
ball joint (3-D gear, its length the rotation vector along the gear) and on a free joint in
its parent's frame (jointinparent)."""

import importlib

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from test_parity import mujoco_rollout, qpos_qvel

# inertia-box bodies (a free box with a hinged capsule below it), the ellipsoid model on a free
# body (two geoms, one with its own coefficients) and on a ball joint (its derivative symmetrized
# by implicitfast, the free body's not); a thruster on the ellipsoid, with a velocity-dependent
# bias (implicitfast's actuator derivative goes through the site's moment)
SWIMMERS = """
<mujoco>
  <option density="1000" viscosity="0.5" wind="0.3 -0.2 0.1" integrator="implicitfast" timestep="0.005"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body pos="0 0 1" euler="10 20 30"><freejoint name="box"/><geom type="box" size="0.1 0.05 0.08" mass="1"/>
      <body pos="0.2 0 0"><joint type="hinge" axis="0 1 0" damping="0.1"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/></body>
    </body>
    <body pos="1 0 1"><freejoint/>
      <geom type="ellipsoid" size="0.1 0.05 0.03" fluidshape="ellipsoid" fluidcoef="0.5 0.25 1.5 1.0 1.0"/>
      <site name="thruster" pos="0.05 0.02 0" euler="0 30 10"/>
      <geom type="cylinder" size="0.04 0.06" pos="0 0 0.1" fluidshape="ellipsoid"/>
    </body>
    <body pos="0 1 1"><joint name="ball" type="ball"/><geom type="sphere" size="0.05" pos="0 0 -0.2" fluidshape="ellipsoid"/></body>
  </worldbody>
  <actuator>
    <general site="thruster" gear="0 0 1 0.1 0 0.2" gainprm="2" biastype="affine" biasprm="0 0 -0.5" ctrlrange="-1 1" ctrllimited="true"/>
    <general joint="ball" gear="0.3 -0.2 0.5 0 0 0" gainprm="0.1" biastype="affine" biasprm="0 -0.2 -0.01"/>
    <general jointinparent="box" gear="0.5 0 1 0.1 -0.2 0.3" gainprm="3"/>
  </actuator>
</mujoco>
"""
STEPS = 60


def test_swimmers_match_mujoco_and_medium_gradients_match_finite_differences():
    m = mujoco.MjModel.from_xml_string(SWIMMERS)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    d.qvel[:] = rng.normal(0, 2, m.nv)
    ball = m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, "ball")]
    d.qpos[ball : ball + 4] = [0.8, 0.3, -0.4, 0.33]
    d.qpos[ball : ball + 4] /= np.linalg.norm(d.qpos[ball : ball + 4])
    ctrl = rng.uniform(-1, 1, (STEPS, m.nu))
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel))

    def run(medium):
        density, viscosity, wind = medium
        opt = eqx.tree_at(lambda o: (o.density, o.viscosity, o.wind), model.opt, (density, viscosity, wind))
        _, traj = jsn.rollout(eqx.tree_at(lambda mm: mm.opt, model, opt), data, jnp.asarray(ctrl))
        return traj

    medium = (model.opt.density, model.opt.viscosity, model.opt.wind)
    traj = jax.jit(run)(medium)
    mujoco.mj_forward(m, d)
    assert np.abs(d.qfrc_fluid).max() > 1.0  # the medium matters here
    np.testing.assert_allclose(traj.qfrc_passive[0], d.qfrc_passive, rtol=0, atol=1e-12)
    d.ctrl[:] = ctrl[0]
    mujoco.mj_forward(m, d)
    np.testing.assert_allclose(traj.qfrc_actuator[0], d.qfrc_actuator, rtol=0, atol=1e-12)
    np.testing.assert_allclose(traj.actuator_velocity[0], d.actuator_velocity, rtol=0, atol=1e-12)
    np.testing.assert_allclose(traj.actuator_length[0], d.actuator_length, rtol=0, atol=1e-12)
    assert np.abs(d.qfrc_actuator).max() > 0.1
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    np.testing.assert_allclose(np.concatenate([traj.qpos, traj.qvel], axis=1), ref, rtol=0, atol=1e-11)

    def loss(medium):
        traj = run(medium)
        return jnp.sum(traj.qpos[-1, :3] ** 2) + jnp.sum(traj.qvel[-1] * jnp.arange(m.nv))

    value_and_grad = jax.jit(jax.value_and_grad(loss))  # also the differences' loss: one compiled program
    grad = value_and_grad(medium)[1]
    assert all(np.all(np.isfinite(g)) for g in grad)
    forward = lambda medium: value_and_grad(medium)[0]  # noqa: E731
    eps = 1e-6
    for k, scale in ((0, 1000.0), (1, 1.0)):
        plus, minus = list(medium), list(medium)
        plus[k], minus[k] = medium[k] + eps * scale, medium[k] - eps * scale
        fd = (forward(tuple(plus)) - forward(tuple(minus))) / (2 * eps * scale)
        np.testing.assert_allclose(grad[k], fd, rtol=1e-5)
    for i in range(3):
        e = jnp.zeros(3).at[i].set(eps)
        fd = (forward((medium[0], medium[1], medium[2] + e)) - forward((medium[0], medium[1], medium[2] - e))) / (2 * eps)
        np.testing.assert_allclose(grad[2][i], fd, rtol=1e-5)


def test_medium_parameters_are_validated():
    model = jsn.load_mjcf(SWIMMERS)
    with pytest.raises(jsn.ModelError, match="opt.viscosity: must be non-negative"):
        jsn.check_model(eqx.tree_at(lambda m: m.opt.viscosity, model, jnp.asarray(-0.1)))
    with pytest.raises(jsn.ModelError, match="opt.wind.*non-finite"):
        jsn.check_model(eqx.tree_at(lambda m: m.opt.wind, model, jnp.asarray([0.0, jnp.nan, 0.0])))


def test_gradient_at_rest_in_still_fluid_is_finite_in_float32():
    """Zero relative velocity: implicitfast differentiates the fluid force twice, and the ellipsoid
    model's floored divisions (by MINVAL = 1e-15) once made that 0/0 in float32."""
    model = jsn.load_mjcf(SWIMMERS.replace('wind="0.3 -0.2 0.1"', ""), dtype=jnp.float32)
    data = jsn.make_data(model)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(jsn.step(model, data.replace(qvel=v)).qvel ** 2)))(jnp.zeros(model.nv, jnp.float32))
    assert np.all(np.isfinite(np.asarray(grad)))


# a playing card (MuJoCo's cards.xml) and a 10-micron grain: the ellipsoid model's lift and
# drag at speeds where powers of the speed or of the sizes fall below MINVAL
SLOW_FLOW = """
<mujoco>
  <option density="1.2" viscosity="1.5e-5" integrator="implicitfast"/>
  <worldbody>
    <body euler="10 20 30"><freejoint/>
      <geom type="ellipsoid" size="1.25e-4 0.032 0.047" mass="0.002" fluidshape="ellipsoid" fluidcoef="0.5 0.25 1.5 1.0 1.0"/>
    </body>
    <body pos="1 0 0"><freejoint/>
      <geom type="ellipsoid" size="1e-5 1e-5 2e-5" fluidshape="ellipsoid" fluidcoef="1 0.5 1 2 1"/>
      <inertial pos="0 0 0" mass="1e-3" diaginertia="1e-6 1e-6 1e-6"/>
    </body>
  </worldbody>
</mujoco>
"""


def test_lift_and_drag_at_low_speed_follow_mujoco():
    """MuJoCo 4 computes the projected area and the Kutta lift without floors, and without
    either below |v| = MINVAL; a floored division (MuJoCo 3's source) is 0.3-1x off below 1e-3 m/s
    for the card and at every speed for the grain."""
    m = mujoco.MjModel.from_xml_string(SLOW_FLOW)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    rng = np.random.default_rng(3)
    qvels = []
    for speed in (1e3, 1.0, 1e-3, 1e-6, 1e-9, 1e-12, 1e-14, 1e-16, 0.0):
        qvel = np.zeros(m.nv)
        for body in range(2):
            direction = rng.normal(size=3)
            qvel[6 * body : 6 * body + 3] = speed * direction / np.linalg.norm(direction)
            qvel[6 * body + 3 : 6 * body + 6] = rng.normal(size=3) * 10.0 ** rng.uniform(-12, 0)
        qvels.append(qvel)
    data = jsn.make_data(model)
    forward = importlib.import_module("jaxsim_ncp.forward").forward
    ours = jax.jit(jax.vmap(lambda v: forward(model, data.replace(qvel=v)).qfrc_passive))(jnp.asarray(np.array(qvels)))
    for qvel, qfrc in zip(qvels, np.asarray(ours)):
        d.qvel[:] = qvel
        mujoco.mj_forward(m, d)
        for body in range(2):  # each body at its own scale
            dofs = slice(6 * body, 6 * body + 6)
            np.testing.assert_allclose(qfrc[dofs], d.qfrc_passive[dofs], rtol=0, atol=1e-12 * np.abs(d.qfrc_passive[dofs]).max())
