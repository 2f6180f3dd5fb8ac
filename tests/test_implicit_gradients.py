"""Gradients through collision, constraint rows and the Newton solver (float64).

For every constraint type (contacts with condim 3/4/6 under both cones, hinge/slide/ball
limits, friction loss, connect/weld/joint equalities) and the parameters users fit
(geom size/friction/solref/solimp, body mass, damping, gear, timestep, ...):

- implicit gradients (custom_vjp at the solution, the default) equal gradients
  unrolled through the converged solver iterations to 1e-6;
- both equal central finite differences to 1e-4 at states where the dynamics are
  smooth (every constraint strictly inside one zone of its penalty);
- gradients stay finite where a contact or limit sits exactly at its activation boundary.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp.solver.implicit import implicit_solver
from test_gradients import check_directional

def test_implicit_solver_differentiates_a_non_differentiable_solver():
    """Roots of g(x) = x^3 + a x - c found by bisection (no derivative through it):
    dx/da = -x / (3x^2 + a), dx/dc = 1 / (3x^2 + a), with the default dense-LU backward pass."""

    def bisect(theta, bracket):
        a, c = theta

        def body(lohi, _):
            lo, hi = lohi
            mid = 0.5 * (lo + hi)
            up = mid**3 + a * mid - c > 0
            return (jnp.where(up, lo, mid), jnp.where(up, mid, hi)), None

        (lo, hi), _ = jax.lax.scan(body, bracket, None, length=200)
        return jnp.atleast_1d(jax.lax.stop_gradient(0.5 * (lo + hi))), jnp.int32(200)

    residual = lambda x, theta: x**3 + theta[0] * x - theta[1]  # noqa: E731
    root = implicit_solver(bisect, residual)
    a, c = 2.0, 5.0
    x, grad = jax.value_and_grad(lambda th: root(th, (-10.0, 10.0))[0][0])((a, c))
    np.testing.assert_allclose(x**3 + a * x, c, rtol=1e-13)
    np.testing.assert_allclose(grad, [-x / (3 * x**2 + a), 1 / (3 * x**2 + a)], rtol=1e-12)

    # a singular dg/dx (x^3 = c at c = 0): no implicit derivative, a zero one instead of NaN
    cube_root = implicit_solver(lambda c, _: (jnp.zeros(1), jnp.int32(0)), lambda x, c: x**3 - c)
    assert jax.grad(lambda c: cube_root(c, None)[0][0])(0.0) == 0.0


_OPTION = '<option timestep="0.005" iterations="40" ls_iterations="20" tolerance="1e-13"/>'
_NOCOLLIDE = 'contype="0" conaffinity="0"'

CONTACTS = f"""<mujoco>{_OPTION}<worldbody>
  <geom type="plane" size="5 5 .1"/>
  <body pos="0 0 .07" quat=".995 .07 .05 0"><freejoint/><geom type="box" size=".1 .08 .06" friction=".8"/></body>
  <body pos="1 0 .048"><freejoint/><geom type="sphere" size=".05" condim="4"/></body>
  <body pos="1.03 0 .145" quat=".96 0 .28 0"><freejoint/><geom type="capsule" size=".04 .08" condim="6"/></body>
</worldbody></mujoco>"""

JOINTS = f"""<mujoco>{_OPTION}<worldbody>
  <body pos="0 0 1"><joint name="h1" type="hinge" axis="0 1 0" range="-30 30" frictionloss=".2" damping=".3"/>
    <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" {_NOCOLLIDE}/>
    <body pos=".3 0 0"><joint name="h2" type="hinge" axis="0 1 0" range="-10 10"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" {_NOCOLLIDE}/>
      <body pos=".3 0 0"><joint name="s" type="slide" axis="1 0 0" range="-.05 .05" frictionloss=".1"/>
        <geom type="sphere" size=".05" {_NOCOLLIDE}/>
        <body pos=".1 0 0"><joint type="ball" range="0 20" damping=".1"/>
          <geom type="capsule" fromto="0 0 0 0 0 -.2" size=".03" {_NOCOLLIDE}/></body></body></body></body>
</worldbody><actuator><motor joint="h1" gear="2"/><position joint="h2" kp="5"/></actuator></mujoco>"""

EQUALITY = f"""<mujoco>{_OPTION}<worldbody>
  <body name="a" pos="0 0 .5"><freejoint/><geom type="box" size=".1 .05 .05" {_NOCOLLIDE}/><site name="sa" pos=".05 .1 0"/></body>
  <body name="b" pos=".25 0 .5" quat=".9 .1 .2 .3"><freejoint/><geom type="box" size=".1 .05 .05" {_NOCOLLIDE}/>
    <site name="sb" pos=".05 .02 -.01" quat=".8 .2 .4 .4"/></body>
  <body name="e" pos=".3 .1 .55" quat=".7 .1 -.3 .2"><freejoint/><geom size=".05" {_NOCOLLIDE}/><site name="se" quat=".6 -.2 .5 .3"/></body>
  <body name="c" pos="0 .3 .6"><joint type="hinge" axis="1 0 0" damping=".2"/>
    <geom type="capsule" fromto="0 0 0 0 .2 0" size=".03" {_NOCOLLIDE}/>
    <body name="d" pos="0 .2 0"><joint name="j2" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 .2 0" size=".03" {_NOCOLLIDE}/><site name="sd" pos="0 .2 0"/></body></body>
</worldbody><equality><weld body1="a" body2="b" torquescale="2"/><connect body1="c" body2="a" anchor="0 .1 0"/>
  <joint joint1="j2" polycoef=".1 .5 .2 0 0"/><weld site1="se" site2="sb" torquescale=".5"/><connect site1="sd" site2="sa"/></equality>
<actuator><motor joint="j2" gear="1.5"/></actuator></mujoco>"""

_BALL = np.array([np.cos(np.deg2rad(12.5)), 0.0, np.sin(np.deg2rad(12.5)), 0.0])  # 25 deg: past its 20 deg limit


def _contact_params(m):
    return m.geom_friction, m.geom_solref, m.geom_solimp, m.geom_size, m.body_mass, m.opt.timestep


def _joint_params(m):
    return m.jnt_range, m.jnt_solref, m.jnt_solimp, m.dof_frictionloss, m.dof_damping, m.actuator_gear, m.body_mass, m.opt.timestep


def _equality_params(m):
    return m.eq_solref, m.eq_solimp, m.eq_data, m.site_pos, m.site_quat, m.dof_damping, m.actuator_gear, m.body_mass, m.opt.timestep


# name -> (xml, qpos or None, params, expected active rows (equality, friction loss, limits, contacts),
#          qpos edit putting a contact or limit exactly at its activation boundary)
SCENES = {
    "contacts": (CONTACTS, None, _contact_params, (False, False, False, True), lambda q: q.at[9].set(0.05)),  # sphere touching
    "joints": (
        JOINTS, np.concatenate([[0.55, -0.19, 0.06], _BALL]), _joint_params, (False, True, True, False),
        lambda q: q.at[0].set(np.deg2rad(30.0)).at[2].set(0.05),  # hinge and slide exactly at their bounds
    ),
    "equality": (EQUALITY, None, _equality_params, (True, False, False, False), None),
}
CASES = [("contacts", "pyramidal"), ("contacts", "elliptic"), ("joints", "pyramidal"), ("equality", "elliptic")]


@functools.cache
def _loss(name: str, cone: str, grad_mode: str):
    """(loss(x), x0, (model, data)): next-state loss of one step as a function of x = (qpos, qvel, ctrl, parameters)."""
    xml, qpos, params = SCENES[name][:3]
    model = jsn.load_mjcf(xml, cone=cone, grad_mode=grad_mode)
    rng = np.random.default_rng(7)
    data = jsn.make_data(model)
    if qpos is not None:
        data = data.replace(qpos=jnp.asarray(qpos))
    data = data.replace(qvel=jnp.asarray(0.2 * rng.normal(size=model.nv)), ctrl=jnp.asarray(rng.normal(size=model.nu)))
    w = jnp.asarray(rng.normal(size=model.nq + 2 * model.nv))

    def loss(x):
        qpos, qvel, ctrl, p = x
        m = eqx.tree_at(params, model, p)
        out = jsn.step(m, data.replace(qpos=qpos, qvel=qvel, ctrl=ctrl))
        return jnp.dot(w, jnp.concatenate([out.qpos, out.qvel, 1e-3 * out.qacc]))

    return loss, (data.qpos, data.qvel, data.ctrl, params(model)), (model, data)


def _active_rows(model, data):
    layout = model.constraints
    mask = np.asarray(jsn.forward(model, data).efc_mask)
    bounds = np.cumsum([0, layout.ne, layout.nf, layout.nl, layout.nefc - layout.ne - layout.nf - layout.nl])
    return tuple(bool(mask[a:b].any()) for a, b in zip(bounds[:-1], bounds[1:]))


@pytest.mark.parametrize("name,cone", CASES)
def test_implicit_gradients_match_unrolled_and_finite_differences(name, cone):
    loss, x0, (model, data) = _loss(name, cone, "implicit")
    assert _active_rows(model, data) == SCENES[name][3], "the state must exercise the scene's constraint types"
    implicit_value_and_grad = jax.jit(jax.value_and_grad(loss))
    implicit_grad = lambda x: implicit_value_and_grad(x)[1]  # noqa: E731
    implicit = implicit_grad(x0)
    unroll_loss, _, _ = _loss(name, cone, "unroll")
    unrolled = jax.jit(jax.grad(unroll_loss))(x0)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(implicit)[0], jax.tree.leaves(unrolled)):
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-8)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * scale, err_msg=jax.tree_util.keystr(path))
    check_directional(loss, x0, np.random.default_rng(11), n_dirs=3, rtol=1e-4, value_and_grad=implicit_value_and_grad)

    to_boundary = SCENES[name][4]
    if to_boundary is not None:  # a contact / limits exactly at the activation boundary: finite (one-sided) gradients
        at_boundary = implicit_grad((to_boundary(x0[0]),) + x0[1:])
        assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(at_boundary))


def test_newton_hessian_puts_limit_and_dof_friction_rows_on_its_diagonal():
    """`constraint.axis_rows` are exactly the rows whose Jacobian is +-e_dof (hinge and slide limits,
    dof friction loss; not the ball's limit), and the Newton Hessian, which adds their weights to
    its diagonal instead of the product, equals M + J^T diag(D) J over the quadratic rows."""
    from jaxsim_ncp import constraint
    from jaxsim_ncp.solver import newton

    model = jsn.load_mjcf(JOINTS)
    qpos = jnp.array([np.radians(35.0), 0.0, -0.06, np.cos(0.22), np.sin(0.22), 0.0, 0.0])  # every limit active
    data = jsn.forward(model, jsn.make_data(model).replace(qpos=qpos))
    J, D, mask = np.asarray(data.efc_J), np.asarray(data.efc_D), np.asarray(data.efc_mask)
    rows, dofs = constraint.axis_rows(model)
    # rows: 2 friction, a lower and an upper limit per hinge/slide, the ball's; active: friction, 2 limits, the ball
    assert len(rows) == 8 and model.constraints.nefc == 9 and mask.sum() == 5 and mask[-1]
    expected = np.zeros_like(J[rows])
    expected[np.arange(len(rows)), dofs] = mask[rows]  # inactive rows are zeroed
    np.testing.assert_array_equal(np.abs(J[rows]), expected)
    quad = mask & np.array([True, False, True, True, True, True, True, True, True])
    efc = constraint.Efc(J=data.efc_J, pos=data.efc_pos, margin=data.efc_margin, D=data.efc_D, R=1 / data.efc_D,
                         aref=data.efc_aref, frictionloss=jnp.zeros_like(data.efc_D), mask=data.efc_mask, mu=jnp.zeros((0,)))
    kinds = newton.row_kinds(model)
    H = jax.jit(lambda M, efc, quad: newton._hessian(M, efc, quad, None, kinds, None))(data.qM, efc, jnp.asarray(quad))
    np.testing.assert_allclose(H, np.asarray(data.qM) + J.T @ (np.where(quad, D, 0.0)[:, None] * J), rtol=1e-13, atol=1e-13)


SLIDING_BOX = """<mujoco><option timestep="0.005" iterations="30" ls_iterations="20" tolerance="1e-12"/><worldbody>
  <geom type="plane" size="5 5 .1" friction=".4"/>
  <body pos="0 0 .09999"><freejoint/><geom type="box" size=".1 .1 .1" friction=".4"/></body></worldbody></mujoco>"""


def test_long_rollout_gradient_of_sliding_stop_distance():
    """A box launched at v0 on a plane with friction mu stops after x = v0^2 / (2 mu g).

    jax.grad through a checkpointed 1000-step rollout (sliding, then sticking) gives
    dx/dv0 = v0 / (mu g) and dx/dmu = -v0^2 / (2 mu^2 g) to within the soft-contact
    creep (3%), and agrees with central finite differences to 1e-4. The checkpointed steps keep
    their solver's solutions, so their backward passes run no solver iterations.
    """
    model = jsn.load_mjcf(SLIDING_BOX)
    data = jsn.make_data(model)
    v0, mu, g = 1.5, 0.4, 9.81

    def stop_distance(v0, mu):
        m = eqx.tree_at(lambda m: m.geom_friction, model, model.geom_friction.at[:, 0].set(mu))
        final, _ = jsn.rollout(m, data.replace(qvel=data.qvel.at[0].set(v0)), jnp.zeros((1000, 0)), checkpoint=100)
        return final.qpos[0]

    x, grad = jax.jit(jax.value_and_grad(stop_distance, argnums=(0, 1)))(v0, mu)
    np.testing.assert_allclose(x, v0**2 / (2 * mu * g), rtol=0.03)
    np.testing.assert_allclose(grad, [v0 / (mu * g), -(v0**2) / (2 * mu**2 * g)], rtol=0.03)
    f, eps = jax.jit(stop_distance), 1e-5
    fd = [(f(v0 + eps, mu) - f(v0 - eps, mu)) / (2 * eps), (f(v0, mu + eps) - f(v0, mu - eps)) / (2 * eps)]
    np.testing.assert_allclose(grad, fd, rtol=1e-4)

    def solver_loops(checkpoint):
        """The while loops of a 3-step rollout's gradient program (traced, not compiled)."""

        def loss(v):
            final, _ = jsn.rollout(model, data.replace(qvel=data.qvel.at[0].set(v)), jnp.zeros((3, 0)), checkpoint=checkpoint)
            return final.qpos[0]

        return str(jax.make_jaxpr(jax.grad(loss))(v0)).count("while[")

    # a checkpointed step keeps its solver's solution: its backward pass replays no iterations
    assert solver_loops(True) == solver_loops(False) > 0
