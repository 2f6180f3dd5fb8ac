"""MuJoCo's reduced primal problem solved as mj_solPrimal's Newton (or conjugate gradient) method does.

Computation chapter, "Constraint solver" / "Newton": minimize over the acceleration a

    cost(a) = 1/2 (a - a0)^T M (a - a0) + s(J a - aref)

where s is the soft-constraint penalty of each row: 1/2 D jar^2 for equality rows,
for active one-sided rows (limits, frictionless and pyramidal contacts, jar < 0),
Huber for friction loss, and the three-zone elliptic-cone penalty (top: 0; bottom:
quadratic; middle: 1/2 D0/(mu^2 (1 + mu^2)) (N - mu T)^2). Each iteration solves
(M + J^T H_s J) p = -grad with a Cholesky factorization and searches along p with
MuJoCo's line search (PrimalSearch), separately in each constraint island
(`island.py`), so truncated solves (small `iterations`) follow MuJoCo's too.
With sparse contact rows (constraint.Efc) the Hessian's contact part is one small block per
contact over the dofs it moves. Iteration counts are static bounds and converged masks freeze
finished islands and worlds, so the solver vmaps: with implicit gradients the loops are bounded
`while_loop`s that stop at convergence (never differentiated); with unrolled
gradients they are `scan`s of exactly `iterations` steps, each searching with a fixed
number of evaluations.
With option/solver="CG" (`Model.opt.solver == "cg"`) the direction is mj_solPrimal's conjugate
gradient instead: -M^-1 grad plus Hager-Zhang's beta times the last direction, with the same line
search and stopping rules less the Newton decrement; its solution is the same problem's minimizer,
so the implicit gradient is the same.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .. import constraint, linalg
from ..constraint import Efc, apply, apply_transpose
from ..types import Model
from . import island
from .implicit import implicit_solver

_MINVAL = 1e-15


class ConeIndex(NamedTuple):
    """Static (ncone, 6) row indices of elliptic contacts (padded with a valid-row mask)."""

    contact: np.ndarray  # (ncone,) efc contact
    rows: np.ndarray  # (ncone, 6)
    valid: np.ndarray  # (ncone, 6)


class RowKinds(NamedTuple):
    equality: np.ndarray  # bool (nefc,)
    friction: np.ndarray
    one_sided: np.ndarray
    cone: ConeIndex | None
    contact_rows: np.ndarray  # (nefc_contact, max rows) each efc contact's rows, counted from the first contact row
    contact_valid: np.ndarray  # (nefc_contact, max rows) which of those exist
    axis_rows: np.ndarray  # rows whose J is +-e_dof (`constraint.axis_rows`), and their dofs
    axis_dofs: np.ndarray


def row_kinds(model: Model) -> RowKinds:
    layout = model.constraints
    n = layout.nefc
    kind = np.zeros(n, np.int64)  # 0 equality
    kind[layout.ne : layout.ne + layout.nf] = 1
    kind[layout.ne + layout.nf :] = 2
    cone = None
    if layout.cone == "elliptic" and layout.ncon:
        dims = layout.efc_contact_dim
        cons = np.nonzero(dims > 1)[0]
        if len(cons):
            start = layout.contact_row_start[cons]
            offs = np.arange(6)
            valid = offs[None, :] < dims[cons][:, None]
            rows = np.where(valid, start[:, None] + offs[None, :], start[:, None])
            kind[rows[valid]] = 3
            cone = ConeIndex(cons, rows, valid)
    counts = layout.contact_rows
    offs = np.arange(max(1, int(counts.max(initial=1))))
    valid = offs[None, :] < counts[:, None]
    first = layout.contact_row_start - (layout.ne + layout.nf + layout.nl)
    return RowKinds(kind == 0, kind == 1, kind == 2, cone, np.where(valid, first[:, None] + offs, 0), valid,
                    *constraint.axis_rows(model))


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
        fU = jnp.concatenate([f0[:, None], -f0[:, None] * (U[:, 1:] / Ts[:, None]) * cone.scale[:, 1:]], axis=1)
        fU = jnp.where(mid[:, None] & jnp.asarray(idx.valid), fU, 0.0)
        force = force.at[idx.rows].add(fU)
        middle = (mid, U, N, Ts, Dm)
    return force, quad, middle


def _cost_terms(jar, efc: Efc, kinds: RowKinds, cone: _Cone | None, quad, middle):
    """s(jar) by row (quadratic rows, linear friction-loss rows) and by elliptic cone (middle zone)."""
    D, R, fl = efc.D, efc.R, efc.frictionloss
    lin = jnp.asarray(kinds.friction) & efc.mask & ~quad
    rows = jnp.where(quad, 0.5 * D * jar**2, jnp.where(lin, -0.5 * R * fl**2 + fl * jnp.abs(jar), 0.0))
    if middle is None:
        return rows, None
    mid, _, N, T, Dm = middle
    return rows, jnp.where(mid, 0.5 * Dm * (N - cone.mu * T) ** 2, 0.0)


def _cost(jar, efc: Efc, kinds: RowKinds, cone: _Cone | None, quad, middle):
    rows, cones = _cost_terms(jar, efc, kinds, cone, quad, middle)
    return jnp.sum(rows) + (0.0 if cones is None else jnp.sum(cones))


def _cone_hessian(middle, cone: _Cone):
    """Each cone's middle-zone Hessian (ncone, 6, 6) in row space (zero outside the middle zone).

    MuJoCo's [1, -mu/T U_t; ., mu N/T^3 U_t U_t^T + (mu^2 - mu N/T) I] in U space, written with
    the unit tangent u = U_t/T and r = N/T, both bounded in the middle zone (-T/mu < N < mu T):
    [1, -mu u; ., mu r u u^T + (mu^2 - mu r) I]. T^3 underflows in float32 at T < 1e-13 (a
    contact whose tangential velocity is almost exactly zero), which made the Hessian inf and
    unrolled gradients NaN (fuzz seed 4003, scene 32)."""
    mid, U, N, T, Dm = middle
    mu = cone.mu
    unit, ratio = U[:, 1:] / T[:, None], N / T
    top_row = jnp.concatenate([jnp.ones_like(mu)[:, None], -mu[:, None] * unit], axis=1)
    block = (mu * ratio)[:, None, None] * unit[:, :, None] * unit[:, None, :]
    block = block + (mu**2 - mu * ratio)[:, None, None] * jnp.eye(5, dtype=U.dtype)
    Hc = jnp.zeros((U.shape[0], 6, 6), U.dtype)
    Hc = Hc.at[:, 0, :].set(top_row).at[:, :, 0].set(top_row).at[:, 1:, 1:].set(block)
    Hc = Hc * (cone.scale[:, :, None] * cone.scale[:, None, :]) * Dm[:, None, None]
    return jnp.where(mid[:, None, None], Hc, 0.0)


def _hessian(M, efc: Efc, quad, middle, kinds: RowKinds, cone: _Cone | None):
    """M + J^T H_s J: quadratic rows D, elliptic middle zones their cone Hessian. Rows that are
    +-e_dof (limits, dof friction) add their weight to H's diagonal instead of entering the product."""
    weight = jnp.where(quad, efc.D, 0.0)
    J = efc.J
    if len(kinds.axis_rows):
        other = np.setdiff1d(np.arange(len(J)), kinds.axis_rows)  # the rest of efc.J's rows
        Jo, wo = J[other], weight[other]
        H = (M + Jo.T @ (wo[:, None] * Jo)).at[kinds.axis_dofs, kinds.axis_dofs].add(weight[kinds.axis_rows])
    else:
        H = M + J.T @ (weight[: len(J), None] * J)
    if efc.Jc is None:
        if middle is not None:
            idx = kinds.cone
            Jcone = J[idx.rows] * jnp.asarray(idx.valid, J.dtype)[:, :, None]  # (ncone, 6, nv)
            H = H + jnp.einsum("cin,cij,cjm->nm", Jcone, _cone_hessian(middle, cone), Jcone)
        return H
    # sparse contact rows: one (w, w) block per efc contact over its dofs, added into H
    rows, valid = kinds.contact_rows, jnp.asarray(kinds.contact_valid)
    Jb = efc.Jc[rows] * valid[..., None]  # (nefc_contact, r, w)
    W = jnp.where(valid, weight[len(J) :][rows], 0.0)[:, :, None] * jnp.eye(rows.shape[1], dtype=J.dtype)  # (., r, r)
    if middle is not None:
        r = min(6, rows.shape[1])
        W = W.at[kinds.cone.contact, :r, :r].add(_cone_hessian(middle, cone)[:, :r, :r])
    block = jnp.einsum("eiw,eij,ejv->ewv", Jb, W, Jb)
    dofs = efc.dofs[rows[:, 0]]  # (nefc_contact, w)
    return H.at[dofs[:, :, None], dofs[:, None, :]].add(block, mode="drop")


class _Eval(NamedTuple):
    cost: Array
    d1: Array
    d2: Array


def _line_eval(alpha, jar, Jp, gauss, efc: Efc, kinds: RowKinds, cone: _Cone | None, isl: island.Islands) -> _Eval:
    """Each island's cost along the search direction, shifted by its Gauss constant, and the
    first two derivatives in its step length alpha (exact); gauss = (p^T (M a - f), p^T M p) per island."""
    x = jar + island.spread(alpha, isl.row) * Jp
    _, quad, middle = _zones(x, efc, kinds, cone)
    D, fl = efc.D, efc.frictionloss
    rows, cones = _cost_terms(x, efc, kinds, cone, quad, middle)
    lin = jnp.asarray(kinds.friction) & efc.mask & ~quad
    d1_rows = jnp.where(quad, D * x * Jp, jnp.where(lin, fl * jnp.sign(x) * Jp, 0.0))
    d2_rows = jnp.where(quad, D * Jp**2, 0.0)
    by_row = island.segment_sum(jnp.stack([rows, d1_rows, d2_rows], axis=-1), isl.row, isl)  # one reduction
    cost = alpha * gauss[0] + 0.5 * alpha**2 * gauss[1] + by_row[:, 0]
    d1 = gauss[0] + alpha * gauss[1] + by_row[:, 1]
    d2 = gauss[1] + by_row[:, 2]
    if middle is not None:
        mid, U, N, T, Dm = middle  # T is only used where mid, where it is > 0
        idx = kinds.cone
        V = Jp[idx.rows] * cone.scale
        # T' = t1 and T'' = t2 / T along V; nmt t2 / T as (N/T - mu) t2, bounded (see _cone_hessian)
        t1 = jnp.sum(U[:, 1:] / T[:, None] * V[:, 1:], -1)
        t2 = jnp.sum(V[:, 1:] ** 2, -1) - t1**2
        nmt = N - cone.mu * T
        nmt1 = V[:, 0] - cone.mu * t1
        d1_cones = jnp.where(mid, Dm * nmt * nmt1, 0.0)
        d2_cones = jnp.where(mid, Dm * (nmt1**2 - cone.mu * (N / T - cone.mu) * t2), 0.0)
        ids = isl.row[idx.rows[:, 0]]
        by_cone = island.segment_sum(jnp.stack([cones, d1_cones, d2_cones], axis=-1), ids, isl)
        cost, d1, d2 = cost + by_cone[:, 0], d1 + by_cone[:, 1], d2 + by_cone[:, 2]
    return _Eval(cost, d1, d2)


def _constraint_cost(qacc, efc: Efc, kinds: RowKinds, cone: _Cone | None):
    """s(J qacc - aref): the constraints' part of the cost at qacc."""
    jar = apply(efc, qacc) - efc.aref
    _, quad, middle = _zones(jar, efc, kinds, cone)
    return _cost(jar, efc, kinds, cone, quad, middle)


def _warm_start_is_worse(problem: Problem, qacc_warmstart, qacc_smooth, kinds: RowKinds, cone: _Cone | None):
    """MuJoCo's warmstart(): the total cost at qacc_warmstart, s + 1/2 (M a - f).(a - a_smooth), above
    the cost at qacc_smooth, where the Gauss term is zero."""
    M, qfrc_smooth, efc, _ = problem
    gauss = 0.5 * jnp.sum((M @ qacc_warmstart - qfrc_smooth) * (qacc_warmstart - qacc_smooth))
    cost_warmstart = _constraint_cost(qacc_warmstart, efc, kinds, cone) + gauss
    return cost_warmstart > _constraint_cost(qacc_smooth, efc, kinds, cone)


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
    iterations: Array  # Newton (or CG) iterations used, the most of any island
    converged: Array  # bool: stopped by the tolerance, not by the iteration limit


class Problem(NamedTuple):
    """What the solution depends on (theta of the implicit differentiation)."""

    M: Float[Array, "nv nv"]
    qfrc_smooth: Float[Array, " nv"]
    efc: Efc
    friction: Float[Array, "nefc_contact 5"]


@jax.jit
def solve(
    model: Model,
    M: Float[Array, "nv nv"],
    qfrc_smooth: Float[Array, " nv"],
    qacc_smooth: Float[Array, " nv"],
    qacc_warmstart: Float[Array, " nv"],
    efc: Efc,
    friction: Float[Array, "nefc_contact 5"],
    contact_geom: Int[Array, "nefc_contact 2"] | np.ndarray,
) -> Solution:
    """Minimize the reduced primal cost (mj_solNewton) from the better of warm start and a0.

    friction, contact_geom: of the efc contacts (`constraint.efc_contacts`).

    With `model.opt.grad_mode == "implicit"` (default) reverse mode differentiates the
    optimality condition grad cost(qacc) = 0 at the solution (`implicit.implicit_solver`:
    one solve with the cost Hessian M + J^T H_s J), and since the iterations are not
    differentiated they stop at convergence (at most `iterations`, as mj_solNewton);
    with "unroll" reverse mode differentiates through exactly `iterations` masked Newton
    steps, each with its line-search step length held fixed, from a start that carries no
    gradient; islands that converged get the implicit derivative of their solution.
    """
    kinds = row_kinds(model)
    problem = Problem(M, qfrc_smooth, efc, friction)
    cone = _cone_data(efc, friction, kinds)
    qacc0 = jnp.where(_warm_start_is_worse(problem, qacc_warmstart, qacc_smooth, kinds, cone), qacc_smooth, qacc_warmstart)
    opt = model.opt
    isl = island.find(model, efc.J, efc.mask, contact_geom)
    scale = island.tolerance_scale(model, M, isl)
    qacc0 = jnp.where(isl.dof == isl.count, qacc_smooth, qacc0)  # unconstrained dofs (islands only)
    minimize = functools.partial(
        _minimize, kinds=kinds, n_islands=isl.count, conjugate_gradient=opt.solver == "cg",
        iterations=opt.iterations, ls_iterations=opt.ls_iterations,
        tolerance=opt.tolerance, ls_tolerance=opt.ls_tolerance, unrolled=opt.grad_mode == "unroll",
        early_exit=opt.grad_mode == "implicit" and newton_early_exit(opt), trees_coupled=model.ntendon > 0,
    )  # fmt: skip
    # the start (warm start or qacc_smooth) carries no gradient in either mode: differentiating it would
    # chain each step's solver error into the next step's derivative (unrolled rollout gradients of
    # resting fuzz scenes grew 1e63-fold over 500 steps in float64, where the implicit one stays ~1e5)
    qacc0 = jax.lax.stop_gradient(qacc0)
    if opt.grad_mode == "implicit":
        residual = functools.partial(_residual, kinds=kinds)
        factorize = functools.partial(_factorize_hessian, kinds=kinds)
        minimize = implicit_solver(minimize, residual, factorize, linalg.cho_solve)
    qacc, (count, converged) = minimize(problem, (qacc0, jax.lax.stop_gradient(scale), isl.dof, isl.row))
    st = _state_at(qacc, problem, kinds, cone)  # forces at the solution, differentiable in qacc and theta
    return Solution(qacc, st.force, apply_transpose(efc, st.force), count, converged)


def newton_early_exit(opt) -> bool:
    """Whether implicit mode's loops stop at convergence (`while_loop`) or run their full counts (`scan`).

    Option `newton_early_exit`; None (default) picks by the platform being traced for. The iterates are
    the same. On the CPU stopping early saves the arithmetic (capped pile B=1: 0.56 s per 3 steps
    against 0.69 s); on a GPU each `while_loop` trip is a predicate read back by the host before the
    next launch, and full counts are faster (H100, float32: capped pile 246 -> 294 steps/s at B=1,
    2538 -> 2781 at B=64; the humanoid at B=8192 unchanged, 3.62e6 against 3.58e6).
    """
    if opt.newton_early_exit is not None:
        return opt.newton_early_exit
    return jax.default_backend() == "cpu"


def _state_at(qacc, problem: Problem, kinds: RowKinds, cone: _Cone | None) -> _State:
    M, _, efc, _ = problem
    return _state_from(qacc, M @ qacc, apply(efc, qacc) - efc.aref, problem, kinds, cone)


def _state_from(qacc, Ma, jar, problem: Problem, kinds: RowKinds, cone: _Cone | None) -> _State:
    """The state at qacc given M qacc and jar = J qacc - aref."""
    _, qfrc_smooth, efc, _ = problem
    force, quad, middle = _zones(jar, efc, kinds, cone)
    return _State(qacc, Ma, jar, force, quad, middle, Ma - qfrc_smooth - apply_transpose(efc, force))


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
    n_islands: int,
    conjugate_gradient: bool,
    iterations: int,
    ls_iterations: int,
    tolerance: float,
    ls_tolerance: float,
    unrolled: bool,
    early_exit: bool,
    trees_coupled: bool,
) -> tuple[Array, tuple[Array, Array]]:
    """mj_solPrimal's Newton loop, every island at once; returns (qacc, (iterations, converged)).

    start = (qacc0, per-island tolerance scale, island of each dof, island of each row).
    Search direction p = -H^-1 grad (H is block diagonal over islands, so this is each
    island's direction), or with conjugate_gradient CG's (`conjugate_direction`); each island
    takes its own step from MuJoCo's line search (`_primal_search`) and stops when that finds
    no improvement, or when its scaled improvement (if positive), gradient norm or (Newton)
    decrement 1/2 grad^T H^-1 grad falls below the tolerance. Before the first step Newton
    stops when both its gradient and decrement are below it (this implies MuJoCo's duality-gap
    certificate, which bounds the decrement), CG on the gap 1/2 grad^T M^-1 grad alone.
    Returns the most iterations any island used.

    Each iteration factors the Hessian once, at its top (as mj_solNewton): a loop that ends on
    improvement, gradient or the iteration cap does not factor at its last iterate (the
    humanoid at iterations = 1: 2 factorizations per step with M's, not 3; 15% less CPU time), so
    there the decrement test is not made (early exit) and reverse mode's implicit gradient
    factors the Hessian at the solution itself.

    unrolled: reverse mode differentiates the iterations (grad_mode="unroll"); otherwise they
    are not differentiated (the implicit VJP of `solve` takes the solution's derivative).
    early_exit (never with unrolled): bounded `while_loop`s (Newton and line search) that stop
    when every island has converged (vmapped, finished worlds frozen); otherwise `scan`s of
    their full counts with converged masks: the same iterates, more arithmetic, but no
    predicate read back by the host per loop trip on a GPU.
    trees_coupled: M is not block diagonal over the kinematic trees (a tendon's armature), so not over
    the islands either: M qacc moves by M (step p), not by each island's step times M p.
    """
    qacc0, scale, dof_island, row_island = start
    isl = island.Islands(dof_island, row_island, n_islands)
    M, qfrc_smooth, efc, friction = problem
    cone = _cone_data(efc, friction, kinds)

    def per_island(v):
        return island.segment_sum(v, isl.dof, isl)

    def direction(st: _State):
        """Newton direction at st and each island's scaled decrement 1/2 grad^T H^-1 grad."""
        H = _hessian(M, efc, st.quad, st.middle, kinds, cone)
        # unrolled: solve_spd, whose derivative is the textbook one; otherwise a plain factor and solve
        p = -linalg.solve_spd(H, st.grad) if unrolled else -linalg.cho_solve(linalg.cho_factor(H), st.grad)
        return p, jnp.maximum(0.0, -0.5 * scale * per_island(st.grad * p))

    st0 = _state_at(qacc0, problem, kinds, cone)
    M_factor = linalg.cho_factor(M) if conjugate_gradient else None  # CG is never unrolled (io refuses it)

    def conjugate_direction(st: _State, previous, count):
        """CG's direction (mj_solPrimal without flg_Newton): -M^-1 grad, plus Hager-Zhang's beta times the
        island's last direction after its first step, restarted (beta = 0) where d.y < mjMINVAL; and each
        island's duality gap 1/2 grad^T M^-1 grad. previous = (last direction, gradient and M^-1 gradient)."""
        Mgrad = linalg.cho_solve(M_factor, st.grad)
        search, grad_old, Mgrad_old = previous
        y, My = st.grad - grad_old, Mgrad - Mgrad_old
        products = per_island(jnp.stack([search * y, y * My, y * Mgrad, search * st.grad, search**2, st.grad**2], -1))
        d_y, y_My, y_Mgrad, d_grad, d_sq, grad_sq = jnp.moveaxis(products, -1, 0)
        conjugate = (count > 0) & (d_y >= _MINVAL)
        d_y = jnp.where(conjugate, d_y, 1.0)
        beta = (y_Mgrad - 2 * (y_My / d_y) * d_grad) / d_y
        eta = -1.0 / jnp.maximum(_MINVAL, jnp.sqrt(d_sq) * jnp.minimum(0.01, jnp.sqrt(grad_sq)))  # HZ's lower bound
        beta = jnp.where(conjugate, jnp.maximum(eta, beta), 0.0)
        p = -Mgrad + island.spread(beta, isl.dof) * search
        gap = jnp.maximum(0.0, 0.5 * scale * per_island(st.grad * Mgrad))
        return p, gap, (p, st.grad, Mgrad)

    def gradient_norm(st: _State):
        return scale * jnp.sqrt(per_island(jax.lax.stop_gradient(st.grad) ** 2))

    small_start_gradient = gradient_norm(st0) < tolerance

    def decrement_converged(decrement, count):
        """The decrement test; before an island's first step its gradient must be small too."""
        return (decrement < tolerance) & ((count > 0) | small_start_gradient)

    def newton_iteration(carry, _):
        # The direction is computed at the top, as mj_solNewton does: an island stopped by its
        # improvement or gradient, or by the iteration cap, costs no factorization it would not use.
        st, done, count, previous = carry
        if conjugate_gradient:  # CG stops before its first step on the duality gap alone
            p, gap, previous = conjugate_direction(st, previous, count)
            done = done | ((count == 0) & (gap < tolerance))
        else:
            p, decrement = direction(st)
            done = done | decrement_converged(decrement, count)
        Jp, Mp = apply(efc, p), M @ p
        sums = per_island(jnp.stack([p * (st.Ma - qfrc_smooth), p * Mp, p**2], axis=-1))  # one reduction
        gauss = (sums[:, 0], sums[:, 1])
        ev = lambda a: _line_eval(a, st.jar, Jp, gauss, efc, kinds, cone, isl)  # noqa: E731
        snorm = jax.lax.stop_gradient(jnp.sqrt(sums[:, 2]))
        alpha, ls_improvement = _primal_search(ev, snorm, tolerance * ls_tolerance * snorm / scale, ~done, ls_iterations, early_exit)
        # Unrolled reverse mode differentiates each iteration with its step held fixed. At the solution
        # p = 0, so d(alpha) * p vanishes in exact arithmetic, but in float32 the derivative of the
        # search's Newton points alpha - d1/d2 (d2 ~ |p|^2 near convergence) overflowed to NaN or
        # amplified round-off until rollout gradients blew up (fuzz scenes found on a GPU).
        alpha = jax.lax.stop_gradient(alpha)
        moved = ~done & (alpha != 0)  # MuJoCo stops an island without counting when its search finds nothing
        taken = jnp.where(moved, alpha, 0.0)
        step, step_rows = island.spread(taken, isl.dof), island.spread(taken, isl.row)
        # M qacc and jar move along M p and J p, as mj_solNewton updates them (no product at the new qacc)
        if unrolled:
            # differentiated as a step of min(alpha, 1): d(next) = (1 - alpha) d(qacc) + alpha dp, and
            # dp = -d(qacc) - H^-1 dgrad/dtheta, so a step past alpha = 2 would amplify the derivative
            # carried so far (|1 - alpha| > 1, up to 10 times a solve); the value is alpha p
            step_p = step * jax.lax.stop_gradient(p) + jnp.minimum(step, 1.0) * (p - jax.lax.stop_gradient(p))
            # the updates' values, with the derivatives of M step_p and J step_p
            tangent = lambda y: y - jax.lax.stop_gradient(y)  # noqa: E731
            dMa = jax.lax.stop_gradient(step * Mp) + tangent(M @ step_p) if not trees_coupled else M @ step_p
            djar = jax.lax.stop_gradient(step_rows * Jp) + tangent(apply(efc, step_p))
        else:
            step_p, djar = step * p, step_rows * Jp
            dMa = step * Mp if not trees_coupled else M @ step_p
        new = _state_from(st.qacc + step_p, st.Ma + dMa, st.jar + djar, problem, kinds, cone)
        improvement = scale * ls_improvement
        converged = ~moved | ((improvement > 0) & (improvement < tolerance)) | (gradient_norm(new) < tolerance)
        return (new, done | converged, count + moved.astype(count.dtype), previous), None

    previous = (jnp.zeros_like(qacc0),) * 3 if conjugate_gradient else ()
    init = (st0, jnp.zeros(n_islands, bool), jnp.zeros(n_islands, jnp.int32), previous)
    if early_exit:  # stop once converged: an island that has not converged moved in every trip, so at most `iterations`
        st, done, count, _ = jax.lax.while_loop(
            lambda c: jnp.any(~c[1]) & (jnp.max(c[2]) < iterations), lambda c: newton_iteration(c, None)[0], init
        )
    else:
        (st, done, count, _), _ = jax.lax.scan(newton_iteration, init, None, length=iterations)
    if not unrolled:
        return st.qacc, (jnp.max(count), jnp.all(done))
    # Converged islands and dofs without constraints pass on the derivative of their solution, the
    # implicit -H^-1 dgrad/dtheta (a Newton step from the solution held fixed, adding zero), not
    # that of the path of iterates: a frozen iterate carries its start's derivative times (1 - alpha)
    # per step taken, which grows where the search steps past alpha = 2. Unconverged islands keep the
    # unrolled derivative.
    solution = jax.lax.stop_gradient(st.qacc)
    final = _state_at(solution, problem, kinds, cone)
    p_fixed, decrement = direction(final)
    done = done | decrement_converged(decrement, count)  # the last iterate's decrement test
    p_fixed = jnp.where(jnp.isfinite(p_fixed), p_fixed, 0.0)  # adds zero to the value, whatever H is
    settled = island.spread(done, isl.dof) | (isl.dof == isl.count)
    qacc = jnp.where(settled, solution + (p_fixed - jax.lax.stop_gradient(p_fixed)), st.qacc)
    return qacc, (jnp.max(count), jnp.all(done))


# A line-search point is one array [..., 4]: step alpha, cost(alpha) - cost(0), first and second
# derivative (one leaf, so the search's state selects 9 arrays per branch instead of 23)
_ALPHA, _COST, _D1, _D2 = range(4)


def _point_where(pred, a, b):
    """tree_where for search states and points: pred per island, broadcast over a point's 4 values."""
    return jax.tree.map(lambda x, y: jnp.where(jnp.reshape(pred, jnp.shape(pred) + (1,) * (jnp.ndim(x) - jnp.ndim(pred))), x, y), a, b)


# phases of `_primal_search`: which point the next evaluation computes
_P1, _ONE_SIDED, _P1NEXT, _MID, _B1NEXT, _B2NEXT, _DONE = range(7)


class _Search(NamedTuple):
    phase: Array
    evals: Array  # cost evaluations so far (MuJoCo's LSiter)
    direction: Array  # +1: the first Newton point still descends (d1 < 0), -1: it overshot
    p1: Array  # points [..., 4]
    p2: Array
    p1next: Array
    p2next: Array
    b2: Array  # the last midpoint round moved the p2 end too: its Newton point is still to evaluate
    result: Array


def _primal_search(ev, snorm, gtol, active, ls_iterations: int, early_exit: bool):
    """(alpha, improvement = cost(0) - cost(alpha)): MuJoCo's PrimalSearch (engine_solver.c), step for step.

    Every argument and result is per island (elementwise); `active` islands search.

    From alpha = 0 one Newton step on the 1-D cost; Newton steps on that side while the
    derivative keeps its sign (stop when |d1| < gtol with a decrease); then bracketed
    rounds whose candidates are the Newton points of both bracket ends and their
    midpoint, until a candidate has |d1| < gtol (the cheapest such), the brackets stop
    moving (the midpoint) or `ls_iterations` evaluations are spent (the better bracket
    end if it decreases the cost, else alpha = 0). The loop makes one evaluation per
    step, so the cost is traced once.
    """
    e0 = ev(jnp.zeros_like(gtol))
    zero = jnp.zeros_like(e0.cost)

    def point(alpha, e):
        return jnp.stack([alpha, e.cost - e0.cost, e.d1, jnp.where(e.d2 > 0, e.d2, _MINVAL)], axis=-1)  # MuJoCo's convexity guard

    def newton(p):
        return p[..., _ALPHA] - p[..., _D1] / p[..., _D2]

    p0 = point(zero, e0)
    nothing = jnp.stack([zero, zero, zero, jnp.ones_like(zero)], axis=-1)  # d2 = 1: its Newton point is finite

    def out_of_evaluations(s: _Search) -> _Search:
        """The bracket end with the lower cost if it decreases the cost, else no step."""
        c1, c2 = s.p1[..., _COST], s.p2[..., _COST]
        use1 = (c1 <= c2) & (c1 < 0)
        use2 = ~use1 & (c2 <= c1) & (c2 < 0)
        return s._replace(phase=_DONE, result=_point_where(use1, s.p1, _point_where(use2, s.p2, nothing)))

    def next_round(s: _Search, more) -> _Search:
        return _point_where(more, s._replace(phase=_MID), out_of_evaluations(s))

    def update_bracket(p, candidates) -> tuple[Array, Array]:
        """updateBracket: move p to any candidate with a same-sign, smaller-magnitude derivative."""
        moved = jnp.zeros((), bool)
        for c in candidates:
            pd, cd = p[..., _D1], c[..., _D1]
            closer = ((pd < 0) & (cd < 0) & (pd < cd)) | ((pd > 0) & (cd > 0) & (pd > cd))
            p, moved = _point_where(closer, c, p), moved | closer
        return p, moved

    def step(s: _Search) -> _Search:
        phase = s.phase
        alpha = jnp.select(
            [phase == _P1, phase == _MID, phase == _B2NEXT],
            [newton(p0), 0.5 * (s.p1[..., _ALPHA] + s.p2[..., _ALPHA]), newton(s.p2)],
            newton(s.p1),  # one-sided step, p1next, b1next
        )
        alpha = jnp.where(phase == _DONE, 0.0, alpha)  # finished: a harmless point (its result is discarded)
        e = point(alpha, ev(alpha))
        e_cost, e_d1 = e[..., _COST], e[..., _D1]
        unchanged, s = s, s._replace(evals=s.evals + 1)
        more = s.evals < ls_iterations
        small = jnp.abs(e_d1) < gtol

        # the first Newton point or a one-sided step: converged, go on along this side, or bracket
        first = phase == _P1
        direction = jnp.where(first, jnp.where(e_d1 < 0, 1.0, -1.0), s.direction)
        success = small & ((e_cost < 0) | (first & (alpha == 0)))
        descend = (e_d1 * direction <= -gtol) & more
        one_sided = s._replace(
            phase=jnp.where(success | ~more, _DONE, jnp.where(descend, _ONE_SIDED, _P1NEXT)),
            direction=direction, p1=e, p2=_point_where(first, p0, s.p1), p2next=e, result=e,
        )  # fmt: skip

        # a bracketed round: a converged candidate ends it, else both ends move toward the sign change
        candidates = (s.p1next, s.p2next, e)
        best, found = nothing, jnp.zeros((), bool)
        for c in candidates:
            take = (jnp.abs(c[..., _D1]) < gtol) & (~found | (c[..., _COST] < best[..., _COST]))
            best, found = _point_where(take, c, best), found | take
        p1, b1 = update_bracket(s.p1, candidates)
        p2, b2 = update_bracket(s.p2, candidates)
        midpoint = s._replace(
            phase=jnp.where(found | (~b1 & ~b2), _DONE, jnp.where(b1, _B1NEXT, _B2NEXT)),
            p1=p1, p2=p2, b2=b2, result=_point_where(found, best, e),
        )  # fmt: skip

        p1next = s._replace(p1next=e)
        b1next = _point_where(s.b2, p1next._replace(phase=_B2NEXT), next_round(p1next, more))
        b2next = next_round(s._replace(p2next=e), more)
        out = b2next
        for ph, branch in ((_P1, one_sided), (_ONE_SIDED, one_sided), (_P1NEXT, next_round(p1next, more)),
                           (_MID, midpoint), (_B1NEXT, b1next)):  # fmt: skip
            out = _point_where(phase == ph, branch, out)
        out = _point_where(phase == _DONE, unchanged, out)
        return out._replace(phase=out.phase.astype(jnp.int32))

    start = _Search(
        jnp.where(active & (snorm >= _MINVAL), _P1, _DONE).astype(jnp.int32),  # a vanishing direction: no step
        jnp.ones(zero.shape, jnp.int32), jnp.ones_like(zero), nothing, p0, nothing, nothing, jnp.zeros(zero.shape, bool), nothing,
    )  # fmt: skip
    bound = max(ls_iterations, 2) + 3  # evaluations: at most 2 past ls_iterations in a bracketed round
    if early_exit:
        s = jax.lax.while_loop(lambda s: jnp.any((s.phase != _DONE) & (s.evals < bound)), step, start)
    else:
        s, _ = jax.lax.scan(lambda s, _: (step(s), None), start, None, length=bound)
    return s.result[..., _ALPHA], -s.result[..., _COST]
