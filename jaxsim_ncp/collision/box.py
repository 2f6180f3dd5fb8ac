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
buffer of 8 vertices. Gradients are finite everywhere (guarded divisions and norms); they
are exact derivatives of the active branch, so they jump where the case switches (ties
between reference faces, vertices crossing a clip plane, face/edge changes).

Known deviations from MuJoCo (float64, verified against mujoco 4.0 on ~30k poses):
- decisions on quantities that are zero up to rounding (e.g. the incident box centre
  exactly on the reference face's mid-plane, which fixes the normal's sign) follow our
  rounding, not MuJoCo's, so such exactly symmetric poses may get the flipped normal;
- near-duplicate clip vertices are tested against earlier candidates rather than earlier
  accepted ones (differs only for chains of vertices each within 1e-7 of the next);
- the clip buffer holds 8 vertices (MuJoCo's holds 12, only reachable through rounding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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
_EI = np.repeat(np.arange(3), 3)
_EJ = np.tile(np.arange(3), 3)
# cyclic permutations (k, k+1, k+2) as row-selection matrices: _PERM[k] @ v = v[[k, k+1, k+2]]
_PERM = np.stack([np.eye(3)[[k, (k + 1) % 3, (k + 2) % 3]] for k in range(3)])

# incident-face corner signs (su, sv), cyclic winding
_CORNERS = np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])


def _clip(poly: Float[Array, "8 3"], n, coord: int, sign: float, limit) -> tuple[Float[Array, "8 3"], Array]:
    """One Sutherland-Hodgman pass against sign * v[coord] <= limit (MuJoCo's clipHalfPlane).

    Vertex k emits itself if inside, then the crossing point of edge (k, k+1) if that edge
    strictly crosses the plane; emitted vertices are compacted in order into the buffer.
    """
    k = np.arange(_NMAX)
    live = k < n
    d = sign * poly[:, coord] - limit
    nxt = jnp.where(k + 1 >= n, 0, k + 1)[:, None] == k[None, :]  # (8, 8) one-hot of k+1 mod n
    nxt = nxt.astype(poly.dtype)
    dq = nxt @ d
    emit_p = live & (d <= 0)
    cross = live & (((d < 0) & (dq > 0)) | ((d > 0) & (dq < 0)))
    t = math.safe_quotient(d, d - dq, cross)
    x = poly + t[:, None] * (nxt @ poly - poly)
    cand = jnp.stack([poly, x], axis=1).reshape(2 * _NMAX, 3)  # p0, x0, p1, x1, ...
    emit = jnp.stack([emit_p, cross], axis=1).reshape(2 * _NMAX)
    slot = jnp.cumsum(emit) - 1
    onehot = (emit[:, None] & (slot[:, None] == k[None, :])).astype(poly.dtype)
    return onehot.T @ cand, jnp.minimum(jnp.sum(emit), _NMAX)


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
    """Single contact of edge pair k: midpoint of the closest points of the supporting edges.

    Works in cyclically permuted frames (i, i+1, i+2) of box1 and (j, j+1, j+2) of box2, so
    the edges run along the first coordinate of each.
    """
    p1m = jnp.asarray(_PERM, rot.dtype)[k // 3]  # box1 coordinates -> (i, i1, i2)
    p2m = jnp.asarray(_PERM, rot.dtype)[k % 3]  # box2 coordinates -> (j, j1, j2)
    r = p1m @ rot @ p2m.T  # box2 edge axes in the permuted box1 frame
    c = p1m @ pos21
    s1, s2 = p1m @ g1.size, p2m @ g2.size

    # unit axis e_i x d2 (component 0 exactly zero), oriented from box1 toward box2
    axis = math.normalize(jnp.stack([jnp.zeros_like(r[0, 0]), -r[2, 0], r[1, 0]]))
    axis = jnp.where(jnp.dot(axis, c) < 0, -axis, axis)
    a2 = r.T @ axis  # in the permuted box2 frame, component 0 ~ 0

    # supporting corners; an ambiguous sign (|component| < 1e-9, at most one per box) is tried both ways
    amb1 = jnp.where(jnp.abs(axis[1]) < _SGNEPS, 1, jnp.where(jnp.abs(axis[2]) < _SGNEPS, 2, -1))
    amb2 = jnp.where(jnp.abs(a2[1]) < _SGNEPS, 1, jnp.where(jnp.abs(a2[2]) < _SGNEPS, 2, -1))
    v1, v2 = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])  # MuJoCo's enumeration order
    comp = np.arange(3)
    flip1 = jnp.where((v1[:, None] == 1) & (comp[None, :] == amb1), -1.0, 1.0)
    flip2 = jnp.where((v2[:, None] == 1) & (comp[None, :] == amb2), -1.0, 1.0)
    mask0 = jnp.array([0.0, 1.0, 1.0], rot.dtype)
    c1 = (jnp.where(axis >= 0, s1, -s1) * mask0)[None, :] * flip1  # (4, 3)
    c2 = (jnp.where(a2 >= 0, -s2, s2) * mask0)[None, :] * flip2 @ r.T + c[None, :]

    # closest points of the segments c1 + s e_0 and c2 + t d2, each clamp re-solving the other
    d2 = r[:, 0]
    b = d2[0]
    denom = 1.0 - b * b
    e = c2 - c1
    d1e, d2e = e[:, 0], e @ d2
    s = math.safe_quotient(d1e - b * d2e, denom, denom >= _MINVAL)
    s = jnp.clip(s, -s1[0], s1[0])
    t = jnp.clip(b * s - d2e, -s2[0], s2[0])
    s = jnp.clip(d1e + b * t, -s1[0], s1[0])
    w1 = c1 * mask0 + s[:, None] * (1.0 - mask0)
    w2 = c2 + t[:, None] * d2
    gap2 = jnp.sum((w2 - w1) ** 2, axis=-1)
    usable = ((v1 == 0) | (amb1 >= 0)) & ((v2 == 0) | (amb2 >= 0))
    pick = jax.nn.one_hot(jnp.argmin(jnp.where(usable, gap2, jnp.inf)), 4, dtype=r.dtype)
    w1, w2 = pick @ w1, pick @ w2

    dist = jnp.dot(w2 - w1, axis)
    to_box1 = g1.mat @ p1m.T
    pos = to_box1 @ (0.5 * (w1 + w2)) + g1.pos
    return dist, pos, to_box1 @ axis, dist <= septol


def _face_contacts(g1: GeomFrame, g2: GeomFrame, rot, pos21, pos12, code, margin):
    """Clipped incident face against the reference face `code` (0..2 box1, 3..5 box2).

    Works in the reference frame permuted to (a+1, a+2, a), a the face axis, and the incident
    frame permuted to (b+1, b+2, b), b its face axis.
    """
    ref1 = code < 3
    perm = jnp.asarray(_PERM, rot.dtype)
    pref = perm[(jnp.where(ref1, code, code - 3) + 1) % 3]  # reference coordinates -> (ax, ay, a)
    sizeref = pref @ jnp.where(ref1, g1.size, g2.size)
    posoi = pref @ jnp.where(ref1, pos21, pos12)  # incident center
    rinc = pref @ jnp.where(ref1, rot, rot.T)  # column c: incident axis c
    sgn = jnp.where(posoi[2] >= 0, 1.0, -1.0)

    binc = jnp.argmax(jnp.abs(rinc[2]))  # incident face most (anti)parallel to the normal
    pinc = perm[(binc + 1) % 3]  # incident coordinates -> (bu, bv, binc)
    sizeinc = pinc @ jnp.where(ref1, g2.size, g1.size)
    rinc = rinc @ pinc.T
    tinc = jnp.where(sgn * rinc[2, 2] > 0, -1.0, 1.0)

    # incident face corners: (x, y) in the reference face plane, z signed height above it
    zflip = jnp.stack([1.0, 1.0, sgn])
    cx = (posoi + tinc * sizeinc[2] * rinc[:, 2]) * zflip - jnp.array([0.0, 0.0, 1.0], rot.dtype) * sizeref[2]
    du = sizeinc[0] * rinc[:, 0] * zflip
    dv = sizeinc[1] * rinc[:, 1] * zflip
    corners = jnp.asarray(_CORNERS, rot.dtype)
    quad = cx + corners[:, :1] * du + corners[:, 1:] * dv
    poly = jnp.concatenate([quad, jnp.zeros((_NMAX - 4, 3), quad.dtype)])

    n = jnp.asarray(4)
    poly, n = _clip(poly, n, 0, 1.0, sizeref[0])
    poly, n = _clip(poly, n, 0, -1.0, sizeref[0])
    poly, n = _clip(poly, n, 1, 1.0, sizeref[1])
    poly, n = _clip(poly, n, 1, -1.0, sizeref[1])

    # vertices within the margin band, minus near-duplicates of earlier ones (MuJoCo compares
    # against earlier *accepted* vertices; the two differ only for chains of vertices each
    # within 1e-7 of the face size of the next)
    cand = (np.arange(_NMAX) < n) & (poly[:, 2] <= margin)
    dupe2 = _DUPEPS * (sizeref[0] ** 2 + sizeref[1] ** 2)
    dxy = poly[:, None, :2] - poly[None, :, :2]
    close = (jnp.sum(dxy * dxy, axis=-1) < dupe2) & np.tri(_NMAX, k=-1, dtype=bool)
    accepted = cand & ~jnp.any(close & cand[None, :], axis=1)

    to_world = jnp.where(ref1, g1.mat, g2.mat) @ pref.T
    normal = jnp.where(ref1, sgn, -sgn) * to_world[:, 2]
    posc = jnp.concatenate([poly[:, :2], (sgn * (sizeref[2] + 0.5 * poly[:, 2]))[:, None]], axis=1)
    pos = posc @ to_world.T + jnp.where(ref1, g1.pos, g2.pos)
    return poly[:, 2], pos, normal, accepted


def box_box(g1: GeomFrame, g2: GeomFrame, margin: Float[Array, ""]) -> Collision:
    """Box-box contacts as MuJoCo's mjc_BoxBox: up to 8 (face clipping) or 1 (edge-edge).

    `margin` is the pair margin MuJoCo hands the collider (in MuJoCo 4.0 the *sum* of the
    two geoms' margins). Normals point from g1 to g2; every contact of a pair shares one
    normal, and frames are completed with mju_makeFrame. Invalid slots hold finite values.
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
    face_normals = jnp.concatenate([jnp.eye(3, dtype=rot.dtype), rot.T])  # in box1's frame
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
