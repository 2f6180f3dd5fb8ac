"""Hard contact: a primal-dual interior-point solver for the velocity-level NCP (Dojo, eqs. 19-54).

One time step in generalized coordinates. Unknowns: the next velocity v (nv), an
impulse per equality row, and per unilateral unit (a contact or a joint-limit side)

    gamma, s    normal impulse and gap slack:         gamma, s >= 0,  gamma s = kappa
    xi, eta     friction impulse and its dual in      xi, eta in the second-order cone Q^3,
                (Dojo eq. 19-25):                     xi o eta = kappa e

tied together by

    M (v - v_old) = h f + J_e^T lambda + sum_c J_c^T (gamma, xi_1, xi_2)   (momentum)
    s     = gap + h J_n v           (the gap at the next configuration, linearized)
    eta_t = J_t v                   (tangential velocity: maximum dissipation, eq. 20)
    xi_0  = mu gamma                (cone radius, eq. 21)
    0     = pos_e + h J_e v + delta L lambda / P_e   (equality constraints, bilateral)

with M the integrator's effective mass (M + h B for Euler with implicit damping), so
xi_t opposes the sliding velocity with magnitude mu gamma and gamma s = 0 at kappa = 0.
delta = 0.01 sqrt(eps) (1.5e-10 in float64) keeps redundant equality rows solvable: a
connect closing a loop with a ball joint has a row no velocity can change, whose drift
(second order in the rotation) made the impulse grow to 1e20 and the solve stall; with
delta the impulse along such a row stays drift / delta, and a loaded row gives way by
only delta L per unit of scaled impulse.
Frictionless units (limits, condim-1 contacts) fix xi = eta = e; inactive units
(out of detection range) are frozen at the starting point and exert nothing.

Every unit's variables are scaled to O(1) so tolerances and kappa are unit-free:
impulses by P = m_eff a_ref h (m_eff = 1 / invweight0, a_ref = |g| or L / h^2 without
gravity), lengths by L (the model's mean body size, mjStatistic.meansize) and
velocities by L / h. With kappa = 1e-8 a body resting on its weight keeps a gap of
about 1e-8 L and creeps at most 1e-8 L per step.

Algorithm (Mehrotra predictor-corrector, Dojo Alg. 2): at each iteration the Newton
system of the residual is reduced per unit (each 8x8 block inverted in closed form) to
one (nv + ne) system, LU-factored once (`linalg.factor_for_solves`: partial pivoting, tiny pivots raised) and
applied to three right-hand sides: an
affine step aiming at complementarity kappa (not 0: then it and the corrector vanish at
the solution), the cone line search (eqs. 41-46), centering sigma = (mu_aff / mu)^3
(eq. 54); then Mehrotra's corrector (the second-order term) and the plain direction,
both aiming at max(sigma mu, kappa), and the one that can step further is taken, with
fraction-to-boundary 0.99 and full Newton steps where the boundary allows; if neither
gets 30% of the way, the step re-centres towards 10 mu instead, moves the friction cone
pairs 10% inside their cones and turns sliding friction against the slip (`_off_the_cone_boundary`). Converged
means every row of the residual is below `tolerance` relative to its terms
(`scaled_residual`). At most `iterations` iterations; a world that converged is frozen
(per-world mask), so the solver vmaps; the loop stops when every world is done
(`ncp_early_exit`, default) or runs the full count in a `lax.scan` (identical results).

A solve may start from a nearby problem's solution (`warm_point`: the re-linearized passes of
`forward._ncp_solve` start from the last pass's), centred at complementarity 0.1 and restarted
cold after `_WARM_RESTART` iterations if it has not converged; warm starts across time steps
were tried and left out (fewer iterations on average, but more unconverged humanoid steps).

Gradients (`implicit.implicit_solver`): after the forward solve at `kappa`, a few pure
Newton steps move to the central point of the `kappa_grad`-relaxed system, and that
point is differentiated with the implicit function theorem, reusing the same block
reduction for the transposed solve; where those steps do not converge, the hard solution with its
pairs moved onto the central path in closed form is differentiated instead (`solve`'s `relax`).
The forward result stays the hard solution. A solve that ends unconverged far from any solution
(`NEAR_SOLUTION`) is differentiated with its impulses held constant instead (`_impulses_held`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .. import linalg
from .implicit import implicit_solver

NU = 8  # variables per unit: gamma, s, xi (3), eta (3)
_U_INIT = (1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
_FRACTION_TO_BOUNDARY = 0.99
_STALLED_STEP = 0.3  # below this step length the iteration re-centres (`_mehrotra_step`)
_WARM_RESTART = 12  # a warm-started solve not converged after this many iterations starts again cold
# an unconverged solve whose best scaled residual is above this is differentiated with its impulses
# held (`_impulses_held`): infeasible problems (coincident bodies whose contacts push both ways) sit
# at 0.008-0.2 for ever, and the implicit derivative at such a point was NaN in float32 fuzz scenes
NEAR_SOLUTION = 1e-3


class Problem(NamedTuple):
    """What the solution depends on (theta of the implicit differentiation).

    `P`, `Pe`, `L`, `V` (scales) and the masks enter only through stop_gradient: they
    define the units the solver works in, not the physics.
    """

    M: Float[Array, "nv nv"]  # effective mass of the integrator
    momentum: Float[Array, " nv"]  # M v_old + h f_smooth
    h: Float[Array, ""]
    J: Float[Array, "nu 3 nv"]  # per unit: normal, tangent 1, tangent 2 (tangents zero if frictionless)
    gap: Float[Array, " nu"]  # signed distance minus margin at the start of the step
    mu: Float[Array, " nu"]
    Je: Float[Array, "ne nv"]
    pos_e: Float[Array, " ne"]
    P: Float[Array, " nu"]  # impulse scale per unit
    Pe: Float[Array, " ne"]  # impulse scale per equality row
    L: Float[Array, ""]  # length scale
    V: Float[Array, ""]  # velocity scale L / h
    active: Float[Array, " nu"]  # 1: the unit takes part in this solve
    friction: Float[Array, " nu"]  # 1: the unit has a friction cone
    # the rows of the velocity terms (gap, tangential velocity) where they are not J, the impulses'
    # directions (`solve_nonlinear`: the normal row at the new configuration); None: J
    G: Float[Array, "nu 3 nv"] | None = None


def _velocity_rows(p: Problem) -> Array:
    return p.J if p.G is None else p.G


class Solution(NamedTuple):
    qvel: Float[Array, " nv"]  # the next velocity
    impulse: Float[Array, "nu 3"]  # per unit (normal, friction 1, friction 2), in N s
    impulse_e: Float[Array, " ne"]
    iterations: Array
    converged: Bool[Array, ""]
    residual: Float[Array, ""]  # scaled residual infinity norm at the returned point
    x: Array  # the solver's variables there (v, equality impulses, unit variables; `solve`'s `solved`)


def _constants(p: Problem) -> Problem:
    return p._replace(**{k: jax.lax.stop_gradient(getattr(p, k)) for k in ("P", "Pe", "L", "V", "active", "friction")})


def _unpack(x, p: Problem):
    nv, ne = p.M.shape[0], p.Je.shape[0]
    return x[:nv], x[nv : nv + ne], x[nv + ne :].reshape(-1, NU)


def _pack(v, le, u):
    return jnp.concatenate([v, le, u.reshape(-1)])


def _soc_product(a, b):
    """Jordan product of the second-order cone (Dojo eq. 24): (a.b, a0 b1 + b0 a1)."""
    return jnp.concatenate([jnp.dot(a, b)[None], a[0] * b[1:] + b[0] * a[1:]])


def _unit_residual(u, Jv, gap, h, mu, L, V, kappa, active, friction):
    """The 8 equations of one unit (gap, tangential velocity, cone radius, complementarity)."""
    gamma, s, xi, eta = u[0], u[1], u[2:5], u[5:8]
    r_gap = s - (gap + h * Jv[0]) / L
    r_cn = gamma * s - kappa
    e = jnp.zeros(3, u.dtype).at[0].set(1.0)
    cone = jnp.concatenate([eta[1:] - Jv[1:] / V, (xi[0] - mu * gamma)[None], _soc_product(xi, eta) - kappa * e])
    fixed = jnp.concatenate([eta[1:], (xi[0] - 1.0)[None], jnp.stack([eta[0] - 1.0, xi[1], xi[2]])])  # xi = eta = e
    fric = jnp.where(friction > 0, cone, fixed)
    r = jnp.concatenate([r_gap[None], fric[:3], r_cn[None], fric[3:]])
    return jnp.where(active > 0, r, u - jnp.asarray(_U_INIT, u.dtype))


def unit_jacobians(u, p: Problem):
    """d r_u / d u (nu, 8, 8) and d r_u / d(J v) (nu, 8, 3) of `_unit_residual`, written out."""
    n = u.shape[0]
    gamma, s, xi, eta = u[:, 0], u[:, 1], u[:, 2:5], u[:, 5:8]
    arrow = jax.vmap(_arrow)
    cone = jnp.zeros((n, NU, NU), u.dtype)
    cone = cone.at[:, 0, 1].set(1.0).at[:, 1, 6].set(1.0).at[:, 2, 7].set(1.0)
    cone = cone.at[:, 4, 0].set(s).at[:, 4, 1].set(gamma)
    fixed = cone.at[:, 3, 2].set(1.0).at[:, 5, 5].set(1.0).at[:, 6, 3].set(1.0).at[:, 7, 4].set(1.0)
    cone = cone.at[:, 3, 2].set(1.0).at[:, 3, 0].set(-p.mu)
    cone = cone.at[:, 5:, 2:5].set(arrow(eta)).at[:, 5:, 5:].set(arrow(xi))
    friction = p.friction[:, None, None] > 0
    A = jnp.where(friction, cone, fixed)
    A = jnp.where(p.active[:, None, None] > 0, A, jnp.eye(NU, dtype=u.dtype))
    B = jnp.zeros((n, NU, 3), u.dtype).at[:, :3, :3].set(jax.vmap(jnp.diag)(_velocity_coefficients(p)))
    return A, B


def _velocity_coefficients(p: Problem):
    """(nu, 3): d r_u / d(J v) is diagonal in its first 3 rows (gap and tangential-velocity rows)
    and zero below: -h / L, -friction / V, -friction / V, zero where inactive."""
    return jnp.stack([jnp.broadcast_to(-p.h / p.L, p.friction.shape), -p.friction / p.V, -p.friction / p.V], axis=-1) * p.active[:, None]


def _unit_force(u, p: Problem):
    """Impulses (nu, 3) in N s of the units: P (gamma, xi_1, xi_2), zero where inactive; for u
    (nu, 8, ...) the same map applied to each trailing column (d impulse / d u times u)."""
    trailing = (1,) * (u.ndim - 2)
    friction = p.friction.reshape(-1, *trailing)
    f = jnp.stack([u[:, 0], u[:, 3] * friction, u[:, 4] * friction], axis=1)
    return (p.P * p.active).reshape(-1, 1, *trailing) * f


def _unit_force_transposed(f, p: Problem):
    """The transpose of `_unit_force`: (nu, 3) -> (nu, 8)."""
    f = (p.P * p.active)[:, None] * f
    zero = jnp.zeros_like(f[:, 0])
    return jnp.stack([f[:, 0], zero, zero, f[:, 1] * p.friction, f[:, 2] * p.friction, zero, zero, zero], axis=1)


def _blocks_times(a, x):
    """a @ x per unit (a (nu, m, k), x (nu, k)) as k elementwise terms: as a dot_general, a
    (vmapped) batch of such tiny products costs a library call per product on the CPU."""
    return sum(a[:, :, i] * x[:, i, None] for i in range(a.shape[2]))


def _blocks_matmul(a, b):
    """a @ b per unit (a (nu, m, k), b (nu, k, l)), likewise."""
    return sum(a[:, :, i, None] * b[:, None, i, :] for i in range(a.shape[2]))


def _blocks_transposed_times(a, x):
    """a^T @ x per unit (a (nu, m, k), x (nu, m)), likewise."""
    return sum(a[:, i, :] * x[:, i, None] for i in range(a.shape[1]))


def residual(x, p: Problem, kappa) -> Array:
    """The full residual r(w; theta, kappa) (Dojo eq. 28): momentum, equalities, units."""
    p = _constants(p)
    v, le, u = _unpack(x, p)
    Jv = jnp.einsum("ckn,n->ck", _velocity_rows(p), v)
    r_u = jax.vmap(_unit_residual, (0, 0, 0, None, 0, None, None, None, 0, 0))(
        u, Jv, p.gap, p.h, p.mu, p.L, p.V, kappa, p.active, p.friction
    )
    r_v = p.M @ v - p.momentum - p.Je.T @ (p.Pe * le) - jnp.einsum("ckn,ck->n", p.J, _unit_force(u, p))
    r_e = (p.pos_e + p.h * (p.Je @ v)) / p.L + _equality_regularization(p.M.dtype) * le
    return _pack(r_v, r_e, r_u)


def _equality_regularization(dtype) -> float:
    """delta of the equality rows (module docstring): far below the tolerance, above roundoff."""
    return 0.01 * float(np.sqrt(np.finfo(dtype).eps))


class Factor(NamedTuple):
    """The Newton matrix of `residual`, block-reduced: unit blocks A^-1, A^-1 B, and the (nv+ne) system."""

    unit_inv: Array  # (nu, 8, 8): A^-1, A = d r_u / d u (cone rows in NT form during the iterations)
    AinvB: Array  # (nu, 8, 3): A^-1 d r_u / d(J v)
    system: tuple  # linalg.factor_for_solves of [[M + sum J^T F A^-1 B J, -Je^T Pe], [h Je / L, delta I]]


def _arrow_inv(a):
    """Arw(a)^-1 = [[a0, -a1^T], [-a1, (det / a0) I + a1 a1^T / a0]] / det, det = a0^2 - |a1|^2 (a interior)."""
    det = _lorentz_det(a)
    lower = (det / a[0]) * jnp.eye(2, dtype=a.dtype) + jnp.outer(a[1:], a[1:]) / a[0]
    top = jnp.concatenate([a[:1], -a[1:]])
    return jnp.concatenate([top[None], jnp.concatenate([-a[1:, None], lower], axis=1)]) / det


def _unit_inverse(u, p: Problem, nt: NT | None) -> Array:
    """A^-1 (nu, 8, 8) of every unit's Jacobian `unit_jacobians`, by elimination in closed form.

    A y = r reads: y_s = r0, y_eta_t = r12, s y_gamma + gamma y_s = r4, y_xi0 - mu y_gamma = r3 and
    the cone rows P y_xi + Q y_eta = r567, so y_xi = P^-1 r567 - S y_eta with S = P^-1 Q; its first
    row fixes y_eta0. Exact Jacobian: P = Arw(eta), Q = Arw(xi); NT form (nt given):
    P = Arw(lam) W^-1, Q = Arw(lam) W, so P^-1 = W Arw(lam)^-1 and S = W^2. Frictionless units
    (xi = eta = e fixed) and inactive ones (identity) are read off directly.
    """
    gamma, s = u[:, 0], u[:, 1]
    if nt is None:
        P_inv = jax.vmap(_arrow_inv)(u[:, 5:8])
        S = _blocks_matmul(P_inv, jax.vmap(_arrow)(u[:, 2:5]))
    else:
        P_inv = _blocks_matmul(nt.W, jax.vmap(_arrow_inv)(nt.lam))
        S = _blocks_matmul(nt.W, nt.W)

    def solve(r):  # r: (nu, 8) -> y (nu, 8)
        y_s = r[:, 0]
        y_gamma = (r[:, 4] - gamma * y_s) / s
        y_eta_t = r[:, 1:3]
        y_xi0 = r[:, 3] + p.mu * y_gamma
        c = _blocks_times(P_inv, r[:, 5:8])
        y_eta0 = (c[:, 0] - S[:, 0, 1] * y_eta_t[:, 0] - S[:, 0, 2] * y_eta_t[:, 1] - y_xi0) / S[:, 0, 0]
        y_xi_t = c[:, 1:] - S[:, 1:, 0] * y_eta0[:, None] - _blocks_times(S[:, 1:, 1:], y_eta_t)
        cone = jnp.concatenate([y_gamma[:, None], y_s[:, None], y_xi0[:, None], y_xi_t, y_eta0[:, None], y_eta_t], axis=1)
        fixed = jnp.concatenate([y_gamma[:, None], y_s[:, None], r[:, 3:4], r[:, 6:8], r[:, 5:6], y_eta_t], axis=1)
        y = jnp.where(p.friction[:, None] > 0, cone, fixed)
        return jnp.where(p.active[:, None] > 0, y, r)

    eye = jnp.broadcast_to(jnp.eye(NU, dtype=u.dtype), (u.shape[0], NU, NU))
    return jax.vmap(solve, in_axes=2, out_axes=2)(eye)


def factorize(x, p: Problem, nt: NT | None = None) -> Factor:
    """Block-reduce and factor the Newton matrix at x; nt (the iterations): cone rows in NT-scaled form."""
    p = _constants(p)
    v, _, u = _unpack(x, p)
    unit_inv = _unit_inverse(u, p, nt)
    AinvB = unit_inv[:, :, :3] * _velocity_coefficients(p)[:, None, :]
    W = _unit_force(AinvB, p)  # (nu, 3, 3): d impulse / d(J v)
    H = p.M + jnp.einsum("cka,ckl,clb->ab", p.J, W, _velocity_rows(p))
    ne = p.Je.shape[0]
    top = jnp.concatenate([H, -p.Je.T * p.Pe[None, :]], axis=1)
    bottom = jnp.concatenate([p.h * p.Je / p.L, _equality_regularization(H.dtype) * jnp.eye(ne, dtype=H.dtype)], axis=1)
    return Factor(unit_inv, AinvB, linalg.factor_for_solves(jnp.concatenate([top, bottom])))


def newton_direction(factor: Factor, p: Problem, r) -> Array:
    """d with (d r / d x) d = -r, by the block reduction (units first, then the (nv+ne) system)."""
    p = _constants(p)
    nv = p.M.shape[0]
    r_v, r_e, r_u = _unpack(r, p)
    Ainv_r = _blocks_times(factor.unit_inv, r_u)  # (nu, 8)
    rhs_v = -r_v - jnp.einsum("ckn,ck->n", p.J, _unit_force(Ainv_r, p))
    d = linalg.lu_solve(factor.system, jnp.concatenate([rhs_v, -r_e]))
    dv, dle = d[:nv], d[nv:]
    du = -(Ainv_r + _blocks_times(factor.AinvB, jnp.einsum("ckn,n->ck", _velocity_rows(p), dv)))
    return _pack(dv, dle, du)


def transposed_solve(factor: Factor, p: Problem, b) -> Array:
    """y with (d r / d x)^T y = b (the implicit backward pass), same blocks transposed."""
    p = _constants(p)
    nv = p.M.shape[0]
    b_v, b_e, b_u = _unpack(b, p)
    Bt_Ainvt_b = _blocks_transposed_times(factor.AinvB, b_u)  # (A^-1 B)^T b_u, (nu, 3)
    rhs_v = b_v - jnp.einsum("ckn,ck->n", _velocity_rows(p), Bt_Ainvt_b)
    y = linalg.lu_solve(factor.system, jnp.concatenate([rhs_v, b_e]), trans=True)
    y_v, y_e = y[:nv], y[nv:]
    FtJy = _unit_force_transposed(jnp.einsum("ckn,n->ck", p.J, y_v), p)
    y_u = _blocks_transposed_times(factor.unit_inv, b_u + FtJy)
    return _pack(y_v, y_e, y_u)


# ---------------------------------------------------------------------- Nesterov-Todd scaling


def _nt_scaling(xi, eta):
    """Nesterov-Todd scaling of a second-order-cone pair (Vandenberghe, "The CVXOPT linear and
    quadratic cone program solvers", sec. 4): symmetric W with W eta = W^-1 xi = lam.

    With Jm = diag(1, -1, -1), xb = xi / sqrt(xi^T Jm xi), eb likewise,
    w = (xb + Jm eb) / sqrt(2 (1 + xb.eb)), b = (xi^T Jm xi / eta^T Jm eta)^(1/4):
    W = b [[w0, w1^T], [w1, I + w1 w1^T / (1 + w0)]], W^-1 the same with -w1 and 1/b.
    Returns (W, W^-1, lam).
    """
    jm = jnp.asarray([1.0, -1.0, -1.0], xi.dtype)
    tiny = jnp.finfo(xi.dtype).tiny
    nx, ne = jnp.sqrt(_lorentz_det(xi)), jnp.sqrt(_lorentz_det(eta))
    xb, eb = xi / nx, eta / ne
    w = (xb + jm * eb) / jnp.sqrt(jnp.maximum(2.0 * (1.0 + jnp.dot(xb, eb)), tiny))
    b = jnp.sqrt(nx / ne)
    w0, w1 = w[0], w[1:]
    lower = jnp.eye(2, dtype=xi.dtype) + jnp.outer(w1, w1) / (1.0 + w0)

    def block(sign):
        top = jnp.concatenate([w0[None], sign * w1])
        return jnp.concatenate([top[None], jnp.concatenate([sign * w1[:, None], lower], axis=1)])

    W, W_inv = b * block(1.0), block(-1.0) / b
    return W, W_inv, W[:, 0] * eta[0] + W[:, 1] * eta[1] + W[:, 2] * eta[2]


def _lorentz_det(a):
    """a0^2 - |a1|^2 as (a0 - |a1|)(a0 + |a1|), floored at eps a0^2: a point rounded onto the cone
    boundary (float32, |a| ~ 1e2) counts as eps inside it instead of making the scaling overflow."""
    eps = jnp.finfo(a.dtype).eps
    r = jnp.sqrt(jnp.dot(a[1:], a[1:]))
    return jnp.maximum((a[0] - r) * (a[0] + r), eps * a[0] ** 2 + jnp.finfo(a.dtype).tiny)


def _arrow(a):
    """Arw(a): the matrix of b -> a o b."""
    return a[0] * jnp.eye(3, dtype=a.dtype) + jnp.zeros((3, 3), a.dtype).at[0, 1:].set(a[1:]).at[1:, 0].set(a[1:])


class NT(NamedTuple):
    """Per unit: the NT scaling of the cone pair, whose linearized rows of xi o eta are
    Arw(lam) (W^-1 dxi + W deta)."""

    lam: Array  # (nu, 3)
    W: Array  # (nu, 3, 3)
    W_inv: Array  # (nu, 3, 3)


def _nt(u) -> NT:
    """The NT linearization of every unit's cone pair at u (nu, 8)."""

    def one(u):
        W, W_inv, lam = _nt_scaling(u[2:5], u[5:8])
        return NT(lam, W, W_inv)

    return jax.vmap(one)(u)


# ---------------------------------------------------------------------- cones


def _orthant_step(y, d):
    """Largest alpha with y + alpha d >= 0 (eq. 41), inf if d >= 0."""
    return jnp.where(d < 0, -y / jnp.where(d < 0, d, -1.0), jnp.inf)


def _soc_step(y, d):
    """Largest alpha with y + alpha d in the second-order cone (eqs. 42-46), inf if unbounded."""
    nu = _lorentz_det(y)
    sq = jnp.sqrt(nu)
    zeta = y[0] * d[0] - jnp.dot(y[1:], d[1:])
    rho0 = zeta / nu
    rho1 = d[1:] / sq - (zeta / sq + d[0]) / (y[0] * sq + nu) * y[1:]
    gap = jnp.linalg.norm(rho1) - rho0
    return jnp.where(gap > 0, 1.0 / jnp.where(gap > 0, gap, 1.0), jnp.inf)


def max_step(u, du, p: Problem):
    """Largest alpha keeping every active unit's cone variables in their cones (Alg. 1), inf if unbounded."""
    orth = jnp.minimum(_orthant_step(u[:, 0], du[:, 0]), _orthant_step(u[:, 1], du[:, 1]))
    soc = jnp.minimum(jax.vmap(_soc_step)(u[:, 2:5], du[:, 2:5]), jax.vmap(_soc_step)(u[:, 5:8], du[:, 5:8]))
    alpha = jnp.minimum(orth, jnp.where(p.friction > 0, soc, jnp.inf))
    return jnp.min(jnp.where(p.active > 0, alpha, jnp.inf), initial=jnp.inf)


def _step_length(alpha):
    """Fraction-to-boundary (0.99 of the way to the boundary) and at most the full Newton step: a
    boundary beyond 1 / 0.99 allows the full step, which converges quadratically (0.99 would not)."""
    return jnp.minimum(1.0, _FRACTION_TO_BOUNDARY * alpha)


def complementarity(u, p: Problem):
    """Mean complementarity (eq. 52): (sum gamma s + sum xi.eta) / degree."""
    total = u[:, 0] * u[:, 1] + p.friction * jnp.sum(u[:, 2:5] * u[:, 5:8], axis=-1)
    degree = jnp.sum(p.active * (1.0 + p.friction))
    return jnp.sum(p.active * total) / jnp.maximum(degree, 1.0)


def _nt_residual(r0, p: Problem, nt: NT, target, du_aff=None):
    """The residual with the cone rows in NT form: lam o lam - target e (+ Mehrotra's corrector
    (W^-1 dxi) o (W deta) of the affine step), and the orthant's dgamma ds corrector.

    r0 = residual(x, p, 0): target enters only the complementarity rows, so one evaluation
    serves every target of an iteration."""
    nvne = r0.shape[0] - nt.lam.shape[0] * NU
    e = jnp.zeros((3,), r0.dtype).at[0].set(1.0)
    r_u = r0[nvne:].reshape(-1, NU)
    r_u = r_u.at[:, 4].set(jnp.where(p.active > 0, r_u[:, 4] - target, r_u[:, 4]))  # gamma s - target
    cone = jax.vmap(_soc_product)(nt.lam, nt.lam) - target * e
    if du_aff is not None:
        dxi = _blocks_times(nt.W_inv, du_aff[:, 2:5])
        deta = _blocks_times(nt.W, du_aff[:, 5:8])
        cone = cone + jax.vmap(_soc_product)(dxi, deta)
    use = (p.friction * p.active)[:, None] > 0
    r_u = r_u.at[:, 5:8].set(jnp.where(use, cone, r_u[:, 5:8]))
    if du_aff is not None:
        r_u = r_u.at[:, 4].add(du_aff[:, 0] * du_aff[:, 1] * p.active)
    return r0.at[nvne:].set(r_u.reshape(-1))


def _term_magnitudes(x, p: Problem) -> Array:
    """Per row of `residual`, the magnitude of its largest terms (same scaling as the rows).

    A row cannot be resolved below roundoff of its terms: in float32 the cone-radius row
    xi_0 - mu gamma of a unit carrying 100x its weight has an error of ~1e-5 however it is solved.
    """
    p = _constants(p)
    v, le, u = _unpack(x, p)
    Jv = jnp.abs(jnp.einsum("ckn,n->ck", _velocity_rows(p), v))
    gamma, s, xi, eta = jnp.abs(u[:, 0]), u[:, 1], jnp.abs(u[:, 2:5]), jnp.abs(u[:, 5:8])
    m_v = (
        jnp.abs(p.M) @ jnp.abs(v) + jnp.abs(p.momentum) + jnp.abs(p.Je.T) @ jnp.abs(p.Pe * le)
        + jnp.einsum("ckn,ck->n", jnp.abs(p.J), jnp.abs(_unit_force(u, p)))
    )  # fmt: skip
    m_e = (jnp.abs(p.pos_e) + p.h * (jnp.abs(p.Je) @ jnp.abs(v))) / p.L + _equality_regularization(p.M.dtype) * jnp.abs(le)
    m_gap = jnp.abs(s) + (jnp.abs(p.gap) + p.h * Jv[:, 0]) / p.L
    m_t = eta[:, 1:] + Jv[:, 1:] / p.V
    m_radius = xi[:, 0] + p.mu * gamma
    m_cone = jnp.concatenate([(xi[:, :1] * eta[:, :1] + jnp.sum(xi[:, 1:] * eta[:, 1:], -1, keepdims=True)), xi[:, :1] * eta[:, 1:] + eta[:, :1] * xi[:, 1:]], axis=1)
    m_u = jnp.concatenate([m_gap[:, None], m_t, m_radius[:, None], (gamma * s)[:, None], m_cone], axis=1)
    m_u = jnp.where((p.active * p.friction)[:, None] > 0, m_u, m_u.at[:, 1:4].set(0.0).at[:, 5:].set(0.0))
    return _pack(m_v, m_e, jnp.where(p.active[:, None] > 0, m_u, 0.0))


def scaled_residual(x, p: Problem, kappa, r=None):
    """Relative residual: max over rows of |r_i| / (1 + m_i), the momentum rows in velocity units
    (/ diag(M) V) and m_i the magnitude of row i's terms (`_term_magnitudes`). r: residual(x, p, kappa)
    when the caller has it."""
    nv = p.M.shape[0]
    r = residual(x, p, kappa) if r is None else r
    scale = jnp.concatenate([1.0 / (jnp.diag(p.M) * p.V), jnp.ones(r.shape[0] - nv, r.dtype)])
    scale = jax.lax.stop_gradient(scale)
    m = jax.lax.stop_gradient(_term_magnitudes(x, p))
    return jnp.max(jnp.abs(r * scale) / (1.0 + m * scale), initial=0.0)


def _uncentered(r, p: Problem, kappa):
    """residual(x, p, 0) from r = residual(x, p, kappa): kappa enters only the complementarity
    rows, and of those `_nt_residual` reads only gamma s (it rebuilds the cone rows)."""
    nvne = r.shape[0] - p.gap.shape[0] * NU
    r_u = r[nvne:].reshape(-1, NU)
    r_u = r_u.at[:, 4].add(jnp.where(p.active > 0, kappa, 0.0))
    return r.at[nvne:].set(r_u.reshape(-1))


# ---------------------------------------------------------------------- the solver


def initial_point(p: Problem):
    """The unconstrained velocity, zero equality impulses and every cone variable at e."""
    nv, ne, nu = p.M.shape[0], p.Je.shape[0], p.gap.shape[0]
    v = linalg.lu_solve(linalg.lu_factor(p.M), p.momentum)
    u = jnp.broadcast_to(jnp.asarray(_U_INIT, p.M.dtype), (nu, NU))
    return _pack(v, jnp.zeros((ne,), p.M.dtype), u)


def _jordan_inverse(a, scale):
    """scale a^-1 per row in the second-order cone's Jordan algebra: scale (a0, -a_t) / (a0^2 - |a_t|^2)."""
    return scale * jnp.concatenate([a[:, :1], -a[:, 1:]], axis=1) / jax.vmap(_lorentz_det)(a)[:, None]


def warm_point(p: Problem, v, impulse, impulse_e, mu0: float = 0.1):
    """A start near a known solution of a nearby problem (velocity v, unit impulses (nu, 3) and
    equality impulses (ne,) in N s), centred: every complementarity pair has product mu0 (against 1
    for `initial_point`). A unit that was loaded (scaled impulse above its predicted gap) keeps its
    impulses, at least sqrt(mu0) inside their cone, and takes the gap and the friction dual that
    centre them; a unit that was not keeps its predicted gap and tangential velocity instead.
    Humanoid second passes (re-linearized, 14 of 114 Table V solves) from the first pass's
    solution: 11.1 -> 6.1 iterations on average, 19 -> 10 at most."""
    c = _constants(p)
    Jv = jnp.einsum("ckn,n->ck", _velocity_rows(c), v)
    r = float(np.sqrt(mu0))
    gamma_hat, s_hat = impulse[:, 0] / c.P, (c.gap + c.h * Jv[:, 0]) / c.L
    loaded = gamma_hat > jnp.maximum(s_hat, 0.0)
    gamma = jnp.where(loaded, jnp.maximum(gamma_hat, r), mu0 / jnp.maximum(s_hat, r))
    s = jnp.where(loaded, mu0 / gamma, jnp.maximum(s_hat, r))
    xi_t, eta_t = impulse[:, 1:] / c.P[:, None], Jv[:, 1:] / c.V
    xi = jnp.concatenate([(jnp.maximum(c.mu * gamma, jnp.linalg.norm(xi_t, axis=-1)) + r)[:, None], xi_t], axis=1)
    eta = jnp.concatenate([(jnp.linalg.norm(eta_t, axis=-1) + r)[:, None], eta_t], axis=1)
    xi, eta = jnp.where(loaded[:, None], xi, _jordan_inverse(eta, mu0)), jnp.where(loaded[:, None], _jordan_inverse(xi, mu0), eta)
    u = jnp.concatenate([gamma[:, None], s[:, None], xi, eta], axis=1)
    cold = jnp.broadcast_to(jnp.asarray(_U_INIT, u.dtype), u.shape)
    u = jnp.where((c.friction * c.active)[:, None] > 0, u, jnp.where(c.active[:, None] > 0, u.at[:, 2:].set(cold[:, 2:]), cold))
    return _pack(v, impulse_e / c.Pe, u)


def _mehrotra_step(x, p: Problem, kappa, r):
    """One predictor-corrector iteration (Dojo Alg. 2 with eqs. 52-54); r = residual(x, p, kappa)."""
    u = _unpack(x, p)[2]
    nt = _nt(u)
    factor = factorize(x, p, nt)
    # the affine (predictor) step aims at kappa, not 0: it vanishes at the kappa-central solution and
    # so does Mehrotra's corrector built from it. Aimed at 0 it does not, and the corrector's bias (of
    # order kappa, as large as the tolerance) balanced the residual at a spurious fixed point (humanoid
    # foot, float64: scaled residual stuck at 7e-5 for 30 iterations; now 1e-13 in 12)
    r0 = _uncentered(r, p, kappa)
    d_aff = newton_direction(factor, p, _nt_residual(r0, p, nt, kappa))
    du_aff = _unpack(d_aff, p)[2]
    a_aff = jnp.minimum(1.0, max_step(u, du_aff, p))
    mu = complementarity(u, p)
    mu_aff = complementarity(u + a_aff * du_aff, p)
    sigma = jnp.clip(mu_aff / jnp.maximum(mu, jnp.finfo(x.dtype).tiny), 0.0, 1.0) ** 3
    target = jnp.maximum(sigma * mu, kappa)
    # Mehrotra's corrected direction, or the plain one to the same target if that reaches further:
    # when the boundary cuts the affine step short, the second-order term overshoots and the
    # iteration can cycle (a sphere 1.75 mm deep, sliding at 2 m/s: period 4, never converging).
    # If neither gets 30% of the way, re-centre towards 10 mu and move the cone pairs off their boundary:
    # a sliding contact near its cone boundary can turn only by ~sqrt(distance to the boundary)
    # per step, so once mu is small a turn that is still due jams the iteration (float32 humanoid,
    # 1000 worlds x 50 steps: 169 unconverged, 141 with the re-centring, 127 with both)
    residuals = jnp.stack(
        [_nt_residual(r0, p, nt, target, du_aff), _nt_residual(r0, p, nt, target), _nt_residual(r0, p, nt, 10.0 * mu)]
    )
    directions = jax.vmap(lambda r: newton_direction(factor, p, r))(residuals)
    alphas = jax.vmap(lambda d: max_step(u, _unpack(d, p)[2], p))(directions)
    best = jnp.argmax(jnp.minimum(alphas[:2], 1.0))  # the corrector unless the plain one goes further
    stalled = alphas[best] < _STALLED_STEP
    best = jnp.where(stalled, 2, best)
    x = x + _step_length(alphas[best]) * directions[best]
    v, le, u = _unpack(x, p)
    return jnp.where(stalled, _pack(v, le, _off_the_cone_boundary(u, p)), x)


def _off_the_cone_boundary(u, p: Problem, margin: float = 0.1):
    """Every friction unit's pair at least `margin` inside its cones: eta_0 >= (1 + margin) |eta_t|
    (eta_0 is a pure slack: no linear row changes) and |xi_t| <= xi_0 / (1 + margin) (the friction
    impulse shrinks; the next Newton step rebalances the momentum); a sliding unit's friction
    (|eta_t| > eta_0 / 2) is also turned to oppose its current slip (maximum dissipation at the
    current velocity). After a stalled step this lets a jammed sliding contact turn (humanoid,
    1000 worlds x 50 steps, float32: 95 unconverged steps with the shrink alone, 47 with the turn
    and re-centring below 30% instead of half-way; captured steps: 23 -> 7 with the first kick)."""
    tiny = jnp.finfo(u.dtype).tiny
    eta_t = jnp.linalg.norm(u[:, 6:8], axis=-1)
    xi_t = jnp.linalg.norm(u[:, 3:5], axis=-1)
    eta0 = jnp.maximum(u[:, 5], (1.0 + margin) * eta_t)
    radius = jnp.minimum(xi_t, u[:, 2] / (1.0 + margin))
    direction = jnp.where((eta_t > 0.5 * u[:, 5])[:, None], -u[:, 6:8] / jnp.maximum(eta_t, tiny)[:, None], u[:, 3:5] / jnp.maximum(xi_t, tiny)[:, None])
    moved = u.at[:, 5].set(eta0).at[:, 3:5].set(radius[:, None] * direction)
    return jnp.where((p.friction * p.active)[:, None] > 0, moved, u)


def _centering_step(x, p: Problem, kappa, r):
    """A damped Newton step on the kappa-relaxed system (no predictor); r = residual(x, p, kappa)."""
    u = _unpack(x, p)[2]
    nt = _nt(u)
    d = newton_direction(factorize(x, p, nt), p, _nt_residual(_uncentered(r, p, kappa), p, nt, kappa))
    return x + _step_length(max_step(u, _unpack(d, p)[2], p)) * d


def _iterate(step_fn, x, p: Problem, kappa, tolerance, iterations: int, early_exit: bool, skip=False, restart=None,
             relinearize=None):
    """At most `iterations` steps; a world whose scaled residual is below tolerance is frozen
    (skip: frozen from the start, its result is not wanted).

    relinearize: v -> Problem (`solve_nonlinear`): the problem is rebuilt at every iterate's
    velocity v (its gap rows at q (+) h v), p being the one at x.

    restart: (x_cold, at): a world not converged after `at` steps (traced; negative: never) starts
    again from x_cold (a warm start gone astray), with `iterations` more.

    early_exit: a `while_loop` that stops once every world (of a vmapped batch) is done;
    otherwise a `lax.scan` of the most steps any world may take. The results are identical (a
    done world never moves); the loop is never differentiated (implicit gradients).
    Returns (x, done, count, residual), x the iterate with the smallest scaled residual.
    """
    limit = iterations if restart is None else iterations + jnp.maximum(restart[1], 0)

    def body(carry):
        x, r, done, count, best, best_res, p_now = carry
        p = p_start if relinearize is None else p_now
        moving = ~done & (count < limit)
        x_new = step_fn(x, p, kappa, r)
        x_new = jnp.where(jnp.all(jnp.isfinite(x_new)), x_new, x)  # never step into NaN
        x = jnp.where(moving, x_new, x)
        count = count + moving.astype(jnp.int32)
        if relinearize is not None:
            p = relinearize(_unpack(x, p)[0])
        r = residual(x, p, kappa)  # also the next step's
        res = scaled_residual(x, p, kappa, r)
        better = res < best_res
        best, best_res = jnp.where(better, x, best), jnp.where(better, res, best_res)
        done = done | (res <= tolerance)
        if restart is not None:
            again = ~done & (count == restart[1])
            x, r = jnp.where(again, restart[0], x), jnp.where(again, r_cold, r)
        return x, r, done, count, best, best_res, None if relinearize is None else p

    p_start = p
    r0 = residual(x, p, kappa)
    res0 = scaled_residual(x, p, kappa, r0)
    if restart is not None:
        r_cold = residual(restart[0], p, kappa)
    carry = (x, r0, skip | (res0 <= tolerance), jnp.zeros((), jnp.int32), x, res0, None if relinearize is None else p)
    if early_exit:
        carry = jax.lax.while_loop(lambda c: ~c[2] & (c[3] < limit), body, carry)
    else:
        length = iterations + (0 if restart is None else _WARM_RESTART)
        carry = jax.lax.scan(lambda c, _: (body(c), None), carry, None, length=length)[0]
    # the iterate with the smallest residual (the converged one, for a world that converged): one that
    # ran out of iterations can have wandered far from where it came closest (humanoid at dt 0.05:
    # residual 4e-6 at iteration 10, 3e-2 at iteration 30)
    _, _, done, count, best, best_res, _ = carry
    return best, done, count, best_res


def _impulses_held(p: Problem, x, x_bar) -> Problem:
    """Cotangent of theta for an unconverged solve: the step with its contact and equality impulses
    (and their Jacobians) held constant, M v+ = momentum + const, so dv+ = M^-1 (d momentum - dM v+).
    The chain through the step stays (v+ follows the smooth dynamics); what the solve was unsure of
    contributes nothing."""
    v, v_bar = _unpack(x, p)[0], _unpack(x_bar, p)[0]
    y = linalg.solve_spd(p.M, v_bar)  # M is symmetric
    zeros = jax.tree.map(jnp.zeros_like, p)
    return zeros._replace(M=-jnp.outer(y, v), momentum=y)


def solve_nonlinear(
    p: Problem, relinearize, kappa: float, tolerance: float, iterations: int, early_exit: bool = True, skip=False,
    start=None,
) -> Solution:
    """The step's NCP with the gap evaluated at the new configuration at every iteration (Dojo's
    nonlinear gap): relinearize(v) is the problem p with each unit's gap row evaluated at
    q (+) h v and linearized about v, gap(q (+) h v) + h G(v) (v' - v), G's normal row the contact
    normal's Jacobian there; the impulses' directions and the tangential rows stay p's (start: (v0,
    impulse, impulse_e) of a nearby solution, `warm_point`; None: cold).

    Each interior-point step is then a Newton step of the nonlinear system, which converges as
    fast as the linear one near the solution; moving the impulses' directions with the iterate too
    left 17% of dt = 0.05 humanoid passes unconverged after 30 iterations (their derivative in q is
    not in the Newton matrix). At the solution v*
    the linear problem relinearize(v*) has the same rows, and v* solves it:
    `solve(relinearize(v*), solved=...)` differentiates it. Runs without gradients."""
    p = p._replace(G=_velocity_rows(p))
    x0 = initial_point(p) if start is None else warm_point(p, *start)
    x, done, count, res = _iterate(_mehrotra_step, x0, p, kappa, tolerance, iterations, early_exit, skip, relinearize=relinearize)
    v, le, u = _unpack(x, p)  # the scales of relinearize(v) are p's
    return Solution(
        qvel=v, impulse=_unit_force(u, _constants(p)), impulse_e=p.Pe * le, iterations=count, converged=done, residual=res, x=x
    )  # fmt: skip


@functools.partial(jax.jit, static_argnames=("kappa", "kappa_grad", "tolerance", "iterations", "early_exit"))
def solve(
    p: Problem, kappa: float, kappa_grad: float, tolerance: float, iterations: int, early_exit: bool = True, skip=False,
    solved=None, start=None,
) -> Solution:
    """Solve the step's NCP at `kappa`; reverse mode differentiates the `kappa_grad` central point.

    skip (per world, traced): do not iterate, the result is discarded (a re-linearized pass that a
    world does not need); under vmap the early-exit loop then runs only for the worlds that do.
    solved: (x, converged, iterations) of an earlier solve of this same problem (`Solution.x`):
    returned as it is, without iterating, and differentiated like a solve.
    start: (v, impulse, impulse_e, use) of a nearby problem's solution to start from where `use`
    (traced) holds (`warm_point`); such a solve not converged after `_WARM_RESTART` iterations
    starts again cold, with `iterations` more. The start carries no gradient either way.
    """

    def run(theta, aux):
        x0, skip, status, restart = aux
        if solved is not None:
            x, (done, count) = x0, status
            res = scaled_residual(x, theta, kappa)
        else:
            x, done, count, res = _iterate(_mehrotra_step, x0, theta, kappa, tolerance, iterations, early_exit, skip, restart)
        return x, (done, count, jax.lax.stop_gradient(res))

    def relax(x, theta, start):
        """The kappa_grad central point, by centering steps from the hard solution x; where they do not
        converge, x's pairs moved onto the central path in closed form (`warm_point` at mu0 = kappa_grad).

        The relaxed NCP need not have a central point a Newton iteration reaches: Coulomb friction
        makes it non-monotone. At a sliding unit whose dual sits on its cone boundary the centering
        cycles (fuzz seed 7016, scene 164: 40% of 500 steps, float64 too), and its best iterate
        can be the hard point itself, where a unit's block carries gamma / s ~ 1e4-1e8 and float32's
        derivative is off by 30-200x (`test_ncp.py`). The projected point has every pair central,
        whatever the iteration did."""
        if kappa_grad == kappa:
            return x
        centred, converged, _, _ = _iterate(_centering_step, x, theta, kappa_grad, tolerance, iterations, early_exit, start[1])
        c = _constants(theta)
        v, le, u = _unpack(x, theta)
        projected = warm_point(theta, v, _unit_force(u, c), c.Pe * le, mu0=kappa_grad)
        return jnp.where(converged, centred, projected)

    solver = implicit_solver(
        run,
        lambda x, theta: residual(x, theta, kappa),
        lambda x, theta: (factorize(x, theta), _constants(theta)),
        lambda factor, b: transposed_solve(factor[0], factor[1], b),
        linearization_point=relax,
        solved_from_info=lambda info: info[0] | (info[2] <= NEAR_SOLUTION),
        fallback=_impulses_held,
    )
    status = restart = None
    if solved is not None:
        x0, status = solved[0], (solved[1], solved[2])
    else:
        x0 = initial_point(jax.lax.stop_gradient(p))  # LAPACK's solves have no derivative rules
    if start is not None:
        *warm, use = start
        restart = (x0, jnp.where(use, _WARM_RESTART, -1))
        x0 = jnp.where(use, jax.lax.stop_gradient(warm_point(p, *warm)), x0)
    x, (done, count, res) = solver(p, (x0, jnp.asarray(skip), status, restart))
    v, le, u = _unpack(x, p)
    return Solution(
        qvel=v,
        impulse=_unit_force(u, _constants(p)),
        impulse_e=jax.lax.stop_gradient(p.Pe) * le,
        iterations=count,
        converged=done,
        residual=res,
        x=jax.lax.stop_gradient(x),
    )
