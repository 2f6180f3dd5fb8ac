"""MuJoCo's noslip post-processor (engine_solver.c, mj_solNoSlip), after the Newton solve.

Option `noslip_iterations` > 0: projected Gauss-Seidel sweeps over the friction dimensions
only, on the unregularized dual problem

    minimize 1/2 f^T A f + b^T f,   A = J M^-1 J^T,   b = J qacc_smooth - aref,

with the normal (and equality, limit) forces held. Each sweep visits, in MuJoCo's row order:
every dry-friction row (the unconstrained minimum clamped to +-frictionloss); every pyramidal
contact's pairs of opposing edges (their sum held, their difference minimized over
[-mid, mid]); every elliptic contact's tangential block (the quadratic program on the
friction ellipsoid sum (f_j / mu_j)^2 <= f_n^2, mju_QCQP2/3/n, put on the ellipsoid when the
constraint is active). A block update that raises the cost by more than 1e-10 is undone.
Each constraint island stops once a sweep improves its cost by less than `noslip_tolerance`,
scaled as the Newton solver's (1 / the island's summed mass-matrix diagonal; 1 / (meaninertia nv)
without islands): what MuJoCo 4.0.0 does (probed; its source's monolithic scale differs from it by
6e-4 in the forces of a state where one island needs a sweep more). Then qacc = qacc_smooth +
M^-1 J^T f (dualFinish). Differentiated by reverse mode through the sweeps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .. import constraint, linalg
from ..constraint import Efc
from ..types import Model
from . import island

_MINVAL = 1e-15
_WIDTH = 6  # rows a block reads: the widest is an elliptic condim-6 contact
_QCQP_ITERATIONS = 20

# block kinds
_DRY, _PAIR, _ELLIPTIC2, _ELLIPTIC3, _ELLIPTIC5 = range(5)


class Blocks(NamedTuple):
    """The sweep's static blocks: kind, first row, efc contact (-1: a dry-friction row), place within it."""

    kind: np.ndarray
    start: np.ndarray
    contact: np.ndarray
    sub: np.ndarray


def blocks(model: Model) -> Blocks:
    layout = model.constraints
    kind, start, contact, sub = [], [], [], []
    for k in range(layout.nf):
        kind.append(_DRY), start.append(layout.ne + k), contact.append(-1), sub.append(0)
    elliptic = layout.cone == "elliptic"
    for c, (dim, row) in enumerate(zip(layout.efc_contact_dim, layout.contact_row_start)):
        if dim == 1:
            continue
        if elliptic:  # one block: the friction rows after the normal
            kind.append({3: _ELLIPTIC2, 4: _ELLIPTIC3, 6: _ELLIPTIC5}[int(dim)]), start.append(row)
            contact.append(c), sub.append(0)
        else:  # one block per pair of opposing edges
            for m in range(int(dim) - 1):
                kind.append(_PAIR), start.append(row + 2 * m), contact.append(c), sub.append(m)
    return Blocks(*(np.asarray(x, np.int64) for x in (kind, start, contact, sub)))


def _sweep_order(model: Model, blk: Blocks, slots) -> Int[Array, " nblocks"] | np.ndarray:
    """Dry friction first, then the contacts in MuJoCo's contact order (`constraint.mujoco_contact_rank`)."""
    rank = constraint.mujoco_contact_rank(model)
    contact = np.maximum(blk.contact, 0)
    xp = np if isinstance(slots, np.ndarray) else jnp
    contact_rank = xp.where(blk.contact >= 0, xp.asarray(rank)[xp.asarray(slots)[contact]], -1)
    return xp.lexsort((blk.sub, contact_rank))


def _cost_change(A, f, old, res):
    """costChange: 1/2 d^T A d + d^T res of the update d = f - old; an increase over 1e-10 is undone."""
    d = f - old
    change = 0.5 * d @ A @ d + d @ res
    worse = change > 1e-10
    return jnp.where(worse, old, f), jnp.where(worse, 0.0, change)


def _clamp(x, bound):
    """x clamped to [-bound, bound] as MuJoCo's branches do. Where x equals a bound (or the bound
    is 0 and so is x: a pair of unloaded pyramid edges), the derivative is the bound's, one-sided:
    jnp.clip's tie would send half of it to x, which is no derivative of the map."""
    return jnp.where(x >= bound, bound, jnp.where(x <= -bound, -bound, x))


def _dry(f, res, A, floss, mu):
    """A dry-friction row: the unconstrained minimum clamped to [-frictionloss, frictionloss]."""
    inv = 1.0 / jnp.maximum(_MINVAL, A[0, 0])
    new = _clamp(f[0] - res[0] * inv, floss)
    d = new - f[0]
    return f.at[0].set(new), 0.5 * d * d / inv + d * res[0]


def _pair(f, res, A, floss, mu):
    """Two opposing pyramid edges: their sum 2 mid held, f0 - f1 = 2y minimized over |y| <= mid."""
    Ac, r, old = A[:2, :2], res[:2], f[:2]
    bc = r - Ac @ old
    mid = 0.5 * (old[0] + old[1])
    K1 = Ac[0, 0] + Ac[1, 1] - Ac[0, 1] - Ac[1, 0]
    K0 = mid * (Ac[0, 0] - Ac[1, 1]) + bc[0] - bc[1]
    flat = K1 < _MINVAL  # no curvature along y: both edges at mid
    y = jnp.where(flat, 0.0, _clamp(-K0 / jnp.where(flat, 1.0, K1), mid))
    new, change = _cost_change(Ac, jnp.stack([mid + y, mid - y]), old, r)
    return f.at[:2].set(new), change


def _qcqp(A, b, d, r):
    """mju_QCQP2/3/n: minimize 1/2 x^T A x + x^T b s.t. sum (x_i / d_i)^2 <= r^2 by Newton on the
    multiplier la of the scaled problem; zero where A + la is not positive definite. Returns x and
    whether the constraint is active (la != 0)."""
    n = b.shape[0]
    As = A * d[:, None] * d[None, :]
    bs = b * d
    eye = jnp.eye(n, dtype=b.dtype)

    def inverse(Ala):
        """x -> (A + la)^-1 x and whether A + la is singular: cofactors over the determinant (below 1e-10: singular)
        for n = 2, 3 as mju_QCQP2/3; Cholesky (a pivot below 1e-10: rank deficient) as mju_QCQP."""
        if n == 2:
            det = Ala[0, 0] * Ala[1, 1] - Ala[0, 1] * Ala[0, 1]
            cof = jnp.array([[Ala[1, 1], -Ala[0, 1]], [-Ala[0, 1], Ala[0, 0]]])
        elif n == 3:
            a = Ala
            c00 = a[1, 1] * a[2, 2] - a[1, 2] * a[1, 2]
            c11 = a[0, 0] * a[2, 2] - a[0, 2] * a[0, 2]
            c22 = a[0, 0] * a[1, 1] - a[0, 1] * a[0, 1]
            c01 = a[0, 2] * a[1, 2] - a[0, 1] * a[2, 2]
            c02 = a[0, 1] * a[1, 2] - a[0, 2] * a[1, 1]
            c12 = a[0, 1] * a[0, 2] - a[1, 2] * a[0, 0]
            det = a[0, 0] * c00 + a[0, 1] * c01 + a[0, 2] * c02
            cof = jnp.array([[c00, c01, c02], [c01, c11, c12], [c02, c12, c22]])
        else:
            L = jnp.linalg.cholesky(Ala)
            bad = ~jnp.all(jnp.diagonal(L) ** 2 >= 1e-10)  # NaN (not positive definite) fails too
            L = jnp.where(bad, eye, L)
            return (lambda x: jax.scipy.linalg.cho_solve((L, True), x)), bad
        bad = det < 1e-10
        P = cof / jnp.where(bad, 1.0, det)
        return (lambda x: P @ x), bad

    def body(_, carry):
        la, v, running, failed = carry
        solve, bad = inverse(As + la * eye)
        v_new = -solve(bs)
        val = v_new @ v_new - r * r
        deriv = -2.0 * (v_new @ solve(v_new))
        delta = -val / jnp.where(deriv == 0, -1.0, deriv)
        stop = bad | (val < 1e-10) | (delta < 1e-10)
        v = jnp.where(running, v_new, v)
        failed = failed | (running & bad)
        la = jnp.where(running & ~stop, la + delta, la)
        return la, v, running & ~stop, failed

    zero = jnp.zeros((), b.dtype)
    la, v, _, failed = jax.lax.fori_loop(0, _QCQP_ITERATIONS, body, (zero, bs * 0, jnp.asarray(True), jnp.asarray(False)))
    return jnp.where(failed, 0.0, v * d), (la != 0) & ~failed


def _elliptic(n: int):
    def update(f, res, A, floss, mu):
        """An elliptic contact's friction (rows 1..n) with its normal force f[0] held."""
        Ac, r, old = A[1 : n + 1, 1 : n + 1], res[1 : n + 1], f[1 : n + 1]
        bc = r - Ac @ old
        normal = f[0]
        x, active = _qcqp(Ac, bc, mu[:n], normal)
        # on the constraint: scaled onto the ellipsoid, in case the QCQP is approximate (projectEllipsoid)
        mu2 = jnp.where(mu[:n] == 0, 1.0, mu[:n] * mu[:n])  # a zero coefficient: the QCQP returned 0
        on = active & (normal >= _MINVAL)
        ratio = jnp.where(on, normal * normal / jnp.maximum(_MINVAL, jnp.sum(x * x / mu2)), 1.0)
        new = jnp.where(normal < _MINVAL, 0.0, jnp.where(on, x * jnp.sqrt(ratio), x))
        new, change = _cost_change(Ac, new, old, r)
        return f.at[1 : n + 1].set(new), change

    return update


_UPDATES = (_dry, _pair, _elliptic(2), _elliptic(3), _elliptic(5))


def solve(
    model: Model,
    M: Float[Array, "nv nv"],
    qacc_smooth: Float[Array, " nv"],
    efc: Efc,
    force: Float[Array, " nefc"],
    friction: Float[Array, "nefc_contact 5"],
    slots: Int[Array, " nefc_contact"] | np.ndarray,
    contact_geom: Int[Array, "nefc_contact 2"] | np.ndarray,
) -> tuple[Float[Array, " nv"], Float[Array, " nefc"], Float[Array, " nv"]]:
    """Noslip sweeps from the Newton solution's forces: (qacc, efc_force, qfrc_constraint)."""
    blk = blocks(model)
    if len(blk.kind):  # else no friction dimension to sweep
        force = _sweeps(model, blk, M, qacc_smooth, efc, force, friction, slots, contact_geom)
    qfrc_constraint = constraint.apply_transpose(efc, force)
    return qacc_smooth + linalg.solve_spd(M, qfrc_constraint), force, qfrc_constraint  # dualFinish


def _sweeps(model: Model, blk: Blocks, M, qacc_smooth, efc: Efc, force, friction, slots, contact_geom) -> Float[Array, " nefc"]:
    opt = model.opt
    kinds = sorted(set(blk.kind.tolist()))  # only the updates this model has are compiled
    updates = [_UPDATES[k] for k in kinds]
    nefc = force.shape[0]
    J = constraint.dense_jacobian(efc) * efc.mask[:, None]
    # A = J M^-1 J^T is never formed (nefc^2: every contact slot's rows, active or not; 18 GB of XLA
    # temporaries for dm_control's dog_v2, 34k rows): a block reads its rows of J and of M^-1 J^T, and its residual rows
    # A_s f = J_s v through v = M^-1 J^T f, which each block's force change updates.
    # Padded by a block's width: the last block may reach past the last row.
    J_pad = jnp.pad(J, ((0, _WIDTH), (0, 0)))
    MinvJT_pad = jnp.pad(linalg.solve_spd(M, J.T), ((0, 0), (0, _WIDTH)))
    b_pad = jnp.pad(constraint.apply(efc, qacc_smooth) - efc.aref, (0, _WIDTH))
    order = _sweep_order(model, blk, slots)
    branch = np.searchsorted(kinds, blk.kind)
    kind, branch, start = (jnp.asarray(x)[order] for x in (blk.kind, branch, blk.start))
    mu = jnp.pad(friction, ((0, 1), (0, 0)), constant_values=1.0)[jnp.asarray(blk.contact)[order]]  # dry rows: unused
    isl = island.find(model, efc.J, efc.mask, contact_geom)
    scale = island.tolerance_scale(model, M, isl)
    owner = isl.row

    def block(k, carry):
        f, v, improvement, done = carry  # f: the forces, padded; v = M^-1 J^T f
        s = start[k]
        fw = jax.lax.dynamic_slice(f, (s,), (_WIDTH,))
        Js = jax.lax.dynamic_slice(J_pad, (s, 0), (_WIDTH, J.shape[1]))
        MinvJTs = jax.lax.dynamic_slice(MinvJT_pad, (0, s), (J.shape[1], _WIDTH))
        Aw = Js @ MinvJTs
        diag = jnp.diagonal(Aw)
        # extractBlock's clamp of the diagonal (rows past the last are padding), which the residual reads too
        clamped = jnp.where(s + jnp.arange(_WIDTH) < nefc, jnp.maximum(1e-10, diag), diag)
        res = jax.lax.dynamic_slice(b_pad, (s,), (_WIDTH,)) + Js @ v + (clamped - diag) * fw
        Aw = Aw.at[jnp.arange(_WIDTH), jnp.arange(_WIDTH)].set(clamped)
        Aw = jnp.where(kind[k] == _DRY, Aw.at[0, 0].set(diag[0]), Aw)  # ARdiaginv: unclamped (_dry floors it at mjMINVAL)
        new, change = jax.lax.switch(branch[k], updates, fw, res, Aw, efc.frictionloss[s], mu[k])
        take = efc.mask[s] & ~jnp.append(done, True)[owner[s]]  # a row of no island: absent
        new = jnp.where(take, new, fw)
        f = jax.lax.dynamic_update_slice(f, new, (s,))
        v = v + MinvJTs @ (new - fw)
        return f, v, improvement.at[owner[s]].add(jnp.where(take, -change, 0.0), mode="drop"), done

    def sweep(i, carry):
        f, v, done = carry
        # iteration 0 counts the regularizer's cost the sweeps remove (mj_solNoSlip's correction)
        start_cost = island.segment_sum(0.5 * jnp.where(efc.mask, f[:nefc] ** 2 * efc.R, 0.0), owner, isl)
        improvement = jnp.where(i == 0, start_cost, 0.0)
        f, v, improvement, _ = jax.lax.fori_loop(0, len(blk.kind), block, (f, v, improvement, done))
        return f, v, done | (improvement * scale < opt.noslip_tolerance)

    f = jnp.pad(force, (0, _WIDTH))
    v = MinvJT_pad @ f
    return jax.lax.fori_loop(0, opt.noslip_iterations, sweep, (f, v, jnp.zeros(isl.count, bool)))[0][:nefc]
