"""Gravity compensation (body/gravcomp), as a passive force and routed through actuators
(joint/actuatorgravcomp, then clamped by actuatorfrcrange), against MuJoCo (float64)."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
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
