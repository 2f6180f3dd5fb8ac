"""Multi-point manifolds for the convex pairs with flat features (MuJoCo 4 multiccd).

MuJoCo 4 sends capsule-cylinder, cylinder-cylinder and cylinder-box to its general
convex collider and, with the `multiccd` flag on (the default; it is a *disable* flag in
MuJoCo 4), turns the single EPA contact into up to 2 (capsule) or 4 (cylinder, box)
points when the touching features are flat:

1. Features. A box face or a cylinder cap is a polygon (a cap is a 16-gon, vertices at
   multiples of 22.5 deg). A capsule, or a cylinder touching with its side, is an edge:
   the surface line through the contact (capsule), or the side line through the
   cylinder's support point towards the other shape's face (along that face's inward
   normal, MuJoCo 4.0.1; 4.0.0 took the contact normal), cap to cap. Geom 2's side on
   geom 1's cap is no edge where geom 2 touches with a rim point (contact normal off its
   side's normal, witness on an end circle): MuJoCo 4.0.1 keeps its single contact there.
2. Face-face: the most anti-parallel pair of face normals, within cos = 0.996 (5.1 deg),
   each facing the other shape (cone 0.0888 of the contact direction). The incident
   polygon (geom 2) is clipped against the side planes of the reference polygon (geom 1)
   (Sutherland-Hodgman), and points above the reference plane are dropped.
   Edge-face: an edge within 0.0888 of parallel to a face of the other shape is clipped
   against that face the same way.
3. Reduction: more than 4 points -> MuJoCo's greedy largest-area quadrilateral; an edge
   clipped to more than 2 points -> its farthest pair.
4. Each point v gives witnesses w1 = v projected on the reference plane, w2 = w1 - d dir
   with d = (w1 - v).dir (dir: the other face's normal, or -n for an edge), contact
   dist = d, pos = (w1 + w2) / 2, normal along w1 - w2 (geom 1 -> geom 2).

With a margin m (MuJoCo 4.0.1, probed): the tests above use the margin-inflated shapes
(direction (dist - m) n), clipped points up to m above the reference plane are kept, and the
manifold replaces the single contact when one of its points is within m. Polygons are the real
faces; a capsule's line runs through its witness on the inflated capsule (r + m/2 along n) and
is then moved back by m/2 along the face normal (a tilted capsule's line shifts by
m/2 (1 - cos t) and along its axis); normals follow the inflated witnesses, so that points
within the band keep the penetrating direction.

No aligned features, or nothing left after clipping: MuJoCo's single contact, which is
`convex.convex_contact` (exact minimum translation). Which features MuJoCo considers is
read off its EPA simplex; here they are chosen geometrically from the contact normal,
which agrees in the resting and sliding configurations that matter (tested against
MuJoCo). All vertex arithmetic follows MuJoCo's operation order, so that the discrete
choices (clipping, the quadrilateral among a regular 16-gon's near-ties) come out the same.
Positions are differentiable; the discrete choices are not (they are piecewise constant).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..math import make_frame, tree_where
from .base import Collision, GeomFrame
from .convex import CAPSULE, CYLINDER, BOX, convex_contact
from .primitives import _compact

MINVAL = 1e-15
FACE_TOLERANCE = 0.996  # cos of the largest angle between "parallel" faces
EDGE_TOLERANCE = 0.0888  # sin of the largest angle between an edge and a "parallel" face
MAXV = 36  # clipped-polygon buffer: 16-gon clipped by 16 planes, with duplicates

# MuJoCo's 15-decimal tables for the cap 16-gon
_COS16 = np.array([float(f"{np.cos(k * np.pi / 8):.15f}") for k in range(16)])
_SIN16 = np.array([float(f"{np.sin(k * np.pi / 8):.15f}") for k in range(16)])
# box faces: local corner signs, MuJoCo's vertex order (clockwise seen from outside)
_BOX_FACES = np.array(
    [
        [(1, 1, 1), (1, 1, -1), (1, -1, -1), (1, -1, 1)],
        [(-1, 1, -1), (-1, 1, 1), (-1, -1, 1), (-1, -1, -1)],
        [(-1, 1, -1), (1, 1, -1), (1, 1, 1), (-1, 1, 1)],
        [(-1, -1, 1), (1, -1, 1), (1, -1, -1), (-1, -1, -1)],
        [(-1, 1, 1), (1, 1, 1), (1, -1, 1), (-1, -1, 1)],
        [(1, 1, -1), (-1, 1, -1), (-1, -1, -1), (1, -1, -1)],
    ],
    dtype=float,
)


# ------------------------------------------------------------------ order-exact vector ops
#
# The clipped polygon of a cap lying flat on a face is a near-regular 16-gon, and MuJoCo's
# choice of 4 of its vertices is decided by round-off; to make the same choice every
# product-then-sum is rounded exactly as in C. XLA fuses a*b + c into a fused multiply-add
# (one rounding); multiplying the product by a runtime 1 (`one`, which XLA cannot fold)
# makes any such fusion fma(round(a*b), 1, c), i.e. C's two roundings.


def _mul(a, b, one):
    return (a * b) * one


def _dot(a, b, one):
    return _mul(a[..., 0], b[..., 0], one) + _mul(a[..., 1], b[..., 1], one) + _mul(a[..., 2], b[..., 2], one)


def _cross(a, b, one):
    return jnp.stack(
        [_mul(a[..., 1], b[..., 2], one) - _mul(a[..., 2], b[..., 1], one),
         _mul(a[..., 2], b[..., 0], one) - _mul(a[..., 0], b[..., 2], one),
         _mul(a[..., 0], b[..., 1], one) - _mul(a[..., 1], b[..., 0], one)],
        axis=-1,
    )  # fmt: skip


def _normalize(v, one):
    """mju_normalize3: v * (1/|v|), (1, 0, 0) below mjMINVAL."""
    sq = _dot(v, v, one)
    norm = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)  # finite gradient at 0
    small = norm < MINVAL
    inv = 1.0 / jnp.where(small, 1.0, norm)
    return jnp.where(small[..., None], jnp.array([1.0, 0.0, 0.0], v.dtype), v * inv[..., None])


def _to_world(g: GeomFrame, local, one):
    """mat @ local + pos, row by row in MuJoCo's order."""
    m = g.mat
    rows = [
        _mul(m[r, 0], local[..., 0], one) + _mul(m[r, 1], local[..., 1], one) + _mul(m[r, 2], local[..., 2], one)
        for r in range(3)
    ]
    return jnp.stack(rows, axis=-1) + g.pos


def _to_local(g: GeomFrame, v, one):
    """mat^T @ v in MuJoCo's order."""
    m = g.mat
    cols = [_mul(m[0, c], v[0], one) + _mul(m[1, c], v[1], one) + _mul(m[2, c], v[2], one) for c in range(3)]
    return jnp.stack(cols)


# ------------------------------------------------------------------ features


def _faces(kind: int, g: GeomFrame, one):
    """Candidate faces of a shape: (normals (F, 3), polygons (F, 16, 3), vertex counts (F,))."""
    dtype = g.pos.dtype
    if kind == BOX:
        polys = _to_world(g, jnp.asarray(_BOX_FACES, dtype) * g.size, one)
        polys = jnp.concatenate([polys, jnp.repeat(polys[:, :1], 12, axis=1)], axis=1)
        m = g.mat
        normals = jnp.stack([m[:, 0], -m[:, 0], m[:, 1], -m[:, 1], m[:, 2], -m[:, 2]])
        return normals, polys, jnp.full(6, 4)
    # cylinder caps: top (+axis) then bottom
    r, h = g.size[0], g.size[1]
    caps = []
    for sgn in (1.0, -1.0):
        local = jnp.stack([r * jnp.asarray(_COS16, r.dtype), (-sgn * r) * jnp.asarray(_SIN16, r.dtype), jnp.full(16, sgn * h)], axis=-1)
        caps.append(_to_world(g, local, one))
    axis = g.mat[:, 2]
    return jnp.stack([axis, -axis]), jnp.stack(caps), jnp.full(2, 16)


def _edge(kind: int, g: GeomFrame, witness, towards, one):
    """The line feature: the capsule's surface line through `witness`, or the cylinder's side
    line through its support point along `towards`, cap to cap. Returns (2, 3) endpoints, axis."""
    axis = g.mat[:, 2]
    if kind == CAPSULE:
        rel = witness - g.pos
        pr = _mul(rel[0], axis[0], one) + _mul(rel[1], axis[1], one)
        pr = _mul(rel[2], axis[2], one) + pr
        half = g.size[1]
        start, end = _mul(-pr - half, axis, one) + witness, _mul(half - pr, axis, one) + witness
        return jnp.stack([start, end]), axis
    local = _to_local(g, towards, one)
    n2 = _mul(local[0], local[0], one) + _mul(local[1], local[1], one)
    # one condition for both wheres: with the axis along `towards` (n2 ~ 0) the unused branch's
    # derivative 1/n2^1.5 would be inf (0 * inf = NaN in float32 gradients). Below float64 the
    # condition is n2 above the round-off of `towards`: in float32 `towards` can land exactly on a cylinder's
    # axis (n2 ~ 1e-16), where the line's azimuth is noise with a derivative ~1/sqrt(n2) (contact
    # gradients 1e7, a rollout's gradient overflowed); in that band the line is put at the local
    # x azimuth (on the side, as any azimuth would be). n2 = 0: the cap centre, as MuJoCo.
    floor = (16 * jnp.finfo(n2.dtype).eps) ** 2 if jnp.finfo(n2.dtype).eps > 1e-10 else MINVAL * MINVAL
    side = n2 >= floor
    scale = jnp.where(side, g.size[0] / jnp.sqrt(jnp.where(side, n2, 1.0)), 0.0)
    noise = ~side & (n2 >= MINVAL * MINVAL)
    x, y = jnp.where(noise, g.size[0], scale * local[0]), jnp.where(noise, 0.0, scale * local[1])
    top = local[2] >= 0
    local = jnp.stack([x, y, jnp.where(top, g.size[1], -g.size[1])])
    support = _to_world(g, local, one)
    direction = jnp.where(top, -axis, axis)
    hh = g.size[1] + g.size[1]
    return jnp.stack([support, _mul(hh, direction, one) + support]), axis


# ------------------------------------------------------------------ clipping


def _clip(ref, nref, poly, npoly, n, one):
    """Sutherland-Hodgman: clip `poly` (first npoly of its rows) by the side planes of the
    reference polygon `ref` (first nref of its rows, normal n), as MuJoCo's polygonClip."""
    rows, size = ref.shape[0], poly.shape[0]
    nxt_ref = jnp.where(jnp.arange(rows) + 1 >= nref, 0, jnp.arange(rows) + 1)
    side = _normalize(_cross(ref[nxt_ref] - ref, (ref + n) - ref, one), one)  # side-plane normals
    idx = jnp.arange(size)

    def one_plane(e, state):
        poly, npoly = state
        f, p = ref[e], side[e]
        q_idx = jnp.where(idx + 1 >= npoly, 0, idx + 1)
        P, Q = poly, poly[q_idx]
        dp, dq = _dot(P - f, p, one), _dot(Q - f, p, one)
        in_p, in_q = dp > -MINVAL, dq > -MINVAL
        live = idx < npoly
        den = dp - dq
        crossing = live & (in_p != in_q) & (den != 0)
        t = dp / jnp.where(crossing, den, 1.0)  # other rows: no tiny den (their unused t would get an inf derivative)
        cross_ok = crossing & (t >= 0) & (t <= 1)
        point = _mul(t[:, None], Q - P, one) + P
        emit = jnp.stack([cross_ok, live & in_q], axis=1).reshape(-1)  # per vertex: [crossing, Q]
        cand = jnp.stack([point, Q], axis=1).reshape(-1, 3)
        new, kept = _compact(cand, emit, size)
        new_n = jnp.sum(kept)
        apply = (e < nref) & (npoly > 0)
        return jnp.where(apply, new, poly), jnp.where(apply, new_n, npoly)

    return jax.lax.fori_loop(0, rows, one_plane, (poly, npoly))


def _area(a, b, c, d, one):
    x = _cross(a - c, b - d, one)
    return 0.5 * jnp.sqrt(_dot(x, x, one))


def _quad(poly, m, one):
    """MuJoCo's greedy largest-area quadrilateral of a polygon with m >= 5 vertices: for each
    corner a, move d forward while that grows the area, after each such move c and then b
    as far as they grow it; returns the indices (a, b, c, d) of the best seen."""
    poly = jax.lax.stop_gradient(poly)
    area = lambda a, b, c, d: _area(poly[a], poly[b], poly[c], poly[d], one)  # noqa: E731
    wrap = lambda i: jnp.where(i + 1 >= m, 0, i + 1)  # noqa: E731

    def move(which, a):
        def next_corners(s):
            corners = list(s[:3])
            corners[which] = wrap(corners[which])
            return corners

        def cond(s):
            return area(a, *next_corners(s)) > s[3]

        def body(s):
            corners = next_corners(s)
            return (*corners, area(a, *corners), jnp.stack([a, *corners]))

        return cond, body

    def outer(a, s):
        cond_d, body_d = move(2, a)
        grow_c, grow_b = move(1, a), move(0, a)

        def body(s):
            s = body_d(s)
            s = jax.lax.while_loop(*grow_c, s)
            return jax.lax.while_loop(*grow_b, s)

        b, c, d, best, res = jax.lax.while_loop(lambda s: (a < m) & cond_d(s), body, s)
        fix_b = (a < m) & (b == a)
        b = jnp.where(fix_b, wrap(b), b)
        fix_c = fix_b & (c == b)
        c = jnp.where(fix_c, wrap(c), c)
        d = jnp.where(fix_c & (d == c), wrap(d), d)
        return b, c, d, best, res

    start = (jnp.array(1), jnp.array(2), jnp.array(3), area(0, 1, 2, 3), jnp.arange(4))
    return jax.lax.fori_loop(0, poly.shape[0], outer, start)[4]


def _farthest_pair(poly, m, one):
    """Indices of the farthest pair of the first m points (first strict maximum, i < j)."""
    diff = poly[None, :, :] - poly[:, None, :]
    d2 = jax.lax.stop_gradient(_dot(diff, diff, one))
    size = poly.shape[0]
    idx = jnp.arange(size)
    upper = (idx[:, None] < idx[None, :]) & (idx[None, :] < m)
    flat = jnp.where(upper, d2, -1.0).reshape(-1)
    k = jnp.argmax(flat)
    return jnp.where(flat[k] > 0, jnp.stack([k // size, k % size]), jnp.array([0, 1]))


def _manifold(ref, nref, incident, nincident, n, direction, edge_axis, limit: int, margin, one):
    """polygonClip: clipped points, reduced to `limit`, as (w1, w2, d) witnesses + mask, and w2 on
    the margin-inflated shapes (w1 - (d - margin) direction: its direction from w1 is the contact
    normal's, also for points within the margin band)."""
    poly, m = _clip(ref, nref, incident, nincident, n, one)
    idx = jnp.arange(poly.shape[0])
    keep = (idx < m) & ~(_dot(poly - ref[0], n, one) > margin)  # drop points beyond the margin band
    poly, kept = _compact(poly, keep, poly.shape[0])
    m = jnp.sum(kept)
    quad = m >= 5
    pair = ~quad & (nincident == 2) & (m >= 3)
    chosen = jnp.where(quad, _quad(poly, m, one), jnp.arange(4))
    chosen = jnp.where(pair, jnp.concatenate([_farthest_pair(poly, m, one), jnp.arange(2, 4)]), chosen)[:limit]
    # an edge's two points in order along it (MuJoCo's order follows its EPA; this one stays
    # put when round-off picks the other of two coincident clip points)
    edge_key = jax.lax.stop_gradient(_dot(poly[chosen[:2]], edge_axis, one))
    swap = pair & (edge_key[0] > edge_key[1])
    chosen = jnp.where(swap, chosen.at[:2].set(chosen[1::-1][:2]), chosen)
    valid = jnp.arange(limit) < jnp.where(quad, 4, jnp.where(pair, 2, m))
    v = poly[chosen]
    w1 = v - _mul(n, _dot(v - ref[0], n, one)[:, None], one)
    d = _dot(w1 - v, direction, one)
    w2 = w1 - _mul(direction, d[:, None], one)
    w2_inflated = w1 - _mul(direction, (d - margin)[:, None], one)
    return w1, w2, w2_inflated, d, valid & (m > 0)


def _pad(poly, count, size: int = MAXV):
    """The first rows of a polygon (or edge) repeated to `size` rows (a clip buffer)."""
    return jnp.concatenate([poly, jnp.repeat(poly[:1], size - poly.shape[0], axis=0)]), count


def multiccd_contact(k1: int, k2: int) -> tuple[Callable, int]:
    """Narrow-phase function for a capsule/cylinder/box pair with a cylinder, and its slots."""
    limit = 2 if CAPSULE in (k1, k2) else 4
    single = convex_contact(k1, k2)

    def fn(g1: GeomFrame, g2: GeomFrame, margin: Float[Array, ""], ccd=None) -> Collision:
        base = single(g1, g2, margin, ccd)
        # a 1 that XLA cannot constant-fold (see _mul): it depends on the (traced) geom poses,
        # also when the model, and so the margin, is a compile-time constant; without a derivative
        # (its true one, zero, would otherwise be carried through every product's JVP and transpose)
        one = jax.lax.stop_gradient((g1.pos[0] + g2.pos[0]) * 0.0 + 1.0)
        n, dist = base.frame[0, 0], base.dist[0]
        direction = jax.lax.stop_gradient((dist - margin) * n)  # x2 - x1 of the margin-inflated shapes
        tol = EDGE_TOLERANCE * jnp.sqrt(_dot(direction, direction, one))
        ns = jax.lax.stop_gradient(n)

        def face_of(kind, g, faces, towards, partner=None):
            """(has, normal, polygon (16, 3), count, dim) of the face MuJoCo's feature names.

            A box's feature faces are those facing the other shape (the faces at its support
            corner): the one most anti-parallel to `partner` (the other shape's face normal),
            else the one facing it most. A cylinder's is the cap on the contact side when the
            contact is not on its side.
            """
            normals, polys, counts = faces
            facing = jax.lax.stop_gradient(normals @ towards)
            if kind == BOX:
                k = jnp.argmax(facing)
                if partner is not None:
                    anti = jax.lax.stop_gradient(normals @ partner)
                    k = jnp.where(partner @ towards != 0, jnp.argmin(jnp.where(facing > 0, anti, jnp.inf)), k)
                return jnp.array(True), normals[k], polys[k], counts[k], 3
            k = jnp.argmax(facing)
            has = jnp.abs(jax.lax.stop_gradient(jnp.dot(g.mat[:, 2], towards))) > EDGE_TOLERANCE
            return has, normals[k], polys[k], counts[k], jnp.where(has, 1, 2)

        zero = jnp.zeros(3, n.dtype)
        if k1 == CAPSULE:
            has1, n1, f1, c1, dim1 = jnp.array(False), zero, jnp.zeros((16, 3), n.dtype), 0, 1
        else:
            has1, n1, f1, c1, dim1 = face_of(k1, g1, _faces(k1, g1, one), ns)
        faces2 = _faces(k2, g2, one)
        has2, n2, f2, c2, dim2 = face_of(k2, g2, faces2, -ns)
        if k2 == BOX and k1 == CYLINDER:  # face-face: the box face most anti-parallel to the cap
            has2f, n2f, f2f, c2f, _ = face_of(k2, g2, faces2, -ns, jax.lax.stop_gradient(jnp.where(has1, n1, 0.0)))
        else:
            has2f, n2f, f2f, c2f = has2, n2, f2, c2
        n1s, n2s, n2fs = jax.lax.stop_gradient((n1, n2, n2f))

        # face-face: anti-parallel within FACE_TOLERANCE, each facing the other shape
        aligned = has1 & has2f & (_dot(n1s, direction, one) < -tol) & (_dot(n2fs, direction, one) > tol)
        aligned = aligned & (_dot(n1s, n2fs, one) < -FACE_TOLERANCE)

        # edge-face: geom 1's edge on geom 2's face, or the mirror image
        x1 = base.pos[0] - 0.5 * dist * n  # witness on geom 1
        if k1 == CAPSULE:  # the line through the margin-inflated witness, deflated along the face normal
            edge1, axis1 = _edge(CAPSULE, g1, x1 + (0.5 * margin) * n, None, one)
            edge1 = edge1 + (0.5 * margin) * n2s
        else:
            edge1, axis1 = _edge(k1, g1, x1, -n2, one)
        edge_pick1 = (dim1 != 3) & has2 & (~has1 | (dim1 <= dim2))
        match1 = jnp.abs(_dot(jax.lax.stop_gradient(axis1), n2s, one)) < EDGE_TOLERANCE
        match1 = match1 & (_dot(n2s, direction, one) > MINVAL)
        use1 = ~aligned & edge_pick1 & match1
        if k2 == CYLINDER and k1 != CAPSULE:  # geom 2's side on geom 1's cap
            edge2, axis2 = _edge(k2, g2, None, -n1, one)
            edge_pick2 = ~edge_pick1 & (dim2 != 3) & has1 & (~has2 | (dim2 <= dim1))
            match2 = jnp.abs(_dot(jax.lax.stop_gradient(axis2), n1s, one)) < EDGE_TOLERANCE
            match2 = match2 & (_dot(n1s, -direction, one) > MINVAL)
            # ... except where geom 2 touches with a rim point (docstring, 1.; geom 1's rim on
            # geom 2's cap does make the manifold)
            x2, axis2s = jax.lax.stop_gradient((base.pos[0] + 0.5 * dist * n, axis2))
            root_eps = jnp.sqrt(jnp.finfo(ns.dtype).eps)
            off_side = jnp.abs(_dot(axis2s, ns, one)) > root_eps
            at_rim = jnp.abs(_dot(x2 - g2.pos, axis2s, one)) >= g2.size[1] * (1 - root_eps)
            match2 = match2 & ~(off_side & at_rim)
            use2 = ~aligned & edge_pick2 & match2
        else:
            edge2, axis2, use2 = edge1, axis1, jnp.array(False)

        # one clip call: reference face, incident polygon, normals for the chosen case
        ref, nref, rn = tree_where(use1, (f2, c2, n2), (f1, c1, n1))
        inc, ninc = tree_where(aligned, _pad(f2f, c2f), _pad(tree_where(use1, edge1, edge2), 2))
        rdir = jnp.where(aligned, n2f, jnp.where(use1, -n2, -n1))
        edge_axis = jax.lax.stop_gradient(jnp.where(use1, axis1, axis2))
        w1, w2, w2i, d, ok = _manifold(ref, nref, inc, ninc, rn, rdir, edge_axis, limit, margin, one)
        p1, p2 = tree_where(use1, (w2, w1), (w1, w2))
        gap = jnp.where(use1, w2i - w1, w1 - w2i)  # geom 1 -> geom 2 on the inflated shapes
        active = (aligned | use1 | use2) & jnp.any(ok)
        active = active & (jnp.min(jnp.where(ok, d, jnp.inf)) < margin)

        normal = _normalize(_normalize(gap, one), one)
        slots = Collision(
            dist=jnp.where(ok, d, 0.0),
            pos=(p1 + p2) * 0.5,
            frame=jax.vmap(make_frame)(normal),
            valid=ok,
        )
        return tree_where(active, slots, _pad_slots(base, limit))

    fn.__name__ = f"multiccd_{k1}_{k2}"
    return fn, limit


def _pad_slots(col: Collision, n: int) -> Collision:
    return jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros((n - 1,) + x.shape[1:], x.dtype)]), col)


def single_contact(k1: int, k2: int) -> Callable:
    """The same slots holding MuJoCo's single contact only (multiccd disabled)."""
    single, limit = convex_contact(k1, k2), 2 if CAPSULE in (k1, k2) else 4
    return lambda g1, g2, margin, ccd=None: _pad_slots(single(g1, g2, margin, ccd), limit)


PAIRS = [(CAPSULE, CYLINDER), (CYLINDER, CYLINDER), (CYLINDER, BOX)]
FUNCTIONS: dict[tuple[int, int], tuple[Callable, int]] = {pair: multiccd_contact(*pair) for pair in PAIRS}
