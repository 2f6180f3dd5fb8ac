"""Planner and sysid building blocks: contacts from distance give a plan that never touches
the object a gradient (exactly zero without), checked against central finite differences;
sysid's bound reparameterization keeps every iterate inside its bounds."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxsim_ncp as jsn
from jaxsim_ncp import sysid
from jaxsim_ncp.control import GradientMPC, make_task, plan_cost


def test_cfd_gives_an_untouched_object_a_gradient():
    task = make_task("pusher", reach_weight=0.0, ctrl_weight=0.0)  # the cost sees only the box
    start = task.sample_start(jax.random.PRNGKey(0))
    start = start.replace(qpos=start.qpos.at[:4].set(jnp.array([-0.1, 0.0, 0.1, 0.0])))  # finger 0.12 m behind the box
    plan = jnp.full((6, 2), 0.2)
    grads = {}
    for width in (None, 0.25):
        cfd = None if width is None else jsn.CFD(width=width, pairs=(("finger", "box"),))  # the floor's stay MuJoCo's
        model = GradientMPC(task, cfd=cfd).model
        cost_and_grad = jax.jit(jax.value_and_grad(lambda p, m=model: plan_cost(task, m, start, p)))
        grads[width] = cost_and_grad(plan)[1]
        direction, eps = jnp.zeros_like(plan).at[:, 0].set(1.0), 1e-5
        fd = (cost_and_grad(plan + eps * direction)[0] - cost_and_grad(plan - eps * direction)[0]) / (2 * eps)
        assert abs(float(fd)) < 1e-9  # the forward pass never touches the box: its cost does not change
    assert np.all(np.asarray(grads[None]) == 0.0)
    # with CFD: pushing the finger towards the box (and the goal, +x) lowers the cost
    assert float(jnp.sum(grads[0.25][:, 0])) < 0 and np.all(np.isfinite(np.asarray(grads[0.25])))


def test_sysid_bounds_hold_along_any_latent():
    theta0 = jnp.array([0.03, 0.5, 2.0, -1.0])
    lo = jnp.array([0.005, 0.0, -jnp.inf, -jnp.inf])
    hi = jnp.array([0.15, jnp.inf, 3.0, jnp.inf])
    reparam = sysid._Reparam(theta0, lo, hi)
    np.testing.assert_allclose(reparam.theta(reparam.z0()), theta0, rtol=1e-6)
    for z in (-50.0, -3.0, 0.0, 3.0, 50.0):
        theta = reparam.theta(jnp.full(4, z))
        assert np.all(np.isfinite(np.asarray(theta)))
        assert lo[0] <= theta[0] <= hi[0] and theta[1] >= 0.0 and theta[2] <= 3.0
        grad = jax.grad(lambda z: jnp.sum(reparam.theta(z)))(jnp.full(4, z))
        assert np.all(np.isfinite(np.asarray(grad)))


def test_sysid_fit_recovers_a_masked_subset_of_a_leaf_from_mujoco_recordings():
    """`fit(model, where, ..., mask=)`: joint dampings of MuJoCo's own trajectories (the
    oracle). Only the first two dofs are fitted; the masked-out ones stay bitwise at their
    start, and the last one may sit on the bound (damping 0) because it is not fitted."""
    import mujoco

    from models import HINGE_CHAIN

    mj = mujoco.MjModel.from_xml_string(HINGE_CHAIN)
    truth = mj.dof_damping.copy()
    d = mujoco.MjData(mj)
    d.qvel[:] = [2.0, -1.5, 1.0, 0.5]
    qpos, qvel = [d.qpos.copy()], [d.qvel.copy()]
    for _ in range(60):
        mujoco.mj_step(mj, d)
        qpos.append(d.qpos.copy())
        qvel.append(d.qvel.copy())
    start = truth * np.array([3.0, 0.2, 1.0, 1.0])
    assert truth[3] == 0.0
    model = eqx.tree_at(lambda m: m.dof_damping, jsn.from_mujoco(mj), jnp.asarray(start))
    mask = np.array([True, True, False, False])
    result = sysid.fit(model, lambda m: m.dof_damping, np.stack(qpos), np.stack(qvel), horizon=30,
                       lower=0.0, mask=mask, learning_rate=0.1, iterations=80)  # fmt: skip
    fitted = np.asarray(result.params)
    np.testing.assert_array_equal(fitted[~mask], start[~mask])
    np.testing.assert_allclose(fitted[mask], truth[mask], rtol=0.01)
    assert result.loss_history[result.best_iteration] < 1e-2 * result.loss_history[0]
    assert result.nonfinite_grads == 0


def test_line_search_over_knots_moves_to_the_cheapest_scaled_update():
    """GradientMPC(knots=3, line_search=...): one iteration evaluates the warm start and the
    optimizer's update at every scale, and returns the cheapest of them (recomputed here) as a
    linear interpolation of the 3 knots inside the control bounds. The optimizer's update is a
    fixed direction here, so the check needs no gradient (CFD's is checked above)."""
    import optax

    task = make_task("pusher")
    start = task.sample_start(jax.random.PRNGKey(1))
    start = start.replace(qpos=start.qpos.at[:4].set(jnp.array([0.02, 0.0, 0.1, 0.02])))  # finger at the box
    direction = jnp.array([[0.4, -0.2], [-0.3, 0.5], [0.6, 0.1]])
    fixed = optax.GradientTransformation(lambda x: optax.EmptyState(), lambda g, state, x=None: (direction, state))
    scales = (0.5, 1.0, 2.0)
    planner = GradientMPC(task, horizon=5, iterations=1, optimizer=fixed, clip_norm=None, knots=3, line_search=scales)
    weights = planner.knot_weights()
    np.testing.assert_allclose(weights.sum(1), 1.0)
    np.testing.assert_allclose(GradientMPC(task, horizon=5, knots=5).knot_weights(), np.eye(5))
    warm = jnp.array([[0.9, 0.1], [0.5, 0.0], [0.8, -0.3], [0.2, 0.9], [0.6, 0.6]])  # knots at steps 0, 2, 4
    state, cost = jax.jit(planner.plan)(planner.init(jax.random.PRNGKey(0))._replace(plan=warm), start)

    candidates = jnp.stack([warm[::2]] + [jnp.clip(warm[::2] + s * direction, -1.0, 1.0) for s in scales])
    costs = jax.jit(jax.vmap(lambda x: plan_cost(task, task.model, start, weights @ x)))(candidates)
    assert float(jnp.max(costs) - jnp.min(costs)) > 1e-6  # the scales differ: the choice is not a tie
    np.testing.assert_allclose(float(cost), float(jnp.min(costs)), rtol=1e-12)
    np.testing.assert_allclose(state.plan, weights @ candidates[int(jnp.argmin(costs))], rtol=1e-12)
    assert int(jnp.argmin(costs)) == 3  # the largest step, clipped to the control bounds, is the cheapest
    assert float(jnp.max(jnp.abs(state.plan))) == 1.0
