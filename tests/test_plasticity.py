"""Spring plasticity (MuJoCo 4's springyield, passive.plasticity) against MuJoCo and finite differences.

A hinge, a ball joint and a slide with plastic springs, two fixed tendons with plastic deadbands
(one [lo, hi], one slack [0, L]) and a spatial one, driven back and forth past their yields: qpos and Data.plastic
follow MuJoCo's (mjData.plastic) step by step; the gradient of the final state w.r.t. the controls,
the yields and the stiffnesses (through the springs' moving references) equals central differences.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
from jaxsim_ncp import passive
from test_gradients import check_directional

XML = """<mujoco><option timestep="0.005" integrator="implicitfast"/><worldbody>
<body pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" stiffness="2" springyield="10" damping="0.05"/>
  <geom type="capsule" fromto="0 0 0 .3 0 0" size=".02"/>
  <body pos=".3 0 0"><joint type="ball" stiffness="1" springyield="15" damping="0.01"/><geom type="capsule" fromto="0 0 0 .2 0 0" size=".02"/></body></body>
<body pos="0 1 1"><joint name="s" type="slide" axis="1 0 0" stiffness="5" springyield="0.05" springref="0.1"/><geom type="box" size=".05 .05 .05"/></body>
<site name="anchor" pos="0.2 2 1.5"/>
<body pos="0 2 1"><joint name="s2" type="slide" axis="0 0 1"/><geom type="box" size=".05 .05 .05"/><site name="tip" pos="0 0 .05"/></body>
<body pos="0 3 1"><joint name="s3" type="slide" axis="0 0 1"/><geom type="box" size=".05 .05 .05"/></body>
</worldbody><tendon><fixed stiffness="4" springlength="0.1 0.3" springyield="0.1"><joint joint="s2" coef="1"/></fixed>
<fixed stiffness="4" springlength="0 0.3" springyield="0.05"><joint joint="s3" coef="-1"/></fixed>
<spatial stiffness="3" springlength="0.4 0.5" springyield="0.03"><site site="anchor"/><site site="tip"/></spatial></tendon>
<actuator><motor joint="h"/><motor joint="s"/><motor joint="s2"/><motor joint="s3"/></actuator></mujoco>"""
T = 400


def _controls(steps: int, dt: float) -> np.ndarray:
    t = np.arange(steps) * dt
    return np.stack([3 * np.sin(3 * t), 8 * np.sin(2 * t), 30 * np.sin(2.5 * t), 30 * np.sin(1.7 * t)], axis=1)


def test_plastic_springs_follow_mujoco_and_finite_differences():
    m = mujoco.MjModel.from_xml_string(XML)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    np.testing.assert_array_equal(data.plastic, d.plastic)  # the references start at qpos_spring, lengthspring
    ctrl = _controls(T, m.opt.timestep)
    rollout = jax.jit(jsn.rollout)
    _, traj = rollout(model, data, jnp.asarray(ctrl))
    start = d.plastic.copy()
    for t in range(T):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        np.testing.assert_allclose(traj.qpos[t], d.qpos, rtol=0, atol=1e-12, err_msg=f"step {t}")
        np.testing.assert_allclose(traj.plastic[t], d.plastic, rtol=0, atol=1e-12, err_msg=f"step {t}")
    moved = np.abs(d.plastic - start)
    assert np.all(moved[[0, 1, 5, 6, 7, 8, 9, 10, 11]] > 0.1)  # every spring yielded: hinge, ball, slide, the tendons
    assert d.plastic[8] < 0  # the slack tendon compressed past its yield: both bounds moved

    def final_state(args):
        ctrl, springyield, stiffness = args
        mdl = eqx.tree_at(lambda mdl: (mdl.jnt_springyield, mdl.jnt_stiffness), model, (springyield, stiffness))
        final, _ = rollout(mdl, data, ctrl)
        return jnp.sum(final.qpos) + jnp.sum(final.qvel) + jnp.sum(final.plastic)

    args = (jnp.asarray(ctrl), model.jnt_springyield, model.jnt_stiffness)
    check_directional(final_state, args, np.random.default_rng(0), n_dirs=2, rtol=1e-5)


def test_disabled_springs_do_not_yield():
    """With <flag spring="disable"/> MuJoCo's references stay put however far the joints move; so do ours."""
    m = mujoco.MjModel.from_xml_string(XML.replace('integrator="implicitfast"/>', 'integrator="implicitfast"><flag spring="disable"/></option>'))
    d = mujoco.MjData(m)
    d.qpos[[0, 5, 6, 7]] = [2.0, 1.0, 1.0, -1.0]  # hinge, slide and both tendons' joints far past their yields
    mujoco.mj_step(m, d)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    np.testing.assert_array_equal(d.plastic, data.plastic)
    np.testing.assert_array_equal(passive.plasticity(model, data, jnp.asarray(d.qpos)), data.plastic)
