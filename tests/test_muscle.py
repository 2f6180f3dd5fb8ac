"""Muscle actuators (MuJoCo's <muscle>: activation dynamics, the active force-length-velocity
curve, the passive force) against MuJoCo C, and their gradients against finite differences.

The scene drives a two-link arm and a slider with muscles on spatial tendons and on a joint:
the default muscle (peak force scale / acc0 and a length range the compiler computes), one with
every curve parameter changed and smoothed activation switching, and one on a slide joint.
Random states put muscle lengths and velocities on every branch of the curves, activations
outside [0, 1] and controls outside their range."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
from test_parity import INTEGRATORS, mujoco_rollout, qpos_qvel, random_state, to_data

SCENE = """
<mujoco>
  <option timestep="0.002"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <site name="anchor_up" pos="0 0 0.15"/>
    <site name="anchor_down" pos="0 0 -0.15"/>
    <body name="upper">
      <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" mass="1"/>
      <site name="upper_bottom" pos="0.15 0 -0.04"/>
      <body name="fore" pos="0.3 0 0">
        <joint name="elbow" type="hinge" axis="0 1 0" damping="0.1"/>
        <geom type="capsule" fromto="0 0 0 0.25 0 0" size="0.025" mass="0.5"/>
        <site name="fore_top" pos="0.08 0 0.03"/>
        <site name="fore_bottom" pos="0.06 0 -0.03"/>
        <body name="slider" pos="0.25 0 0">
          <joint name="slide" type="slide" axis="1 0 0" damping="0.5"/>
          <geom type="sphere" size="0.03" mass="0.2"/>
        </body>
      </body>
    </body>
  </worldbody>
  <tendon>
    <spatial name="biceps"><site site="anchor_up"/><site site="fore_top"/></spatial>
    <spatial name="triceps"><site site="anchor_down"/><site site="upper_bottom"/><site site="fore_bottom"/></spatial>
  </tendon>
  <actuator>
    <muscle name="biceps" tendon="biceps" timeconst="0.01 0.04"/>
    <muscle name="triceps" tendon="triceps" force="30" tausmooth="0.2" range="0.7 1.1" lmin="0.4" lmax="1.7"
            vmax="2" fpmax="1.5" fvmax="1.6" lengthrange="0.2 0.5"/>
    <muscle name="slider" joint="slide" force="10" timeconst="0.02 0.05" tausmooth="0.5" lengthrange="-0.1 0.1"
            ctrlrange="0 0.8"/>
  </actuator>
</mujoco>
"""


def test_muscles_match_mujoco_and_finite_differences():
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    forward = jax.jit(jsn.forward)
    rng = np.random.default_rng(0)
    for _ in range(4):
        d = random_state(m, rng)
        d.act[:] = rng.uniform(-0.3, 1.3, size=m.na)
        d.ctrl[:] = rng.uniform(-0.3, 1.3, size=m.nu)
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d))
        for field in ("actuator_length", "actuator_velocity", "actuator_force", "act_dot", "qfrc_actuator"):
            np.testing.assert_allclose(getattr(out, field), getattr(d, field), rtol=1e-12, atol=1e-12, err_msg=field)
        np.testing.assert_allclose(out.qacc, d.qacc, rtol=1e-10, atol=1e-9)

    for integrator in ("euler", "implicitfast"):  # implicitfast also uses the muscles' velocity slope
        m.opt.integrator = INTEGRATORS[integrator]
        model = jsn.from_mujoco(m)
        d = random_state(m, rng, speed=0.5)
        d.act[:] = rng.uniform(0, 1, size=m.na)
        data = to_data(model, d)
        ctrl = rng.uniform(0, 1, size=(200, m.nu))
        ref = mujoco_rollout(m, d, ctrl, lambda d: np.concatenate([qpos_qvel(d), d.act]))
        _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
        np.testing.assert_allclose(jnp.concatenate([traj.qpos, traj.qvel, traj.act], axis=-1), ref, atol=1e-9, err_msg=integrator)

    def loss(u):
        return jnp.sum(jsn.rollout(model, data, u)[0].qpos ** 2)

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    u = jnp.asarray(ctrl[:20])
    grad = value_and_grad(u)[1]
    assert np.abs(grad).max() > 0
    for t, a in ((0, 0), (3, 1), (10, 2), (5, 1)):
        e = jnp.zeros_like(u).at[t, a].set(1e-6)
        fd = (value_and_grad(u + e)[0] - value_and_grad(u - e)[0]) / 2e-6
        np.testing.assert_allclose(grad[t, a], fd, rtol=1e-5, atol=1e-9)
