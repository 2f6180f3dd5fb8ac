"""Sites and tendons: site_xpos, ten_length, ten_J, ten_velocity (mj_tendon).

Fixed tendon:   L = sum_k c_k q_k               J[dof_k] += c_k
Spatial tendon: a path of sites, split into branches by pulleys (divisor D):
                L = sum over consecutive sites (p0, p1) of |p1 - p0| / D
                J += u^T (J_p(p1) - J_p(p0)) / D,   u = (p1 - p0) / |p1 - p0|
                (segments whose two sites are on one body add length only, as MuJoCo).
ten_velocity = J qvel. Wrapping around spheres and cylinders is refused at load (io.py).
The path structure is static (Topology.tendon_*, wrap_*); the coefficients, divisors
and site positions are differentiable leaves.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import math
from .constraint import point_jacobian
from .types import Data, Model, WrapType


def site_positions(model: Model, data: Data):
    """site_xpos = xpos[body] + xmat[body] site_pos (mj_kinematics, sites)."""
    body = np.asarray(model.topology.site_bodyid, dtype=np.int64)
    if len(body) == 0:
        return jnp.zeros((0, 3), model.dtype)
    return data.xpos[body] + jnp.einsum("sij,sj->si", data.xmat[body], model.site_pos)


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


def _site_segments(model: Model):
    """(tendon, site0, site1, divisor wrap index or -1) of every straight spatial segment (mj_tendon's walk)."""
    topo = model.topology
    segments = []
    for t, (adr, num) in enumerate(zip(topo.tendon_adr, topo.tendon_num)):
        if not num or topo.wrap_type[adr] == WrapType.JOINT:
            continue
        divisor = -1
        for j in range(adr, adr + num - 1):
            if topo.wrap_type[j] == WrapType.PULLEY:
                divisor = j
                continue
            if topo.wrap_type[j + 1] == WrapType.PULLEY:
                continue
            segments.append((t, topo.wrap_objid[j], topo.wrap_objid[j + 1], divisor))
    return np.asarray(segments, dtype=np.int64).reshape(-1, 4)


def tendon(model: Model, data: Data) -> Data:
    """site_xpos, ten_length, ten_J and ten_velocity at the current state (after com_pos)."""
    site_xpos = site_positions(model, data)
    nt = model.ntendon
    if nt == 0:
        return data.replace(site_xpos=site_xpos)
    length = jnp.zeros(nt, model.dtype)
    J = jnp.zeros((nt, model.nv), model.dtype)
    topo = model.topology

    fixed = _fixed_terms(model)
    if len(fixed):
        t, w, jnt = fixed.T
        coef = model.wrap_prm[w]
        qadr = np.asarray(topo.jnt_qposadr, dtype=np.int64)[jnt]
        dadr = np.asarray(topo.jnt_dofadr, dtype=np.int64)[jnt]
        length = length.at[t].add(coef * data.qpos[qadr])
        J = J.at[t, dadr].add(coef)

    seg = _site_segments(model)
    if len(seg):
        t, s0, s1, w = seg.T
        divisor = jnp.where(jnp.asarray(w >= 0), model.wrap_prm[np.maximum(w, 0)], 1.0)
        p0, p1 = site_xpos[s0], site_xpos[s1]
        dif = p1 - p0
        dist = math.safe_norm(dif, axis=-1)
        length = length.at[t].add(dist / divisor)
        body = np.asarray(topo.site_bodyid, dtype=np.int64)
        moving = body[s0] != body[s1]  # static: a segment within one body has no moment arm
        if np.any(moving):
            t, s0, s1 = t[moving], s0[moving], s1[moving]
            jac0, _ = point_jacobian(model, data, body[s0], p0[moving])
            jac1, _ = point_jacobian(model, data, body[s1], p1[moving])
            direction = math.normalize(dif[moving])
            arm = jnp.einsum("si,siv->sv", direction, jac1 - jac0) / divisor[moving, None]
            J = J.at[t].add(arm)
    return data.replace(site_xpos=site_xpos, ten_length=length, ten_J=J, ten_velocity=J @ data.qvel)
