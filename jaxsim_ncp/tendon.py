"""Tendons: ten_length, ten_J, ten_velocity (mj_tendon).

Fixed tendon:   L = sum_k c_k q_k               J[dof_k] += c_k
Spatial tendon: a path of sites, split into branches by pulleys (divisor D):
                L = sum over consecutive sites (p0, p1) of |p1 - p0| / D
                J += u^T (J_p(p1) - J_p(p0)) / D,   u = (p1 - p0) / |p1 - p0|
                (segments whose two sites are on one body add length only, as MuJoCo).
                A sphere or cylinder between two sites may wrap the segment (wrap.py;
                a side site inside the geom selects the inside wrap, one outside it the side):
                p0 -> t0, an arc of length w on the geom, t1 -> p1; the moment arms come
                from the two straight pieces (the arc rides on the geom's body).
ten_velocity = J qvel.
Tendon armature a (mj_tendonArmature, mj_tendonBias): qM += a J^T J, qfrc_bias += a J^T (dJ/dt qvel).
The path structure is static (Topology.tendon_*, wrap_*); the coefficients, divisors
and site positions are differentiable leaves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import math, smooth, wrap
from .smooth import point_jacobian
from .types import Data, Model, WrapType


def _fixed_terms(model: Model):
    """(tendon, wrap index, joint) of every fixed-tendon element."""
    topo = model.topology
    items = [
        (t, adr + k, topo.wrap_objid[adr + k])
        for t, (adr, num) in enumerate(zip(topo.tendon_adr, topo.tendon_num))
        if num and topo.wrap_type[adr] == WrapType.JOINT
        for k in range(num)
    ]
    return np.asarray(items, dtype=np.int64).reshape(-1, 3)


def fixed_lengths(model: Model, qpos):
    """Fixed tendons' lengths at qpos (sum of coef q over their joints; 0 for spatial tendons)."""
    length = jnp.zeros(model.ntendon, model.dtype)
    fixed = _fixed_terms(model)
    if len(fixed):
        t, w, jnt = fixed.T
        length = length.at[t].add(model.wrap_prm[w] * qpos[np.asarray(model.topology.jnt_qposadr, dtype=np.int64)[jnt]])
    return length


def _site_segments(model: Model):
    """Spatial segments in mj_tendon's walk, as rows (tendon, site0, site1, divisor wrap index
    or -1, wrapping geom or -1, wrap index of that geom (its side site) or -1)."""
    topo = model.topology
    segments = []
    for t, (adr, num) in enumerate(zip(topo.tendon_adr, topo.tendon_num)):
        if not num or topo.wrap_type[adr] == WrapType.JOINT:
            continue
        divisor, j = -1, adr
        while j < adr + num - 1:
            types = topo.wrap_type[j], topo.wrap_type[j + 1]
            if WrapType.PULLEY in types:
                divisor = j if types[0] == WrapType.PULLEY else divisor
                j += 1
            elif types[1] in (WrapType.SPHERE, WrapType.CYLINDER):
                segments.append((t, topo.wrap_objid[j], topo.wrap_objid[j + 2], divisor, topo.wrap_objid[j + 1], j + 1))
                j += 2
            else:
                segments.append((t, topo.wrap_objid[j], topo.wrap_objid[j + 1], divisor, -1, -1))
                j += 1
    return np.asarray(segments, dtype=np.int64).reshape(-1, 6)


def _arms(model: Model, data: Data, bodies, points, direction_of):
    """u^T (J_p(end) - J_p(start)) of straight pieces: bodies/points (2, n), direction_of (n, 3)."""
    jac0, _ = point_jacobian(model, data, bodies[0], points[0])
    jac1, _ = point_jacobian(model, data, bodies[1], points[1])
    return jnp.einsum("si,siv->sv", math.normalize(direction_of), jac1 - jac0)


def tendon(model: Model, data: Data) -> Data:
    """ten_length, ten_J and ten_velocity at the current state (after kinematics and com_pos)."""
    nt = model.ntendon
    if nt == 0:
        return data
    length = fixed_lengths(model, data.qpos)
    J = jnp.zeros((nt, model.nv), model.dtype)

    fixed = _fixed_terms(model)
    if len(fixed):
        t, w, jnt = fixed.T
        J = J.at[t, np.asarray(model.topology.jnt_dofadr, dtype=np.int64)[jnt]].add(model.wrap_prm[w])

    seg = _site_segments(model)
    if len(seg):
        length, J = _spatial(model, data, seg, length, J)
    return data.replace(ten_length=length, ten_J=J, ten_velocity=J @ data.qvel)


def armature(model: Model, data: Data) -> Data:
    """Add the tendons' armature to qM and qfrc_bias (after crb and rne): an inertia a moving with
    the tendon adds a J^T J to M and a J^T (dJ/dt qvel) to the bias force. dJ/dt qvel is the rate of
    change of ten_velocity = J qvel as the configuration moves along qvel (a forward-mode derivative;
    zero for fixed tendons on hinges and slides). As mj_tendonArmature, the J^T J term is added only
    within M's sparsity (dof pairs on one ancestor chain): couplings across branches or trees, which
    a tendon between two of them has, are dropped from M (checked against MuJoCo 4)."""
    ids = np.asarray(model.topology.tendon_with_armature, dtype=np.int64)
    if len(ids) == 0:
        return data

    def velocity_at(qpos):
        d = smooth.com_pos(model, smooth.kinematics(model, data.replace(qpos=qpos)))
        return tendon(model, d).ten_velocity[ids]

    zero = jnp.zeros((), data.qpos.dtype)
    qpos_rate = jax.jvp(lambda h: smooth.integrate_pos(model, data.qpos, data.qvel, h), (zero,), (jnp.ones_like(zero),))[1]
    jdot_qvel = jax.jvp(velocity_at, (data.qpos,), (qpos_rate,))[1]
    J, a = data.ten_J[ids], model.tendon_armature_total[ids]
    anc = model.topology.dof_ancestor
    inertia = jnp.where(jnp.asarray(anc | anc.T), J.T @ (a[:, None] * J), 0.0)
    return data.replace(qM=data.qM + inertia, qfrc_bias=data.qfrc_bias + J.T @ (a * jdot_qvel))


def _spatial(model: Model, data: Data, seg: np.ndarray, length, J):
    """Add the spatial segments' lengths and moment arms (mj_tendon's spatial branch)."""
    t, s0, s1, w, geom, wrap_at = seg.T
    divisor = jnp.where(jnp.asarray(w >= 0), model.wrap_prm[np.maximum(w, 0)], 1.0)
    site_body = np.asarray(model.topology.site_bodyid, dtype=np.int64)
    b0, b1 = site_body[s0], site_body[s1]
    p0, p1 = data.site_xpos[s0], data.site_xpos[s1]
    # straight segments; those within one body have no moment arm (static), as MuJoCo skips them
    dist = math.safe_norm(p1 - p0, axis=-1)
    arm = jnp.where(jnp.asarray(b0 != b1)[:, None], _arms(model, data, (b0, b1), (p0, p1), p1 - p0), 0.0)
    wraps = np.nonzero(geom >= 0)[0]
    if len(wraps):
        g = geom[wraps]
        bg = np.asarray(model.topology.geom_bodyid, dtype=np.int64)[g]
        side = np.asarray(model.topology.wrap_side, dtype=np.int64)[wrap_at[wraps]]
        cylinder = np.asarray(model.topology.wrap_type, dtype=np.int64)[wrap_at[wraps]] == WrapType.CYLINDER
        wlen, t0, t1 = jax.vmap(wrap.wrap)(
            p0[wraps], p1[wraps], data.geom_xpos[g], data.geom_xmat[g], model.geom_size[g, 0],
            jnp.asarray(cylinder), jnp.asarray(side >= 0), data.site_xpos[np.maximum(side, 0)],
        )  # fmt: skip
        wrapped = wlen >= 0
        q0, q1 = p0[wraps], p1[wraps]
        wrapped_len = math.safe_norm(t0 - q0, axis=-1) + wlen + math.safe_norm(q1 - t1, axis=-1)
        dist = dist.at[wraps].set(jnp.where(wrapped, wrapped_len, dist[wraps]))
        arm_in = jnp.where(jnp.asarray(b0[wraps] != bg)[:, None], _arms(model, data, (b0[wraps], bg), (q0, t0), t0 - q0), 0.0)
        arm_out = jnp.where(jnp.asarray(bg != b1[wraps])[:, None], _arms(model, data, (bg, b1[wraps]), (t1, q1), q1 - t1), 0.0)
        arm = arm.at[wraps].set(jnp.where(wrapped[:, None], arm_in + arm_out, arm[wraps]))
    return length.at[t].add(dist / divisor), J.at[t].add(arm / divisor[:, None])
