"""MuJoCo 4's control blocks and pid actuators against MuJoCo, and their gradients against central
finite differences.

An actuator reads ctrl[ctrladr : ctrladr + ctrlnum] (so nu counts controls, not actuators); a pid
reads any subset of (pos, vel, ff), keeps a slew-limited setpoint and the integral of its position
error (anti-windup at imax) as activation states, and, like a position servo, wraps its setpoint
on a ball joint to the representative nearest the joint's rotation.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from test_gradients import check_directional

_SCENE = """<mujoco><option timestep="0.005" integrator="implicitfast"/><worldbody>
  <body><joint name="h1" type="hinge" axis="0 1 0" damping=".1"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/>
    <body pos=".3 0 0"><joint name="h2" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/></body></body>
  <body pos="1 0 0"><joint name="b" type="ball" damping=".05"/><geom type="capsule" fromto="0 0 0 0 0 -.3" size=".03"/></body>
  <body pos="2 0 0"><joint name="s" type="slide" axis="0 0 1"/><geom type="box" size=".05 .05 .05"/></body>
  <body pos="3 0 0"><joint name="h3" type="hinge" axis="1 0 0"/><geom type="box" size=".05 .2 .02"/></body></worldbody>
  <actuator>
    <motor joint="h1" gear="2"/>
    <pid joint="h1" kp="20" kv="2" ki="5" imax=".01" slewmax="4" input="pos vel ff" posrange="-2 2" velrange="-3 3"
         ffrange="-1 1" ctrllimited="true"/>
    <pid joint="h2" kp="10" dampratio="1" input="vel ff"/>
    <pid joint="s" kp="50" kv="3" ki="40" input="pos" forcerange="-30 30" forcelimited="true"/>
    <position joint="b" kp="3" gear="0 0 1"/>
    <pid joint="b" kp="2" kv=".2" ki="1" gear="1 0 0" input="pos ff"/>
    <intvelocity joint="h3" kp="4" actrange="-10 10"/>
    <pid joint="h3" kp="3" kv=".3" slewmax="2" input="pos vel"/>
  </actuator></mujoco>"""
STEPS = 30


def test_pid_actuators_follow_mujoco_and_finite_differences():
    """Every kind of control block (plain, pos+vel+ff with slew and a clamped integral, vel+ff,
    pos with a saturating force, pos+ff on a ball joint, pos+vel with slew) and position servos on a
    ball joint whose setpoints wrap: 30 implicitfast steps with controls beyond +-pi (slew limits,
    the integral's clamp and the force range all active), states, activations and forces equal to
    MuJoCo's; the gradient of the final state w.r.t. the controls, the pids' gains (kp, kv, ki) and
    their slew and integral limits equals central differences."""
    m = mujoco.MjModel.from_xml_string(_SCENE)
    assert (m.nu, m.nactuator, m.na) == (13, 8, 6)
    d = mujoco.MjData(m)
    ctrl = np.random.default_rng(0).uniform(-4, 4, (STEPS, m.nu))
    expected = {"qpos": [], "qvel": [], "act": [], "actuator_force": []}
    for t in range(STEPS):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        for k, v in expected.items():
            v.append(getattr(d, k).copy())
    model = jsn.from_mujoco(m)
    assert model.nactuator == 8 and model.nu == 13

    # the pids' nonzero kp, kv (biasprm[1:3]), ki (gainprm[0]), imax and slewmax (dynprm[:2]), scaled by
    # 1 + x (a position servo's kp changed alone would stop being a servo: MuJoCo then stops wrapping)
    pid = np.asarray(m.actuator_gaintype == mujoco.mjtGain.mjGAIN_PID)[:, None]
    columns = lambda cols: pid & np.isin(np.arange(10), cols)[None, :]  # noqa: E731
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
    assert np.any(np.abs(np.array(expected["actuator_force"])[:, 3]) == 30.0)  # the slide's force saturates
    assert np.max(np.abs(np.array(expected["act"])[:, 1])) >= 0.01  # h1's integral reached imax

    value_and_grad = lambda x: (lambda out: (out[0][0], out[1]))(with_traj(x))  # noqa: E731
    check_directional(lambda x: loss(*x)[0], x0, np.random.default_rng(1), rtol=1e-6, value_and_grad=value_and_grad)


def test_a_delay_on_an_actuator_with_several_controls_is_refused_by_name():
    xml = _SCENE.replace('<pid joint="h2" kp="10"', '<pid name="late" joint="h2" delay=".01" nsample="3" kp="10"')
    with pytest.raises(jsn.UnsupportedFeatureError, match="'late'.*delay"):
        jsn.from_mujoco(mujoco.MjModel.from_xml_string(xml))
