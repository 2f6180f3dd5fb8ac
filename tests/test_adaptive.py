"""The adaptive (Diffrax) integrator: against MuJoCo's RK4 at a tiny step, finite differences, max_steps.

MuJoCo C with RK4 at dt = 1e-5 is the tight fixed-step reference. Two compiled rollouts
(a contact-free scene, a contact scene with its gradient) and one batched forward with a
tiny max_steps.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn

# a spinning free box (gyroscopic terms, quaternion on the manifold) and a damped pendulum
# driven through a first-order filter actuator (act integrated as part of the ODE)
FREE = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <body pos="0 0 1" euler="10 20 30"><freejoint/><geom type="box" size="0.1 0.05 0.08" mass="1" contype="0" conaffinity="0"/></body>
    <body pos="1 0 1"><joint name="hinge" axis="0 1 0" damping="0.05"/><geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/></body>
  </worldbody>
  <actuator><general joint="hinge" dyntype="filter" dynprm="0.05" gainprm="2"/></actuator>
</mujoco>
"""
# a tossed box (DiffMJX's toss, Fig. S5): solimp dmin = 0 as in the paper, so the contact force
# grows from zero at first touch (with MuJoCo's default dmin = 0.9 it jumps there: the ODE's
# right-hand side is discontinuous and its flow's derivative has an event term that no
# integrator's derivative contains); the floor's friction is lower, so the box's own counts
CONTACT = """
<mujoco>
  <option timestep="0.01"/>
  <default><geom solimp="0 0.95 0.001 0.5 2"/></default>
  <worldbody>
    <geom type="plane" size="5 5 .1" friction="0.1"/>
    <body pos="0 0 0.12" euler="10 20 30"><freejoint/><geom type="box" size="0.1 0.05 0.08" mass="1" friction="0.4"/></body>
  </worldbody>
</mujoco>
"""
T = 20


def _mujoco_rk4(xml, qvel, ctrl, duration, dt=1e-5, friction=None):
    m = mujoco.MjModel.from_xml_string(xml)
    m.opt.integrator, m.opt.timestep = mujoco.mjtIntegrator.mjINT_RK4, dt
    if friction is not None:
        m.geom_friction[1, 0] = friction
    d = mujoco.MjData(m)
    d.qvel[:], d.ctrl[:] = qvel, ctrl
    for _ in range(int(round(duration / dt))):
        mujoco.mj_step(m, d)
    return d.qpos.copy(), d.qvel.copy(), d.act.copy()


def _run(model, qvel, ctrl):
    data = jsn.make_data(model).replace(qvel=jnp.asarray(qvel))
    return jsn.rollout(model, data, jnp.tile(jnp.asarray(ctrl), (T, 1)))


def test_free_flight_and_filter_actuator_match_mujoco_rk4_with_backsolve_gradients():
    """Values and (BacksolveAdjoint: the adjoint ODE solved backwards) gradients vs MuJoCo's RK4."""
    model = jsn.load_mjcf(FREE, integrator="adaptive", rtol=1e-10, atol=1e-10, adjoint=diffrax.BacksolveAdjoint())
    weights = np.array([1.0, 0.5, -1.0, 2.0, 1.0, -1.0, 0.5, 3.0, 2.0])  # over (qpos, act)

    def loss(qvel, ctrl):
        final, traj = _run(model, qvel, ctrl)
        return jnp.dot(weights, jnp.concatenate([final.qpos, final.act])), (final, traj)

    qvel, ctrl = np.array([1.0, 0, 2, 3, -2, 5, 1.5]), np.array([0.7])
    (_, (final, traj)), (g_qvel, g_ctrl) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(qvel, ctrl)
    qpos_ref, qvel_ref, act_ref = _mujoco_rk4(FREE, qvel, ctrl, T * 0.01)
    np.testing.assert_allclose(final.qpos, qpos_ref, atol=1e-9)
    np.testing.assert_allclose(final.qvel, qvel_ref, atol=1e-8)
    np.testing.assert_allclose(final.act, act_ref, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(final.qpos[3:7]), 1.0, atol=1e-14)  # unit without renormalizing drift
    assert np.all(np.asarray(traj.substeps) >= 1) and not np.any(np.asarray(traj.diverged))

    def loss_ref(qvel, ctrl):
        qpos, _, act = _mujoco_rk4(FREE, qvel, ctrl, T * 0.01)
        return weights @ np.concatenate([qpos, act])

    eps = 1e-5
    for k in range(7):
        e = np.zeros(7)
        e[k] = eps
        fd = (loss_ref(qvel + e, ctrl) - loss_ref(qvel - e, ctrl)) / (2 * eps)
        np.testing.assert_allclose(g_qvel[k], fd, rtol=1e-6, atol=1e-8)
    fd = (loss_ref(qvel, ctrl + eps) - loss_ref(qvel, ctrl - eps)) / (2 * eps)
    np.testing.assert_allclose(g_ctrl[0], fd, rtol=1e-6)


@pytest.fixture(scope="module")
def contact():
    model = jsn.load_mjcf(CONTACT, integrator="adaptive", rtol=1e-8, atol=1e-8)

    def loss(qvel, friction):
        m = eqx.tree_at(lambda m: m.geom_friction, model, model.geom_friction.at[1, 0].set(friction))
        final, traj = _run(m, qvel, np.zeros(0))
        return final.qpos[0] + 0.5 * final.qpos[1], traj

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def test_toss_matches_mujoco_rk4_and_its_finite_difference_gradients(contact):
    """The gradient of the ODE's flow: central differences of MuJoCo C's RK4 at dt = 2e-5.

    (Differences of the adaptive solver itself are noise below eps ~ 1e-4: a perturbation
    can flip a step's acceptance.)

    The gradient is that of the discrete solution at the substeps taken, and it moves with them:
    over 20 runs at rtol = atol in 0.9e-9 .. 1.1e-8 and with rounding-level changes to the
    Cholesky (XLA loops, LAPACK with and without its eps shift; Newton converged to 1e-15 too),
    the 7-vector d loss / d (qvel, friction) was within 0.5-19% of central differences of MuJoCo
    C's RK4 (cosine >= 0.983), its largest entry within 1% and the friction entry within 0.3-23%.
    Friction is the cause: frictionless (condim 1) the gradient moves by 2e-5 across rtol 0.9e-8 ..
    1.1e-8, with an elliptic cone as much as with the pyramid (stage points land on either side of
    the friction law's kinks). Single small entries are no criterion: the whole gradient is checked
    to 25% and cosine 0.98.
    """
    qvel, friction = np.array([1.0, 0.0, -0.5, 0.0, 2.0, 0.0]), 0.4
    (value, traj), (g_qvel, g_fric) = contact(qvel, friction)
    loss_ref = lambda qv, fr: (lambda q: q[0] + 0.5 * q[1])(_mujoco_rk4(CONTACT, qv, [], T * 0.01, 2e-5, fr)[0])  # noqa: E731
    qpos_ref, _, _ = _mujoco_rk4(CONTACT, qvel, [], T * 0.01, 2e-5)
    np.testing.assert_allclose(traj.qpos[-1], qpos_ref, atol=1e-5)
    assert np.any(np.asarray(traj.contact.mask & (traj.contact.dist < 0)))  # the box hit the floor
    assert int(np.sum(traj.substeps)) > 2 * T  # and needed substeps there
    eps = 1e-5
    fd = lambda f: (f(eps) - f(-eps)) / (2 * eps)  # noqa: E731
    ref = [fd(lambda h: loss_ref(qvel + h * e, friction)) for e in np.eye(6)] + [fd(lambda h: loss_ref(qvel, friction + h))]
    ref, grad = np.array(ref), np.append(np.asarray(g_qvel), g_fric)
    assert abs(ref[-1]) > 0.05  # friction matters: the box slides on the floor
    assert np.linalg.norm(grad - ref) < 0.25 * np.linalg.norm(ref), (grad, ref)
    assert grad @ ref > 0.98 * np.linalg.norm(grad) * np.linalg.norm(ref), (grad, ref)
    np.testing.assert_allclose(grad[0], ref[0], rtol=0.02)


def test_max_steps_flags_the_world_and_leaves_the_others_alone():
    model = jsn.load_mjcf(CONTACT, integrator="adaptive", max_steps=2)
    data = jsn.make_data(model)
    free = data.replace(qpos=data.qpos.at[2].set(5.0))  # high up: free flight needs one substep a step
    crash = data.replace(qvel=data.qvel.at[2].set(-20.0))  # into the floor: many
    batch = lambda a, b: jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)  # noqa: E731
    run = jax.jit(jax.vmap(lambda d: jsn.rollout(model, d, jnp.zeros((5, 0)))[0]))
    mixed, clean = run(batch(free, crash)), run(batch(free, free))
    kind = jsn.WarningKind.INTEGRATOR
    assert bool(mixed.diverged[1]) and int(mixed.warning[1, kind]) == 1 and np.isfinite(mixed.qpos[1]).all()
    assert not bool(mixed.diverged[0]) and int(mixed.warning[0, kind]) == 0
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a[0], b[0])), mixed, clean))
