"""Gravity compensation (body/gravcomp), as a passive force and routed through actuators
(joint/actuatorgravcomp, then clamped by actuatorfrcrange), and joint and tendon actuator force
limits under the implicit integrators, against MuJoCo (float64)."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
from test_gradients import check_directional
from test_parity import mujoco_rollout, qpos_qvel

ARM = """
<mujoco model="gravcomp">
  <option timestep="0.002"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="upper" pos="0 0 1" gravcomp="1">
      <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04"/>
      <body name="fore" pos="0.4 0 0" gravcomp="0.5">
        <joint name="elbow" type="hinge" axis="0 1 0" actuatorgravcomp="true" actuatorfrcrange="-0.4 0.4"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
        <body name="hand" pos="0.3 0 0" gravcomp="0.7">
          <joint name="wrist" type="ball" damping="0.05"/>
          <geom type="box" size="0.05 0.03 0.02"/>
        </body>
      </body>
    </body>
    <body name="float" pos="1 0 1" gravcomp="1">
      <freejoint/>
      <geom type="sphere" size="0.1"/>
    </body>
  </worldbody>
  <actuator>
    <motor name="elbow_motor" joint="elbow" gear="1"/>
  </actuator>
</mujoco>
"""


def test_gravcomp_matches_mujoco():
    m = mujoco.MjModel.from_xml_string(ARM)
    model = jsn.from_mujoco(m)
    rng = np.random.default_rng(0)
    d = mujoco.MjData(m)
    d.qvel[:] = rng.normal(size=m.nv)
    d.qpos[:2] = rng.normal(size=2)
    d.ctrl[:] = 0.1
    mujoco.mj_forward(m, d)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel), ctrl=jnp.asarray(d.ctrl))
    ctrl = 0.3 * rng.normal(size=(100, 1))
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    first = jsn.forward(model, data.replace(ctrl=jnp.asarray(ctrl[0])))
    np.testing.assert_allclose(np.concatenate([traj.qpos, traj.qvel], axis=1), ref, atol=1e-8)
    # the free ball floats (fully compensated) and the elbow's share shows up as actuation
    np.testing.assert_allclose(traj.qvel[-1, -6:-3], traj.qvel[0, -6:-3], atol=1e-12)
    assert abs(float(first.qfrc_actuator[1])) > 0.05 and float(first.qfrc_passive[1]) == 0.0


LIMITED = """<mujoco><option integrator="implicitfast" timestep="0.01"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body pos="0 0 1" gravcomp="1"><joint name="hinge" type="hinge" axis="0 1 0" actuatorgravcomp="true" actuatorfrcrange="-0.8 0.6"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/>
      <body pos=".3 0 0"><joint name="elbow" type="hinge" axis="0 1 0" actuatorfrcrange="-0.4 0.4"/>
        <geom type="capsule" fromto="0 0 0 .2 0 0" size=".02"/></body></body>
    <body pos="0 1 0"><joint name="slide" type="slide" axis="1 0 0"/><geom size=".05"/></body>
  </worldbody>
  <tendon><fixed name="cable" actuatorfrcrange="-0.3 0.5"><joint joint="slide" coef="1"/></fixed>
    <fixed name="twist"><joint joint="elbow" coef="2"/></fixed></tendon>
  <actuator>
    <velocity joint="hinge" kv="2"/><position jointinparent="elbow" kp="3" kv="0.5"/><velocity tendon="twist" kv="0.3"/>
    <velocity tendon="cable" kv="4" forcerange="-0.2 0.2"/><velocity tendon="cable" kv="1"/>
  </actuator></mujoco>"""


def test_saturated_actuators_add_no_implicit_damping():
    """MuJoCo 4: an actuator saturated by its joint's actuatorfrcrange (the joint's total with the
    actuator-level gravity compensation, at or beyond the range) or its tendon's (the total within 1e-10
    of a bound) adds no velocity derivative to implicitfast's M - h D; actuators through a tendon on a
    limited joint count towards its total but keep theirs. 200 steps of switching controls (the hinge
    saturated in 130, the cable in 23) to round-off of MuJoCo (1.9 off in qvel with the derivative kept);
    the rollout's gradient w.r.t. the controls against central differences."""
    m = mujoco.MjModel.from_xml_string(LIMITED)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    rng = np.random.default_rng(0)
    ctrl = jnp.asarray(np.repeat(rng.uniform(-1, 1, size=(10, m.nu)) * [1.0, 0.6, 2.0, 0.3, 0.5], 20, axis=0))
    weights = jnp.asarray(rng.normal(size=m.nq + m.nv))

    def loss(u):
        final, traj = jsn.rollout(model, data, u)
        return jnp.dot(weights, jnp.concatenate([final.qpos, final.qvel])), traj

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (_, traj), _ = value_and_grad(ctrl)
    ref = mujoco_rollout(m, mujoco.MjData(m), np.asarray(ctrl), qpos_qvel)
    np.testing.assert_allclose(np.concatenate([traj.qpos, traj.qvel], axis=1), ref, rtol=0, atol=1e-12)
    hinge = np.asarray(traj.qfrc_actuator[:, 0])
    assert np.sum((hinge >= 0.6) | (hinge <= -0.8)) > 50  # the hinge's limit binds
    check_directional(None, ctrl, np.random.default_rng(1), n_dirs=2, rtol=1e-5,
                      value_and_grad=lambda u: (lambda out: (out[0][0], out[1]))(value_and_grad(u)))  # fmt: skip
