"""Box-box narrow phase: MuJoCo's mjc_BoxBox (engine_collision_box.c, MuJoCo >= 3.12 rewrite).

MuJoCo 4.0 computes a box-box manifold in two stages:

1. Separating-axis test over the 15 candidate axes (3 face normals per box, 9 edge
   cross products, the latter skipped when sin^2(angle) < 1e-16). Any separation above
   ``septol = margin + 1e-13 * sum(sizes)`` means no contact. The face axis with the
   largest separation wins (first on ties, box1 before box2); an edge axis replaces it
   only if ``sep - 1e-6 |sep|`` beats the best so far, and a winning edge axis within
   ~8 degrees of the best face axis (|cos| > 0.99) that is not 5% deeper falls back to
   the face.
2. Face axis: the owner of the face is the reference box; the incident box's face most
   anti-parallel to the reference normal is clipped against the reference face's four
   side planes (Sutherland-Hodgman). Each clipped vertex with depth <= margin becomes a
   contact (near-duplicates within 1e-7 of the face scale are dropped): dist is the
   vertex's signed height over the reference face, pos is the vertex projected halfway
   to the reference face plane, and the normal is the reference face normal oriented
   box1 -> box2. A 4-gon clipped by 4 half-planes has at most 8 vertices, so at most 8
   contacts (mj_maxContact for box-box is also 8).
   Edge axis: one contact at the midpoint of the closest points of the two supporting
   edges (both supports enumerated when an axis component is below 1e-9), dist measured
   along the axis, normal the axis oriented box1 -> box2.

All branches are evaluated and selected with ``jnp.where``; the clipper works on a fixed
buffer of 8 vertices. Gradients are finite everywhere (guarded divisions and norms).

With ``smooth=True`` the backward pass is unchanged in structure but the forward output
is identical (the discrete case selection is not softened): see ``box_box``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxsim_ncp import math
from jaxsim_ncp.collision.base import Collision, GeomFrame

_SEPEPS = 1e-13  # separation slack, times the summed half-sizes
_PAREPS = 1e-16  # sin^2 below which an edge-cross axis is skipped
_SGNEPS = 1e-9  # axis component below which a supporting edge is ambiguous
_DUPEPS = 1e-14  # squared relative radius for clip-vertex deduplication
_EDGEBIAS = 1e-6  # relative penalty on edge axes in near-ties
_MINVAL = 1e-15  # mjMINVAL
_NMAX = 8  # clip buffer size and contact slots

# edge pairs (i, j): axis i of box1 crossed with axis j of box2, in MuJoCo's loop order
_EI = jnp.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
_EJ = jnp.array([0, 1, 2, 0, 1, 2, 0, 1, 2])

# incident-face corner signs (su, sv), cyclic winding
_CORNERS = jnp.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])


def _safe_div(num, den, ok):
    """num / den where ok, 0 elsewhere, with finite gradients on both sides."""
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _clip(poly: Float[Array, "8 3"], n, coord: int, sign: float, limit) -> tuple[Float[Array, "8 3"], Array]:
    """One Sutherland-Hodgman pass against sign * v[coord] <= limit (MuJoCo's clipHalfPlane).

    Vertex k emits itself if inside, then the crossing point of edge (k, k+1) if that edge
    strictly crosses the plane; emitted vertices are compacted in order into the buffer.
    """
    k = jnp.arange(_NMAX)
    live = k < n
    d = sign * poly[:, coord] - limit
    k1 = jnp.where(k + 1 >= n, 0, k + 1)
    dq = d[k1]
    emit_p = live & (d <= 0)
    cross = live & (((d < 0) & (dq > 0)) | ((d > 0) & (dq < 0)))
    t = _safe_div(d, d - dq, cross)
    x = poly + t[:, None] * (poly[k1] - poly)
    cand = jnp.stack([poly, x], axis=1).reshape(2 * _NMAX, 3)  # p0, x0, p1, x1, ...
    emit = jnp.stack([emit_p, cross], axis=1).reshape(2 * _NMAX)
    slot = jnp.cumsum(emit) - 1
    onehot = emit[:, None] & (slot[:, None] == k[None, :])
    out = jnp.einsum("cs,cd->sd", onehot.astype(poly.dtype), cand)
    return out, jnp.minimum(jnp.sum(emit), _NMAX)


def _face_axes(g1: GeomFrame, g2: GeomFrame, rot, pos21, pos12):
    """Separations along the 6 face normals (box1 axes, then box2 axes)."""
    rotabs = jnp.abs(rot)
    sep1 = jnp.abs(pos21) - g1.size - rotabs @ g2.size
    sep2 = jnp.abs(pos12) - g2.size - rotabs.T @ g1.size
    return jnp.concatenate([sep1, sep2])


def _edge_axes(g1: GeomFrame, g2: GeomFrame, rot, pos21):
    """Unit edge-cross axes e_i x rot[:, j] in box1's frame, their separations and usability."""
    i1, i2 = (_EI + 1) % 3, (_EI + 2) % 3
    j1, j2 = (_EJ + 1) % 3, (_EJ + 2) % 3
    ax1 = -rot[i2, _EJ]
    ax2 = rot[i1, _EJ]
    norm2 = ax1 * ax1 + ax2 * ax2
    ok = norm2 >= _PAREPS
    inv = 1.0 / jnp.sqrt(jnp.where(ok, norm2, 1.0))
    ax1, ax2 = ax1 * inv, ax2 * inv
    radius1 = g1.size[i1] * jnp.abs(ax1) + g1.size[i2] * jnp.abs(ax2)
    a2_1 = ax1 * rot[i1, j1] + ax2 * rot[i2, j1]
    a2_2 = ax1 * rot[i1, j2] + ax2 * rot[i2, j2]
    radius2 = g2.size[j1] * jnp.abs(a2_1) + g2.size[j2] * jnp.abs(a2_2)
    sep = jnp.abs(ax1 * pos21[i1] + ax2 * pos21[i2]) - radius1 - radius2
    eye = jnp.eye(3, dtype=rot.dtype)
    axes = ax1[:, None] * eye[i1] + ax2[:, None] * eye[i2]  # (9, 3), component i exactly 0
    return axes, sep, ok


def _edge_contact(g1: GeomFrame, g2: GeomFrame, rot, pos21, k, septol):
    """Single contact of edge pair k: midpoint of the closest points of the supporting edges."""
    eye = jnp.eye(3, dtype=rot.dtype)
    i, j = _EI[k], _EJ[k]
    i1, i2 = (i + 1) % 3, (i + 2) % 3
    j1, j2 = (j + 1) % 3, (j + 2) % 3
    e_i, e_j = eye[i], eye[j]

    # unit axis, recomputed from rot with a guarded norm, oriented from box1 toward box2
    axis = -rot[i2, j] * eye[i1] + rot[i1, j] * eye[i2]
    axis = math.normalize(axis)
    axis = jnp.where(jnp.dot(axis, pos21) < 0, -axis, axis)
    a2 = rot.T @ axis  # axis in box2's frame

    amb1 = jnp.where(jnp.abs(axis[i1]) < _SGNEPS, i1, jnp.where(jnp.abs(axis[i2]) < _SGNEPS, i2, -1))
    amb2 = jnp.where(jnp.abs(a2[j1]) < _SGNEPS, j1, jnp.where(jnp.abs(a2[j2]) < _SGNEPS, j2, -1))

    d2 = rot[:, j]
    b = d2[i]
    denom = 1.0 - b * b
    c1_base = jnp.where(axis >= 0, g1.size, -g1.size) * (1.0 - e_i)
    cc_base = jnp.where(a2 >= 0, -g2.size, g2.size) * (1.0 - e_j)

    # the up-to-4 sign variants (v1, v2) in MuJoCo's enumeration order
    v1 = jnp.array([0, 0, 1, 1])
    v2 = jnp.array([0, 1, 0, 1])
    flip1 = jnp.where((v1[:, None] == 1) & (jnp.arange(3)[None, :] == amb1), -1.0, 1.0)
    flip2 = jnp.where((v2[:, None] == 1) & (jnp.arange(3)[None, :] == amb2), -1.0, 1.0)
    c1 = c1_base[None, :] * flip1  # (4, 3)
    cc = cc_base[None, :] * flip2
    c2 = cc @ rot.T + pos21[None, :]
    e = c2 - c1
    d1e = e[:, i]
    d2e = e @ d2
    s = _safe_div(d1e - b * d2e, denom, denom >= _MINVAL)
    s = jnp.clip(s, -g1.size[i], g1.size[i])
    t = jnp.clip(b * s - d2e, -g2.size[j], g2.size[j])
    s = jnp.clip(d1e + b * t, -g1.size[i], g1.size[i])
    p1 = c1 * (1.0 - e_i) + s[:, None] * e_i
    p2 = c2 + t[:, None] * d2
    gap2 = jnp.sum((p2 - p1) ** 2, axis=-1)
    usable = ((v1 == 0) | (amb1 >= 0)) & ((v2 == 0) | (amb2 >= 0))
    best = jnp.argmin(jnp.where(usable, gap2, jnp.inf))
    w1, w2 = p1[best], p2[best]

    dist = jnp.dot(w2 - w1, axis)
    pos = g1.mat @ (0.5 * (w1 + w2)) + g1.pos
    normal = g1.mat @ axis
    return dist, pos, normal, dist <= septol


def _face_contacts(g1: GeomFrame, g2: GeomFrame, rot, pos21, pos12, code, margin):
    """Clipped incident face against the reference face `code` (0..2 box1, 3..5 box2)."""
    eye = jnp.eye(3, dtype=rot.dtype)
    ref1 = code < 3
    a = jnp.where(ref1, code, code - 3)
    sizeref = jnp.where(ref1, g1.size, g2.size)
    sizeinc = jnp.where(ref1, g2.size, g1.size)
    posref = jnp.where(ref1, g1.pos, g2.pos)
    matref = jnp.where(ref1, g1.mat, g2.mat)
    posoi = jnp.where(ref1, pos21, pos12)  # incident center in the reference frame
    rinc = jnp.where(ref1, rot, rot.T)  # column c: incident axis c in the reference frame

    sgn = jnp.where(posoi[a] >= 0, 1.0, -1.0)
    binc = jnp.argmax(jnp.abs(rinc[a]))  # incident face most (anti)parallel to the normal
    tinc = jnp.where(sgn * rinc[a, binc] > 0, -1.0, 1.0)

    ax, ay = (a + 1) % 3, (a + 2) % 3
    bu, bv = (binc + 1) % 3, (binc + 2) % 3
    coords = jnp.stack([ax, ay, a])
    zsign = jnp.array([1.0, 1.0, 0.0]) + jnp.array([0.0, 0.0, 1.0]) * sgn
    cx = posoi[coords] + tinc * sizeinc[binc] * rinc[coords, binc]
    cx = cx * zsign - jnp.array([0.0, 0.0, 1.0]) * sizeref[a]
    du = sizeinc[bu] * rinc[coords, bu] * zsign
    dv = sizeinc[bv] * rinc[coords, bv] * zsign
    quad = cx + _CORNERS[:, :1] * du + _CORNERS[:, 1:] * dv  # (4, 3)
    poly = jnp.zeros((_NMAX, 3), rot.dtype).at[:4].set(quad)

    n = jnp.asarray(4)
    poly, n = _clip(poly, n, 0, 1.0, sizeref[ax])
    poly, n = _clip(poly, n, 0, -1.0, sizeref[ax])
    poly, n = _clip(poly, n, 1, 1.0, sizeref[ay])
    poly, n = _clip(poly, n, 1, -1.0, sizeref[ay])

    # accept vertices within the margin band, dropping near-duplicates of earlier accepted ones
    cand = (jnp.arange(_NMAX) < n) & (poly[:, 2] <= margin)
    dupe2 = _DUPEPS * (sizeref[ax] ** 2 + sizeref[ay] ** 2)
    dxy = poly[:, None, :2] - poly[None, :, :2]
    close = jnp.sum(dxy * dxy, axis=-1) < dupe2
    accepted = jnp.zeros(_NMAX, bool)
    for k in range(_NMAX):
        dup = jnp.any(accepted & close[k])
        accepted = accepted.at[k].set(cand[k] & ~dup)

    normal = jnp.where(ref1, sgn, -sgn) * matref[:, a]
    posc = poly[:, :1] * eye[ax] + poly[:, 1:2] * eye[ay] + (sgn * (sizeref[a] + 0.5 * poly[:, 2]))[:, None] * eye[a]
    pos = posc @ matref.T + posref
    return poly[:, 2], pos, normal, accepted


def box_box(g1: GeomFrame, g2: GeomFrame, margin: Float[Array, ""]) -> Collision:
    """Box-box contacts as MuJoCo's mjc_BoxBox: up to 8 (face clipping) or 1 (edge-edge).

    Normals point from g1 to g2; every contact of a pair shares one normal, and frames are
    completed with mju_makeFrame. Invalid slots hold finite values.
    """
    rot = g1.mat.T @ g2.mat  # box2 axes (columns) in box1's frame
    pos21 = g1.mat.T @ (g2.pos - g1.pos)
    pos12 = g2.mat.T @ (g1.pos - g2.pos)
    septol = margin + _SEPEPS * (jnp.sum(g1.size) + jnp.sum(g2.size))

    # stage 1: separating axes
    sep_faces = _face_axes(g1, g2, rot, pos21, pos12)
    code_face = jnp.argmax(sep_faces)  # first maximum, as MuJoCo's strict '>' scan
    sep_face = sep_faces[code_face]
    axes, sep_edges, edge_ok = _edge_axes(g1, g2, rot, pos21)
    separated = jnp.any(sep_faces > septol) | jnp.any(edge_ok & (sep_edges > septol))

    code, best = code_face, sep_face
    for k in range(9):  # sequential: the acceptance threshold moves with each accepted edge
        s = sep_edges[k]
        take = edge_ok[k] & (s - _EDGEBIAS * jnp.abs(s) > best) & (s > sep_face)
        code = jnp.where(take, 6 + k, code)
        best = jnp.where(take, s, best)

    # an edge axis nearly parallel to the best face normal falls back to the face
    kedge = jnp.clip(code - 6, 0, 8)
    face_normals = jnp.concatenate([jnp.eye(3, dtype=rot.dtype), rot.T])  # box1 frame
    edge_axis = math.normalize(axes[kedge])
    face_dot = jnp.abs(jnp.dot(edge_axis, face_normals[code_face]))
    to_face = (code >= 6) & (face_dot > 0.99) & (best < sep_face + 0.05 * jnp.abs(sep_face) + _MINVAL)
    code = jnp.where(to_face, code_face, code)
    is_edge = code >= 6

    # stage 2: both manifolds, then select
    e_dist, e_pos, e_normal, e_valid = _edge_contact(g1, g2, rot, pos21, kedge, septol)
    f_dist, f_pos, f_normal, f_valid = _face_contacts(g1, g2, rot, pos21, pos12, jnp.where(is_edge, 0, code), margin)

    first = jnp.arange(_NMAX) == 0
    dist = jnp.where(is_edge, jnp.where(first, e_dist, 0.0), f_dist)
    pos = jnp.where(is_edge, jnp.where(first[:, None], e_pos[None, :], 0.0), f_pos)
    valid = ~separated & jnp.where(is_edge, first & e_valid, f_valid)
    normal = jnp.where(is_edge, e_normal, f_normal)
    frame = jnp.broadcast_to(math.make_frame(normal), (_NMAX, 3, 3))
    return Collision(dist=dist, pos=pos, frame=frame, valid=valid)


FUNCTIONS = {(6, 6): (box_box, 8)}
