"""Central finite differences (float64) against jax.grad through step and rollout."""

import functools

import equinox as eqx
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from models import ALL

EPS = 1e-6


@functools.cache
def setup(name: str, integrator: str):
    model = jsn.load_mjcf(ALL[name], integrator=integrator)
    rng = np.random.default_rng(3)
    m = mujoco.MjModel.from_xml_string(ALL[name])
    qpos = np.array(m.qpos0)
    for j in range(m.njnt):  # random unit quaternions / angles
        adr, t = m.jnt_qposadr[j], m.jnt_type[j]
        n = {0: 7, 1: 4}.get(int(t), 1)
        if t in (0, 1):
            q = rng.normal(size=4)
            qpos[adr + n - 4: adr + n] = q / np.linalg.norm(q)
        else:
            qpos[adr] += 0.3 * rng.normal()
    data = jsn.make_data(model).replace(
        qpos=jnp.asarray(qpos), qvel=jnp.asarray(rng.normal(size=m.nv)), act=jnp.asarray(0.1 * rng.normal(size=m.na))
    )
    weights = jnp.asarray(rng.normal(size=m.nq + m.nv))
    ctrl = jnp.asarray(0.3 * rng.uniform(-1, 1, size=(50, m.nu)))
    return model, data, weights, ctrl


def loss_from(final: jsn.Data, weights) -> jax.Array:
    return jnp.dot(weights, jnp.concatenate([final.qpos, final.qvel])) + 0.1 * jnp.sum(final.act**2)


def check_directional(f, x, rng, n_dirs: int = 2, rtol: float = 1e-5, value_and_grad=None):
    """grad(f)(x) . u == (f(x + eps u) - f(x - eps u)) / (2 eps) for random directions u (pytrees).

    `value_and_grad`: a compiled value_and_grad of f, if there is one (otherwise jitted here).
    The differences evaluate f through it too: one compiled program, not two (compile time
    dominates these tests, not the gradient's run time).
    """
    if value_and_grad is None:
        value_and_grad = jax.jit(jax.value_and_grad(f))
    value, grad = value_and_grad(x)
    assert np.isfinite(float(value))
    f = lambda y: value_and_grad(y)[0]  # noqa: E731
    leaves, treedef = jax.tree.flatten(x)
    grad_leaves = jax.tree.leaves(grad)
    for _ in range(n_dirs):
        # directions scaled to each leaf's magnitude (a timestep of 2e-3 gets a 2e-3-sized direction)
        u = [jnp.asarray(rng.normal(size=np.shape(leaf)) * max(float(jnp.mean(jnp.abs(leaf))), 1e-3)) for leaf in leaves]
        along = lambda s: jax.tree.unflatten(treedef, [leaf + s * d for leaf, d in zip(leaves, u)])  # noqa: E731
        fd = (f(along(EPS)) - f(along(-EPS))) / (2 * EPS)
        ad = sum(jnp.vdot(g, d) for g, d in zip(grad_leaves, u))
        assert np.isfinite(float(ad))
        assert abs(float(ad) - float(fd)) <= rtol * max(1.0, abs(float(fd))), (float(ad), float(fd))


CASES = [("arm", "euler"), ("arm", "implicitfast"), ("ball_chain", "rk4"), ("free_spinner", "implicitfast"), ("slider", "euler")]


@pytest.mark.parametrize("name,integrator", CASES)
def test_grad_step_state_and_ctrl(name, integrator):
    model, data, weights, ctrl = setup(name, integrator)
    rng = np.random.default_rng(0)

    def f(x):
        qpos, qvel, u = x
        return loss_from(jsn.step(model, data.replace(qpos=qpos, qvel=qvel, ctrl=u)), weights)

    check_directional(f, (data.qpos, data.qvel, ctrl[0]), rng)


@pytest.mark.parametrize("name,integrator", CASES)
def test_grad_rollout_state_ctrl_and_parameters(name, integrator):
    model, data, weights, ctrl = setup(name, integrator)
    rng = np.random.default_rng(1)

    def f(x):
        qpos, qvel, u, mass, damping, timestep = x
        m = eqx.tree_at(lambda m: (m.body_mass, m.dof_damping, m.opt.timestep), model, (mass, damping, timestep))
        final, _ = jsn.rollout(m, data.replace(qpos=qpos, qvel=qvel), u)
        return loss_from(final, weights)

    x = (data.qpos, data.qvel, ctrl, model.body_mass, model.dof_damping, model.opt.timestep)
    check_directional(f, x, rng, rtol=1e-5)


def test_grad_with_respect_to_whole_model():
    """jax.grad of a rollout loss w.r.t. the Model pytree itself: every float leaf gets a gradient."""
    model, data, weights, ctrl = setup("arm", "implicitfast")
    rng = np.random.default_rng(2)

    def f(m):
        final, _ = jsn.rollout(m, data, ctrl[:20])
        return loss_from(final, weights)

    value_and_grad = jax.jit(jax.value_and_grad(f))  # also the differences' f: one compiled program
    grad = value_and_grad(model)[1]
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grad))
    for getter in (lambda m: m.actuator_gainprm, lambda m: m.body_inertia, lambda m: m.dof_armature,
                   lambda m: m.jnt_pos, lambda m: m.body_ipos, lambda m: m.opt.gravity):
        direction = jnp.asarray(rng.normal(size=getter(model).shape))
        g = lambda s: value_and_grad(eqx.tree_at(getter, model, getter(model) + s * direction))[0]  # noqa: E731
        fd = (g(EPS) - g(-EPS)) / (2 * EPS)
        ad = jnp.vdot(getter(grad), direction)
        assert abs(float(ad) - float(fd)) <= 1e-5 * max(1.0, abs(float(fd)))


def test_gradients_finite_at_rest_and_identity():
    """Zero angular velocity and identity quaternions are Taylor-branch points: gradients stay finite."""
    model = jsn.load_mjcf(ALL["free_spinner"], integrator="implicitfast")
    data = jsn.make_data(model)  # qvel = 0

    def f(qvel):
        return jnp.sum(jsn.step(model, data.replace(qvel=qvel)).qpos ** 2)

    g = jax.grad(f)(jnp.zeros(model.nv))
    assert np.all(np.isfinite(np.asarray(g)))
    ball = jsn.load_mjcf(ALL["ball_chain"])
    bdata = jsn.make_data(ball)
    g = jax.grad(lambda q: jnp.sum(jsn.step(ball, bdata.replace(qpos=q)).qvel ** 2))(ball.qpos_spring)
    assert np.all(np.isfinite(np.asarray(g)))


def test_small_math_helpers_keep_only_their_arguments_for_reverse_mode(capsys):
    """`math.recomputed` helpers save their inputs, not their intermediates, as residuals (each
    residual is a per-step store in a differentiated rollout), and their derivatives are those of
    the same formulas without it (float64, to rounding)."""
    from jaxsim_ncp import math

    rng = np.random.default_rng(0)
    q, p = (jnp.asarray(rng.normal(size=(3, 4))) for _ in range(2))
    v, m = (jnp.asarray(rng.normal(size=(3, 6))) for _ in range(2))
    cases = [(math.quat_to_mat, (q,)), (math.quat_mul, (q, p)), (math.quat_integrate, (q, v[:, :3], 0.01)),
             (math.cross_motion, (v, m)), (math.cross_force, (v, m)), (math.quat_sub, (q, p)),
             (math.make_frame, (v[0, :3], m[0, :3])), (math.spatial_inertia, (v[:, 0], math.skew(m[:, :3]), v[:, 3:]))]
    for fn, args in cases:
        loss = lambda *a: jnp.sum(jnp.sin(fn(*a)))  # noqa: E731
        jax.ad_checkpoint.print_saved_residuals(loss, *args)
        saved = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
        allowed = ("from the argument", "from a constant", "output of cos")  # cos: the loss's own sin
        assert saved and all(any(a in line for a in allowed) for line in saved), (fn.__name__, saved)
        every = tuple(range(len(args)))
        plain = lambda *a: jnp.sum(jnp.sin(fn.__wrapped__(*a)))  # noqa: E731
        for g, g_plain in zip(jax.grad(loss, every)(*args), jax.grad(plain, every)(*args)):
            np.testing.assert_allclose(g, g_plain, rtol=1e-12, atol=1e-14)
