"""Narrow phase for MuJoCo's primitive geom pairs (engine_collision_primitive.c / _box.c).

Each function follows the contract of `base`: `fn(g1, g2, margin) -> Collision` with a
static number of contact slots. Every case switch of the C code is a `jnp.where`; the
branches not taken are evaluated on safe inputs ("double where") so that gradients stay
finite everywhere (coincident centres, parallel axes, faces parallel to the plane, ...).

Conventions reproduced from MuJoCo: a contact's `pos` is the midpoint between the two
surfaces along the normal, the normal points from g1 to g2, and the frame is completed by
mju_makeFrame (plane-capsule passes the capsule axis as the tangent hint).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ..math import make_frame, normalize, quotient, safe_norm, safe_quotient
from .base import Collision, GeomFrame
from .smoothing import blend

MINVAL = 1e-15  # mjMINVAL
PARALLEL_SIN2 = 1e-8  # capsule axes with sin^2(angle) below this are parallel (MuJoCo 4)

PLANE, HFIELD, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX = range(7)


# ------------------------------------------------------------------------------ helpers


def _normalize_mj(v: Float[Array, "3"]) -> tuple[Float[Array, "3"], Float[Array, ""]]:
    """mju_normalize3: (v / |v|, |v|), or ((1, 0, 0), |v|) when |v| < mjMINVAL."""
    norm = safe_norm(v)
    small = norm < MINVAL
    unit = jnp.where(small, jnp.array([1.0, 0.0, 0.0], v.dtype), v / jnp.where(small, 1.0, norm))
    return unit, norm


def _frame(normal: Float[Array, "3"], hint: Float[Array, "3"] | None = None) -> Float[Array, "3 3"]:
    """mju_makeFrame, including its (1, 0, 0) tangent when the hint is parallel to the normal."""
    if hint is None:
        return make_frame(normal)
    frame = make_frame(normal, hint)
    n = frame[0]
    proj = hint - n * jnp.dot(n, hint)
    degenerate = (jnp.dot(hint, hint) >= 0.25) & (safe_norm(proj) < MINVAL)
    t = jnp.where(degenerate, jnp.array([1.0, 0.0, 0.0], n.dtype), frame[1])
    return jnp.stack([n, t, jnp.cross(n, t)])


def _collision(dist, pos, normal, valid, hint=None) -> Collision:
    """Stack per-slot results into a Collision (frames completed slot by slot)."""
    dist = jnp.stack(dist)
    pos = jnp.stack(pos)
    normal = jnp.stack(normal)
    if hint is None:
        frame = jax.vmap(_frame)(normal)
    else:
        frame = jax.vmap(_frame)(normal, jnp.stack(hint))
    return Collision(dist=dist, pos=pos, frame=frame, valid=jnp.stack(valid))


def _compact(values, valid: Bool[Array, " m"], n: int):
    """Keep the first n valid of m candidates, in order (MuJoCo fills con[cnt++]).

    values is a pytree of arrays with leading axis m; empty output slots hold zeros.
    """
    rank = jnp.cumsum(valid) - 1
    select = valid[None, :] & (rank[None, :] == jnp.arange(n)[:, None])  # (n, m) one-hot rows
    out = jax.tree.map(lambda v: jnp.tensordot(select.astype(v.dtype), v, axes=1), values)
    return out, jnp.any(select, axis=1)


def _sphere_sphere(p1, r1, z1, p2, r2, z2, margin):
    """mjraw_SphereSphere -> (dist, pos, normal, valid); z1, z2 are the geoms' z axes."""
    d = p2 - p1
    min_dist = margin + r1 + r2
    valid = jnp.dot(d, d) <= min_dist * min_dist
    normal, length = _normalize_mj(d)
    dist = length - r1 - r2
    # coincident centres: normal = cross of the z axes ((1, 0, 0) if those are parallel)
    fallback, _ = _normalize_mj(jnp.cross(z1, z2))
    normal = jnp.where(length < MINVAL, fallback, normal)
    pos = p1 + normal * (r1 + 0.5 * dist)
    return dist, pos, normal, valid


def _plane_sphere(plane_pos, n, center, radius, margin):
    """mjraw_PlaneSphere -> (dist, pos, valid); the normal is the plane's n."""
    cdist = jnp.dot(center - plane_pos, n)
    dist = cdist - radius
    pos = center - n * (0.5 * dist + radius)
    return dist, pos, cdist <= margin + radius


def _sphere_box(center_w, r, box: GeomFrame, margin, smoothing: float = 0.0):
    """mjraw_SphereBox for a sphere at center_w -> (dist, pos, normal, valid).

    smoothing > 0 blends the nearest-face choice (centre inside), see `smoothing`.
    """
    size, mat = box.size, box.mat
    center = mat.T @ (center_w - box.pos)
    clamped = jnp.clip(center, -size, size)
    tmp, dist = _normalize_mj(clamped - center)
    valid = dist - r <= margin
    inside = dist <= MINVAL

    # centre inside the box: push out through the nearest face (first minimum wins)
    faces = jnp.abs(jnp.stack([-size, size], axis=1).reshape(6) - jnp.repeat(center, 2))
    k = jnp.argmin(faces)
    closest = faces[k]
    nearest = jax.nn.one_hot(k // 2, 3, dtype=center.dtype) * jnp.where(k % 2 == 1, -1.0, 1.0)
    if smoothing > 0:
        face_normals = jnp.kron(jnp.eye(3, dtype=center.dtype), jnp.array([[1.0], [-1.0]], center.dtype))
        closest, nearest = blend(faces, (faces, face_normals), smoothing)
        nearest = normalize(nearest)
    pos_in = center + nearest * (0.5 * (r - closest))

    # centre outside: midpoint of the box point and the deepest sphere point
    pos_out = 0.5 * clamped + 0.5 * (center + tmp * r)

    pos_local = jnp.where(inside, pos_in, pos_out)
    normal = mat @ jnp.where(inside, nearest, tmp)
    dist = jnp.where(inside, -closest, dist) - r
    return dist, mat @ pos_local + box.pos, normal, valid


def _clip_segments(ma, mb, mc, u, v, det_ok, det):
    """Closest-point parameters (x1, x2) of two segments, clipped like MuJoCo; plus clamp codes.

    Returns x1, x2 in [-1, 1] and s1, s2 in {0, 1, 2} (lower end, interior, upper end),
    reproducing the C sequence (clip x1, recompute x2; clip x2, recompute and clip x1).
    """
    idet = 1.0 / jnp.where(det_ok, det, 1.0)
    x1 = (mc * u - mb * v) * idet
    x2 = (ma * v - mb * u) * idet
    hi, lo = x1 > 1, x1 < -1
    s1 = jnp.where(hi, 2, jnp.where(lo, 0, 1))
    x2 = jnp.where(hi, (v - mb) / mc, jnp.where(lo, (v + mb) / mc, x2))
    x1 = jnp.clip(x1, -1.0, 1.0)
    hi, lo = x2 > 1, x2 < -1
    s2 = jnp.where(hi, 2, jnp.where(lo, 0, 1))
    x1r = jnp.where(hi, (u - mb) / ma, (u + mb) / ma)
    s1 = jnp.where(hi | lo, jnp.where(x1r > 1, 2, jnp.where(x1r < -1, 0, s1)), s1)
    x1 = jnp.where(hi | lo, jnp.clip(x1r, -1.0, 1.0), x1)
    x2 = jnp.clip(x2, -1.0, 1.0)
    return x1, x2, s1, s2


# ------------------------------------------------------------------------------ plane


def plane_sphere(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_PlaneSphere: one contact."""
    n = g1.mat[:, 2]
    dist, pos, valid = _plane_sphere(g1.pos, n, g2.pos, g2.size[0], margin)
    return _collision([dist], [pos], [n], [valid])


def plane_capsule(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_PlaneCapsule: the two end spheres, frames aligned with the capsule axis."""
    n = g1.mat[:, 2]
    axis = g2.mat[:, 2]
    segment = axis * g2.size[1]
    d1, p1, v1 = _plane_sphere(g1.pos, n, g2.pos + segment, g2.size[0], margin)
    d2, p2, v2 = _plane_sphere(g1.pos, n, g2.pos - segment, g2.size[0], margin)
    return _collision([d1, d2], [p1, p2], [n, n], [v1, v2], hint=[axis, axis])


def plane_ellipsoid(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_PlaneConvex for an ellipsoid: its support point along -normal."""
    n = g1.mat[:, 2]
    size = g2.size
    scaled = (g2.mat.T @ -n) * size
    norm = safe_norm(scaled)
    small = norm < MINVAL
    local = jnp.where(small, jnp.array([1.0, 0.0, 0.0], n.dtype), scaled / jnp.where(small, 1.0, norm)) * size
    point = g2.mat @ local + g2.pos
    dist = jnp.dot(n, point - g1.pos)
    return _collision([dist], [point - n * (0.5 * dist)], [n], [dist <= margin])


def plane_cylinder(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_PlaneCylinder: lowest rim point, opposite-cap rim point, two rim points at +-120 deg."""
    n = g1.mat[:, 2]
    radius, half = g2.size[0], g2.size[1]
    axis = g2.mat[:, 2]

    # make the axis point towards the plane
    prjaxis = jnp.dot(n, axis)
    flip = prjaxis > 0
    axis = jnp.where(flip, -axis, axis)
    prjaxis = jnp.where(flip, -prjaxis, prjaxis)

    dist0 = jnp.dot(g2.pos - g1.pos, n)

    # rim direction nearest the plane: -normal without its axial part, scaled to the radius
    vec = axis * prjaxis - n
    len_sqr = jnp.dot(vec, vec)
    general = len_sqr >= MINVAL * MINVAL
    scl = radius / jnp.sqrt(jnp.where(general, len_sqr, 1.0))
    vec = jnp.where(general, vec * scl, g2.mat[:, 0] * radius)  # disk parallel: cylinder x axis
    prjvec = jnp.dot(vec, n)

    axis = axis * half
    prjaxis = prjaxis * half

    # first point (near cap), second point (far cap)
    d1 = dist0 + prjaxis + prjvec
    d2 = dist0 - prjaxis + prjvec
    p1 = g2.pos + vec + axis - n * (0.5 * d1)
    p2 = g2.pos + vec - axis - n * (0.5 * d2)
    v1 = d1 <= margin
    v2 = v1 & (d2 <= margin)

    # two more points on the near cap, at +-120 degrees from the first
    d3 = dist0 + prjaxis - 0.5 * prjvec
    side, _ = _normalize_mj(jnp.cross(vec, axis))
    side = side * (radius * jnp.sqrt(3.0) / 2)
    base = g2.pos + axis - 0.5 * vec - n * (0.5 * d3)
    v3 = v1 & (d3 <= margin)

    # MuJoCo packs contacts: the triangle points follow the second point if it exists
    (dist, pos), valid = _compact(
        (jnp.stack([d1, d2, d3, d3]), jnp.stack([p1, p2, base + side, base - side])),
        jnp.stack([v1, v2, v3, v3]),
        4,
    )
    return _collision(list(dist), list(pos), [n] * 4, list(valid))


def plane_box(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_PlaneBox: the first four corners (in corner order) below margin and below the centre."""
    n = g1.mat[:, 2]
    dist0 = jnp.dot(g2.pos - g1.pos, n)
    signs = jnp.array([[(i & 1) * 2 - 1, (i & 2) - 1, (i & 4) // 2 - 1] for i in range(8)], dtype=n.dtype)
    corners = (signs * g2.size) @ g2.mat.T  # (8, 3), relative to the box centre
    ldist = corners @ n
    dist = dist0 + ldist
    valid = (dist <= margin) & (ldist <= 0)
    pos = corners + g2.pos - n * (0.5 * dist)[:, None]
    (dist, pos), valid = _compact((dist, pos), valid, 4)
    return _collision(list(dist), list(pos), [n] * 4, list(valid))


# ------------------------------------------------------------------------------ sphere, capsule


def sphere_sphere(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_SphereSphere: one contact."""
    dist, pos, normal, valid = _sphere_sphere(
        g1.pos, g1.size[0], g1.mat[:, 2], g2.pos, g2.size[0], g2.mat[:, 2], margin
    )
    return _collision([dist], [pos], [normal], [valid])


def sphere_capsule(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_SphereCapsule: sphere against the nearest point of the capsule segment."""
    axis = g2.mat[:, 2]
    x = jnp.clip(jnp.dot(axis, g1.pos - g2.pos), -g2.size[1], g2.size[1])
    dist, pos, normal, valid = _sphere_sphere(
        g1.pos, g1.size[0], g1.mat[:, 2], g2.pos + axis * x, g2.size[0], axis, margin
    )
    return _collision([dist], [pos], [normal], [valid])


def capsule_capsule(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """mjc_CapsuleCapsule: nearest segment points; (nearly) parallel axes give two contacts.

    Axes count as parallel when sin^2 of their angle is below 1e-8 (MuJoCo 4). The two
    contacts then sit at the ends of the segments' overlap along axis 1: at each end, either
    an end of capsule 2 (projected onto segment 1) or an end of capsule 1 (projected onto
    segment 2). Disjoint segments give the nearest end pair twice, as MuJoCo does.
    """
    r1, r2 = g1.size[0], g2.size[0]
    z1, z2 = g1.mat[:, 2], g2.mat[:, 2]
    axis1 = z1 * g1.size[1]
    axis2 = z2 * g2.size[1]
    dif = g1.pos - g2.pos
    ma = jnp.dot(axis1, axis1)
    mb = -jnp.dot(axis1, axis2)
    mc = jnp.dot(axis2, axis2)
    u = -jnp.dot(axis1, dif)
    v = jnp.dot(axis2, dif)
    det = ma * mc - mb * mb
    general = det >= PARALLEL_SIN2 * ma * mc

    def ss(x1, x2):
        return _sphere_sphere(g1.pos + axis1 * x1, r1, z1, g2.pos + axis2 * x2, r2, z2, margin)

    # general configuration: one contact between the clipped nearest points
    x1, x2, _, _ = _clip_segments(ma, mb, mc, u, v, general, det)
    gen = ss(x1, x2)

    # parallel: capsule 2's ends projected on axis 1 (parameters t), sorted
    t_plus, t_minus = (u - mb) / ma, (u + mb) / ma
    plus_first = t_plus < t_minus
    t_lo = jnp.where(plus_first, t_plus, t_minus)
    t_hi = jnp.where(plus_first, t_minus, t_plus)
    end_lo = jnp.where(plus_first, 1.0, -1.0)
    one = jnp.ones_like(ma)
    lo = ss(
        jnp.where(t_lo > -1, jnp.clip(t_lo, -1, 1), -one),
        jnp.where(t_lo > -1, end_lo, jnp.clip((v + mb) / mc, -1, 1)),
    )
    hi = ss(
        jnp.where(t_hi < 1, jnp.clip(t_hi, -1, 1), one),
        jnp.where(t_hi < 1, -end_lo, jnp.clip((v - mb) / mc, -1, 1)),
    )

    first = [jnp.where(general, a, b) for a, b in zip(gen, lo)]
    second = list(hi[:3]) + [~general & hi[3]]
    return _collision(*[[a, b] for a, b in zip(first, second)])


def sphere_cylinder(g1: GeomFrame, g2: GeomFrame, margin, smoothing: float = 0.0) -> Collision:
    """mjc_SphereCylinder: side (sphere-sphere with the axis point), cap (plane), or rim corner.

    smoothing > 0 blends the side / top cap / bottom cap choice (centre inside), see `smoothing`.
    """
    r1, z1 = g1.size[0], g1.mat[:, 2]
    radius, height = g2.size[0], g2.size[1]
    axis = g2.mat[:, 2]

    vec = g1.pos - g2.pos
    x = jnp.dot(axis, vec)
    a_proj = axis * x
    p_proj = vec - a_proj
    p_sqr = jnp.dot(p_proj, p_proj)
    p_len = safe_norm(p_proj)

    side = jnp.abs(x) < height
    cap = p_sqr < radius * radius
    both = side & cap  # centre inside the cylinder: keep the shallower direction
    cap_wins = height - jnp.abs(x) < radius - p_len
    side = jnp.where(both, ~cap_wins, side)
    cap = jnp.where(both, cap_wins, cap)

    top = x > 0
    cap_offset = axis * jnp.where(top, height, -height)

    # side: sphere against the axis point with the cylinder radius
    ds, ps, ns, vs = _sphere_sphere(g1.pos, r1, z1, g2.pos + a_proj, radius, axis, margin)

    # cap: plane through the cap with outward normal, normal flipped to point into the cylinder
    cap_n = jnp.where(top, axis, -axis)
    dc, pc, vc = _plane_sphere(g2.pos + cap_offset, cap_n, g1.pos, r1, margin)

    # rim: sphere against the nearest rim point (p_len > 0 here since the cap test failed)
    rim = g2.pos + p_proj * safe_quotient(radius, p_len, p_len > 0) + cap_offset
    dr, pr, nr, vr = _sphere_sphere(g1.pos, r1, z1, rim, jnp.zeros_like(r1), axis, margin)

    dist = jnp.where(side, ds, jnp.where(cap, dc, dr))
    pos = jnp.where(side, ps, jnp.where(cap, pc, pr))
    normal = jnp.where(side, ns, jnp.where(cap, -cap_n, nr))
    valid = jnp.where(side, vs, jnp.where(cap, vc, vr))
    if smoothing > 0:
        d_top, p_top, _ = _plane_sphere(g2.pos + axis * height, axis, g1.pos, r1, margin)
        d_bot, p_bot, _ = _plane_sphere(g2.pos - axis * height, -axis, g1.pos, r1, margin)
        candidates = (jnp.stack([ds, d_top, d_bot]), jnp.stack([ps, p_top, p_bot]), jnp.stack([ns, -axis, axis]))
        soft_dist, soft_pos, soft_normal = blend(jnp.stack([radius - p_len, height - x, height + x]), candidates, smoothing)
        dist = jnp.where(both, soft_dist, dist)
        pos = jnp.where(both, soft_pos, pos)
        normal = jnp.where(both, normalize(soft_normal), normal)
    return _collision([dist], [pos], [normal], [valid])


def sphere_box(g1: GeomFrame, g2: GeomFrame, margin, smoothing: float = 0.0) -> Collision:
    """mjc_SphereBox: one contact."""
    dist, pos, normal, valid = _sphere_box(g1.pos, g1.size[0], g2, margin, smoothing)
    return _collision([dist], [pos], [normal], [valid])


# box edges in MuJoCo's order: axis j, then corner index i with bit j clear
_EDGES = tuple((j, i) for j in range(3) for i in range(8) if not i & (1 << j))


def _capsule_box_edges(pos, halfaxis, hl, size):
    """Capsule segment against the 12 box edges (box frame): squared distance, det ok, x1, x2, clamp code."""
    dtype = size.dtype
    j = jnp.array([e[0] for e in _EDGES])
    onehot = jax.nn.one_hot(j, 3, dtype=dtype)
    signs = jnp.array([[1.0 if e[1] & (1 << k) else -1.0 for k in range(3)] for e in _EDGES], dtype)
    mid = signs * size * (1 - onehot)  # edge midpoints
    dif = mid - pos
    sj = size[j]
    ma = sj * sj
    mb = -sj * halfaxis[j]
    mc = hl * hl
    u = -sj * jnp.sum(dif * onehot, axis=1)
    v = dif @ halfaxis
    det = ma * mc - mb * mb
    ok = jnp.abs(det) >= MINVAL
    x1, x2, s1, s2 = _clip_segments(ma, mb, mc, u, v, ok, det)
    d2 = jnp.sum((dif - halfaxis * x2[:, None] + onehot * (sj * x1)[:, None]) ** 2, axis=1)
    return d2, ok, x1, x2, s1 * 3 + s2


def capsule_box(g1: GeomFrame, g2: GeomFrame, margin, smoothing: float = 0.0) -> Collision:
    """mjc_CapsuleBox: sphere-box at the segment point nearest the box, plus a second point.

    The nearest point is searched over the two capsule ends against the box faces and the
    capsule segment against the 12 box edges (in MuJoCo's order, first minimum wins). When the
    capsule lies along a face or edge, a second sphere-box test is placed further along the
    segment, as far as the capsule stays over the box.
    """
    radius, hl = g1.size[0], g1.size[1]
    size, mat = g2.size, g2.mat
    dtype = size.dtype
    pos = mat.T @ (g1.pos - g2.pos)  # capsule centre in the box frame
    axis = mat.T @ g1.mat[:, 2]
    halfaxis = axis * hl
    axisdir = (halfaxis[0] > 0).astype(int) + 2 * (halfaxis[1] > 0) + 4 * (halfaxis[2] > 0)
    abs_half = jnp.abs(halfaxis)
    nonzero = abs_half > 0

    def ratio(num, k):  # num / |halfaxis[k]|, +inf where that component is 0 (as in C)
        ok = nonzero[k]  # a component of 1e-25 (float32 round-off of an axis-aligned capsule): see `quotient`
        return jnp.where(ok, quotient(num, jnp.where(ok, abs_half[k], 1.0)), jnp.inf)

    # nearest point: capsule ends against the faces (an end clamped along at most one axis),
    # then the segment against the 12 edges; sequential "first strict minimum" as in C (edges
    # must improve by mjMINVAL). Only the winner's index goes through the chain.
    ends = pos + halfaxis * jnp.array([[-1.0], [1.0]], dtype)
    over = (ends < -size) | (ends > size)
    face_d2 = jnp.sum((jnp.clip(ends, -size, size) - ends) ** 2, axis=1)
    face_ok = jnp.sum(over, axis=1) <= 1
    face_axis = jnp.max(jnp.where(over, jnp.arange(3), -1), axis=1)
    edge_d2, edge_ok, edge_x1, edge_x2, edge_code = _capsule_box_edges(pos, halfaxis, hl, size)

    cand_d2 = jax.lax.stop_gradient(jnp.concatenate([face_d2, edge_d2]))
    cand_ok = jnp.concatenate([face_ok, edge_ok])
    best = jax.lax.stop_gradient(margin + 2 * (radius + hl + jnp.sum(size)))
    win = jnp.array(-1)
    for k in range(14):
        update = cand_ok[k] & (cand_d2[k] < best - (MINVAL if k >= 2 else 0.0))
        best = jnp.where(update, cand_d2[k], best)
        win = jnp.where(update, k, win)
    found = win >= 0
    win = jnp.maximum(win, 0)

    edge_j = jnp.array([e[0] for e in _EDGES])
    edge_i = jnp.array([e[1] for e in _EDGES])
    zeros2 = jnp.zeros(2, int)
    bestpos = jnp.concatenate([jnp.array([-1.0, 1.0], dtype), edge_x2])[win]  # segment parameter
    boxpos = jnp.concatenate([jnp.zeros(2, dtype), edge_x1])[win]  # edge parameter
    cltype = jnp.concatenate([jnp.array([-3, -1]), edge_code])[win]
    clface = jnp.concatenate([face_axis, -jnp.ones(12, int)])[win]
    clcorner = jnp.concatenate([zeros2, edge_i + (1 << edge_j) * (edge_code // 6)])[win]
    cledge = jnp.concatenate([zeros2, edge_j])[win]

    # --- second point: nearest point at a box corner
    ca = axisdir ^ clcorner
    a_plus = (ca == 1) | (ca == 2) | (ca == 4)
    mul_a = jnp.where(a_plus, 1.0, -1.0)
    ca = jnp.where(a_plus, ca, 7 - ca)
    ax = jnp.where(ca == 1, 0, jnp.where(ca == 2, 1, 2))
    ax1, ax2 = (ax + 1) % 3, (ax + 2) % 3
    de = 1 - mul_a * bestpos
    dp = 1 + mul_a * bestpos
    along_edge = axis[ax] * axis[ax] > 0.5
    second_a = jnp.where(
        along_edge,
        jnp.minimum(de, ratio(2 * size[ax], ax)) * mul_a,
        jnp.minimum(dp, jnp.minimum(ratio(2 * size[ax1], ax1), ratio(2 * size[ax2], ax2))) * -mul_a,
    )
    has_a = (axisdir ^ clcorner != 0) & (axisdir ^ clcorner != 7)

    # --- second point: nearest point inside a box edge
    cb = (axisdir ^ clcorner) & (7 - (1 << cledge))
    has_b = (cb == 1) | (cb == 2) | (cb == 4)
    ax = cledge
    ax1, ax2 = (ax + 1) % 3, (ax + 2) % 3
    ax1 = jnp.where(jnp.abs(axis[ax1]) > jnp.abs(axis[ax2]), ax2, ax1)
    ax2 = 3 - ax - ax1
    bit = ((cb >> ax2) & 1) == 1
    mul_b = jnp.where(bit, 1.0, -1.0)
    second_b = jnp.minimum(1 - mul_b * bestpos, ratio(2 * size[ax2], ax2))
    e2 = jnp.where(((axisdir >> ax) & 1 == 1) == bit, 1 - boxpos, 1 + boxpos)
    second_b = jnp.minimum(second_b, ratio(size[ax] * e2, ax)) * mul_b

    # --- second point: nearest point is a capsule end over a face
    mul_c = jnp.where(cltype == -3, 1.0, -1.0)
    start = pos - halfaxis * mul_c
    second_c = jnp.asarray(2.0, dtype)
    for i in range(3):
        for bound in (size[i], -size[i]):
            ok = (clface != i) & nonzero[i]
            e1 = quotient(bound - start[i], jnp.where(nonzero[i], halfaxis[i], 1.0)) * mul_c
            update = ok & (e1 > 0) & (e1 < second_c)
            second_c = jnp.where(update, e1, second_c)
    second_c = second_c * mul_c
    has_c = clface != -1

    corner = (cltype >= 0) & (cltype // 3 != 1)
    edge = (cltype >= 0) & (cltype // 3 == 1)
    secondpos = jnp.where(corner, second_a, jnp.where(edge, second_b, second_c))
    has_second = jnp.where(corner, has_a, jnp.where(edge, has_b, has_c))

    t = jnp.stack([bestpos, jnp.where(has_second, secondpos, 0.0) + bestpos])
    centers = (pos + halfaxis * t[:, None]) @ mat.T + g2.pos
    dist, cpos, normal, valid = jax.vmap(lambda c: _sphere_box(c, radius, g2, margin, smoothing))(centers)
    valid = valid & found & jnp.stack([True, has_second])
    return _collision(list(dist), list(cpos), list(normal), list(valid))


# pairs whose function takes `smoothing` (see collision.smoothing)
SMOOTHED = {(SPHERE, CYLINDER), (SPHERE, BOX), (CAPSULE, BOX)}

FUNCTIONS: dict[tuple[int, int], tuple[Callable, int]] = {
    (PLANE, SPHERE): (plane_sphere, 1),
    (PLANE, CAPSULE): (plane_capsule, 2),
    (PLANE, ELLIPSOID): (plane_ellipsoid, 1),
    (PLANE, CYLINDER): (plane_cylinder, 4),
    (PLANE, BOX): (plane_box, 4),
    (SPHERE, SPHERE): (sphere_sphere, 1),
    (SPHERE, CAPSULE): (sphere_capsule, 1),
    (SPHERE, CYLINDER): (sphere_cylinder, 1),
    (SPHERE, BOX): (sphere_box, 1),
    (CAPSULE, CAPSULE): (capsule_capsule, 2),
    (CAPSULE, BOX): (capsule_box, 2),
}
