"""MuJoCo 4's history buffers (`delay`, `nsample`, `interp`, a sensor's `interval`): the buffers
against MuJoCo's own (insertion in and out of order, reads in every interpolation); a rollout of
delayed actuators and delayed, sampled and recorded sensors step for step with MuJoCo, and its
gradient w.r.t. the controls and the delays against central finite differences. Disabled
actuator groups (option/actuatorgroupdisable) against MuJoCo."""

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
from jaxsim_ncp import history
from test_gradients import check_directional

INTERPS = ("zoh", "linear", "cubic")


def _scene(integrator="RK4"):
    """A hinge and a slide, each driven by delayed actuators of every interpolation (one
    undelayed position servo, one filter actuator with a delay); sensors delayed (every
    interpolation, a contact-force one among them), sampled at intervals (with and without a phase
    and a delay), or only recorded."""
    return f"""<mujoco><option timestep="0.01" integrator="{integrator}"/>
      <default><geom contype="0" conaffinity="0"/></default><worldbody><geom type="plane" size="2 2 .1" contype="1" conaffinity="1"/>
      <body pos="0 0 .5"><joint name="hinge" type="hinge" axis="0 1 0" damping=".1"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/>
        <site name="tip" pos=".3 0 0"/></body>
      <body pos="1 0 .5"><joint name="slide" type="slide"/><geom size=".1"/></body>
      <body pos=".5 0 .06"><freejoint/><geom size=".05" contype="1" conaffinity="1"/><site name="ball" size=".06"/></body></worldbody>
      <sensor><jointpos joint="hinge" delay=".015" nsample="4" interp="linear"/><framepos objtype="site" objname="tip" interval=".03" nsample="3"/>
        <jointvel joint="hinge" interval=".02 -.005" nsample="2" delay=".01" interp="cubic"/><accelerometer site="tip" nsample="2"/>
        <touch site="ball" nsample="3" delay=".02"/><framequat objtype="site" objname="tip" delay=".013" nsample="5" interp="cubic"/></sensor>
      <actuator><motor joint="hinge" delay=".023" nsample="4" interp="zoh" ctrlrange="-2 2" ctrllimited="true"/>
        <position joint="slide" kp="10"/><motor joint="slide" nsample="3" delay=".013" interp="linear"/>
        <general joint="hinge" dyntype="filter" dynprm=".05" delay=".017" nsample="5" interp="cubic"/></actuator></mujoco>"""


def test_history_buffers_insert_and_read_as_mujoco():
    """Samples recorded at increasing, repeated and earlier times (mj_step records d.time), then
    read at times before, between, on and after the samples (mj_readCtrl), for each interpolation."""
    m = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body><joint name='j' type='slide'/><geom size='.1'/></body></worldbody>"
        "<actuator><motor joint='j' nsample='5' delay='.01'/></actuator></mujoco>"
    )
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    n = 5
    insert = jax.jit(history.insert, static_argnums=(1, 2))
    buf = jsn.make_data(model).history
    np.testing.assert_array_equal(buf, d.history)
    # times: in order, a repeat of the newest, one before the oldest, ones in between, an exact earlier sample
    times = [0.0, 0.002, 0.004, 0.004, 0.006, -0.05, 0.003, 0.008, 0.0051, 0.002, 0.01, 0.0075]
    rng = np.random.default_rng(0)
    for t in times:
        d.time, d.ctrl[0] = t, rng.normal()
        buf = insert(buf, n, 1, t, d.ctrl[:1])
        mujoco.mj_step(m, d)
        np.testing.assert_array_equal(buf, d.history, err_msg=f"insert at {t}")
    # mj_readCtrl reads at its time argument minus the delay, as the actuator does
    at = np.concatenate([[-1.0, 0.0, 0.002, 0.01, 0.011, 1.0], rng.uniform(-0.001, 0.011, 30)]) + m.actuator_delay[0]
    for interp in range(3):
        read = jax.jit(jax.vmap(lambda s: history.read(buf, n, 1, s, interp)[0]))
        expected = [mujoco.mj_readCtrl(m, d, 0, s, np.zeros(1), interp)[0] for s in at]
        np.testing.assert_allclose(read(jnp.asarray(at - m.actuator_delay[0])), expected, rtol=1e-14, atol=1e-14, err_msg=INTERPS[interp])


def test_delayed_actuators_follow_mujoco_with_finite_difference_gradients():
    """RK4 (its stages read the buffers at intermediate times): buffers, sensors and states step
    for step with mj_step. d(final state)/d(controls, delays) against central differences, with
    Euler (the RK4 gradient compiles twice as long and differentiates the same reads)."""
    m = mujoco.MjModel.from_xml_string(_scene())
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    steps = 40
    ctrl = np.random.default_rng(0).normal(0, 2, (steps, m.nu))
    rollout = jax.jit(jsn.rollout)
    final, traj = rollout(model, data, jnp.asarray(ctrl))
    for t in range(steps):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        np.testing.assert_allclose(traj.history[t], d.history, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(traj.qpos[t], d.qpos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.act[t], d.act, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.sensordata[t], d.sensordata, rtol=1e-12, atol=1e-12)
    assert np.abs(d.qpos[:2]).max() > 0.1  # the delayed actuators moved the joints
    assert d.sensordata[m.sensor_adr[4]] > 0  # the ball rests on the floor: its delayed touch reads its weight

    model = jsn.load_mjcf(_scene("Euler"))
    data = jsn.make_data(model)
    w = jnp.asarray(np.random.default_rng(1).normal(size=model.nq + model.nv))

    def loss(x):
        u, delay = x
        final, _ = jsn.rollout(eqx.tree_at(lambda mo: mo.actuator_delay, model, delay), data, u)
        return w @ jnp.concatenate([final.qpos, final.qvel])

    check_directional(loss, (jnp.asarray(ctrl[:12]), model.actuator_delay), np.random.default_rng(2), n_dirs=2, rtol=1e-6)


def test_disabled_actuator_groups_follow_mujoco():
    """Actuators in disabled groups exert no force and their activations hold (act_dot is still
    reported), under implicitfast (the actuators' velocity derivative skips them too)."""
    xml = """<mujoco><option timestep="0.01" integrator="implicitfast" actuatorgroupdisable="1 3"/>
      <default><geom contype="0" conaffinity="0"/></default><worldbody>
      <body><joint name="hinge" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/></body>
      <body pos="1 0 0"><joint name="slide" type="slide"/><geom size=".1"/></body></worldbody>
      <actuator><motor joint="hinge" group="1"/><velocity joint="slide" kv="3" group="3"/><position joint="slide" kp="10" group="2"/>
        <general joint="hinge" dyntype="filter" dynprm=".05" group="1"/><general joint="hinge" dyntype="integrator" group="0"/>
      </actuator></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    assert model.topology.actuator_disabled == (True, True, False, True, False)
    ctrl = np.random.default_rng(0).normal(0, 2, (30, m.nu))
    _, traj = jax.jit(jsn.rollout)(model, jsn.make_data(model), jnp.asarray(ctrl))
    for t in range(30):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        np.testing.assert_allclose(traj.actuator_force[t], d.actuator_force, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.act_dot[t], d.act_dot, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.qpos[t], d.qpos, rtol=0, atol=1e-12)
        np.testing.assert_allclose(traj.act[t], d.act, rtol=0, atol=1e-12)
    assert d.act[0] == 0 and d.act[1] != 0  # the disabled filter held, the enabled integrator moved


def test_disabled_sensors_keep_their_values_and_buffers_record_as_mujoco():
    """option/flag sensor="disable": sensordata is not refreshed (a value set by the user stays); the
    buffers still record, a delayed sensor's value computed for it, an interval sensor's stale sensordata
    (mj_advance). 12 steps against MuJoCo."""
    xml = """<mujoco><option timestep="0.01"><flag sensor="disable"/></option><worldbody>
      <body pos="0 1 .5"><joint name="h" type="hinge" axis="1 0 0"/><geom type="capsule" fromto="0 0 0 0 .3 0" size=".03"/></body>
      </worldbody><sensor><jointpos joint="h" nsample="5" delay="0.02"/><jointvel joint="h"/>
      <jointpos joint="h" nsample="3" interval="0.03"/></sensor></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    d.qvel[0], d.sensordata[:] = 1.0, [0.5, -2.0, 0.25]
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(qvel=jnp.asarray(d.qvel), sensordata=jnp.asarray(d.sensordata))
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.zeros((12, 0)))
    for t in range(12):
        mujoco.mj_step(m, d)
        np.testing.assert_array_equal(traj.sensordata[t], d.sensordata)
        np.testing.assert_allclose(traj.history[t], d.history, rtol=0, atol=1e-15)
    assert np.count_nonzero(d.history[2 + 5 + 5 :][2 + 3 :] == 0.25) >= 2  # the interval sensor recorded the stale value
