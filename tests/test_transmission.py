"""Site transmissions measured from a reference site (`refsite`): actuator length, velocity and
force, and the dynamics they drive, against MuJoCo; the gradient through them against finite
differences. Covers a translational and a rotational gear on a chain whose sites share ancestor
dofs (MuJoCo clears those Jacobian columns), a free body against a world site, and a 6-D gear.
Body transmissions (adhesion): their moments from the body's contacts; slider-cranks: against MuJoCo."""

import importlib

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp import actuation, smooth
from test_gradients import check_directional
from test_parity import mujoco_rollout, qpos_qvel, random_state, to_data

SCENE = """
<mujoco>
  <option timestep="0.002"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <site name="world_ref" pos="0.1 0.2 0.3" euler="10 20 30"/>
    <body name="base" pos="0 0 1">
      <joint name="yaw" type="hinge" axis="0 0 1"/>
      <geom type="box" size="0.1 0.1 0.05"/>
      <site name="base_ref" pos="0.05 0 0" euler="0 30 0"/>
      <body name="arm" pos="0.1 0 0">
        <joint name="pitch" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
        <body name="hand" pos="0.3 0 0">
          <joint type="ball"/>
          <geom type="sphere" size="0.05"/>
          <site name="tip" pos="0.05 0.01 0" euler="20 0 40"/>
        </body>
      </body>
    </body>
    <body name="drone" pos="1 0 1" euler="5 10 15">
      <freejoint/>
      <geom type="box" size="0.1 0.1 0.02"/>
      <site name="drone_site" pos="0.02 0 0.01" euler="0 0 10"/>
    </body>
  </worldbody>
  <actuator>
    <position name="reach" site="tip" refsite="base_ref" gear="1 0.5 -0.3 0 0 0" kp="50"/>
    <general name="twist" site="tip" refsite="base_ref" gear="0 0 0 0.2 1 -0.5" gainprm="3" biasprm="0 -2 -0.1" biastype="affine"/>
    <general name="fly" site="drone_site" refsite="world_ref" gear="0.3 -1 2 0.1 0.2 0.3" gainprm="2" biasprm="0 -1 -0.5" biastype="affine"/>
    <motor name="both" site="tip" refsite="world_ref" gear="1 1 1 1 1 1"/>
  </actuator>
</mujoco>
"""


def test_refsite_transmissions_match_mujoco_and_finite_differences():
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    assert model.topology.actuator_refsite_shared_dofs == ((0,), (0,), (), ())  # the yaw turns tip and base_ref alike
    forward = jax.jit(jsn.forward)
    rng = np.random.default_rng(0)
    for _ in range(3):
        d = random_state(m, rng)
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d))
        for field in ("actuator_length", "actuator_velocity", "qfrc_actuator"):
            np.testing.assert_allclose(getattr(out, field), getattr(d, field), atol=1e-12, err_msg=field)
        np.testing.assert_allclose(out.qacc, d.qacc, rtol=1e-10, atol=1e-9)
    d = random_state(m, rng, speed=0.5)
    data = to_data(model, d)
    ctrl = 0.5 * rng.normal(size=(100, m.nu))
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    rollout = jax.jit(jsn.rollout)
    _, traj = rollout(model, data, jnp.asarray(ctrl))
    np.testing.assert_allclose(jnp.concatenate([traj.qpos, traj.qvel], axis=-1), ref, atol=1e-9)

    def loss(u):
        return jnp.sum(jsn.rollout(model, data, u)[0].qpos ** 2)

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    u = jnp.asarray(ctrl[:20])
    grad = value_and_grad(u)[1]
    for t, a in ((0, 0), (3, 1), (10, 2), (5, 3)):
        e = jnp.zeros_like(u).at[t, a].set(1e-6)
        fd = (value_and_grad(u + e)[0] - value_and_grad(u - e)[0]) / 2e-6
        np.testing.assert_allclose(grad[t, a], fd, rtol=1e-5, atol=1e-8)


ADHESION = """<mujoco><option timestep="0.002"/>
  <worldbody><geom type="plane" size="2 2 .1"/>
    <body name="ceiling" pos="0 0 0.6"><geom type="box" size="0.3 0.3 0.02"/></body>
    <body pos="0 0 0.3"><joint name="lift" type="slide" axis="0 0 1" damping="5"/><geom type="capsule" fromto="0 0 0 0 0 0.2" size="0.02"/>
      <body name="pad" pos="0 0 0.24"><joint type="hinge" axis="0 1 0" damping="0.05"/>
        <geom type="box" size="0.05 0.05 0.02" gap="0.02"/><geom type="sphere" size="0.02" pos="0.04 0 0.02" gap="0.01"/></body></body>
    <body name="brick" pos="0.5 0 0.04"><freejoint/><geom type="box" size="0.06 0.04 0.03" gap="0.015" euler="0 3 0"/></body>
  </worldbody>
  <actuator><adhesion body="pad" ctrlrange="0 1" gain="20"/><adhesion body="brick" ctrlrange="0 1" gain="4"/>
    <motor joint="lift" ctrlrange="-20 20"/></actuator></mujoco>"""


def test_adhesion_body_transmission_matches_mujoco_and_finite_differences():
    """mjTRN_BODY (adhesion): moment = minus the mean normal Jacobian of the body's contacts, those
    in the gap (no constraint rows) included. A pad lifted to a ceiling and a brick on the floor,
    with gaps: qfrc_actuator and actuator_velocity at 30 states of MuJoCo's trajectory (in-gap
    contacts only, mixed, all active); the gradient of qfrc_actuator against finite differences."""
    m = mujoco.MjModel.from_xml_string(ADHESION)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    states, ref, exclude = [], [], set()
    for t in range(300):
        d.ctrl[:] = [1.0, 0.7, 8.0 if t < 150 else -3.0]
        mujoco.mj_step(m, d)
        if t % 10 == 9:
            mujoco.mj_forward(m, d)
            states.append((d.qpos.copy(), d.qvel.copy(), d.ctrl.copy()))
            ref.append((d.qfrc_actuator.copy(), d.actuator_velocity.copy()))
            exclude |= {int(c.exclude) for c in d.contact[: d.ncon]}
    assert exclude == {0, 1}  # active contacts and contacts in the gap both occur
    forward = importlib.import_module("jaxsim_ncp.forward").forward
    data = jsn.make_data(model)
    qpos, qvel, ctrl = (jnp.asarray(np.array(x)) for x in zip(*states))
    out = jax.jit(jax.vmap(lambda q, v, u: forward(model, data.replace(qpos=q, qvel=v, ctrl=u))))(qpos, qvel, ctrl)
    for s, (qfrc, velocity) in enumerate(ref):
        np.testing.assert_allclose(out.qfrc_actuator[s], qfrc, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out.actuator_velocity[s], velocity, rtol=0, atol=1e-12)
    assert float(jnp.min(out.qfrc_actuator[:, 0])) > 15  # the pad's pull on the lift is there

    weights = jnp.asarray(np.random.default_rng(0).normal(size=m.nv))
    at = data.replace(qpos=qpos[5], qvel=qvel[5], ctrl=ctrl[5])
    check_directional(lambda q: weights @ forward(model, at.replace(qpos=q)).qfrc_actuator, at.qpos, np.random.default_rng(1))
    with pytest.raises(jsn.UnsupportedFeatureError, match="mjTRN_BODY.*solver='ncp'"):
        jsn.from_mujoco(m, solver="ncp")


SLIDER_CRANK = """<mujoco><option timestep="0.002"/><default><geom contype="0" conaffinity="0"/>
    <position ctrllimited="true" ctrlrange="-.1 .1" kp="30"/></default>
  <worldbody>
    <site name="slider" pos="0 -.1 0" zaxis="1 .5 0"/>
    <body><joint damping=".1"/><geom type="capsule" size=".01" fromto="0 0 0 .2 0 0"/>
      <site name="crank" pos=".1 0 0"/><site name="crank2" pos=".2 0 0"/>
      <body pos=".15 0 0"><joint damping=".1"/><geom type="capsule" size=".01" fromto="0 -.15 0 0 0 0"/>
        <site name="slider2" pos=".02 -.1 0" zaxis="1 2 0"/></body></body>
    <site name="slider3" pos="0 .1 0" zaxis="1 .2 0"/>
    <body pos="0 .2 0"><joint damping=".1"/><geom type="capsule" size=".01" fromto="0 0 0 .15 0 0"/><site name="crank3" pos=".1 0 0"/></body>
  </worldbody>
  <actuator><position cranksite="crank" slidersite="slider" cranklength=".08"/>
    <position cranksite="crank2" slidersite="slider2" cranklength=".06" gear="2"/>
    <position cranksite="crank3" slidersite="slider3" cranklength=".05"/></actuator></mujoco>"""


def test_slider_crank_matches_mujoco():
    """mjTRN_SLIDERCRANK (MuJoCo's slider_crank.xml: a slider on the parent, one on the child, and a
    rod too short to reach, whose length falls back to a.v): lengths and moments at the start
    (moments against central differences of our lengths), 300 steps of random controls against
    MuJoCo."""
    m = mujoco.MjModel.from_xml_string(SLIDER_CRANK)
    model = jsn.from_mujoco(m)
    rng = np.random.default_rng(4)
    d = random_state(m, rng, speed=1.0)
    mujoco.mj_forward(m, d)
    frames = lambda q: smooth.com_pos(model, smooth.kinematics(model, jsn.make_data(model).replace(qpos=q)))  # noqa: E731
    transmission = jax.jit(lambda q: actuation.transmission(model, frames(q)))
    length, moment = transmission(jnp.asarray(d.qpos))
    np.testing.assert_allclose(length, d.actuator_length, rtol=0, atol=1e-14)
    dense = np.zeros((m.nu, m.nv))
    mujoco.mju_sparse2dense(dense, d.actuator_moment, d.moment_rownnz, d.moment_rowadr, d.moment_colind)
    np.testing.assert_allclose(moment, dense, rtol=0, atol=1e-14)
    step = 1e-6 * rng.normal(size=m.nq)
    fd = (transmission(jnp.asarray(d.qpos + step))[0] - transmission(jnp.asarray(d.qpos - step))[0]) / 2
    np.testing.assert_allclose(fd, moment @ step, rtol=1e-6, atol=1e-13)
    ctrl = rng.uniform(-0.1, 0.1, size=(300, m.nu))
    data = to_data(model, d)
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    np.testing.assert_allclose(np.concatenate([traj.qpos, traj.qvel], axis=1), ref, rtol=0, atol=1e-9)
