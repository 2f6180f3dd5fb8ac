"""Constraint rows: Jacobian J, residual pos, margin, regularizer R, reference acceleration.

Follows the Computation chapter ("Constraint model", "Solver parameters") and
MuJoCo's engine_core_constraint: rows in MuJoCo's order (equality, friction loss,
limits, contacts) with a fixed count (`ConstraintLayout.nefc`) and a mask for rows
that do not exist at this state.

    impedance  d(r) from solimp (eq. "impedance"), r = pos - margin
    R        = max(mjMINVAL, (1 - d) / d * diagApprox)          diagApprox from invweight0, or with
               <flag diagexact="enable"/> the exact A_ii = J_i M^-1 J_i^T (= |Y_i|^2, Y = J M^-1/2)
               (and R >= 100 eps diagApprox: binds only in float32, see _PRECISION_FLOOR)
    aref     = -b (J v) - k d r,   k = 1/(dmax^2 tc^2 dr^2), b = 2/(dmax tc)  (standard solref)
                                   k = -solref[0]/dmax^2, b = -solref[1]/dmax  (direct solref)
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from . import linalg, math
from .cfd import CFD, pair_mask, reference_distance
from .smooth import point_jacobian
from .types import Contact, Data, JointType, Model

MINVAL = 1e-15  # mjMINVAL
_MINIMP, _MAXIMP = 0.0001, 0.9999  # mjMINIMP, mjMAXIMP
_CONNECT, _WELD, _JOINT, _TENDON = 0, 1, 2, 3  # mjtEq
# R >= _PRECISION_FLOOR * eps * diagApprox: the stiffest row the working precision can resolve.
# Never binds in float64 (MuJoCo's own extremes, mu = 1e-5 in a pyramid, give R ~ 1e-11 diagApprox),
# binds in float32 where a pyramid with mu < ~0.01 asks for D ~ 1/mu^2 that H = M + J^T D J and the
# residual J a - aref cannot represent (the Newton step and its implicit gradient turned to NaN).
_PRECISION_FLOOR = 100.0


class Rows(NamedTuple):
    """Constraint rows of one category, before they are stacked."""

    J: Float[Array, "n nv"]
    pos: Float[Array, " n"]
    margin: Float[Array, " n"]
    diag_approx: Float[Array, " n"]
    solref: Float[Array, "n 2"]
    solimp: Float[Array, "n 5"]
    imp_r: Float[Array, " n"]  # r = pos - margin the impedance is evaluated at (a connect/weld: norm over its rows)
    stiff: Bool[Array, " n"]  # False where k = 0 (friction loss, elliptic friction rows)
    mask: Bool[Array, " n"]
    frictionloss: Float[Array, " n"]
    jdot_v: Float[Array, " n"]  # J_dot v, subtracted from aref (connect/weld, MuJoCo >= 3.3)


class Efc(NamedTuple):
    """All constraint rows, stacked; what the solvers consume.

    J holds every row densely, or, where contact rows are sparse (`contact_dofs`), only the
    rows before the contacts; contact row i is then Jc[i] over the dofs dofs[i] (an index nv
    is padding). `apply`, `apply_transpose` and `dense_jacobian` read either form."""

    J: Float[Array, "nJ nv"]
    pos: Float[Array, " nefc"]
    margin: Float[Array, " nefc"]
    D: Float[Array, " nefc"]
    R: Float[Array, " nefc"]
    aref: Float[Array, " nefc"]
    frictionloss: Float[Array, " nefc"]
    mask: Bool[Array, " nefc"]
    mu: Float[Array, " nefc_contact"]  # regularized cone slope friction[0] * sqrt(R1 / R0)
    Jc: Float[Array, "ncrow w"] | None = None
    dofs: Int[Array, "ncrow w"] | None = None


def apply(efc: Efc, v: Float[Array, " nv"]) -> Float[Array, " nefc"]:
    """J v."""
    if efc.Jc is None:
        return efc.J @ v
    return jnp.concatenate([efc.J @ v, jnp.sum(efc.Jc * v.at[efc.dofs].get(mode="fill", fill_value=0), axis=-1)])


def apply_transpose(efc: Efc, f: Float[Array, " nefc"]) -> Float[Array, " nv"]:
    """J^T f."""
    if efc.Jc is None:
        return efc.J.T @ f
    n = efc.J.shape[0]
    return (efc.J.T @ f[:n]).at[efc.dofs].add(efc.Jc * f[n:, None], mode="drop")


def dense_jacobian(efc: Efc) -> Float[Array, "nefc nv"]:
    """J with every row dense (efc_J of Data)."""
    return efc.J if efc.Jc is None else _dense_rows(efc.J, efc.Jc, efc.dofs)


def _dense_rows(J: Float[Array, "nJ nv"], Jc: Float[Array, "ncrow w"], dofs: Int[Array, "ncrow w"]) -> Float[Array, "nefc nv"]:
    """J's dense rows followed by the sparse contact rows Jc (over dofs) made dense."""
    rows = jnp.arange(Jc.shape[0])[:, None]
    contact = jnp.zeros((Jc.shape[0], J.shape[1]), Jc.dtype).at[rows, dofs].set(Jc, mode="drop")
    return jnp.concatenate([J, contact])


def exact_diagonal(qM: Float[Array, "nv nv"], J: Float[Array, "nefc nv"]) -> Float[Array, " nefc"]:
    """mj_makeY with diagexact: the constraint-space inverse inertia's diagonal A_ii = J_i M^-1 J_i^T
    at the current configuration (Computation, "Diagonal approximation"), replacing diagApprox."""
    if J.shape[0] == 0 or J.shape[1] == 0:
        return jnp.zeros(J.shape[:1], J.dtype)
    return jnp.sum(J * linalg.solve_spd(qM, J.T).T, axis=1)


# ---------------------------------------------------------------------- Jacobians


def _velocity_product_acc(model: Model, data: Data, body: np.ndarray, point: Float[Array, "n 3"]):
    """(J_dot v) of points fixed to `body`, translational and rotational, as MuJoCo's mj_jacDot.

    mj_jacDot differentiates cdof of ball and free-rotation dofs with the body's full
    velocity (cvel x cdof) rather than the parent velocity used in cdof_dot.
    """
    topo = model.topology
    jtype = np.asarray(topo.jnt_type, dtype=np.int64)[np.asarray(topo.dof_jntid, dtype=np.int64)]
    quat_dof = (jtype == JointType.BALL) | ((jtype == JointType.FREE) & ~topo.dof_free_translation)
    dof_body = np.asarray(topo.dof_bodyid, dtype=np.int64)
    own = math.cross_motion(data.cvel[dof_body], data.cdof)
    cdof_dot = jnp.where(jnp.asarray(quat_dof)[:, None], own, data.cdof_dot)
    chain = jnp.asarray(topo.body_dof_chain[body], dtype=model.dtype)
    acc = chain @ (cdof_dot * data.qvel[:, None])  # (n, 6): sum_i cdof_dot_i v_i
    root = np.asarray(topo.body_rootid, dtype=np.int64)[body]
    offset = point - data.subtree_com[root]
    vel = data.cvel[body]
    v_point = vel[:, 3:] + jnp.cross(vel[:, :3], offset)
    lin = acc[:, 3:] + jnp.cross(acc[:, :3], offset) + jnp.cross(vel[:, :3], v_point)
    return lin, acc[:, :3]


# ---------------------------------------------------------------------- row builders


def _empty(model: Model) -> Rows:
    z = jnp.zeros((0,), model.dtype)
    return Rows(
        J=jnp.zeros((0, model.nv), model.dtype), pos=z, margin=z, diag_approx=z,
        solref=jnp.zeros((0, 2), model.dtype), solimp=jnp.zeros((0, 5), model.dtype), imp_r=z,
        stiff=jnp.zeros((0,), bool), mask=jnp.zeros((0,), bool), frictionloss=z, jdot_v=z,
    )  # fmt: skip


def _quat_left(q):
    """Matrix L(q) with q * p = L(q) p (Hamilton product, p as 4-vector)."""
    w, x, y, z = q
    return jnp.array([[w, -x, -y, -z], [x, w, -z, y], [y, z, w, -x], [z, -y, x, w]])


def _quat_right(q):
    """Matrix R(q) with p * q = R(q) p."""
    w, x, y, z = q
    return jnp.array([[w, -x, -y, -z], [x, w, z, -y], [y, -z, w, x], [z, y, -x, w]])


def _equality_anchors(model: Model, data: Data, k: int, etype: int):
    """Connect or weld k's two bodies and the world points it joins (mj_equalityAnchors): body
    semantics, eq_data's anchors in the bodies' frames; site semantics, the two sites' positions."""
    o1, o2 = model.eq_obj1id[k], model.eq_obj2id[k]
    if model.constraints.eq_sites[k]:
        bodies = model.topology.site_bodyid
        return bodies[o1], bodies[o2], data.site_xpos[o1], data.site_xpos[o2]
    a1, a2 = (model.eq_data[k, 0:3], model.eq_data[k, 3:6]) if etype == _CONNECT else (model.eq_data[k, 3:6], model.eq_data[k, 0:3])
    return o1, o2, data.xmat[o1] @ a1 + data.xpos[o1], data.xmat[o2] @ a2 + data.xpos[o2]


def _weld_frames(model: Model, k: int):
    """Weld k's two bodies and the orientations its sides keep aligned, in those bodies' frames:
    (eq_data's relpose, identity) with body semantics, the two sites' quaternions with site semantics."""
    o1, o2 = model.eq_obj1id[k], model.eq_obj2id[k]
    if model.constraints.eq_sites[k]:
        bodies = model.topology.site_bodyid
        return bodies[o1], bodies[o2], model.site_quat[o1], model.site_quat[o2]
    return o1, o2, model.eq_data[k, 6:10], None


def _weld_rotation(model: Model, data: Data, k: int):
    """Weld k's rotated relative pose q0r = q_1 r_1, the conjugate nq1 of q_2 r_2 (r_1 = relpose and
    r_2 = 1, or the sites' quaternions), and the linear map from the relative angular velocity
    w_1 - w_2 to its rotational rows: 0.5 * torquescale * vec(nq1 * (0, w) * q0r)."""
    b1, b2, r1, r2 = _weld_frames(model, k)
    q0r = math.quat_mul(data.xquat[b1], r1)
    nq1 = math.quat_conj(data.xquat[b2] if r2 is None else math.quat_mul(data.xquat[b2], r2))
    return q0r, nq1, 0.5 * model.eq_data[k, 10] * (_quat_left(nq1) @ _quat_right(q0r))[1:, 1:]


def _equality_rows(model: Model, data: Data) -> Rows:
    """connect (3 rows), weld (6 rows), joint and tendon (1 row) equalities (mj_instantiateEquality);
    the rows of those Data.eq_active switches off are masked."""
    layout = model.constraints
    if not layout.eq_ids:
        return _empty(model)
    parts = []
    topo = model.topology
    for k, etype in enumerate(layout.eq_types):
        b1, b2 = model.eq_obj1id[k], model.eq_obj2id[k]
        data_k = model.eq_data[k]
        solref = model.eq_solref[k]
        solimp = model.eq_solimp[k]
        if etype in (_CONNECT, _WELD):
            b1, b2, p1, p2 = _equality_anchors(model, data, k, etype)
            bodies = np.array([b1, b2])
            jacp, jacr = point_jacobian(model, data, bodies, jnp.stack([p1, p2]))
            accp, accr = _velocity_product_acc(model, data, bodies, jnp.stack([p1, p2]))
            J = jacp[0] - jacp[1]
            pos = p1 - p2
            jdot_v = accp[0] - accp[1]
            iw = model.body_invweight0
            diag = jnp.full((3,), iw[b1, 0] + iw[b2, 0])
            if etype == _WELD:
                ts = data_k[10]
                q0r, nq1, lin_map = _weld_rotation(model, data, k)
                err = math.quat_mul(nq1, q0r)[1:] * ts
                Jr = lin_map @ (jacr[0] - jacr[1])
                # J_dot v of those rows, by the product rule (as mj_Jdotv, incl. its quaternion rates)
                w1, w2 = data.cvel[b1, :3], data.cvel[b2, :3]
                dw = w1 - w2
                pure = lambda v: jnp.concatenate([jnp.zeros(1, v.dtype), v])  # noqa: E731
                _, _, r1, r2 = _weld_frames(model, k)
                qdot0r = math.quat_mul(0.5 * math.quat_mul(pure(w1), data.xquat[b1]), r1)
                qdot2 = 0.5 * math.quat_mul(pure(w2), data.xquat[b2])
                nqdot1 = math.quat_conj(qdot2 if r2 is None else math.quat_mul(qdot2, r2))
                t1 = math.quat_mul(math.quat_mul(nqdot1, pure(dw)), q0r)
                t2 = math.quat_mul(math.quat_mul(nq1, pure(accr[0] - accr[1])), q0r)
                t3 = math.quat_mul(math.quat_mul(nq1, pure(dw)), qdot0r)
                jdr = 0.5 * ts * (t1 + t2 + t3)[1:]
                J = jnp.concatenate([J, Jr])
                pos = jnp.concatenate([pos, err])
                jdot_v = jnp.concatenate([jdot_v, jdr])
                diag = jnp.concatenate([diag, jnp.full((3,), iw[b1, 1] + iw[b2, 1])])
            n = pos.shape[0]
            imp_r = jnp.full((n,), math.safe_norm(pos))
        else:  # joint or tendon coupling: x1 - x1_0 - poly(x2 - x2_0)
            def scalar(obj):  # value, value at qpos0, Jacobian row, invweight0
                if etype == _TENDON:
                    return data.ten_length[obj], model.tendon_length0[obj], data.ten_J[obj], model.tendon_invweight0[obj]
                d, q = topo.jnt_dofadr[obj], topo.jnt_qposadr[obj]
                row = jnp.zeros((model.nv,), model.dtype).at[d].set(1.0)
                return data.qpos[q], model.qpos0[q], row, model.dof_invweight0[d]

            x1, ref1, J1, diag = scalar(b1)
            J = J1[None]
            pos1 = x1 - ref1
            if b2 >= 0:
                x2, ref2, J2, diag2 = scalar(b2)
                dif = x2 - ref2
                c = data_k[1:5]
                poly = c[0] * dif + c[1] * dif**2 + c[2] * dif**3 + c[3] * dif**4
                deriv = c[0] + 2 * c[1] * dif + 3 * c[2] * dif**2 + 4 * c[3] * dif**3
                J = J - deriv * J2[None]
                pos1 = pos1 - poly
                diag = diag + diag2
            pos = (pos1 - data_k[0])[None]
            jdot_v = jnp.zeros((1,), model.dtype)
            diag = jnp.reshape(diag, (1,))
            n = 1
            imp_r = pos
        parts.append(
            Rows(
                J=J, pos=pos, margin=jnp.zeros((n,), model.dtype), diag_approx=diag,
                solref=jnp.broadcast_to(solref, (n, 2)), solimp=jnp.broadcast_to(solimp, (n, 5)),
                imp_r=imp_r, stiff=jnp.ones((n,), bool), mask=jnp.broadcast_to(data.eq_active[k], (n,)),
                frictionloss=jnp.zeros((n,), model.dtype), jdot_v=jdot_v,
            )
        )  # fmt: skip
    return _concat(parts)


def _friction_rows(model: Model, data: Data) -> Rows:
    """Dry friction (friction loss), mj_instantiateFriction: one row per dof (J = e_dof),
    then one per tendon (J = ten_J)."""
    dofs = np.asarray(model.constraints.friction_dofs, dtype=np.int64)
    tendons = np.asarray(model.constraints.friction_tendons, dtype=np.int64)
    n = len(dofs) + len(tendons)
    if n == 0:
        return _empty(model)
    z = jnp.zeros((n,), model.dtype)
    cat = jnp.concatenate
    return Rows(
        J=cat([jnp.eye(model.nv, dtype=model.dtype)[dofs], data.ten_J[tendons]]), pos=z, margin=z,
        diag_approx=cat([model.dof_invweight0[dofs], model.tendon_invweight0[tendons]]),
        solref=cat([model.dof_solref[dofs], model.tendon_solref_fri[tendons]]),
        solimp=cat([model.dof_solimp[dofs], model.tendon_solimp_fri[tendons]]), imp_r=z,
        stiff=jnp.zeros((n,), bool), mask=jnp.ones((n,), bool),
        frictionloss=cat([model.dof_frictionloss[dofs], model.tendon_frictionloss[tendons]]), jdot_v=z,
    )  # fmt: skip


def axis_rows(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """(rows, dofs): the rows whose Jacobian is +-e_dof, static: dof friction loss (e_dof) and
    hinge/slide limits (-side e_dof). Their J^T D J is diagonal (`solver.newton._hessian`)."""
    layout, topo = model.constraints, model.topology
    friction = np.asarray(layout.friction_dofs, dtype=np.int64)
    jnt = np.asarray(layout.limit_jnts, dtype=np.int64)
    hinge_or_slide = np.asarray(layout.limit_sides, dtype=np.int64) != 0
    rows = np.concatenate([layout.ne + np.arange(len(friction)), layout.ne + layout.nf + np.flatnonzero(hinge_or_slide)])
    dofs = np.concatenate([friction, np.asarray(topo.jnt_dofadr, dtype=np.int64)[jnt[hinge_or_slide]]])
    return rows, dofs


def _limit_rows(model: Model, data: Data) -> Rows:
    """Limits (mj_instantiateLimit): joints, then tendons."""
    return _concat([_joint_limit_rows(model, data), _tendon_limit_rows(model, data)])


def _tendon_limit_rows(model: Model, data: Data) -> Rows:
    """Tendon limits: dist = side (range[side] - ten_length), J = -side ten_J, one row per side."""
    ten = np.asarray(model.constraints.limit_tendons, dtype=np.int64)
    n = len(ten)
    if n == 0:
        return _empty(model)
    side = np.asarray(model.constraints.limit_tendon_sides)
    sign = jnp.asarray(side, model.dtype)
    dist = sign * (model.tendon_range[ten, np.where(side > 0, 1, 0)] - data.ten_length[ten])
    margin = model.tendon_margin[ten]
    return Rows(
        J=-sign[:, None] * data.ten_J[ten], pos=dist, margin=margin, diag_approx=model.tendon_invweight0[ten],
        solref=model.tendon_solref_lim[ten], solimp=model.tendon_solimp_lim[ten], imp_r=dist - margin,
        stiff=jnp.ones((n,), bool), mask=dist < margin,
        frictionloss=jnp.zeros((n,), model.dtype), jdot_v=jnp.zeros((n,), model.dtype),
    )  # fmt: skip


def _joint_limit_rows(model: Model, data: Data) -> Rows:
    """Joint limits: lower and upper rows for hinge/slide, one angle row for ball."""
    layout, topo = model.constraints, model.topology
    jnt = np.asarray(layout.limit_jnts, dtype=np.int64)
    n = len(jnt)
    if n == 0:
        return _empty(model)
    side = np.asarray(layout.limit_sides)
    qadr = np.asarray(topo.jnt_qposadr, dtype=np.int64)[jnt]
    dadr = np.asarray(topo.jnt_dofadr, dtype=np.int64)[jnt]
    is_ball = side == 0
    # hinge / slide: dist = side * (range[side] - q), J = -side e_dof
    q = data.qpos[np.minimum(qadr, model.nq - 1)]
    bound = model.jnt_range[jnt, np.where(side > 0, 1, 0)]
    dist = jnp.asarray(side, model.dtype) * (bound - q)
    J = jnp.zeros((n, model.nv), model.dtype).at[np.arange(n), dadr].set(jnp.asarray(-side, model.dtype))
    if np.any(is_ball):
        quat = math.quat_normalize(data.qpos[np.minimum(qadr[:, None] + np.arange(4), model.nq - 1)])
        rotvec = math.quat_to_rotvec(quat)
        angle = math.safe_norm(rotvec)
        axis = math.normalize(rotvec)
        ball_dist = jnp.max(model.jnt_range[jnt], axis=-1) - angle
        dist = jnp.where(jnp.asarray(is_ball), ball_dist, dist)
        cols = np.minimum(dadr[:, None] + np.arange(3), model.nv - 1)
        ball_J = jnp.zeros((n, model.nv), model.dtype).at[np.arange(n)[:, None], cols].set(-axis)
        J = jnp.where(jnp.asarray(is_ball)[:, None], ball_J, J)
    margin = model.jnt_margin[jnt]
    return Rows(
        J=J, pos=dist, margin=margin, diag_approx=model.dof_invweight0[dadr],
        solref=model.jnt_solref[jnt], solimp=model.jnt_solimp[jnt], imp_r=dist - margin,
        stiff=jnp.ones((n,), bool), mask=dist < margin,
        frictionloss=jnp.zeros((n,), model.dtype), jdot_v=jnp.zeros((n,), model.dtype),
    )  # fmt: skip


def contact_jacobian(model: Model, data: Data, body, pos: Float[Array, "n 3"], frame: Float[Array, "n 3 3"],
                     dofs=None) -> Float[Array, "n 6 nv"]:  # fmt: skip
    """Relative velocity of contacts (body2 - body1) in their frames: normal, 2 tangents, 3 rotations.

    body (n, 2): the two bodies of each contact, pos its point, frame its axes (rows);
    dofs (n, w): only these columns (`contact_dofs`), (n, 6, w)."""
    jp1, jr1 = point_jacobian(model, data, body[:, 0], pos, dofs)
    jp2, jr2 = point_jacobian(model, data, body[:, 1], pos, dofs)
    return jnp.concatenate([math.small_matmul(frame, jp2 - jp1), math.small_matmul(frame, jr2 - jr1)], axis=1)


def _take(table: np.ndarray, index):
    """table[index], static (numpy) where the index is."""
    return table[index] if isinstance(index, np.ndarray) else jnp.asarray(table)[index]


def geom_body(model: Model, geom):
    """The bodies of geom ids, static (numpy) where the ids are."""
    return _take(np.asarray(model.topology.geom_bodyid, dtype=np.int64), geom)


def normal_jacobians(model: Model, data: Data, slots: np.ndarray) -> Float[Array, "k nv"]:
    """n^T (J_body2(p) - J_body1(p)) of the contacts in `slots` (static): their normal Jacobians."""
    bodies = geom_body(model, model.constraints.contact_geom[slots])
    pos = data.contact.pos[slots]
    jac1, _ = point_jacobian(model, data, bodies[:, 0], pos)
    jac2, _ = point_jacobian(model, data, bodies[:, 1], pos)
    return jnp.einsum("ki,kin->kn", data.contact.frame[slots, 0], jac2 - jac1)


def adhesion_force(model: Model, data: Data) -> Float[Array, " nv"]:
    """qfrc_adhesion (mj_adhesion, MuJoCo 4): every contact with adhesion a, those in the gap too (not
    those that move no dof), pulls its geoms together along its normal, -a n^T (J2 - J1)."""
    slots = np.flatnonzero(slots_make_rows(model))
    if slots.size == 0:
        return jnp.zeros(model.nv, model.dtype)
    pull = jnp.where(data.contact.mask[slots], data.contact.adhesion[slots], 0.0)
    return -(pull @ normal_jacobians(model, data, slots))


def efc_slots(model: Model, contact: Contact) -> Int[Array, " nefc_contact"] | np.ndarray:
    """The contact slot of each efc contact (types.ConstraintLayout): every slot in order, or with a
    capacity, per condim the occupied slots first, each group in order (`math.true_first`), as many
    as can be occupied; with `max_contact_points` the deepest of those (MJX's choice)."""
    layout = model.constraints
    if layout.capacity_by_dim is None:
        return np.arange(layout.ncon)
    picks, makes_rows = [], slots_make_rows(model)
    for dim, capacity in layout.capacity_by_dim.items():
        slots = np.nonzero(layout.contact_dim == dim)[0]
        mask = contact.mask[slots] & makes_rows[slots]  # a contact that moves no dof takes no place
        if capacity < layout.occupiable_by_dim[dim]:  # the deepest (a top_k: cheaper than compacting first)
            depth = jnp.where(mask & ~jnp.isnan(contact.dist[slots]), -contact.dist[slots], -jnp.inf)
            picks.append(jnp.asarray(slots)[jax.lax.top_k(depth, capacity)[1]])
        elif capacity < len(slots):
            picks.append(jnp.asarray(slots)[math.true_first(mask, capacity)])
        else:  # every slot has a place
            picks.append(jnp.asarray(slots))
    return jnp.concatenate(picks)


def mujoco_contact_rank(model: Model) -> np.ndarray:
    """Each contact slot's place in MuJoCo's contact order (mj_collision): body pairs by signature
    (lower body id first), a pair's explicit <pair>s before its geom pairs, geoms by id, then
    the collision function's own order. (Bodies with several geoms go through MuJoCo's midphase,
    whose order this approximates by geom id.)"""
    layout = model.constraints
    geom = layout.contact_geom
    body = np.sort(geom_body(model, geom), axis=1)
    explicit = np.concatenate([np.zeros(0, bool)] + [np.repeat(np.asarray(g.pair_id) >= 0, g.n_slots) for g in layout.groups])
    slot = np.arange(len(geom))
    order = np.lexsort((slot, geom.max(1), geom.min(1), ~explicit, body[:, 1], body[:, 0]))
    return np.argsort(order)


class EfcContacts(NamedTuple):
    """The efc contacts of a step: their slots, geom ids (static where the slots are) and contact data."""

    slots: Int[Array, " nefc_contact"] | np.ndarray
    geom: Int[Array, "nefc_contact 2"] | np.ndarray
    contact: Contact


def efc_contacts(model: Model, contact: Contact) -> EfcContacts:
    """The contact array at `efc_slots`: what the contact rows are built from."""
    slots = efc_slots(model, contact)
    geom = _take(model.constraints.contact_geom, slots)
    if isinstance(slots, np.ndarray):  # every slot, in order
        return EfcContacts(slots, geom, contact)
    fields = {f.name: getattr(contact, f.name)[slots] for f in dataclasses.fields(contact) if f.name != "overflow"}
    return EfcContacts(slots, geom, contact.replace(**fields))


def contact_dofs(model: Model) -> np.ndarray | None:
    """(ncon, w): the dofs that move either body of each contact slot, ascending, padded with nv,
    or None for dense contact rows: MuJoCo's `<option jacobian>`; "sparse" whenever w < nv, "auto"
    (the default) where the rows are sparse enough to pay for their gathers and scatters,
    w <= nv / 16. Measured on cube piles (w = 12, float32, 2-core CPU, per step at batch 1 / 16,
    sparse vs dense): nv 96: 4.1 vs 3.2 / 65 vs 45 ms; nv 144: 10.5 vs 7.9 / 136 vs 203 ms;
    nv 192: 17.9 vs 24.7 / 284 vs 513 ms; nv 600 (capacity 400 pairs, before the blocked
    Cholesky): 63 vs 166 ms at batch 1."""
    layout, topo = model.constraints, model.topology
    if layout.ncon == 0 or model.opt.jacobian == "dense":
        return None
    pairs, slot_pair = np.unique(np.asarray(topo.geom_bodyid, np.int64)[layout.contact_geom], axis=0, return_inverse=True)
    chain = topo.body_dof_chain
    moves = chain[pairs[:, 0]] | chain[pairs[:, 1]]  # (npairs, nv)
    width = max(1, int(moves.sum(axis=1).max()))
    if width >= model.nv or (model.opt.jacobian == "auto" and 16 * width > model.nv):
        return None
    order = np.argsort(~moves, axis=1, kind="stable")[:, :width]  # the moving dofs first, ascending
    return np.where(np.take_along_axis(moves, order, axis=1), order, model.nv)[slot_pair.reshape(-1)]


def _moves_a_dof(model: Model, body) -> Bool[Array, " n"] | np.ndarray:
    """Whether a contact between these bodies (n, 2) moves any dof: MuJoCo makes no rows for one whose
    two bodies' dof chains are the same (mj_instantiateContact's NV == 0, the dofs in one chain but
    not the other): two bodies without joints above them (an explicit <pair> of a mocap body and the
    world), or two geoms of one welded body. Static (numpy) where the bodies are."""
    chain = _take(model.topology.body_dof_chain_id, body)
    return chain[:, 0] != chain[:, 1]


def slots_make_rows(model: Model) -> np.ndarray:
    """Per contact slot (static): whether a contact there can have rows (`_moves_a_dof`)."""
    return _moves_a_dof(model, geom_body(model, model.constraints.contact_geom))


def _contact_rows(model: Model, data: Data, contacts: EfcContacts, dofs=None) -> Rows:
    """Contact rows (mj_instantiateContact): frame-rotated Jacobian differences, body2 - body1.
    dofs (nefc_contact, w): J only over those columns (sparse rows, `contact_dofs`)."""
    layout = model.constraints
    if layout.ncon == 0:
        return _empty(model)
    con = contacts.contact
    body = geom_body(model, contacts.geom)  # (nefc_contact, 2)
    J6 = contact_jacobian(model, data, body, con.pos, con.frame, dofs)

    c, k, sign = layout.row_contact, layout.row_axis, layout.row_sign
    fric = con.friction[c, np.maximum(k - 1, 0)]
    elliptic = layout.cone == "elliptic"
    if elliptic:
        J = J6[c, k]
    else:  # pyramid edges J_n +- mu_k J_k (frictionless rows: J_n)
        J = J6[c, 0] + (jnp.asarray(sign, model.dtype) * fric)[:, None] * J6[c, k]

    iw = model.body_invweight0
    tran = iw[body[:, 0], 0] + iw[body[:, 1], 0]
    rot = iw[body[:, 0], 1] + iw[body[:, 1], 1]
    lin_axis = jnp.asarray(k < 3)
    if elliptic:
        diag = jnp.where(lin_axis, tran[c], rot[c])
    else:
        diag = tran[c] + jnp.where(jnp.asarray(k >= 1), fric**2 * jnp.where(lin_axis, tran[c], rot[c]), 0.0)
    normal = jnp.asarray((k == 0) | (not elliptic))
    dist = con.dist[c]
    margin = con.includemargin[c]
    # elliptic friction rows use solreffriction when it is set
    use_fr = jnp.asarray(k > 0) & elliptic & jnp.any(con.solreffriction[c] != 0, axis=-1)
    solref = jnp.where(use_fr[:, None], con.solreffriction[c], con.solref[c])
    return Rows(
        J=J, pos=jnp.where(normal, dist, 0.0), margin=jnp.where(normal, margin, 0.0), diag_approx=diag,
        solref=solref, solimp=con.solimp[c], imp_r=dist - margin,  # every row of a contact: the normal's r
        stiff=normal, mask=con.mask[c] & ((con.dist[c] < con.includemargin[c]) | (con.adhesion[c] != 0)) & _moves_a_dof(model, body)[c],
        frictionloss=jnp.zeros_like(dist), jdot_v=jnp.zeros_like(dist),
    )  # fmt: skip


def contact_force(model: Model, data: Data) -> Float[Array, "ncon 6"]:
    """Each contact's force:torque in its own frame (normal, two tangents, torsion, rolling) from
    efc_force (mj_contactForce); zero for contacts without rows. A pyramid decodes as
    normal = sum of its edge forces, tangent k = mu_k (f_k+ - f_k-) (mju_decodePyramid)."""
    layout = model.constraints
    if layout.ncon == 0:
        return jnp.zeros((0, 6), model.dtype)
    start = layout.ne + layout.nf + layout.nl
    f = jnp.where(data.efc_mask[start:], data.efc_force[start:], 0.0)
    k, sign = layout.row_axis, layout.row_sign
    c = efc_slots(model, data.contact)[layout.row_contact]  # each row's contact slot
    out = jnp.zeros((layout.ncon * 6,), model.dtype)
    if layout.cone == "elliptic":
        return out.at[6 * c + k].add(f).reshape(-1, 6)
    fric = data.contact.friction[c, np.maximum(k - 1, 0)]
    out = out.at[6 * c].add(f).at[6 * c + k].add(jnp.where(jnp.asarray(k > 0), sign * fric * f, 0.0))
    return out.reshape(-1, 6)


def external_wrenches(model: Model, data: Data) -> Float[Array, "nbody 6"]:
    """cfrc_ext of mj_rnePostConstraint: per body, the com-based wrench (torque; force about its
    tree's subtree com) of xfrc_applied, contact forces and connect/weld constraint forces (the
    wrench J^T efc_force of their rows on each body, as MuJoCo 4 reports it)."""
    root_com = data.subtree_com[np.asarray(model.topology.body_rootid, dtype=np.int64)]

    def at_com(body, point, torque, force):  # a world-frame wrench at `point`, moved to the com
        return jnp.concatenate([torque + jnp.cross(point - root_com[body], force), force], axis=-1)

    xfrc = data.xfrc_applied
    cfrc = at_com(np.arange(model.nbody), data.xipos, xfrc[:, 3:], xfrc[:, :3])
    layout = model.constraints
    if layout.ncon:
        local = contact_force(model, data)
        frame_t = jnp.swapaxes(data.contact.frame, -1, -2)  # contact frame (rows: axes) -> world
        force, torque = jnp.einsum("cij,cj->ci", frame_t, local[:, :3]), jnp.einsum("cij,cj->ci", frame_t, local[:, 3:])
        body = geom_body(model, layout.contact_geom)
        pos = data.contact.pos
        cfrc = cfrc.at[body[:, 0]].add(-at_com(body[:, 0], pos, torque, force))  # body 1 gets the opposite
        cfrc = cfrc.at[body[:, 1]].add(at_com(body[:, 1], pos, torque, force))
    row = 0
    for k, etype in enumerate(layout.eq_types):
        n = {_CONNECT: 3, _WELD: 6}.get(etype, 1)
        if etype in (_CONNECT, _WELD):
            force = data.efc_force[row : row + 3]
            torque = jnp.zeros(3, model.dtype)
            if etype == _WELD:  # the torque its rotational rows exert: their Jacobian's transpose
                torque = _weld_rotation(model, data, k)[2].T @ data.efc_force[row + 3 : row + 6]
            b1, b2, p1, p2 = _equality_anchors(model, data, k, etype)
            cfrc = cfrc.at[b1].add(at_com(b1, p1, torque, force))
            cfrc = cfrc.at[b2].add(-at_com(b2, p2, torque, force))
        row += n
    return cfrc.at[0].set(0.0)  # the world body receives nothing


def _concat(parts: list[Rows]) -> Rows:
    return Rows(*(jnp.concatenate(xs) for xs in zip(*parts)))


# ---------------------------------------------------------------------- parameters


def impedance(solimp: Float[Array, "n 5"], r: Float[Array, " n"]) -> Float[Array, " n"]:
    """d(r) of the Computation chapter: a sigmoid from dmin to dmax over width, power p, midpoint m."""
    dmin, dmax, width, mid, power = (solimp[:, i] for i in range(5))
    flat = (dmin == dmax) | (width <= MINVAL)
    x = jnp.abs(r) / jnp.where(flat, 1.0, width)
    inside = (x > 0) & (x < 1) & ~flat
    xs = jnp.where(inside, x, 0.5)
    ms = jnp.clip(mid, MINVAL, 1 - MINVAL)
    low = xs**power / ms ** (power - 1)
    high = 1 - (1 - xs) ** power / (1 - ms) ** (power - 1)
    y = jnp.where(power == 1, xs, jnp.where(xs <= mid, low, high))
    imp = jnp.where(inside, dmin + y * (dmax - dmin), jnp.where(x >= 1, dmax, dmin))
    return jnp.where(flat, 0.5 * (dmin + dmax), imp)


def _clamp_solimp(solimp):
    lo = jnp.clip(solimp[:, 0], _MINIMP, _MAXIMP)
    hi = jnp.clip(solimp[:, 1], _MINIMP, _MAXIMP)
    mid = jnp.clip(solimp[:, 3], _MINIMP, _MAXIMP)
    return jnp.stack([lo, hi, jnp.maximum(solimp[:, 2], 0.0), mid, jnp.maximum(solimp[:, 4], 1.0)], axis=-1)


def cfd_impedance(cfd: CFD, solimp: Float[Array, "n 5"], r: Float[Array, " n"]) -> Float[Array, " n"]:
    """Contacts from distance (cfd.py): MuJoCo's d(r) for r <= 0; beyond the surface MuJoCo's spline
    again, from d(0) at r = 0 to cfd.dmin at r = cfd.width (so d and its slope are continuous at 0)."""
    d0 = impedance(solimp, jnp.zeros_like(r))
    full = lambda v: jnp.full_like(r, v)  # noqa: E731
    taper = _clamp_solimp(jnp.stack([d0, full(cfd.dmin), full(cfd.width), full(cfd.midpoint), full(cfd.power)], axis=-1))
    return jnp.where(r > 0, impedance(taper, jnp.maximum(r, 0.0)), impedance(solimp, r))


def make_efc(model: Model, data: Data, cfd: CFD | None = None, contacts: EfcContacts | None = None) -> Efc:
    """Stack all rows and compute R, D and aref (mj_makeConstraint, mj_makeImpedance, mj_referenceConstraint).

    `contacts`: `efc_contacts(model, data.contact)` when the caller has it already.

    With `cfd` (the gradient-only model of contacts from distance, cfd.py) contact rows
    of the pairs it names (all by default) exist out to `cfd.width` beyond their margin
    (`data.contact` must come from a collision with that reach), their impedance is
    `cfd_impedance` and the position term of aref uses `reference_distance` (-s softplus(-r / s)) in place of r.
    """
    layout = model.constraints
    contacts = efc_contacts(model, data.contact) if contacts is None else contacts
    head = _concat([_equality_rows(model, data), _friction_rows(model, data), _limit_rows(model, data)])
    dofs = contact_dofs(model)
    sparse = dofs is not None
    dofs = _take(dofs, contacts.slots) if sparse else None
    tail = _contact_rows(model, data, contacts, dofs)
    rows = _concat([head, tail._replace(J=head.J[:0]) if sparse else tail])  # sparse: J holds the rows before the contacts
    solimp = _clamp_solimp(rows.solimp)
    solref = rows.solref
    standard = solref[:, 0] > 0
    if not model.opt.disabled("refsafe"):
        solref = solref.at[:, 0].set(jnp.where(standard, jnp.maximum(solref[:, 0], 2 * model.opt.timestep), solref[:, 0]))
    imp = impedance(solimp, rows.imp_r)
    r_ref = rows.pos - rows.margin
    if cfd is not None and layout.ncon:
        first = layout.ne + layout.nf + layout.nl  # contact rows follow
        con, c = contacts.contact, layout.row_contact
        pairs = pair_mask(cfd.pairs, model.topology.geom_names)
        wide = True if pairs is None else jnp.asarray(pairs)[contacts.geom[:, 0], contacts.geom[:, 1]][c]
        moves = _moves_a_dof(model, geom_body(model, contacts.geom))[c]
        reach = con.mask[c] & (con.dist[c] < con.includemargin[c] + jnp.where(wide, cfd.width, 0.0)) & moves
        rows = rows._replace(mask=rows.mask.at[first:].set(reach))
        imp = imp.at[first:].set(jnp.where(wide, cfd_impedance(cfd, solimp[first:], rows.imp_r[first:]), imp[first:]))
        r_ref = r_ref.at[first:].set(jnp.where(wide, reference_distance(r_ref[first:], cfd.softplus_length), r_ref[first:]))
    dmax = solimp[:, 1]
    diag = rows.diag_approx
    if model.opt.diag_exact:
        diag = exact_diagonal(data.qM, _dense_rows(rows.J, tail.J, dofs[layout.row_contact]) if sparse else rows.J)
    R = jnp.maximum(MINVAL, (1 - imp) * diag / imp)

    mu = jnp.zeros((layout.nefc_contact,), model.dtype)
    if layout.ncon:
        R, mu = _contact_regularizer(model, contacts.contact.friction, R)
    R = jnp.maximum(R, _PRECISION_FLOOR * jnp.finfo(R.dtype).eps * diag)
    D = 1.0 / R
    tc, dr = solref[:, 0], solref[:, 1]
    k_std = 1.0 / jnp.maximum(MINVAL, dmax**2 * tc**2 * dr**2)
    k_dir = -tc / jnp.maximum(MINVAL, dmax**2)
    k = jnp.where(rows.stiff, jnp.where(standard, k_std, k_dir), 0.0)
    b = jnp.where(dr > 0, 2.0 / jnp.maximum(MINVAL, dmax * tc), -dr / jnp.maximum(MINVAL, dmax))
    mask = rows.mask
    efc = Efc(
        J=jnp.where(mask[: len(rows.J), None], rows.J, 0.0), pos=rows.pos, margin=rows.margin,
        D=jnp.where(mask, D, 0.0), R=R, aref=jnp.zeros_like(R), frictionloss=rows.frictionloss, mask=mask, mu=mu,
    )  # fmt: skip
    if sparse:
        efc = efc._replace(Jc=jnp.where(mask[len(rows.J) :, None], tail.J, 0.0), dofs=dofs[layout.row_contact])
    vel = apply(efc, data.qvel)
    if model.topology.has_surfacevel and layout.ncon:
        vel = vel.at[layout.ne + layout.nf + layout.nl :].add(_surface_velocity(model, data, contacts))
    aref = -b * vel - k * imp * r_ref - rows.jdot_v
    if model.topology.has_adhesion and layout.ncon:
        aref = aref.at[layout.ne + layout.nf + layout.nl :].add(R[layout.ne + layout.nf + layout.nl :] * _adhesion_share(model, contacts))
    return efc._replace(aref=jnp.where(mask, aref, 0.0))


def _adhesion_share(model: Model, contacts: EfcContacts) -> Float[Array, " nefc_contact"]:
    """mj_adhesionRef: a contact's adhesion on its normal row (elliptic, condim 1) or split evenly over
    its pyramid's 2 (dim - 1) edges; aref gains R times it, so that the force-penetration curve under
    compression does not depend on the adhesion."""
    layout = model.constraints
    c, k = layout.row_contact, layout.row_axis
    adhesion = contacts.contact.adhesion[c]
    if layout.cone == "elliptic":
        return jnp.where(jnp.asarray(k == 0), adhesion, 0.0)
    return adhesion / jnp.asarray(layout.contact_rows[c], adhesion.dtype)  # 1 row, or the pyramid's edges


def _surface_velocity(model: Model, data: Data, contacts: EfcContacts) -> Float[Array, " nefc_contact"]:
    """mj_addSurfaceVel: each contact row's share of its geoms' relative surface velocity (geom 2's
    minus geom 1's; each geom's `surfacevel` rotated to the world, plus w x (p - geom centre)),
    in the contact frame, tangential and torsional only (no normal push, no rolling drive)."""
    layout = model.constraints
    con, geoms = contacts.contact, contacts.geom
    surface = model.geom_surfacevel[geoms]  # (n, 2, 6)
    rot = data.geom_xmat[geoms]
    angular = jnp.einsum("ngij,ngj->ngi", rot, surface[..., 3:])
    linear = jnp.einsum("ngij,ngj->ngi", rot, surface[..., :3])
    linear = linear + jnp.cross(angular, con.pos[:, None, :] - data.geom_xpos[geoms])
    local = jnp.concatenate([jnp.einsum("nij,nj->ni", con.frame, x[:, 1] - x[:, 0]) for x in (linear, angular)], axis=-1)
    local = local * jnp.asarray([0.0, 1.0, 1.0, 1.0, 0.0, 0.0], model.dtype)
    c, k, sign = layout.row_contact, layout.row_axis, layout.row_sign
    if layout.cone == "elliptic":
        return local[c, k]
    return jnp.asarray(sign, model.dtype) * con.friction[c, np.maximum(k - 1, 0)] * local[c, k]


def _contact_regularizer(model: Model, friction: Float[Array, "nefc_contact 5"], R):
    """Friction-dimension R of each efc contact (second loop of mj_makeImpedance) and the cone slope mu."""
    layout = model.constraints
    start = layout.contact_row_start
    dim = layout.efc_contact_dim
    R0 = R[start]
    frictional = dim > 1
    R1 = R0 / jnp.maximum(MINVAL, model.opt.impratio)
    mu = jnp.where(jnp.asarray(frictional), friction[:, 0] * jnp.sqrt(R1 / R0), 0.0)
    rows = np.arange(layout.ne + layout.nf + layout.nl, layout.nefc)
    c, k = layout.row_contact, layout.row_axis
    fr = jnp.asarray(frictional)[c]
    if layout.cone == "elliptic":
        f = friction[c, np.maximum(k - 1, 0)]
        R_fric = R1[c] * friction[c, 0] ** 2 / f**2
        new = jnp.where(jnp.asarray(k == 0), R[rows], R_fric)
    else:
        new = 2 * mu[c] ** 2 * R0[c]
    return R.at[rows].set(jnp.where(fr, new, R[rows])), mu


# ---------------------------------------------------------------------- hard-contact rows


class UnitRows(NamedTuple):
    """Rows of the interior-point NCP (solver/ncp.py): unilateral units (limits, then contacts) and equalities.

    The contact units are the efc contacts (`efc_contacts`: with a capacity, fewer than the slots);
    `index` says which unit of the full layout (limits, then contact slots) each one is."""

    J: Float[Array, "nunit 3 nv"]  # normal, tangent 1, tangent 2 (tangents unused where friction is off)
    gap: Float[Array, " nunit"]  # distance minus margin (the unit's surface) at this state
    mu: Float[Array, " nunit"]
    inv_mass: Float[Array, " nunit"]  # invweight0 along the normal (impulse scale)
    active: Bool[Array, " nunit"]
    friction: Bool[Array, " nunit"]  # a condim-3 contact
    Je: Float[Array, "ne nv"]
    pos_e: Float[Array, " ne"]
    inv_mass_e: Float[Array, " ne"]
    index: Int[Array, " nunit"]  # position in the full layout


def expand_units(model: Model, rows: UnitRows, x: Array, fill=0) -> Array:
    """x (nunit, ...) of the compacted units in the full layout (nl + ncon, ...), `fill` elsewhere."""
    layout = model.constraints
    n = layout.nl + layout.ncon
    if x.shape[0] == n:
        return x
    return jnp.full((n,) + x.shape[1:], fill, x.dtype).at[rows.index].set(x)


def unit_rows(model: Model, data: Data, limit_lookahead: Float[Array, " nl"]) -> UnitRows:
    """Limits and contacts as NCP units; a limit side takes part when dist < margin + lookahead.

    `data.contact` must come from a collision run with the NCP's lookahead (contacts
    within reach this step are in the mask, touching or not).
    """
    layout = model.constraints
    eq = _equality_rows(model, data)
    lim = _limit_rows(model, data)
    none = jnp.zeros((0,), model.dtype)  # each list starts empty-shaped, so a model without units concatenates too
    J, gap, mu, inv_mass = [jnp.zeros((0, 3, model.nv), model.dtype)], [none], [none], [none]
    active, friction = [jnp.zeros((0,), bool)], [np.zeros(0, bool)]
    if layout.nl:
        z = jnp.zeros_like(lim.J)
        J.append(jnp.stack([lim.J, z, z], axis=1))
        gap.append(lim.pos - lim.margin)
        mu.append(jnp.zeros_like(lim.pos))
        inv_mass.append(lim.diag_approx)
        active.append(lim.pos < lim.margin + limit_lookahead)
        friction.append(np.zeros(layout.nl, bool))
    index = [np.arange(layout.nl)]
    if layout.ncon:  # the efc contacts: with a capacity, the occupied slots first (efc_slots)
        slots, geom, con = efc_contacts(model, data.contact)
        body = geom_body(model, geom)
        J.append(contact_jacobian(model, data, body, con.pos, con.frame)[:, :3])
        gap.append(con.dist - con.includemargin)
        mu.append(con.friction[:, 0])
        inv_mass.append(model.body_invweight0[body[:, 0], 0] + model.body_invweight0[body[:, 1], 0])
        active.append(con.mask & _moves_a_dof(model, body))
        friction.append(layout.efc_contact_dim == 3)
        index.append(layout.nl + slots)
    return UnitRows(
        J=jnp.concatenate(J), gap=jnp.concatenate(gap), mu=jnp.concatenate(mu), inv_mass=jnp.concatenate(inv_mass),
        active=jnp.concatenate(active), friction=jnp.concatenate(friction),
        Je=jnp.where(eq.mask[:, None], eq.J, 0.0), pos_e=jnp.where(eq.mask, eq.pos, 0.0), inv_mass_e=eq.diag_approx,
        index=jnp.concatenate(index),
    )  # fmt: skip
