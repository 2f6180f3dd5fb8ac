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


CONTACT_SCENE = """
<mujoco model="acceleration-stage sensors">
  <option timestep="0.002" cone="{cone}"/>
  <worldbody>
    <geom type="plane" size="5 5 .1"/>
    <site name="world_site" pos="0 0 1"/>
    <body name="box" pos="0 0 0.11" euler="3 2 10">
      <freejoint/>
      <geom type="box" size="0.1 0.07 0.1"/>
      <site name="box_corner" type="box" pos="0.1 0.07 -0.1" size="0.03 0.03 0.03"/>
      <site name="box_imu" pos="0.02 0.01 0" euler="10 20 30"/>
    </body>
    <body name="ball" pos="0.5 0 0.1">
      <freejoint/>
      <geom type="sphere" size="0.1" condim="6"/>
      <site name="ball_zone" type="sphere" size="0.12"/>
    </body>
    <body name="rod" pos="-0.5 0 0.05" euler="0 90 0">
      <freejoint/>
      <geom type="capsule" size="0.04 0.2" condim="1"/>
      <site name="rod_end" type="capsule" pos="0 0 0.2" size="0.05 0.03"/>
      <site name="rod_half" type="cylinder" pos="0 0 0.1" size="0.05 0.12"/>
      <site name="rod_ellipsoid" type="ellipsoid" pos="0 0 -0.15" size="0.05 0.06 0.08"/>
    </body>
    <body name="arm" pos="0 1 1">
      <joint name="hinge" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
      <site name="arm_site" pos="0.15 0.01 0" euler="0 30 0"/>
      <body name="forearm" pos="0.3 0 0">
        <joint type="ball"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.025"/>
        <site name="forearm_site" pos="0.1 0 0.02"/>
        <body name="hand" pos="0.3 0 0">
          <joint type="slide" axis="1 0 0"/>
          <geom type="sphere" size="0.04"/>
          <site name="hand_site"/>
        </body>
      </body>
    </body>
    <body name="link" pos="1 1 1">
      <joint type="ball"/>
      <geom type="box" size="0.05 0.05 0.2" pos="0 0 -0.2"/>
      <site name="link_site" pos="0 0 -0.1"/>
    </body>
    <body name="mocap" mocap="true" pos="2 2 1" euler="10 0 0"><site name="mocap_site"/></body>
    <body name="welded" pos="1.3 1 1">
      <freejoint/>
      <geom type="box" size="0.05 0.05 0.05"/>
      <site name="welded_site" euler="5 5 5"/>
    </body>
    <body name="tag" pos="1.4 1 1.1">
      <freejoint/>
      <geom type="sphere" size="0.03" contype="0" conaffinity="0"/>
      <site name="tag_site" pos="0.02 0 0" euler="0 20 10"/>
    </body>
  </worldbody>
  <equality>
    <connect body1="link" body2="world" anchor="0 0 -0.4"/>
    <weld body1="welded" body2="link" relpose="0.3 0 0 1 0 0 0"/>
    <weld site1="tag_site" site2="welded_site" torquescale="0.5"/>
  </equality>
  <actuator><motor joint="hinge"/></actuator>
  <sensor>
    <touch site="box_corner"/>
    <touch site="ball_zone"/>
    <touch site="rod_end"/>
    <touch site="rod_half"/>
    <touch site="rod_ellipsoid"/>
    <accelerometer site="box_imu"/>
    <accelerometer site="forearm_site"/>
    <accelerometer site="world_site"/>
    <accelerometer site="mocap_site"/>
    <force site="arm_site"/>
    <torque site="arm_site"/>
    <force site="hand_site"/>
    <torque site="forearm_site"/>
    <force site="link_site"/>
    <torque site="welded_site"/>
    <force site="tag_site"/>
    <torque site="tag_site"/>
    <force site="box_imu"/>
    <framelinacc objtype="site" objname="hand_site"/>
    <frameangacc objtype="body" objname="forearm"/>
    <framelinacc objtype="xbody" objname="ball"/>
    <frameangacc objtype="site" objname="world_site"/>
    <subtreelinvel body="arm"/>
    <subtreeangmom body="arm"/>
    <subtreeangmom body="world"/>
    <subtreelinvel body="box"/>
    <contact name="all" num="8" data="found force torque dist pos normal tangent"/>
    <contact name="ball_first" body1="ball" num="2" data="found force torque normal tangent linvel angvel" reduce="maxforce"/>
    <contact name="box_second" subtree2="box" num="3" data="found force dist linvel angvel" reduce="mindist"/>
    <contact name="corner" site="box_corner" num="2" data="found force pos normal"/>
    <contact name="rod_net" body1="rod" reduce="netforce" data="found force torque dist pos normal tangent"/>
  </sensor>
</mujoco>
"""


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_acceleration_stage_sensors_match_mujoco(cone):
    """Touch (zones of every shape), accelerometer, force, torque, frame accelerations, subtree
    momenta and contact sensors (every reduction, flipped directions, site zones, velocities) along
    a contact rollout with connect/weld constraints and applied wrenches: they read the contact and
    constraint forces, so this checks their decoding (pyramid edges, frames, the weld's torque)
    against MuJoCo."""
    m = mujoco.MjModel.from_xml_string(CONTACT_SCENE.format(cone=cone))
    model = jsn.from_mujoco(m)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    d.qvel[:] = 0.3 * rng.normal(size=m.nv)
    d.xfrc_applied[2] = [1, 2, 3, 0.1, 0.2, 0.3]  # on the ball and on the forearm
    d.xfrc_applied[5] = [0, 1, -3, 0.1, 0, 0.3]
    data = to_data(model, d).replace(xfrc_applied=jnp.asarray(d.xfrc_applied))
    ctrl = np.sin(0.1 * np.arange(100))[:, None]
    ref = mujoco_rollout(m, d, ctrl, lambda d: d.sensordata)
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    scale = np.maximum(1.0, np.abs(ref))
    np.testing.assert_array_less(np.abs(np.asarray(traj.sensordata) - ref) / scale, 1e-9)
    felt = np.count_nonzero(ref[:, :5], axis=0)  # steps in which each touch zone reads a force
    assert np.all(felt > 10) and np.any(felt < 60)  # every zone is exercised, and some only part of the time
    found = ref[:, [m.sensor_adr[i] for i in range(m.nsensor) if m.sensor_type[i] == mujoco.mjtSensor.mjSENS_CONTACT]]
    assert np.all(np.sum(found > 0, axis=0) > 40) and found.max() >= 7  # every contact sensor matches, "all" up to 7
    if cone == "pyramidal":  # gradients through the contact solve: d(readings . w) / d(qvel) against central differences
        state = jax.tree.map(lambda x: x[60], traj)
        weights = jnp.asarray(np.random.default_rng(1).normal(size=m.nsensordata))
        loss = jax.jit(jax.value_and_grad(lambda v: jsn.forward(model, state.replace(qvel=v)).sensordata @ weights))
        grad = loss(state.qvel)[1]
        for i in (0, 4, 8, 15, 20):
            e = jnp.zeros(m.nv).at[i].set(1e-6)
            fd = (loss(state.qvel + e)[0] - loss(state.qvel - e)[0]) / 2e-6
            np.testing.assert_allclose(grad[i], fd, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "sensor,match",
    [("<rangefinder name='lidar' camera='c'/>", "sensor 'lidar': a rangefinder on a camera"),
     ("<user name='custom' dim='2'/>", "sensor 'custom' of type user"),
     ("<framepos name='cam' objtype='camera' objname='c'/>", "sensor 'cam' on a camera")],
)
def test_unsupported_sensors_are_refused_by_name(sensor, match):
    xml = ("<mujoco><worldbody><camera name='c' resolution='4 3'/><body><joint name='j' limited='true' range='-1 1'/>"
           "<geom name='g' size='.1'/><site name='s'/></body></worldbody>"
           f"<sensor>{sensor}</sensor></mujoco>")
    with pytest.raises(jsn.UnsupportedFeatureError, match=match):
        jsn.load_mjcf(xml)


LIMITS_ENERGY_ZONES = """<mujoco><option timestep="0.002"/>
<worldbody><geom type="plane" size="5 5 .1"/>
<site name="zone_box" type="box" size=".4 .3 .5" pos="0 0 .5" euler="10 20 30"/>
<site name="zone_cap" type="capsule" size=".3 .4" pos=".5 0 .8"/>
<site name="zone_sph" type="sphere" size=".6" pos="0 .3 1"/>
<site name="zone_ell" type="ellipsoid" size=".6 .3 .4" pos=".2 .1 .9"/>
<site name="zone_cyl" type="cylinder" size=".08 .3" pos="0 0 .6"/>
<body name="arm" pos="0 0 1"><joint name="j1" type="hinge" axis="0 1 0" range="-30 40" stiffness="3" springref="10" margin="0.05"/>
 <geom type="capsule" fromto="0 0 0 .4 0 0" size=".04"/><site name="tip" pos=".4 0 0"/>
 <body pos=".4 0 0"><joint name="j2" type="slide" axis="1 0 0" range="-.1 .1" stiffness="20"/><geom type="sphere" size=".05"/>
 </body></body>
<body name="massless" pos="-.2 0 .6"><body pos=".1 0 0"><joint name="j3" type="hinge" axis="0 0 1"/><geom size=".03" pos=".1 0 0"/></body></body>
<body name="ball" pos=".3 .2 1.2"><freejoint/><geom name="g" type="box" size=".05 .05 .05"/></body>
<body name="bj" pos="-.5 0 1"><joint type="ball" stiffness="2"/><geom type="capsule" fromto="0 0 0 0 0 -.3" size=".03"/></body>
</worldbody>
<tendon><fixed name="t" limited="true" range="-.3 .2" stiffness="5" springlength="-.05 .05"><joint joint="j1" coef="1"/><joint joint="j2" coef="2"/></fixed></tendon>
<sensor><e_potential/><e_kinetic/>
<jointlimitpos joint="j1"/><jointlimitvel joint="j1"/><jointlimitfrc joint="j1"/><jointlimitpos joint="j2"/><jointlimitfrc joint="j2"/>
<tendonlimitpos tendon="t"/><tendonlimitvel tendon="t"/><tendonlimitfrc tendon="t"/>
<insidesite site="zone_box" objtype="site" objname="tip"/><insidesite site="zone_cap" objtype="body" objname="ball"/>
<insidesite site="zone_sph" objtype="xbody" objname="ball"/><insidesite site="zone_ell" objtype="geom" objname="g"/>
<insidesite site="zone_cyl" objtype="body" objname="massless"/>
</sensor></mujoco>"""


def test_limit_energy_and_inside_site_sensors_match_mujoco():
    """Joint and tendon limit distance/velocity/force (the first active limit row), potential
    (gravity, joint springs on hinge/slide/ball, a tendon spring beyond its deadband) and kinetic
    energy, and inside-site flags for every zone shape (a massless static body reads its subtree
    com); the readings' Jacobian w.r.t. the state against finite differences."""
    m = mujoco.MjModel.from_xml_string(LIMITS_ENERGY_ZONES)
    model = jsn.from_mujoco(m)

    def readings(state, data):
        sensordata = jsn.forward(model, data.replace(qpos=state[: m.nq], qvel=state[m.nq :])).sensordata
        return sensordata[:10], sensordata  # (energies and limit readings, all)

    jacobian_and_readings = jax.jit(jax.jacrev(readings, has_aux=True))  # one compiled program for all checks
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(30):
        d = random_state(m, rng)
        d.qpos[:2] = rng.uniform(-1, 1, 2) * [1, 0.2]  # past the joints' limits at times
        d.qpos[3:6] = rng.uniform([-0.2, -0.3, 0.6], [0.7, 0.4, 1.4])  # the free box around the zones
        mujoco.mj_forward(m, d)
        data = to_data(model, d)
        state = jnp.concatenate([data.qpos, data.qvel])
        jac, out = jacobian_and_readings(state, data)
        np.testing.assert_allclose(out, d.sensordata, rtol=1e-10, atol=1e-10)
        seen.append(d.sensordata.copy())
    seen = np.array(seen)
    assert np.all(np.any(seen[:, 2:10] != 0, axis=0))  # every limit reading was active at some state
    assert np.all(np.any(seen[:, 10:] == 1, axis=0)) and np.all(np.any(seen[:, 10:] == 0, axis=0))

    for i in range(len(state)):
        e = jnp.zeros_like(state).at[i].set(1e-6)
        fd = (jacobian_and_readings(state + e, data)[1][:10] - jacobian_and_readings(state - e, data)[1][:10]) / 2e-6
        np.testing.assert_allclose(jac[:, i], fd, rtol=1e-6, atol=1e-6)


DISTANCES = """<mujoco><option ccd_tolerance="1e-12" ccd_iterations="1000"/>
<asset><mesh name="tet" vertex="0 0 0  .2 0 0  0 .2 0  0 0 .2"/></asset>
<default><geom contype="0" conaffinity="0"/></default>
<worldbody><geom name="floor" type="plane" size="3 3 .1"/>
<body name="A" pos="0 0 .5"><freejoint/><geom name="a_sph" type="sphere" size=".1"/><geom name="a_box" type="box" size=".1 .05 .08" pos=".15 0 0"/></body>
<body name="B" pos=".3 .2 .6"><freejoint/><geom name="b_cap" type="capsule" size=".05 .1"/><geom name="b_cyl" type="cylinder" size=".06 .08" pos="0 .2 0"/></body>
<body name="C" pos="-.3 .1 .4"><freejoint/><geom name="c_ell" type="ellipsoid" size=".1 .06 .04"/><geom name="c_mesh" type="mesh" mesh="tet" pos="0 -.2 0"/></body>
</worldbody>
<sensor>
<distance geom1="a_sph" geom2="b_cap" cutoff="1"/><distance geom1="floor" geom2="a_box" cutoff="1"/>
<distance geom1="a_box" geom2="c_ell" cutoff="1"/><distance body1="A" body2="B" cutoff="0.3"/>
<normal geom1="b_cyl" geom2="c_mesh" cutoff="1"/><fromto geom1="c_ell" geom2="a_box" cutoff="1"/>
</sensor></mujoco>"""


def test_geom_distance_sensors_match_mujoco_with_finite_difference_gradients():
    """distance/normal/fromto between geoms and between bodies' geoms: primitive pairs through their
    collision functions (cutoff as margin), convex pairs (box-box, ellipsoid, cylinder, mesh) as
    exact distances, as MuJoCo's nativeccd; MuJoCo's GJK runs at ccd_tolerance 1e-12 here and its
    witness points still carry ~1e-7 of error, so normals and segments are compared to 1e-6."""
    m = mujoco.MjModel.from_xml_string(DISTANCES)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    distance = np.isin(np.arange(m.nsensordata), m.sensor_adr[m.sensor_type == mujoco.mjtSensor.mjSENS_GEOMDIST])

    def readings(qpos):
        sensordata = jsn.forward(model, data.replace(qpos=qpos)).sensordata
        return sensordata[distance], sensordata

    jacobian_and_readings = jax.jit(jax.jacrev(readings, has_aux=True))  # one compiled program for all checks
    rng = np.random.default_rng(0)
    for _ in range(12):
        d = random_state(m, rng)
        for body in range(3):
            d.qpos[7 * body : 7 * body + 3] = rng.uniform(-0.3, 0.3, 3) + [0, 0, 0.4]
        mujoco.mj_forward(m, d)
        jac, out = jacobian_and_readings(jnp.asarray(d.qpos))
        np.testing.assert_allclose(out[distance], d.sensordata[distance], atol=1e-9)
        np.testing.assert_allclose(out[~distance], d.sensordata[~distance], atol=1e-6)

    assert np.abs(jac).max() > 0.1
    qpos = jnp.asarray(d.qpos)
    for i in range(m.nq):
        e = jnp.zeros(m.nq).at[i].set(1e-6)
        fd = (jacobian_and_readings(qpos + e)[1][distance] - jacobian_and_readings(qpos - e)[1][distance]) / 2e-6
        np.testing.assert_allclose(jac[:, i], fd, rtol=1e-5, atol=1e-6)


ENERGY = """<mujoco><option timestep="0.005" integrator="RK4" iterations="3" ls_iterations="4"><flag energy="enable"/></option><worldbody><geom type="plane" size="2 2 .1"/>
  <body pos="0 0 .3"><freejoint/><geom type="box" size=".05 .04 .03"/></body>
  <body pos="0 1 .5"><joint name="h" type="hinge" axis="1 0 0" stiffness="3" springref="10"/><geom type="capsule" fromto="0 0 0 0 .3 0" size=".03" contype="0" conaffinity="0"/>
    <body pos="0 .3 0"><joint type="ball" stiffness="1"/><geom type="capsule" fromto="0 0 0 0 .2 0" size=".02" contype="0" conaffinity="0"/></body></body>
  </worldbody><tendon><fixed stiffness="2" springlength=".1"><joint joint="h" coef="1"/></fixed></tendon></mujoco>"""


def test_energy_flag_fills_data_energy_as_mujoco():
    """<flag energy="enable"/>: Data.energy = (potential, kinetic) of forward's state (gravity, joint,
    ball and tendon springs; 1/2 v^T M v), under RK4 its last stage's as MuJoCo's mj_step leaves it; 100
    steps of a box dropping onto the floor and a sprung chain against d.energy. RK4's other reports as
    MuJoCo 4's: qacc the stages' weighted sum, the warm start (and contacts) the last stage's; with a
    3-iteration solver the warm start decides the trajectory (it was 1e-3 off from the initial qacc's)."""
    m = mujoco.MjModel.from_xml_string(ENERGY)
    d = mujoco.MjData(m)
    d.qvel[:] = np.random.default_rng(0).normal(size=m.nv)
    model = jsn.from_mujoco(m)
    _, traj = jax.jit(jsn.rollout)(model, jsn.make_data(model).replace(qvel=jnp.asarray(d.qvel)), jnp.zeros((100, 0)))
    record = lambda d: np.concatenate([d.energy, d.qpos, d.qacc, d.qacc_warmstart, [d.ncon]])  # noqa: E731
    ref = mujoco_rollout(m, d, np.zeros((100, 0)), record)
    energy, qpos, qacc, warmstart, ncon = np.split(ref, np.cumsum([2, m.nq, m.nv, m.nv]), axis=1)
    assert ncon.max() >= 4  # the box lands
    np.testing.assert_allclose(traj.energy, energy, rtol=0, atol=1e-12)
    np.testing.assert_allclose(traj.qpos, qpos, rtol=0, atol=1e-11)
    np.testing.assert_allclose(traj.qacc, qacc, rtol=0, atol=1e-9 * np.abs(qacc).max())
    np.testing.assert_allclose(traj.qacc_warmstart, warmstart, rtol=0, atol=1e-9 * np.abs(warmstart).max())
    np.testing.assert_array_equal(np.asarray(traj.contact.mask).sum(axis=1), ncon[:, 0])
