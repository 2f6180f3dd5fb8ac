"""MuJoCo 4's DC motor actuator (`<dcmotor>`) against MuJoCo, and its gradients against central
finite differences.

A DC motor's force is K i with an armature-current state (inductance), else K/R (V - K dl/dt); the
drive voltage V comes from the raw `voltage` input and/or an on-board torque-space PID controller
(slew-limited first input, integral with anti-windup, Vmax clip); the winding temperature scales R;
cogging and LuGre friction act outside the current limit (forcerange).
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
STEPS = 30


# a velocity-dependent gain on an actearly filter: the implicit integrators' derivative reads its next activation
FILTER = '<general name="filter" joint="j0" dyntype="filter" dynprm="0.05" gaintype="affine" gainprm="1 0 0.5" actearly="true"/>'


def _scene(motors, integrator="implicitfast", extra=""):
    bodies = "".join(f'<body pos="{i} 0 1"><joint name="j{i}" axis="0 1 0" damping="0.01"/>'
                     f'<geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/></body>' for i in range(len(motors)))  # fmt: skip
    actuators = "".join(f'<dcmotor name="m{i}" joint="j{i}" {m}/>' for i, m in enumerate(motors))
    return f"""<mujoco><option timestep="0.002" integrator="{integrator}"/><worldbody>{bodies}</worldbody>
      <actuator>{actuators}{extra}</actuator></mujoco>"""


def test_dc_motors_follow_mujoco_and_finite_differences():
    """Every DC motor state (slew, integral, temperature, bristle, current) and input signature
    (voltage, none, pos+vel+ff, pos+voltage, vel+ff), with the current and voltage limits active:
    30 implicitfast steps (MuJoCo 4.0.1's velocity derivative of the motors: Vmax and di/dt limits,
    hot winding; beside them an actearly filter with a velocity-dependent gain) with controls +-3:
    states, activations and forces equal to MuJoCo's; the gradient of the final state w.r.t. the
    controls and every actuator parameter equals central differences."""
    m = mujoco.MjModel.from_xml_string(_scene(MOTORS, extra=FILTER))
    assert (m.nu, m.nactuator, m.na) == (11, 8, 12)
    d = mujoco.MjData(m)
    ctrl = np.random.default_rng(0).uniform(-3, 3, (STEPS, m.nu))
    ctrl[:, 1] = 3.0  # motor 1: full voltage, its current saturates
    expected = {"qpos": [], "qvel": [], "act": [], "actuator_force": []}
    for t in range(STEPS):
        d.ctrl[:] = ctrl[t]
        mujoco.mj_step(m, d)
        for k, v in expected.items():
            v.append(getattr(d, k).copy())
    model = jsn.from_mujoco(m)

    # every nonzero actuator parameter, scaled by 1 + x
    prms = (model.actuator_gainprm, model.actuator_dynprm, model.actuator_biasprm)

    def loss(scales, ctrl):
        tuned = eqx.tree_at(lambda m: (m.actuator_gainprm, m.actuator_dynprm, m.actuator_biasprm), model,
                            tuple(prm * (1 + x) for prm, x in zip(prms, scales)))  # fmt: skip
        traj = jsn.rollout(tuned, jsn.make_data(tuned), ctrl)[1]
        return jnp.sum(traj.qpos[-1] ** 2) + jnp.sum(traj.qvel[-1]) + jnp.sum(traj.act[-1]), traj

    with_traj = jax.jit(jax.value_and_grad(lambda x: loss(*x), has_aux=True))
    x0 = ([jnp.zeros(prm.shape) for prm in prms], jnp.asarray(ctrl))
    (_, traj), _ = with_traj(x0)
    for k, v in expected.items():
        np.testing.assert_allclose(np.asarray(getattr(traj, k)), np.array(v), atol=1e-9, rtol=0, err_msg=k)
    angle = np.concatenate([m.qpos0[None], expected["qpos"][:-1]])[:, 1]  # each step's force is at its start
    cogging = 0.05 * np.sin(6 * angle + 0.3)  # motor 1: its current saturates
    assert np.any(np.isclose(np.abs(np.array(expected["actuator_force"])[:, 1] - cogging), 0.15))

    value_and_grad = lambda x: (lambda out: (out[0][0], out[1]))(with_traj(x))  # noqa: E731
    check_directional(lambda x: loss(*x)[0], x0, np.random.default_rng(1), rtol=1e-6, value_and_grad=value_and_grad)


def test_stateless_dc_motors_without_activations_and_mixed_kinds_refused():
    """Stateless motors only (na = 0): a step equals MuJoCo's. A <general> mixing the DC motor's
    dynamics with another gain is refused by name."""
    m = mujoco.MjModel.from_xml_string(_scene([MOTORS[0], 'resistance="1" motorconst="0.3" input="vel" controller="0 0 0.4 0 0 0"'], "Euler"))
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

    mixed = '<general name="odd" joint="j0" dyntype="dcmotor" dynprm="0.01" actearly="true"/></actuator>'
    m = mujoco.MjModel.from_xml_string(_scene([MOTORS[0]]).replace("</actuator>", mixed))
    with pytest.raises(jsn.UnsupportedFeatureError, match="'odd'.*DC motor"):
        jsn.from_mujoco(m)
