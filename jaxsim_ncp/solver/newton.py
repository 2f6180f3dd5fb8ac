"""MuJoCo's reduced primal problem solved by exact Newton with an exact line search.

Computation chapter, "Constraint solver" / "Newton": minimize over the acceleration a

    cost(a) = 1/2 (a - a0)^T M (a - a0) + s(J a - aref)

where s is the soft-constraint penalty of each row: 1/2 D jar^2 for equality rows,
for active one-sided rows (limits, frictionless and pyramidal contacts, jar < 0),
Huber for friction loss, and the three-zone elliptic-cone penalty (top: 0; bottom:
quadratic; middle: 1/2 D0/(mu^2 (1 + mu^2)) (N - mu T)^2). Each iteration solves
(M + J^T H_s J) p = -grad with a Cholesky factorization and minimizes the convex,
piecewise-smooth 1-D cost along p with safeguarded Newton steps. Iteration counts
are static bounds and a per-world converged mask freezes finished solves, so the
solver vmaps: with implicit gradients the loops are bounded `while_loop`s that stop
at convergence (never differentiated); with unrolled gradients they are `scan`s of
exactly `iterations` / `ls_iterations` steps.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import linalg
from ..constraint import Efc
from ..types import Model
from .implicit import implicit_solver

_MINVAL = 1e-15


class ConeIndex(NamedTuple):
    """Static (ncone, 6) row indices of elliptic contacts (padded with a valid-row mask)."""

    contact: np.ndarray  # (ncone,)
    rows: np.ndarray  # (ncone, 6)
    valid: np.ndarray  # (ncone, 6)


class RowKinds(NamedTuple):
    equality: np.ndarray  # bool (nefc,)
    friction: np.ndarray
    one_sided: np.ndarray
    cone: ConeIndex | None


def row_kinds(model: Model) -> RowKinds:
    layout = model.constraints
    n = layout.nefc
    kind = np.zeros(n, np.int64)  # 0 equality
    kind[layout.ne : layout.ne + layout.nf] = 1
    kind[layout.ne + layout.nf :] = 2
    cone = None
    if layout.cone == "elliptic" and layout.ncon:
        dims = layout.contact_dim
        cons = np.nonzero(dims > 1)[0]
        if len(cons):
            start = layout.contact_row_start[cons]
            offs = np.arange(6)
            valid = offs[None, :] < dims[cons][:, None]
            rows = np.where(valid, start[:, None] + offs[None, :], start[:, None])
            kind[rows[valid]] = 3
            cone = ConeIndex(cons, rows, valid)
    return RowKinds(kind == 0, kind == 1, kind == 2, cone)


class _Cone(NamedTuple):
    mu: Array  # (ncone,)
    scale: Array  # (ncone, 6): diag(mu, friction) mapping jar to the regular dual-cone space
    D0: Array  # (ncone,)


def _cone_data(efc: Efc, friction: Array, kinds: RowKinds) -> _Cone | None:
    cone = kinds.cone
    if cone is None:
        return None
    mu = efc.mu[cone.contact]
    fr = friction[cone.contact]  # (ncone, 5)
    scale = jnp.concatenate([mu[:, None], fr], axis=1) * jnp.asarray(cone.valid, fr.dtype)
    return _Cone(mu, scale, efc.D[cone.rows[:, 0]])


def _zones(jar, efc: Efc, kinds: RowKinds, cone: _Cone | None):
    """Per-row force, per-row quadratic weight, and elliptic middle-zone data at jar."""
    D, R, fl = efc.D, efc.R, efc.frictionloss
    eq = jnp.asarray(kinds.equality)
    fr = jnp.asarray(kinds.friction)
    one = jnp.asarray(kinds.one_sided)
    lin_neg = fr & (jar <= -R * fl)
    lin_pos = fr & (jar >= R * fl)
    quad = eq | (fr & ~lin_neg & ~lin_pos) | (one & (jar < 0))
    quad = quad & efc.mask
    force = jnp.where(quad, -D * jar, 0.0)
    force = jnp.where(lin_neg & efc.mask, fl, jnp.where(lin_pos & efc.mask, -fl, force))
    middle = None
    if cone is not None:
        idx = kinds.cone
        U = jar[idx.rows] * cone.scale  # (ncone, 6)
        N = U[:, 0]
        Tsq = jnp.sum(U[:, 1:] ** 2, axis=-1)
        T = jnp.sqrt(jnp.where(Tsq > 0, Tsq, 1.0)) * (Tsq > 0)
        mu = cone.mu
        active = efc.mask[idx.rows[:, 0]]
        top = (N >= mu * T) | ((T <= 0) & (N >= 0))
        bottom = ~top & ((mu * N + T <= 0) | ((T <= 0) & (N < 0)))
        mid = ~top & ~bottom & active
        bottom = bottom & active
        rows_bottom = jnp.zeros_like(quad).at[idx.rows].max(bottom[:, None] & jnp.asarray(idx.valid))
        quad = quad | rows_bottom
        force = jnp.where(rows_bottom, -D * jar, force)
        Dm = cone.D0 / (mu**2 * (1 + mu**2) + _MINVAL)
        NmT = N - mu * T
        Ts = jnp.where(mid, T, 1.0)
        f0 = -Dm * NmT * mu
        fU = jnp.concatenate([f0[:, None], (-f0 / Ts)[:, None] * U[:, 1:] * cone.scale[:, 1:]], axis=1)
        fU = jnp.where(mid[:, None] & jnp.asarray(idx.valid), fU, 0.0)
        force = force.at[idx.rows].add(fU)
        middle = (mid, U, N, Ts, Dm)
    return force, quad, middle


def _cost(jar, efc: Efc, kinds: RowKinds, cone: _Cone | None, quad, middle):
    """s(jar): quadratic rows, linear friction-loss rows and the elliptic middle zone."""
    D, R, fl = efc.D, efc.R, efc.frictionloss
    fr = jnp.asarray(kinds.friction) & efc.mask
    s = jnp.sum(jnp.where(quad, 0.5 * D * jar**2, 0.0))
    lin = fr & ~quad
    s += jnp.sum(jnp.where(lin, -0.5 * R * fl**2 + fl * jnp.abs(jar), 0.0))
    if middle is not None:
        mid, _, N, T, Dm = middle
        s += jnp.sum(jnp.where(mid, 0.5 * Dm * (N - cone.mu * T) ** 2, 0.0))
    return s


def _hessian(M, efc: Efc, quad, middle, kinds: RowKinds, cone: _Cone | None):
    J = efc.J
    H = M + J.T @ (jnp.where(quad, efc.D, 0.0)[:, None] * J)
    if middle is not None:
        mid, U, N, T, Dm = middle
        idx = kinds.cone
        mu = cone.mu
        Ut = U[:, 1:]
        # cone Hessian in U space: [1, -mu/T U_t; ., mu N / T^3 U_t U_t^T + (mu^2 - mu N / T) I]
        top_row = jnp.concatenate([jnp.ones_like(mu)[:, None], (-mu / T)[:, None] * Ut], axis=1)
        block = (mu * N / T**3)[:, None, None] * Ut[:, :, None] * Ut[:, None, :]
        block = block + (mu**2 - mu * N / T)[:, None, None] * jnp.eye(5, dtype=U.dtype)
        Hc = jnp.zeros((U.shape[0], 6, 6), U.dtype)
        Hc = Hc.at[:, 0, :].set(top_row).at[:, :, 0].set(top_row).at[:, 1:, 1:].set(block)
        Hc = Hc * (cone.scale[:, :, None] * cone.scale[:, None, :]) * Dm[:, None, None]
        Hc = jnp.where(mid[:, None, None], Hc, 0.0)
        Jc = J[idx.rows] * jnp.asarray(idx.valid, J.dtype)[:, :, None]  # (ncone, 6, nv)
        H = H + jnp.einsum("cin,cij,cjm->nm", Jc, Hc, Jc)
    return H


class _Eval(NamedTuple):
    cost: Array
    d1: Array
    d2: Array


def _line_eval(alpha, jar, Jp, gauss, efc: Efc, kinds: RowKinds, cone: _Cone | None) -> _Eval:
    """Cost along the search direction and its first two derivatives in alpha (exact)."""
    x = jar + alpha * Jp
    _, quad, middle = _zones(x, efc, kinds, cone)
    D, R, fl = efc.D, efc.R, efc.frictionloss
    cost = gauss[0] + alpha * gauss[1] + 0.5 * alpha**2 * gauss[2]
    d1 = gauss[1] + alpha * gauss[2]
    d2 = gauss[2]
    cost += _cost(x, efc, kinds, cone, quad, middle)
    d1 += jnp.sum(jnp.where(quad, D * x * Jp, 0.0))
    d2 += jnp.sum(jnp.where(quad, D * Jp**2, 0.0))
    lin = jnp.asarray(kinds.friction) & efc.mask & ~quad
    d1 += jnp.sum(jnp.where(lin, fl * jnp.sign(x) * Jp, 0.0))
    if middle is not None:
        mid, U, N, T, Dm = middle  # T is only used where mid, where it is > 0
        idx = kinds.cone
        V = Jp[idx.rows] * cone.scale
        t1 = jnp.sum(U[:, 1:] * V[:, 1:], -1) / T
        t2 = (jnp.sum(V[:, 1:] ** 2, -1) - t1**2) / T
        nmt = N - cone.mu * T
        nmt1 = V[:, 0] - cone.mu * t1
        d1 += jnp.sum(jnp.where(mid, Dm * nmt * nmt1, 0.0))
        d2 += jnp.sum(jnp.where(mid, Dm * (nmt1**2 - nmt * cone.mu * t2), 0.0))
    return _Eval(cost, d1, d2)


def _total_cost(qacc, M, qfrc_smooth, efc, kinds, cone):
    jar = efc.J @ qacc - efc.aref
    _, quad, middle = _zones(jar, efc, kinds, cone)
    return 0.5 * qacc @ M @ qacc - qacc @ qfrc_smooth + _cost(jar, efc, kinds, cone, quad, middle)


class _State(NamedTuple):
    """Everything the Newton iteration needs at one qacc."""

    qacc: Array
    Ma: Array
    jar: Array
    force: Array
    quad: Array
    middle: tuple | None
    grad: Array  # M qacc - qfrc_smooth - J^T force: gradient of the total cost


class Solution(NamedTuple):
    qacc: Float[Array, " nv"]
    efc_force: Float[Array, " nefc"]
    qfrc_constraint: Float[Array, " nv"]
    iterations: Array  # Newton iterations used
    converged: Array  # bool: stopped by the tolerance, not by the iteration limit


class Problem(NamedTuple):
    """What the solution depends on (theta of the implicit differentiation)."""

    M: Float[Array, "nv nv"]
    qfrc_smooth: Float[Array, " nv"]
    efc: Efc
    friction: Float[Array, "ncon 5"]


def solve(
    model: Model,
    M: Float[Array, "nv nv"],
    qfrc_smooth: Float[Array, " nv"],
    qacc_smooth: Float[Array, " nv"],
    qacc_warmstart: Float[Array, " nv"],
    efc: Efc,
    friction: Float[Array, "ncon 5"],
) -> Solution:
    """Minimize the reduced primal cost (mj_solNewton) from the better of warm start and a0.

    With `model.opt.grad_mode == "implicit"` (default) reverse mode differentiates the
    optimality condition grad cost(qacc) = 0 at the solution (`implicit.implicit_solver`:
    one solve with the cost Hessian M + J^T H_s J), and since the iterations are not
    differentiated they stop at convergence (at most `iterations`, as mj_solNewton);
    with "unroll" reverse mode differentiates through exactly `iterations` masked Newton
    steps and their line searches.
    """
    kinds = row_kinds(model)
    problem = Problem(M, qfrc_smooth, efc, friction)
    cone = _cone_data(efc, friction, kinds)
    cost_ws = _total_cost(qacc_warmstart, M, qfrc_smooth, efc, kinds, cone)
    cost_sm = _total_cost(qacc_smooth, M, qfrc_smooth, efc, kinds, cone)
    qacc0 = jnp.where(cost_ws < cost_sm, qacc_warmstart, qacc_smooth)
    opt = model.opt
    scale = 1.0 / (opt.meaninertia * max(1, model.nv))  # MuJoCo's tolerance scaling
    minimize = functools.partial(
        _minimize, kinds=kinds, iterations=opt.iterations, ls_iterations=opt.ls_iterations,
        tolerance=opt.tolerance, ls_tolerance=opt.ls_tolerance, early_exit=opt.grad_mode == "implicit",
    )
    if opt.grad_mode == "implicit":
        residual = functools.partial(_residual, kinds=kinds)
        factorize = functools.partial(_factorize_hessian, kinds=kinds)
        minimize = implicit_solver(minimize, residual, factorize, linalg.cho_solve)
        qacc0, scale = jax.lax.stop_gradient((qacc0, scale))
    qacc, (count, converged) = minimize(problem, (qacc0, scale))
    st = _state_at(qacc, problem, kinds, cone)  # forces at the solution, differentiable in qacc and theta
    return Solution(qacc, st.force, efc.J.T @ st.force, count, converged)


def _state_at(qacc, problem: Problem, kinds: RowKinds, cone: _Cone | None) -> _State:
    M, qfrc_smooth, efc, _ = problem
    jar = efc.J @ qacc - efc.aref
    force, quad, middle = _zones(jar, efc, kinds, cone)
    Ma = M @ qacc
    return _State(qacc, Ma, jar, force, quad, middle, Ma - qfrc_smooth - efc.J.T @ force)


def _residual(qacc, problem: Problem, kinds: RowKinds):
    """Optimality condition: the gradient of the total cost, M qacc - qfrc_smooth - J^T force."""
    return _state_at(qacc, problem, kinds, _cone_data(problem.efc, problem.friction, kinds)).grad


def _factorize_hessian(qacc, problem: Problem, kinds: RowKinds):
    """Cholesky factor of the cost Hessian M + J^T H_s J at qacc (the Jacobian of `_residual`)."""
    cone = _cone_data(problem.efc, problem.friction, kinds)
    st = _state_at(qacc, problem, kinds, cone)
    return linalg.cho_factor(_hessian(problem.M, problem.efc, st.quad, st.middle, kinds, cone))


def _minimize(
    problem: Problem,
    start,
    *,
    kinds: RowKinds,
    iterations: int,
    ls_iterations: int,
    tolerance: float,
    ls_tolerance: float,
    early_exit: bool,
) -> tuple[Array, tuple[Array, Array]]:
    """Newton iterations from start = (qacc0, tolerance scale); returns (qacc, (iterations used, converged)).

    early_exit: a bounded `while_loop` that stops at convergence (vmapped, it runs until
    every world has converged, finished worlds frozen); otherwise a `scan` of exactly
    `iterations` steps with a converged mask, which reverse mode can differentiate.
    """
    qacc0, scale = start
    M, qfrc_smooth, efc, friction = problem
    cone = _cone_data(efc, friction, kinds)

    def newton_iteration(carry, _):
        st, done, count = carry
        H = _hessian(M, efc, st.quad, st.middle, kinds, cone)
        p = -linalg.solve_spd(H, st.grad)
        Jp = efc.J @ p
        gauss = (0.5 * st.qacc @ st.Ma - st.qacc @ qfrc_smooth, p @ (st.Ma - qfrc_smooth), p @ M @ p)
        ev = lambda a: _line_eval(a, st.jar, Jp, gauss, efc, kinds, cone)  # noqa: E731
        start = ev(jnp.zeros((), st.qacc.dtype))
        alpha, new_cost = _line_search(ev, start, ls_iterations, ls_tolerance, early_exit)
        new = _state_at(st.qacc + alpha * p, problem, kinds, cone)
        improvement = scale * (start.cost - new_cost)
        gnorm = scale * jnp.sqrt(jnp.sum(new.grad**2))
        converged = (improvement < tolerance) | (gnorm < tolerance)
        st = jax.tree.map(lambda old, fresh: jnp.where(done, old, fresh), st, new)
        return (st, done | converged, count + jnp.where(done, 0, 1)), None

    st0 = _state_at(qacc0, problem, kinds, cone)
    done0 = scale * jnp.sqrt(jnp.sum(st0.grad**2)) < tolerance
    init = (st0, done0, jnp.zeros((), jnp.int32))
    if early_exit:  # not differentiated (implicit mode): stop once converged, at most `iterations`
        st, done, count = jax.lax.while_loop(
            lambda c: ~c[1] & (c[2] < iterations), lambda c: newton_iteration(c, None)[0], init
        )
    else:
        (st, done, count), _ = jax.lax.scan(newton_iteration, init, None, length=iterations)
    return st.qacc, (count, done)


def _line_search(ev, start: _Eval, iterations: int, ls_tolerance: float, early_exit: bool):
    """(alpha, cost at alpha). Exact 1-D minimization of a convex piecewise-smooth cost: bracketed Newton steps.

    Starts at alpha = 0 (d1 < 0 along a descent direction); each step jumps to the
    minimum of the local quadratic model, falling back to bisection when that leaves
    the bracket. Stops refining once |d1| <= ls_tolerance * |d1(0)|.
    """
    gtol = ls_tolerance * jnp.abs(start.d1)
    dtype = start.cost.dtype

    def body(carry, _):
        alpha, cur, lo, hi, best, best_cost = carry
        step = alpha - cur.d1 / jnp.maximum(cur.d2, _MINVAL)
        outside = (step <= lo) | (step >= hi)
        cand = jnp.where(outside, jnp.where(jnp.isfinite(hi), 0.5 * (lo + hi), 2 * jnp.maximum(step, lo) + 1), step)
        done = jnp.abs(cur.d1) <= gtol
        cand = jnp.where(done, alpha, cand)
        new = ev(cand)
        lo = jnp.where(done | (new.d1 > 0), lo, cand)
        hi = jnp.where(~done & (new.d1 > 0), cand, hi)
        better = new.cost < best_cost
        best = jnp.where(better, cand, best)
        best_cost = jnp.where(better, new.cost, best_cost)
        return (cand, new, lo, hi, best, best_cost), None

    zero = jnp.zeros((), dtype)
    init = (zero, start, zero, jnp.asarray(jnp.inf, dtype), zero, start.cost)
    if early_exit:
        step = lambda c: (body(c[0], None)[0], c[1] + 1)  # noqa: E731
        unfinished = lambda c: (jnp.abs(c[0][1].d1) > gtol) & (c[1] < max(1, iterations))  # noqa: E731
        (_, _, _, _, best, best_cost), _ = jax.lax.while_loop(unfinished, step, (init, 0))
    else:
        (_, _, _, _, best, best_cost), _ = jax.lax.scan(body, init, None, length=max(1, iterations))
    return best, best_cost
