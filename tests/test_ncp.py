"""The interior-point hard-contact solver (solver="ncp") against analytic mechanics and finite differences.

The main compiled programs: a drop rollout (timestep is a model leaf, so one
compile serves every dt), a slide rollout and its gradient (gravity and friction are
leaves: the incline is the flat scene with gravity tilted by theta) and one saved Problem solved
at every budget; the later tests add small programs each (saved Problems, a pendulum's nonlinear
solve, one dt = 0.05 humanoid step with its gradient).
"""

import functools
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn

G = 9.81

DROP = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1"/>
    <body pos="-1 0 0.3" euler="10 20 5"><freejoint/><geom name="box" type="box" size="0.1 0.1 0.1" mass="1"/></body>
    <body pos="0 0 0.2"><freejoint/><geom name="sphere" type="sphere" size="0.1" mass="1"/></body>
    <body pos="1 0 0.3" euler="30 10 0"><freejoint/><geom name="capsule" type="capsule" size="0.05 0.1" mass="1"/></body>
  </worldbody>
  <sensor>
    <contact geom2="box" reduce="netforce" data="found force"/>
    <contact geom2="sphere" reduce="netforce" data="found force"/>
    <contact geom2="capsule" reduce="netforce" data="found force"/>
  </sensor>
</mujoco>
"""

# a box sliding on a frictionless-by-mixing floor (pair friction = max: the box's own), and
# far away a sphere on an actuated slider (slide x, slide z) pushed along the floor
SLIDE = """
<mujoco>
  <option timestep="0.002" tolerance="1e-13"/>
  <worldbody>
    <geom name="floor" type="plane" size="10 10 .1" friction="0 0 0"/>
    <body name="box" pos="0 0 0.1"><freejoint/><geom name="box" type="box" size="0.1 0.1 0.1" mass="1" friction="0.5 0 0"/></body>
    <body name="slider" pos="4 0 0.1">
      <joint name="x" type="slide" axis="1 0 0"/><joint name="z" type="slide" axis="0 0 1"/>
      <geom name="puck" type="sphere" size="0.1" mass="1" friction="0.3 0 0"/>
    </body>
  </worldbody>
  <actuator><motor joint="x" gear="1"/></actuator>
</mujoco>
"""
T_DROP = 200
T_SLIDE = 150


@pytest.fixture(scope="module")
def drop():
    model = jsn.load_mjcf(DROP, solver="ncp")
    run = jax.jit(lambda m, d: jsn.rollout(m, d, jnp.zeros((T_DROP, 0)))[1])
    return model, run


def _min_distance(mj, qpos):
    """Per state, the smallest signed distance of each body geom to the floor (MuJoCo's own collision)."""
    d = mujoco.MjData(mj)
    out = []
    for q in qpos:
        d.qpos[:] = q
        mujoco.mj_forward(mj, d)
        out.append([mujoco.mj_geomDistance(mj, d, 0, g, 1.0, None) for g in range(1, mj.ngeom)])
    return np.asarray(out)


@pytest.mark.parametrize("dt", [0.1, 0.05, 0.01, 0.001])
def test_drops_never_penetrate_and_rest_on_the_floor(drop, dt):
    model, run = drop
    model = eqx.tree_at(lambda m: m.opt.timestep, model, jnp.asarray(dt))
    traj = run(model, jsn.make_data(model))
    assert np.all(np.asarray(traj.solver_converged)), np.asarray(traj.solver_residual).max()
    dist = _min_distance(mujoco.MjModel.from_xml_string(DROP), np.asarray(traj.qpos))
    assert dist.min() >= -1e-6, (dist.min(), np.unravel_index(dist.argmin(), dist.shape))
    if dt >= 0.01:  # 200 steps: long enough to come to rest
        assert np.all(dist[-1] <= 1e-4), dist[-1]
        assert np.abs(np.asarray(traj.qvel[-1])).max() < 1e-6
        # contact sensors: the floor carries each body's weight, on 4, 1 and 2 contacts
        net = np.asarray(traj.sensordata[-1]).reshape(3, 4)  # per body: found, net force (world)
        np.testing.assert_array_equal(net[:, 0], [4, 1, 2])
        np.testing.assert_allclose(net[:, 1:], [[0, 0, G]] * 3, atol=1e-3)


@pytest.fixture(scope="module")
def slide():
    model = jsn.load_mjcf(SLIDE, solver="ncp", kappa_grad=1e-8)  # kappa_grad == kappa: exact derivative

    def final(m, d, u):
        return jsn.rollout(m, d, jnp.full((T_SLIDE, 1), u))[0]

    def loss(qvel, u, friction, m, d, direction):
        f = final(eqx.tree_at(lambda mm: mm.geom_friction, m, friction), d.replace(qvel=qvel), u)
        return _objective(f, direction)

    return model, jax.jit(final), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _objective(final, direction):
    """Box displacement along the slide direction plus 0.3 x the slider's position."""
    return jnp.dot(final.qpos[:2], direction) + 0.3 * final.qpos[7]


def _slide_setup(model, speed, angle_deg, mu, gravity_tilt_deg=0.0, dt=0.002):
    a, th = np.radians(angle_deg), np.radians(gravity_tilt_deg)
    direction = np.array([np.cos(a), np.sin(a)])
    friction = model.geom_friction.at[1, 0].set(mu)
    m = eqx.tree_at(lambda m: (m.geom_friction, m.opt.gravity, m.opt.timestep), model,
                    (friction, jnp.asarray([G * np.sin(th), 0.0, -G * np.cos(th)]), jnp.asarray(dt)))  # fmt: skip
    data = jsn.make_data(m)
    qvel = data.qvel.at[:2].set(speed * direction)
    return m, data.replace(qvel=qvel), direction


def test_sliding_box_stops_at_the_coulomb_distance_without_drift(slide):
    model, final, _ = slide
    v0, mu = 1.0, 0.5
    m, data, direction = _slide_setup(model, v0, 30.0, mu)
    f = final(m, data, 0.0)
    disp = np.asarray(f.qpos[:2])
    along = disp @ direction
    sideways = disp @ np.array([-direction[1], direction[0]])
    assert along == pytest.approx(v0**2 / (2 * mu * G), rel=0.01)
    assert abs(sideways) <= 1e-6
    assert abs(float(f.qpos[2]) - 0.1) <= 1e-6  # neither sinks nor hovers
    assert np.abs(np.asarray(f.qvel[:6])).max() < 1e-6  # stopped


@pytest.mark.parametrize("mu, sticks", [(0.5, True), (0.2, False)])
def test_box_on_an_incline_sticks_or_slides_at_the_coulomb_acceleration(slide, mu, sticks):
    model, final, _ = slide
    theta, dt = 20.0, 0.004  # tan 20 deg = 0.364; 150 steps of 4 ms = 0.6 s
    m, data, _ = _slide_setup(model, 0.0, 0.0, mu, gravity_tilt_deg=theta, dt=dt)
    f = final(m, data, 0.0)
    x = float(f.qpos[0])
    if sticks:
        assert abs(x) <= 1e-5 and abs(float(f.qpos[1])) <= 1e-5
    else:  # semi-implicit Euler from rest: x_N = a h^2 N (N + 1) / 2
        th = np.radians(theta)
        a = 2 * x / (dt**2 * T_SLIDE * (T_SLIDE + 1))
        assert a == pytest.approx(G * (np.sin(th) - mu * np.cos(th)), rel=0.01)


def test_sliding_gradients_match_analytic_mechanics_and_finite_differences(slide):
    model, final, grad = slide
    v0, mu, u = 1.0, 0.5, 8.0
    m, data, direction = _slide_setup(model, v0, 30.0, mu)
    d = jnp.asarray(direction)
    g_qvel, g_u, g_fr = grad(data.qvel, u, m.geom_friction, m, data, d)

    def loss(qvel, u, friction, m, data, d):  # the forward pass itself, no extra compile
        return _objective(final(eqx.tree_at(lambda mm: mm.geom_friction, m, friction), data.replace(qvel=qvel), u), d)

    # stop distance v0^2 / (2 mu g): d/dv0 = v0 / (mu g), d/dmu = -v0^2 / (2 mu^2 g)
    assert float(jnp.dot(g_qvel[:2], d)) == pytest.approx(v0 / (mu * G), rel=0.03)
    assert float(g_fr[1, 0]) == pytest.approx(-(v0**2) / (2 * mu**2 * G), rel=0.03)

    def central(f, x, eps=1e-6):
        return (f(x + eps) - f(x - eps)) / (2 * eps)

    checks = [
        (g_u, central(lambda s: loss(data.qvel, s, m.geom_friction, m, data, d), u)),
        (g_fr[1, 0], central(lambda s: loss(data.qvel, u, m.geom_friction.at[1, 0].set(s), m, data, d), mu)),
        (g_fr[2, 0], central(lambda s: loss(data.qvel, u, m.geom_friction.at[2, 0].set(s), m, data, d), 0.3)),
    ]
    for i in (0, 1, 5, 6):  # box vx, vy, wz; slider vx
        checks.append((g_qvel[i], central(lambda s: loss(data.qvel.at[i].set(s), u, m.geom_friction, m, data, d), data.qvel[i])))
    for ours, fd in checks:
        assert float(ours) == pytest.approx(float(fd), rel=1e-4, abs=1e-7)


def test_ncp_rejects_what_it_does_not_model():
    with pytest.raises(jsn.UnsupportedFeatureError, match="rk4"):
        jsn.load_mjcf(DROP, solver="ncp", integrator="rk4")
    with pytest.raises(jsn.UnsupportedFeatureError, match="condim 6"):
        jsn.load_mjcf(DROP.replace('type="sphere"', 'type="sphere" condim="6"'), solver="ncp")
    with pytest.raises(jsn.UnsupportedFeatureError, match="frictionloss"):
        jsn.load_mjcf(SLIDE.replace('axis="1 0 0"/>', 'axis="1 0 0" frictionloss="1"/>'), solver="ncp")
    with pytest.raises(ValueError, match="kappa_grad"):
        jsn.load_mjcf(DROP, solver="ncp", kappa=1e-6, kappa_grad=1e-8)
    with pytest.raises(jsn.UnsupportedFeatureError, match="implicit"):
        jsn.load_mjcf(DROP, solver="ncp", grad_mode="unroll")
    with pytest.raises(jsn.UnsupportedFeatureError, match="noslip_iterations"):
        jsn.load_mjcf(DROP.replace("<worldbody>", '<option noslip_iterations="3"/><worldbody>', 1), solver="ncp")


def test_a_deep_penetration_is_undone_at_the_recovery_speed():
    """A sphere starting 5 cm into the floor (dt = 5 ms) is pushed out at `ncp_recovery_speed` (1 m/s:
    ten steps), then flies only as high as that speed carries it; with the limit off (inf) one step
    undoes it at depth / h = 10 m/s (fuzz scenes starting deeply interpenetrating gained kilojoules
    that way, and their 500-step gradients overflowed float32)."""
    xml = """<mujoco><option timestep="0.005"/><worldbody><geom type="plane" size="2 2 .1"/>
      <body pos="0 0 .05"><freejoint/><geom type="sphere" size=".1" mass="1"/></body></worldbody></mujoco>"""
    for speed, first_vz in ((1.0, 1.0), (np.inf, 10.0)):
        model = jsn.load_mjcf(xml, solver="ncp", ncp_recovery_speed=speed)
        traj = jax.jit(lambda m: jsn.rollout(m, jsn.make_data(m), jnp.zeros((40, 0)))[1])(model)
        z = np.asarray(traj.qpos[:, 2])
        assert np.all(np.asarray(traj.solver_converged))
        np.testing.assert_allclose(traj.qvel[0, 2], first_vz, rtol=1e-4)
        steps_out = int(round(0.05 / (0.005 * min(speed, 10.0))))
        assert z[steps_out - 1] >= 0.1 - 1e-6 and np.all(np.diff(z[:steps_out]) > 0)
        assert z.max() <= 0.1 + first_vz**2 / (2 * G) + 0.005 * first_vz
    with pytest.raises(ValueError, match="ncp_recovery_speed"):
        jsn.load_mjcf(xml, solver="ncp", ncp_recovery_speed=0.0)


def test_block_reduction_solves_the_full_newton_system():
    """Unit Jacobians, the reduced Newton direction and the transposed (implicit backward) solve
    against the dense Jacobian of the residual, on a random problem with equality rows and
    active, inactive, frictional and frictionless units."""
    from jaxsim_ncp.solver import ncp

    rng = np.random.default_rng(0)
    n, nv, ne = 6, 5, 2
    A = rng.normal(size=(nv, nv))
    p = ncp.Problem(
        M=jnp.asarray(A @ A.T + nv * np.eye(nv)), momentum=jnp.asarray(rng.normal(size=nv)), h=jnp.asarray(0.01),
        J=jnp.asarray(rng.normal(size=(n, 3, nv))), gap=jnp.asarray(rng.normal(size=n)), mu=jnp.asarray(rng.uniform(size=n)),
        Je=jnp.asarray(rng.normal(size=(ne, nv))), pos_e=jnp.asarray(rng.normal(size=ne)), P=jnp.asarray(rng.uniform(1, 2, n)),
        Pe=jnp.asarray(rng.uniform(1, 2, ne)), L=jnp.asarray(0.2), V=jnp.asarray(20.0),
        active=jnp.asarray([1.0, 1, 0, 1, 1, 0]), friction=jnp.asarray([1.0, 0, 1, 1, 0, 0]),
    )  # fmt: skip
    u = rng.uniform(0.1, 2, size=(n, 8))
    u[:, [2, 5]] += np.linalg.norm(u[:, [3, 4]], axis=1, keepdims=True) + np.linalg.norm(u[:, [6, 7]], axis=1, keepdims=True)  # interior
    x = jnp.concatenate([jnp.asarray(rng.normal(size=nv + ne)), jnp.asarray(u.reshape(-1))])
    b = jnp.asarray(rng.normal(size=x.shape[0]))

    @jax.jit
    def everything(x, p, b):
        axes = (0, 0, 0, None, 0, None, None, None, 0, 0)
        u, Jv = x[nv + ne :].reshape(n, 8), jnp.einsum("ckn,n->ck", p.J, x[:nv])
        args = (u, Jv, p.gap, p.h, p.mu, p.L, p.V, 0.0, p.active, p.friction)
        by_ad = (jax.vmap(jax.jacfwd(ncp._unit_residual, 0), axes)(*args), jax.vmap(jax.jacfwd(ncp._unit_residual, 1), axes)(*args))
        factor = ncp.factorize(x, p)
        r = ncp.residual(x, p, 1e-3)
        reduced = (ncp.newton_direction(factor, p, r), ncp.transposed_solve(factor, p, b))
        nt = ncp._nt(u)
        lam_rows = jax.vmap(ncp._arrow)(nt.lam)
        rows = jnp.concatenate([lam_rows @ nt.W_inv, lam_rows @ nt.W], axis=2)  # Arw(lam) [W^-1 | W] on (xi, eta)
        nt_rows = ncp.unit_jacobians(u, p)[0].at[:, 5:8, 2:].set(jnp.where((p.friction * p.active)[:, None, None] > 0, rows, 0.0))
        nt_inverse = (ncp.factorize(x, p, nt).unit_inv, nt_rows)
        return ncp.unit_jacobians(u, p), by_ad, reduced, jax.jacfwd(ncp.residual)(x, p, 1e-3), r, nt_inverse

    written, by_ad, (direction, transposed), dense, r, (nt_inv, nt_A) = everything(x, p, b)
    for ours, ad in zip(written, by_ad):
        np.testing.assert_array_equal(ours, ad)
    np.testing.assert_allclose(direction, np.linalg.solve(dense, -r), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(transposed, np.linalg.solve(dense.T, b), rtol=1e-9, atol=1e-12)
    frictional = np.asarray(p.friction * p.active) > 0  # the NT-scaled cone rows of the iterations, inverted in closed form
    np.testing.assert_allclose(np.asarray(nt_inv)[frictional] @ np.asarray(nt_A)[frictional], np.broadcast_to(np.eye(8), (int(frictional.sum()), 8, 8)), atol=1e-12)


def test_an_unconverged_solve_returns_its_best_iterate():
    """A humanoid step at dt = 0.05 (saved Problem: 13 active units, two feet sliding) on which the
    iteration came within 4e-6 of the solution at iteration 10, then stalled and wandered to 3e-2:
    whatever the budget, the solver returns the iterate with the smallest residual, so the residual
    it reports never grows with the budget (the last iterate's did, to 3e-2 at the default 30)."""
    from jaxsim_ncp.solver import ncp

    saved = np.load(pathlib.Path(__file__).parent / "data" / "ncp_humanoid_stall.npz")
    p = ncp.Problem(**{k: jnp.asarray(saved[k]) for k in ncp.Problem._fields if k in saved})
    kappa = tolerance = 1e-8
    budgets = jnp.arange(1, 41)

    @jax.jit
    def residual_per_budget(p):
        def one(budget):
            x, done, count, _ = ncp._iterate(ncp._mehrotra_step, ncp.initial_point(p), p, kappa, tolerance, budget, True)
            return ncp.scaled_residual(x, p, kappa), done, count

        return jax.vmap(one)(budgets)

    res, done, count = map(np.asarray, residual_per_budget(p))
    assert np.all(np.isfinite(res))
    assert np.all(np.diff(res) <= 0.0), res
    assert np.all(count <= np.asarray(budgets)) and np.all(res[done] <= tolerance)
    assert res[29] < 1e-4, res  # the default budget of 30


def test_an_infeasible_solve_is_flagged_and_differentiated_with_its_impulses_held():
    """One dof held by two frictionless units 1 cm deep that push opposite ways (coincident bodies):
    gap + h J v >= 0 asks v >= 1 and v <= -1, which no v satisfies. The solve ends unconverged, far
    from any solution, and is differentiated as M v+ = momentum + constant impulse (dv+/dmomentum =
    1/M, nothing through the gaps) instead of at its best iterate (+-50 here, NaN in float32 fuzz
    scenes). With the second unit 5 cm clear the problem is feasible, v+ = -gap_0 / h, and its
    gradient is the implicit one: dv+/dgap_0 = -1/h, dv+/dmomentum = 0."""
    from jaxsim_ncp.solver import ncp

    def problem(gap, momentum):
        return ncp.Problem(
            M=jnp.eye(1), momentum=momentum, h=jnp.asarray(0.01), J=jnp.asarray([[[1.0], [0], [0]], [[-1.0], [0], [0]]]),
            gap=gap, mu=jnp.zeros(2), Je=jnp.zeros((0, 1)), pos_e=jnp.zeros(0), P=jnp.full(2, 0.1), Pe=jnp.zeros(0),
            L=jnp.asarray(0.1), V=jnp.asarray(10.0), active=jnp.ones(2), friction=jnp.zeros(2),
        )  # fmt: skip

    @jax.jit
    def next_velocity_and_gradient(gap):
        def v_next(gap, momentum):
            sol = ncp.solve(problem(gap, momentum), 1e-8, 1e-8, 1e-8, 30)
            return sol.qvel[0], sol

        return jax.value_and_grad(v_next, argnums=(0, 1), has_aux=True)(gap, jnp.zeros(1))

    (_, sol), (d_gap, d_momentum) = next_velocity_and_gradient(jnp.asarray([-0.01, -0.01]))
    assert not bool(sol.converged) and float(sol.residual) > 1e-3
    np.testing.assert_array_equal(d_gap, [0.0, 0.0])
    np.testing.assert_allclose(d_momentum, [1.0], rtol=1e-12)
    (v, sol), (d_gap, d_momentum) = next_velocity_and_gradient(jnp.asarray([-0.01, 0.05]))
    assert bool(sol.converged)
    np.testing.assert_allclose(v, 1.0, rtol=1e-6)
    np.testing.assert_allclose(d_gap, [-100.0, 0.0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d_momentum, [0.0], atol=1e-4)


def test_float32_derivative_agrees_with_float64_where_the_centering_stalls():
    """Three steps of a fuzz scene (seed 7016, group 1663471682, scene 164: a capsule and two spheres
    on a plane, mu 1.3; the Problems float32 steps 434, 479, 298 differentiate, saved by
    `experiments/ncp_step_jacobian.py --save-problems`), where the kappa_grad centering
    that the derivative linearizes at does not converge in either precision: a sliding unit whose
    dual sits on its cone boundary makes it cycle. Its best iterate was then the hard solution itself,
    whose blocks float32 cannot resolve: d v+ / d momentum came out 26-180x float64's (norm 300-3000
    against 13-16), and a 500-step rollout gradient 5.6e14 against 416. The derivative is now taken
    where every pair is moved onto the central path in closed form: float32 within 10% of float64."""
    from jaxsim_ncp.solver import ncp

    saved = np.load(pathlib.Path(__file__).parent / "data" / "ncp_centering_stall.npz")

    def jacobians(dtype):
        p = ncp.Problem(**{k: jnp.asarray(saved[k], dtype) for k in ncp.Problem._fields if k in saved})
        kappa = tolerance = max(1e-8, 100 * float(jnp.finfo(dtype).eps))  # forward's float32 floor

        def next_velocity(p, momentum):
            return ncp.solve(p._replace(momentum=momentum), kappa, 1e-4, tolerance, 30).qvel

        return np.asarray(jax.jit(jax.vmap(jax.jacrev(next_velocity, argnums=1)))(p, p.momentum), np.float64)

    j32, j64 = jacobians(jnp.float32), jacobians(jnp.float64)
    norm = functools.partial(np.linalg.norm, ord=2, axis=(1, 2))
    assert np.all(np.isfinite(j32)) and np.all(norm(j64) < 20), norm(j64)
    np.testing.assert_array_less(norm(j32 - j64) / norm(j64), 0.1)


def test_the_predictor_aims_at_kappa_so_the_iteration_has_no_spurious_fixed_point():
    """A humanoid foot's step at dt = 0.01 (saved Problem, float32 run of experiments/ncp_convergence.py:
    8 contacts, two carrying the load while sliding slowly), solved in float64 at the float32 run's
    kappa. When the affine predictor aimed at zero complementarity, Mehrotra's corrector (built from
    it) kept a bias of order kappa at the solution: the iteration stopped moving with the scaled
    residual at 7.4e-5 for ever. Aimed at kappa, and with full Newton steps where the cone boundary
    allows, it converges quadratically (1e-4, 4e-7, 1e-13)."""
    from jaxsim_ncp.solver import ncp

    saved = np.load(pathlib.Path(__file__).parent / "data" / "ncp_humanoid_fixed_point.npz")
    p = ncp.Problem(**{k: jnp.asarray(saved[k]) for k in ncp.Problem._fields if k in saved})
    kappa, tolerance = 1.1920929e-05, 1e-12

    @jax.jit
    def solve(p):
        x, done, count, _ = ncp._iterate(ncp._mehrotra_step, ncp.initial_point(p), p, kappa, tolerance, 30, True)
        return ncp.scaled_residual(x, p, kappa), done, count

    res, done, count = map(np.asarray, solve(p))
    assert done and res <= tolerance and count <= 20, (res, count)


def test_a_redundant_equality_row_converges_with_bounded_impulses():
    """A connect 0.4 m below a ball joint's centre leaves only the spin about that axis free, and
    its third row is redundant (no velocity changes it to first order, its drift is second order).
    Without the equality rows' regularization the solve stalled on that drift (3 of 30 steps
    unconverged) and reported impulses of 1e20; the motion must stay the free spin."""
    xml = """<mujoco><option timestep="0.01"/><worldbody><body name="b" pos="0 0 1"><joint type="ball" damping="0.01"/>
      <geom type="box" size="0.05 0.05 0.2" pos="0 0 -0.2"/></body></worldbody>
      <equality><connect body1="b" body2="world" anchor="0 0 -0.4"/></equality></mujoco>"""
    model = jsn.load_mjcf(xml, solver="ncp")
    data = jsn.make_data(model).replace(qvel=jnp.array([0.3, 0.2, 3.0]))  # off-axis velocity the connect removes
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.zeros((30, 0)))
    assert np.all(traj.solver_converged)
    # N: the first step stops the off-axis rotation (~17 N over 0.01 s); after it the box, 6.3 N,
    # hangs from its joint and the connect carries (almost) nothing
    assert np.max(np.abs(traj.efc_force[1:])) < 1.0
    assert np.max(np.abs(traj.qvel[5:, :2])) < 1e-5 and np.all(traj.qvel[:, 2] > 1.0)


def test_a_warm_start_converges_to_the_cold_solution_and_restarts_cold_when_astray():
    """`ncp.warm_point` (the re-linearized pass starts from the last pass's solution), on the
    humanoid foot's step (saved Problem, float64): from the solution of the same step with 2% less
    momentum it reaches the cold start's solution; from impulses 50x too large and reversed it
    still does (after `_WARM_RESTART` iterations it starts again cold); `use` False is the cold solve."""
    from jaxsim_ncp.solver import ncp

    saved = np.load(pathlib.Path(__file__).parent / "data" / "ncp_humanoid_fixed_point.npz")
    p = ncp.Problem(**{k: jnp.asarray(saved[k]) for k in ncp.Problem._fields if k in saved})
    kappa = 1.1920929e-05
    solve = jax.jit(lambda p, start: ncp.solve(p, kappa, kappa, 1e-10, 30, start=start))
    near = ncp.solve(p._replace(momentum=0.98 * p.momentum), kappa, kappa, 1e-10, 30)
    starts = {
        "near": (near.qvel, near.impulse, near.impulse_e, True),
        "astray": (near.qvel, -50.0 * near.impulse, near.impulse_e, True),
        "unused": (near.qvel, near.impulse, near.impulse_e, False),
    }
    cold = ncp.solve(p, kappa, kappa, 1e-10, 30)
    assert cold.converged
    for name, start in starts.items():
        warm = solve(p, start)
        assert warm.converged, name
        np.testing.assert_allclose(warm.qvel, cold.qvel, rtol=1e-7, atol=1e-9, err_msg=name)
        if name == "astray":  # converged only after the cold restart; the fixed-count scan agrees
            assert int(warm.iterations) > ncp._WARM_RESTART, int(warm.iterations)
            scanned = ncp.solve(p, kappa, kappa, 1e-10, 30, early_exit=False, start=start)
            assert int(scanned.iterations) == int(warm.iterations)
            np.testing.assert_allclose(scanned.qvel, warm.qvel, rtol=1e-12, atol=1e-14)
    unused = solve(p, starts["unused"])  # the same iterates (another program: round-off aside)
    assert int(unused.iterations) == int(cold.iterations)
    np.testing.assert_allclose(unused.qvel, cold.qvel, rtol=1e-10, atol=1e-12)


def test_the_nonlinear_gap_stops_a_swinging_foot_on_the_floor_with_analytic_gradients():
    """`ncp.solve_nonlinear` on a pendulum whose foot swings into the floor in one step (dt = 0.05,
    1 rad per step: the arc the humanoid's feet follow at dt = 0.05). Foot at angle t from the
    vertical, gap(t) = H - R cos t: the linear gap (the tangent at the start) stops the foot ~30 mm
    above the floor;
    with the gap evaluated at every iterate the step ends where the arc meets the floor,
    t0 + h v* = arccos(H / R), and the implicit gradient of that solution (the problem re-linearized
    at v*, as `forward._ncp_solve` differentiates it) is the analytic dv*/dt0 = -1/h, dv*/dv0 = 0."""
    from jaxsim_ncp.solver import ncp

    R, H, h, inertia, kappa = 0.5, 0.45, 0.05, 0.25, 1e-10
    gap = lambda t: H - R * jnp.cos(t)  # noqa: E731
    slope = jax.grad(gap)

    def problem(t0, v0, v):  # impulses along the normal at t0; the gap at t0 + h v, linearized about v
        v = jnp.reshape(v, ())
        t = t0 + h * v
        J = jnp.zeros((1, 3, 1)).at[0, 0, 0].set(slope(t0))
        G = J.at[0, 0, 0].set(slope(t))
        one = jnp.ones(1)
        return ncp.Problem(
            M=jnp.full((1, 1), inertia), momentum=inertia * v0[None], h=jnp.asarray(h), J=J, gap=(gap(t) - h * slope(t) * v)[None],
            mu=0 * one, Je=jnp.zeros((0, 1)), pos_e=jnp.zeros(0), P=one, Pe=jnp.zeros(0), L=jnp.asarray(R),
            V=jnp.asarray(R / h), active=one, friction=0 * one, G=G,
        )  # fmt: skip

    def next_velocity(t0, v0):
        relinearize = functools.partial(problem, *jax.lax.stop_gradient((t0, v0)))
        sol = ncp.solve_nonlinear(relinearize(jax.lax.stop_gradient(v0)), relinearize, kappa, 1e-10, 60)
        v_star = jax.lax.stop_gradient(sol.qvel[0])
        again = ncp.solve(problem(t0, v0, v_star), kappa, kappa, 1e-10, 60, solved=(sol.x, sol.converged, sol.iterations))
        return again.qvel[0], (sol, ncp.solve(problem(t0, v0, 0.0)._replace(G=None), kappa, kappa, 1e-10, 60))

    t0, v0 = -1.0, 20.0
    (v, (sol, linear)), grads = jax.jit(jax.value_and_grad(next_velocity, argnums=(0, 1), has_aux=True))(t0, v0)
    t_contact = -np.arccos(H / R)
    assert sol.converged and linear.converged
    assert gap(t0 + h * linear.qvel[0]) > 0.02  # the tangent's prediction: the foot stops in the air
    np.testing.assert_allclose(t0 + h * v, t_contact, atol=1e-8)
    assert sol.impulse[0, 0] > 0
    np.testing.assert_allclose(grads, (-1.0 / h, 0.0), atol=1e-6)


def test_dt_005_humanoid_steps_stop_their_feet_on_the_floor_with_exact_gradients():
    """Steps of the mjx humanoid at dt = 0.05 under random controls that earlier passes sank
    (saved states of experiments/ncp_humanoid_worlds.py, the state before the step; world, step,
    control amplitude: 5, 31, 0.3; 8, 36, 0.3; 11, 38, 0.2):
    0. feet touching the floor, joints swinging them on arcs the linearized gap cannot follow: the
       re-linearized passes alone (`ncp_nonlinear_gap=False`) sank a foot 5.3 mm;
    1. two contacts come into reach only at the first pass's configuration: a nonlinear pass that
       left them out sank the feet 12 mm;
    2. the body falls spinning at 6 rad/s: the nonlinear pass with impulse directions at q gains
       energy (rejected), the next takes them where that pass ended; 42 mm before.
    Each ends converged without penetrating (MuJoCo's collision on the new qpos). The implicit
    gradient (kappa_grad = kappa) equals central differences in 0 and 1 (the two new units' rows are
    differentiated at the step's end, not where the pass took them); in 2 the directions depend on
    an earlier pass's solution, held fixed: finite, not exact."""
    path = pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data" / "humanoid" / "humanoid.xml"
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.timestep = 0.05
    saved = np.load(pathlib.Path(__file__).parent / "data" / "ncp_humanoid_dt005_states.npz")
    model = jsn.from_mujoco(m, solver="ncp", integrator="implicitfast", kappa_grad=1e-8)
    weights = jnp.asarray(np.random.default_rng(1).normal(size=m.nq))

    @jax.jit
    @functools.partial(jax.value_and_grad, has_aux=True)
    def loss(qvel, qpos, ctrl):
        after = jsn.step(model, jsn.make_data(model).replace(qpos=qpos, qvel=qvel, ctrl=ctrl))
        return weights @ after.qpos, after

    d = mujoco.MjData(m)
    for case, (qpos, qvel, ctrl) in enumerate(zip(*(jnp.asarray(saved[k]) for k in ("qpos", "qvel", "ctrl")))):
        (_, after), grad = loss(qvel, qpos, ctrl)
        assert after.solver_converged, case
        d.qpos[:] = np.asarray(after.qpos)
        mujoco.mj_forward(m, d)
        assert min([0.0] + [d.contact[i].dist for i in range(d.ncon)]) > -1e-6, case
        assert np.all(np.isfinite(grad)), case
        for seed in range(2 if case < 2 else 0):
            e = jnp.asarray(np.random.default_rng(seed + 2).normal(size=m.nv))
            fd = (loss(qvel + 1e-6 * e, qpos, ctrl)[0][0] - loss(qvel - 1e-6 * e, qpos, ctrl)[0][0]) / 2e-6
            np.testing.assert_allclose(grad @ e, fd, rtol=1e-4)
