"""MuJoCo 4's control blocks, pid and DC motor actuators against MuJoCo, and their gradients
against central finite differences, in one compiled program.

An actuator reads ctrl[ctrladr : ctrladr + ctrlnum] (so nu counts controls, not actuators); a pid
reads any subset of (pos, vel, ff), keeps a slew-limited setpoint and the integral of its position
error (anti-windup at imax) as activation states, and, like a position servo, wraps its setpoint
on a ball joint to the representative nearest the joint's rotation. A DC motor's force is K i with
an armature-current state (inductance), else K/R (V - K dl/dt); the drive voltage V comes from the
raw `voltage` input and/or an on-board torque-space PID controller (slew-limited first input,
integral with anti-windup, Vmax clip); the winding temperature scales R; cogging and LuGre friction
act outside the current limit (forcerange).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from test_gradients import check_directional

MOTORS = [
    'resistance="2" motorconst="0.1"',  # stateless, voltage-commanded
    'resistance="1.5" motorconst="0.2" inductance="0.002 0" saturation="0.15 0 200" cogging="0.05 6 0.3"',
    'resistance="1" motorconst="0.15" input="pos vel ff" controller="4 2 0.3 3 0.5 12" inductance="0 0.005"',
    'resistance="2" motorconst="0.1" thermal="2 10 0 0.004 25 20" lugre="50 0.5 0.05 0.08 0.1"',
    'resistance="2" motorconst="0.1" input="none" lugre="30 0.2 0.04 0.06 0.2" cogging="0.02 4 0"',  # passive
    'resistance="1" motorconst="0.2" input="pos voltage" controller="3 0 0.2 0 0 0" thermal="1 5 0 0.004 25 30"',
    'resistance="1" motorconst="0.2" input="vel ff" controller="0 0 0.5 4 0 6" thermal="1 5 0 0.004 25 30" inductance="0 0.003"',
]
# a velocity-dependent gain on an actearly filter: the implicit integrators' derivative reads its next activation
FILTER = '<general name="filter" joint="j0" dyntype="filter" dynprm="0.05" gaintype="affine" gainprm="1 0 0.5" actearly="true"/>'
_PIDS = """<motor joint="h1" gear="2"/>
    <pid joint="h1" kp="20" kv="2" ki="5" imax=".01" slewmax="4" input="pos vel ff" posrange="-2 2" velrange="-3 3"
         ffrange="-1 1" ctrllimited="true"/>
    <pid joint="h2" kp="10" dampratio="1" input="vel ff"/>
    <pid joint="s" kp="50" kv="3" ki="40" input="pos" forcerange="-30 30" forcelimited="true"/>
    <position joint="b" kp="3" gear="0 0 1"/>
    <pid joint="b" kp="2" kv=".2" ki="1" gear="1 0 0" input="pos ff"/>
    <intvelocity joint="h3" kp="4" actrange="-10 10"/>
    <pid joint="h3" kp="3" kv=".3" slewmax="2" input="pos vel"/>"""
STEPS = 30


def _scene(motors=MOTORS, actuators=_PIDS + FILTER, integrator="implicitfast"):
    """The pids' bodies (two hinges in a chain, a ball, a slide, a hinge; with their actuators) and a
    pendulum per DC motor."""
    hinges = "".join(f'<body pos="{4 + i} 0 1"><joint name="j{i}" axis="0 1 0" damping="0.01"/>'
                     f'<geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/></body>' for i in range(len(motors)))  # fmt: skip
    dc = "".join(f'<dcmotor name="m{i}" joint="j{i}" {m}/>' for i, m in enumerate(motors))
    pid_bodies = """
  <body><joint name="h1" type="hinge" axis="0 1 0" damping=".1"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/>
    <body pos=".3 0 0"><joint name="h2" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/></body></body>
  <body pos="1 0 0"><joint name="b" type="ball" damping=".05"/><geom type="capsule" fromto="0 0 0 0 0 -.3" size=".03"/></body>
  <body pos="2 0 0"><joint name="s" type="slide" axis="0 0 1"/><geom type="box" size=".05 .05 .05"/></body>
  <body pos="3 0 0"><joint name="h3" type="hinge" axis="1 0 0"/><geom type="box" size=".05 .2 .02"/></body>""" if _PIDS in actuators else ""
    return f"""<mujoco><option timestep="0.005" integrator="{integrator}"/><worldbody>{pid_bodies}{hinges}</worldbody>
  <actuator>{actuators}{dc}</actuator></mujoco>"""


def test_pid_and_dc_motor_actuators_follow_mujoco_and_finite_differences():
    """Every kind of pid control block (plain, pos+vel+ff with slew and a clamped integral, vel+ff,
    pos with a saturating force, pos+ff on a ball joint, pos+vel with slew), position servos on a
    ball joint whose setpoints wrap, an actearly filter with a velocity-dependent gain, and every DC
    motor state (slew, integral, temperature, bristle, current) and input signature (voltage, none,
    pos+vel+ff, pos+voltage, vel+ff) with its current and voltage limits: 30 implicitfast steps
    (MuJoCo 4.0.1's velocity derivatives: the filter's next activation, the motors' Vmax and di/dt
    limits and hot windings) with controls beyond +-pi (slew limits, the integral's clamp and the
    force ranges active): states, activations and forces equal to MuJoCo's. The gradient of the
    final state w.r.t. the controls, the pids' gains (kp, kv, ki), slew and integral limits, and
    every parameter of the filter and the motors equals central differences."""
    m = mujoco.MjModel.from_xml_string(_scene())
    assert (m.nu, m.nactuator, m.na) == (24, 16, 18)
    d = mujoco.MjData(m)
    ctrl = np.random.default_rng(0).uniform(-4, 4, (STEPS, m.nu))
    motor1 = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_ACTUATOR, "m1")
    ctrl[:, m.actuator_ctrladr[motor1]] = 3.0  # full voltage: its current saturates
    expected = {"qpos": [], "qvel": [], "act": [], "actuator_force": []}
    for t in range(STEPS):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        for k, v in expected.items():
            v.append(getattr(d, k).copy())
    model = jsn.from_mujoco(m)
    assert model.nactuator == 16 and model.nu == 24

    # the pids' nonzero kp, kv (biasprm[1:3]), ki (gainprm[0]), imax and slewmax (dynprm[:2]), and every
    # nonzero parameter of the filter and the motors, scaled by 1 + x (a position servo's kp changed
    # alone would stop being a servo: MuJoCo then stops wrapping)
    pid = np.asarray(m.actuator_gaintype == mujoco.mjtGain.mjGAIN_PID)[:, None]
    whole = np.isin(m.actuator_gaintype, [mujoco.mjtGain.mjGAIN_DCMOTOR, mujoco.mjtGain.mjGAIN_AFFINE])[:, None]
    columns = lambda cols: whole | (pid & np.isin(np.arange(10), cols)[None, :])  # noqa: E731
    masks = [columns([0]) & (m.actuator_gainprm != 0), columns([1, 2]) & (m.actuator_biasprm != 0),
             columns([0, 1]) & (m.actuator_dynprm != 0)]  # fmt: skip

    def loss(scales, ctrl):
        prms = [jnp.where(mask, prm * (1 + x), prm) for mask, prm, x in
                zip(masks, (model.actuator_gainprm, model.actuator_biasprm, model.actuator_dynprm), scales)]  # fmt: skip
        tuned = eqx.tree_at(lambda m: (m.actuator_gainprm, m.actuator_biasprm, m.actuator_dynprm), model, tuple(prms))
        traj = jsn.rollout(tuned, jsn.make_data(tuned), ctrl)[1]
        return jnp.sum(traj.qpos[-1] ** 2) + jnp.sum(traj.qvel[-1]) + jnp.sum(traj.act[-1]), traj

    # one compiled program: the trajectory at the model's own parameters (scales 0) is its aux output
    with_traj = jax.jit(jax.value_and_grad(lambda x: loss(*x), has_aux=True))
    x0 = ([jnp.zeros(mask.shape) for mask in masks], jnp.asarray(ctrl))
    (_, traj), _ = with_traj(x0)
    for k, v in expected.items():
        np.testing.assert_allclose(np.asarray(getattr(traj, k)), np.array(v), atol=1e-9, rtol=0, err_msg=k)
    force, act = np.array(expected["actuator_force"]), np.array(expected["act"])
    assert np.any(np.abs(force[:, 3]) == 30.0)  # the slide's force saturates
    assert np.max(np.abs(act[:, 1])) >= 0.01  # h1's integral reached imax
    angle = np.concatenate([m.qpos0[None], expected["qpos"][:-1]])[:, m.jnt_qposadr[m.actuator_trnid[motor1, 0]]]
    cogging = 0.05 * np.sin(6 * angle + 0.3)  # each step's force is at its start
    assert np.any(np.isclose(np.abs(force[:, motor1] - cogging), 0.15))  # motor 1's current limit

    value_and_grad = lambda x: (lambda out: (out[0][0], out[1]))(with_traj(x))  # noqa: E731
    check_directional(lambda x: loss(*x)[0], x0, np.random.default_rng(1), rtol=1e-6, value_and_grad=value_and_grad)


def test_stateless_dc_motors_and_refusals():
    """Stateless motors only (na = 0): a step equals MuJoCo's; an edit that would give one a current
    state fails check_model. A <general> mixing the DC motor's dynamics with another gain is refused
    by name."""
    motors = [MOTORS[0], 'resistance="1" motorconst="0.3" input="vel" controller="0 0 0.4 0 0 0"']
    m = mujoco.MjModel.from_xml_string(_scene(motors, actuators="", integrator="Euler"))
    assert m.na == 0
    d = mujoco.MjData(m)
    d.ctrl[:] = [2.0, -1.5]
    d.qvel[:] = [0.3, -0.7]
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(ctrl=jnp.asarray(d.ctrl), qvel=jnp.asarray(d.qvel))
    out = jax.jit(jsn.step)(model, data)
    mujoco.mj_step(m, d)
    np.testing.assert_allclose(np.asarray(out.qvel), d.qvel, atol=1e-12, rtol=0)
    np.testing.assert_allclose(np.asarray(out.actuator_force), d.actuator_force, atol=1e-12, rtol=0)
    inductive = eqx.tree_at(lambda m: m.actuator_dynprm, model, model.actuator_dynprm.at[0, 0].set(0.01))
    with pytest.raises(jsn.ModelError, match='"m0".*electrical time constant'):  # a state cannot appear by an edit
        jsn.check_model(inductive)

    mixed = '<general name="odd" joint="j0" dyntype="dcmotor" dynprm="0.01" actearly="true"/>'
    m = mujoco.MjModel.from_xml_string(_scene([MOTORS[0]], actuators=mixed))
    with pytest.raises(jsn.UnsupportedFeatureError, match="'odd'.*DC motor"):
        jsn.from_mujoco(m)


def test_a_delay_on_an_actuator_with_several_controls_is_refused_by_name():
    xml = _scene().replace('<pid joint="h2" kp="10"', '<pid name="late" joint="h2" delay=".01" nsample="3" kp="10"')
    with pytest.raises(jsn.UnsupportedFeatureError, match="'late'.*delay"):
        jsn.from_mujoco(mujoco.MjModel.from_xml_string(xml))
