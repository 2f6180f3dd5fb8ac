"""Sensors: Data.sensordata against MuJoCo's (float64) at random states and along a rollout,
covering every simulated type, object kind, reference frames and cutoffs; gradients of
sensor readings match finite differences; unsupported sensors are refused by name."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from test_parity import mujoco_rollout, random_state, to_data

SCENE = """
<mujoco model="sensors">
  <option timestep="0.002" magnetic="0.1 -0.4 0.3"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <site name="anchor" pos="0 0 1.4"/>
    <body name="base" pos="0 0 1" euler="10 0 20">
      <joint name="yaw" type="hinge" axis="0 0 1" damping="0.1"/>
      <geom name="base_geom" type="box" size="0.1 0.08 0.05" euler="0 15 0" pos="0.02 0 0"/>
      <site name="imu" pos="0.05 0.02 0.03" euler="30 0 45"/>
      <body name="arm" pos="0.1 0 0">
        <joint name="shoulder" type="ball" damping="0.05"/>
        <geom name="arm_geom" type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
        <site name="tip" pos="0.3 0 0" euler="0 0 90"/>
        <body name="slider" pos="0.3 0 0">
          <joint name="extend" type="slide" axis="1 0 0"/>
          <geom type="sphere" size="0.04" pos="0.05 0 0"/>
        </body>
      </body>
    </body>
    <body name="puck" pos="0.6 0 0.5">
      <freejoint/>
      <geom name="puck_geom" type="cylinder" size="0.05 0.02" euler="20 0 0"/>
    </body>
  </worldbody>
  <tendon>
    <spatial name="cord"><site site="anchor"/><site site="tip"/></spatial>
  </tendon>
  <actuator>
    <motor name="turn" joint="yaw" gear="2"/>
    <motor name="push" joint="extend"/>
    <motor name="pull" tendon="cord"/>
  </actuator>
  <sensor>
    <jointpos joint="yaw"/>
    <jointvel joint="extend" cutoff="0.5"/>
    <ballquat joint="shoulder"/>
    <ballangvel joint="shoulder"/>
    <tendonpos tendon="cord"/>
    <tendonvel tendon="cord"/>
    <actuatorpos actuator="push"/>
    <actuatorvel actuator="turn"/>
    <actuatorfrc actuator="turn" cutoff="0.3"/>
    <jointactuatorfrc joint="yaw"/>
    <tendonactuatorfrc tendon="cord"/>
    <framepos objtype="site" objname="tip"/>
    <framepos objtype="body" objname="arm" reftype="site" refname="imu"/>
    <framequat objtype="geom" objname="puck_geom"/>
    <framequat objtype="xbody" objname="slider" reftype="body" refname="puck"/>
    <framexaxis objtype="body" objname="puck"/>
    <frameyaxis objtype="site" objname="imu" reftype="geom" refname="arm_geom"/>
    <framezaxis objtype="xbody" objname="arm"/>
    <framelinvel objtype="geom" objname="arm_geom"/>
    <framelinvel objtype="site" objname="tip" reftype="xbody" refname="puck"/>
    <frameangvel objtype="body" objname="slider"/>
    <frameangvel objtype="site" objname="tip" reftype="site" refname="imu"/>
    <subtreecom body="base"/>
    <velocimeter site="tip" cutoff="1.0"/>
    <gyro site="imu"/>
    <magnetometer site="imu"/>
    <clock/>
  </sensor>
</mujoco>
"""


def test_sensordata_matches_mujoco():
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    forward = jax.jit(jsn.forward)
    rng = np.random.default_rng(0)
    for _ in range(4):
        d = random_state(m, rng)
        d.time = rng.uniform()
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d).replace(time=jnp.asarray(d.time)))
        np.testing.assert_allclose(out.sensordata, d.sensordata, atol=1e-10, rtol=1e-10)
    assert np.any(np.abs(d.sensordata) == 0.5) or np.any(np.abs(d.sensordata) == 0.3)  # a cutoff clipped something
    # along a rollout: traj.sensordata[t] is MuJoCo's sensordata after its t-th mj_step's forward
    d = random_state(m, rng)
    data = to_data(model, d)
    ctrl = rng.normal(size=(30, m.nu))
    ref = mujoco_rollout(m, d, ctrl, lambda d: d.sensordata)
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    np.testing.assert_allclose(traj.sensordata, ref, atol=1e-8)


def test_sensor_gradients_match_finite_differences():
    """d(sensordata) / d(qpos, qvel) at a random state (gyro, frame sensors in reference frames, ...)."""
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    d = random_state(m, np.random.default_rng(1))
    data = to_data(model, d)

    def readings(x):
        out = jsn.forward(model, data.replace(qpos=x[: m.nq], qvel=x[m.nq :]))
        return out.sensordata

    x = jnp.concatenate([data.qpos, data.qvel])
    jac = jax.jit(jax.jacfwd(readings))(x)
    f = jax.jit(readings)
    for i in np.random.default_rng(2).choice(len(x), size=6, replace=False):
        e = jnp.zeros_like(x).at[i].set(1e-6)
        np.testing.assert_allclose(jac[:, i], (f(x + e) - f(x - e)) / 2e-6, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "sensor,match",
    [("<touch name='feel' site='s'/>", "sensor 'feel' of type touch"),
     ("<framepos name='cam' objtype='camera' objname='c'/>", "sensor 'cam' on a camera")],
)
def test_unsupported_sensors_are_refused_by_name(sensor, match):
    xml = ("<mujoco><worldbody><camera name='c'/><body><joint/><geom size='.1'/><site name='s'/></body></worldbody>"
           f"<sensor>{sensor}</sensor></mujoco>")
    with pytest.raises(jsn.UnsupportedFeatureError, match=match):
        jsn.load_mjcf(xml)
