"""MuJoCo's native convex collision (mjc_ccd), iterate for iterate: the value of a convex contact.

MuJoCo runs GJK and EPA until they are within `opt.ccd_tolerance` (default 1e-6) of the
contact, so where a curved shape takes part its contact is that far from the exact one, not at
it: barkour's spherical feet pressed into its height field sit up to 7.7e-5 m from the exact
contact point, and its qacc differs by 5.6e-5 relative. `convex.py` converges to the exact
contact, whose derivative it needs. This module repeats MuJoCo's iterates (engine_collision_gjk.c,
MuJoCo 4; GJK's signed-volume subalgorithm is Montanari et al., ToG 2017), so that
`convex.convex_contact` can return MuJoCo's value with the exact contact's derivative.

1. A sphere or capsule in the pair: GJK between the cores (centre, segment), starting from the
   geoms' centres. Cores apart by more than the tolerance: the contact is their distance less
   the radii (shallow penetration, no EPA).
2. Else GJK on the whole shapes from the centres, until its simplex is a tetrahedron that
   contains the origin, or a triangle or segment within the tolerance of it.
3. EPA from that tetrahedron, or from the hexahedron built on the triangle or the segment:
   expand the candidate face closest to the origin by the support point along its normal until
   that support's distance is within the tolerance of the face's. The faces the new point sees
   are found depth first from the expanded face (MuJoCo's order, which decides the order of its
   map of candidates and so which of two equally distant faces wins: symmetric scenes have
   such ties). The witnesses are interpolated at the origin's projection onto the last face.

The source read (the repository as of August 2026) differs from the installed MuJoCo 4.0 in
three places, found by comparing iterates with the library's own mjc_ccd: 4.0 does not hand a
tetrahedron to gjkIntersect, puts the hexahedron's apex along +n before the one along -n, and
stops EPA on the iteration's own bound (not the best so far). With these, contacts of
ellipsoid, cylinder, capsule, sphere, box and prism pairs agree with 4.0's to round-off. Runs
on stop-gradient inputs, in float64 (MuJoCo's double build; its float build has other
thresholds).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..math import tree_where

MINVAL = 1e-15  # mjMINVAL
MINVAL2 = MINVAL * MINVAL  # mjMINVAL2 = mjMINDIST2/3/4 (double)
MAXVAL2 = 1e20  # mjMAXVAL^2
HORIZON = 24  # MuJoCo's horizon buffer: edges a new support point can see
STACK = 64  # depth of the horizon's depth-first search (faces deleted in a row)
SIN120, COS120 = 0.86602540378, -0.5  # polytope2's rotation, MuJoCo's constants

Support = Callable  # normalized direction d -> (w, a, b, i): a = s_1(d), b = s_2(-d), w = a - b,
# i = (vertex ids of a and b) for polytopes (box corner, mesh vertex; -1 a height-field prism's)


def _big(dtype):
    return jnp.asarray(np.finfo(dtype).max, dtype)  # mjMAX_LIMIT


def _same(a, b):
    return ((a > 0) & (b > 0)) | ((a < 0) & (b < 0))


def _det3(a, b, c):
    return jnp.dot(a, jnp.cross(b, c))


# -------------------------------------------------------------- signed-volume subalgorithm


def _s1d(s1, s2):
    """Barycentric coordinates of the origin's projection onto segment s1 s2, or (0, 1) (s2)
    when it falls outside (MuJoCo keeps the newer point, s2)."""
    diff = s2 - s1
    dd = jnp.dot(diff, diff)
    p = s2 + (-(jnp.dot(s2, diff) / jnp.where(dd > 0, dd, 1.0))) * diff
    mu = s1 - s2
    idx = jnp.where(jnp.abs(mu[1]) >= jnp.abs(mu[0]), 1, 0)
    idx = jnp.where(jnp.abs(mu[2]) >= jnp.abs(mu[idx]), 2, idx)
    mu_max = mu[idx]
    c1, c2 = p[idx] - s2[idx], s1[idx] - p[idx]
    inside = _same(mu_max, c1) & _same(mu_max, c2) & (dd > 0)
    safe = jnp.where(inside, mu_max, 1.0)
    return jnp.where(inside, jnp.stack([c1 / safe, c2 / safe]), jnp.array([0.0, 1.0], s1.dtype))


def _project_origin_plane(v1, v2, v3):
    """(origin projected onto the plane of v1 v2 v3, failed): three cross products tried in turn."""
    d21, d31, d32 = v2 - v1, v3 - v1, v3 - v2
    cands = [(jnp.cross(d32, d21), v2), (jnp.cross(d21, d31), v1), (jnp.cross(d31, d32), v3)]
    out = []
    for n, v in cands:
        nv, nn = jnp.dot(n, v), jnp.dot(n, n)
        out.append((n * (nv / jnp.where(nn == 0, 1.0, nn)), nv, nn))
    (r1, nv1, nn1), (r2, nv2, nn2), (r3, _, _) = out
    ok1 = (nv1 != 0) & (nn1 > MINVAL)
    ok2 = (nv2 != 0) & (nn2 > MINVAL)
    failed = (nn1 == 0) | (~ok1 & (nn2 == 0))
    return jnp.where(ok1, r1, jnp.where(ok2, r2, r3)), failed


def _minors(s1, s2, s3):
    """(largest minor of [s; 1], the two axes kept): the triangle's largest axis projection."""
    m14 = s2[1] * s3[2] - s2[2] * s3[1] - s1[1] * s3[2] + s1[2] * s3[1] + s1[1] * s2[2] - s1[2] * s2[1]
    m24 = s2[0] * s3[2] - s2[2] * s3[0] - s1[0] * s3[2] + s1[2] * s3[0] + s1[0] * s2[2] - s1[2] * s2[0]
    m34 = s2[0] * s3[1] - s2[1] * s3[0] - s1[0] * s3[1] + s1[1] * s3[0] + s1[0] * s2[1] - s1[1] * s2[0]
    a1, a2, a3 = jnp.abs(m14), jnp.abs(m24), jnp.abs(m34)
    k = jnp.where((a1 >= a2) & (a1 >= a3), 0, jnp.where(a2 >= a3, 1, 2))
    return jnp.stack([m14, m24, m34])[k], jnp.array([[1, 2], [0, 2], [0, 1]])[k]


def _areas(p, s1, s2, s3, axes):
    """Signed areas (p, s2, s3), (p, s3, s1), (p, s1, s2) in the plane of `axes`."""

    def area(q, u, v):
        q, u, v = q[axes], u[axes], v[axes]
        return q[0] * u[1] + q[1] * v[0] + u[0] * v[1] - q[0] * v[1] - q[1] * u[0] - v[0] * u[1]

    return jnp.stack([area(p, s2, s3), area(p, s3, s1), area(p, s1, s2)])


def _closest_of(cands, fallback):
    """MuJoCo's choice among sub-simplices [(outside, lam, x)]: the first outside one, then any
    later outside one strictly closer."""
    lam, dmin, any_ = fallback, None, None
    for outside, lam_c, x in cands:
        d = jnp.dot(x, x)
        if dmin is None:
            lam, dmin, any_ = jnp.where(outside, lam_c, lam), jnp.where(outside, d, jnp.inf), outside
        else:
            take = outside & (~any_ | (d < dmin))
            lam, dmin, any_ = jnp.where(take, lam_c, lam), jnp.where(take, d, dmin), any_ | outside
    return lam


_EDGES = np.array([[1, 2], [0, 2], [0, 1]])  # a triangle's edges (s2 s3), (s1 s3), (s1 s2) by the slots they keep
_FACES = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])  # a tetrahedron's faces, each without one point


def _s2d_parts(s1, s2, s3):
    """(S2D: barycentric coordinates of the point of triangle s1 s2 s3 closest to the origin, (3,);
    S1D's coordinates on each edge, (3, 3) in the triangle's slots). The edges are one batched
    S1D, not three traced copies (the subalgorithm is traced once per GJK and pair type)."""
    p, failed = _project_origin_plane(s1, s2, s3)
    m_max, axes = _minors(s1, s2, s3)
    c = _areas(p, s1, s2, s3, axes)
    comp = _same(m_max, c)
    inside = jnp.all(comp)
    u, v = jnp.stack([s2, s1, s1]), jnp.stack([s3, s3, s2])
    on_edge = jax.vmap(_s1d)(u, v)  # (3, 2)
    lam = jnp.zeros((3, 3), s1.dtype).at[np.arange(3)[:, None], _EDGES].set(on_edge)
    x = on_edge[:, :1] * u + on_edge[:, 1:] * v
    closest = _closest_of([(~comp[i], lam[i], x[i]) for i in range(3)], jnp.zeros(3, s1.dtype))
    closest = jnp.where(inside, c / jnp.where(inside, m_max, 1.0), closest)
    return jnp.where(failed, lam[2], closest), lam  # no plane: the segment s1 s2


def _s3d(s, on_face):
    """Barycentric coordinates of the point of tetrahedron s (4, 3) closest to the origin (S3D),
    given S2D's coordinates on each face (`_FACES`), (4, 3)."""
    s1, s2, s3, s4 = s
    c = jnp.stack([-_det3(s2, s3, s4), _det3(s1, s3, s4), -_det3(s1, s2, s4), _det3(s1, s2, s3)])
    m_det = c[0] + c[1] + c[2] + c[3]
    comp = _same(m_det, c)
    inside = jnp.all(comp)
    lam = jnp.zeros((4, 4), s.dtype).at[np.arange(4)[:, None], _FACES].set(on_face)
    corners = s[_FACES]  # (4, 3, 3)
    x = on_face[:, :1] * corners[:, 0] + on_face[:, 1:2] * corners[:, 1] + on_face[:, 2:] * corners[:, 2]
    lam = _closest_of([(~comp[i], lam[i], x[i]) for i in range(4)], jnp.zeros(4, s.dtype))
    return jnp.where(inside, c / jnp.where(inside, m_det, 1.0), lam)


def _subdistance(w, n):
    """Closest-point coordinates on the first n points of w (4, 3). The triangle w0 w1 w2 is the
    tetrahedron's last face and the segment w0 w1 that face's last edge: each sub-simplex is
    solved once, in one batched S2D over the four faces."""
    corners = w[_FACES]
    on_face, on_edge = jax.vmap(_s2d_parts)(corners[:, 0], corners[:, 1], corners[:, 2])
    one = jnp.zeros(4, w.dtype).at[0].set(1.0)
    two = jnp.zeros(4, w.dtype).at[:3].set(on_edge[3, 2])
    three = jnp.zeros(4, w.dtype).at[:3].set(on_face[3])
    four = _s3d(w, on_face)
    return jnp.select([n == 4, n == 3, n == 2], [four, three, two], one)


# ------------------------------------------------------------------------------ GJK


class _Simplex(NamedTuple):
    w: jax.Array  # (4, 3) points of the Minkowski difference
    a: jax.Array  # (4, 3) their support points on geom 1
    b: jax.Array  # (4, 3) on geom 2
    i: jax.Array  # (4, 2) their vertex ids


class _Status(NamedTuple):
    simplex: _Simplex
    n: jax.Array  # points in the simplex
    dist: jax.Array  # distance GJK found; 0: the simplex contains the origin; max: separated
    x1: jax.Array  # witness on geom 1
    x2: jax.Array
    separated: jax.Array


def _set(sx: _Simplex, i, v) -> _Simplex:
    return _Simplex(*(x.at[i].set(y) for x, y in zip(sx, v)))


def _gjk(support: Support, x1, x2, tol, kmax: int, dist_cutoff=None, discrete=False) -> _Status:
    """MuJoCo's gjk() from witnesses x1, x2 (the centres); its signed-volume subalgorithm.

    dist_cutoff None: only contact is needed (a support plane separating the shapes ends it);
    else distances up to the cutoff are. discrete: two polytopes, run to convergence.
    """
    dtype = x1.dtype
    big = _big(dtype)
    eps = jnp.where(discrete, 0.0, 0.5 * tol * tol)  # Frank-Wolfe gap below which GJK stops
    min_norm = jnp.where(discrete, MINVAL, tol)
    x = x1 - x2
    z = jnp.zeros((4, 3), dtype)
    # state: k, n, simplex, lam, x, |x|, previous |x|, done, separated
    state = (jnp.asarray(0), jnp.asarray(0), _Simplex(z, z, z, jnp.full((4, 2), -1, jnp.int32)), jnp.zeros(4, dtype),
             x, jnp.linalg.norm(x), jnp.zeros((), dtype), jnp.asarray(False), jnp.asarray(False))  # fmt: skip

    def cond(st):
        k, done = st[0], st[7]
        return (k < kmax) & ~done

    def body(st):
        k, n, sx, lam, x, xnorm, xprev, _, _ = st
        stalled = (xnorm < min_norm) | (jnp.abs(xprev - xnorm) < MINVAL)
        new = support(-(x * (1 / jnp.where(xnorm > 0, xnorm, 1.0))))
        sx_new = _set(sx, n, new)
        converged = jnp.dot(x, x - new[0]) < eps
        lower = jnp.dot(x, new[0])  # > 0: a plane separates the shapes (lower / |x| from each other)
        if dist_cutoff is None:
            separated = lower > 0
        else:
            separated = (lower > 0) & (lower >= dist_cutoff * xnorm)
        lam_new = _subdistance(sx_new.w, n + 1)
        keep = lam_new != 0
        order = jnp.argsort(~keep, stable=True)  # drop the unused points, keep the order
        n_new = jnp.sum(keep)
        sx_kept = jax.tree.map(lambda a: a[order], sx_new)
        lam_kept = jnp.where(jnp.arange(4) < n_new, lam_new[order], 0.0)
        x_new = lam_kept @ sx_kept.w
        separated = separated | (~(stalled | converged) & (n_new < 1))
        advance = ~(stalled | converged | separated)
        done = ~advance | (n_new == 4)
        return (jnp.where(advance, k + 1, k), jnp.where(advance, n_new, n), tree_where(advance, sx_kept, sx),
                jnp.where(advance, lam_kept, lam), jnp.where(advance, x_new, x),
                jnp.where(advance, jnp.linalg.norm(x_new), xnorm), jnp.where(advance, xnorm, xprev), done,
                ~(stalled | converged) & separated)  # fmt: skip

    _, n, sx, lam, x, xnorm, _, _, stopped_apart = jax.lax.while_loop(cond, body, state)
    # GJK ran out or converged: a final separation check; witnesses at the closest point
    final = support(-(x * (1 / jnp.where(xnorm > 0, xnorm, 1.0))))
    separated = stopped_apart | ((xnorm > 0) & (jnp.dot(x, final[0]) > 0))
    return _Status(
        simplex=sx,
        n=jnp.where(stopped_apart, 0, n),
        dist=jnp.where(stopped_apart, big, jnp.where((n == 4) & ~separated, 0.0, xnorm)),
        x1=jnp.where(n > 0, lam @ sx.a, x1),
        x2=jnp.where(n > 0, lam @ sx.b, x2),
        separated=separated,
    )


# ------------------------------------------------------------------------------ EPA


class _Polytope(NamedTuple):
    w: jax.Array  # (V, 3) vertices; a, b their support points on geoms 1 and 2, i their vertex ids
    a: jax.Array
    b: jax.Array
    i: jax.Array
    nverts: jax.Array
    verts: jax.Array  # (F, 3) faces' vertex ids
    adj: jax.Array  # (F, 3) the face across edges (v0 v1), (v1 v2), (v2 v0)
    v: jax.Array  # (F, 3) the origin's projection onto each face (its outward normal)
    dist2: jax.Array  # (F,) |v|^2
    index: jax.Array  # (F,) position in the map of candidate faces; -1 not a candidate, -2 deleted (or unused)
    map: jax.Array  # (F,) candidate faces, in MuJoCo's order (a deleted entry takes the last one)
    nmap: jax.Array
    nfaces: jax.Array
    center: jax.Array


def _face(w, center, i, j, k):
    """attachFace's geometry for face (i, j, k): (v, dist2); dist2 0 when degenerate."""
    v, failed = _project_origin_plane(w[k], w[j], w[i])
    v = jnp.where(jnp.dot(v, w[i] - center) < 0, -v, v)
    return v, jnp.where(failed, 0.0, jnp.dot(v, v))


def _polytope(vertices, faces, adj, center, nv: int, nf: int):
    """A start polytope from vertices [(w, a, b, ids)] and faces [(i, j, k)] with their adjacency."""
    w = jnp.stack([v[0] for v in vertices])
    dtype = w.dtype
    z = jnp.zeros((nv, 3), dtype)
    n0 = len(vertices)
    faces_np = np.asarray(faces, np.int32)
    v, d2 = jax.vmap(lambda f: _face(w, center, f[0], f[1], f[2]))(jnp.asarray(faces_np))
    f0 = len(faces)
    pt = _Polytope(
        w=z.at[:n0].set(w), a=z.at[:n0].set(jnp.stack([v_[1] for v_ in vertices])),
        b=z.at[:n0].set(jnp.stack([v_[2] for v_ in vertices])), nverts=jnp.asarray(n0),
        i=jnp.full((nv, 2), -1, jnp.int32).at[:n0].set(jnp.stack([v_[3] for v_ in vertices])),
        verts=jnp.zeros((nf, 3), jnp.int32).at[:f0].set(faces_np), adj=jnp.zeros((nf, 3), jnp.int32).at[:f0].set(np.asarray(adj, np.int32)),
        v=jnp.zeros((nf, 3), dtype).at[:f0].set(v), dist2=jnp.zeros(nf, dtype).at[:f0].set(d2),
        index=jnp.full(nf, -2, jnp.int32).at[:f0].set(np.arange(f0, dtype=np.int32)),
        map=jnp.zeros(nf, jnp.int32).at[:f0].set(np.arange(f0, dtype=np.int32)), nmap=jnp.asarray(f0, jnp.int32),
        nfaces=jnp.asarray(f0), center=center,
    )  # fmt: skip
    return pt, d2


def _same_side(p0, p1, p2, p3):
    n = jnp.cross(p1 - p0, p2 - p0)
    return _same(jnp.dot(n, p3 - p0), jnp.dot(n, -p0))


def _contains_origin(p0, p1, p2, p3):
    return _same_side(p0, p1, p2, p3) & _same_side(p1, p2, p3, p0) & _same_side(p2, p3, p0, p1) & _same_side(p3, p0, p1, p2)


def _tri_coords(v1, v2, v3, p):
    """triAffineCoord: affine coordinates of p (in the triangle's plane) on v1 v2 v3."""
    m_max, axes = _minors(v1, v2, v3)
    return _areas(p, v1, v2, v3, axes) / jnp.where(m_max == 0, 1.0, m_max)


def _first_degenerate(d2):
    """Index of the first face whose distance is below MuJoCo's threshold, or -1."""
    bad = d2 < MINVAL2
    return jnp.where(jnp.any(bad), jnp.argmax(bad), -1)


_HEX = [(4, 0, 1), (4, 2, 0), (4, 1, 2), (3, 1, 0), (3, 0, 2), (3, 2, 1)]
_HEX_ADJ = [(1, 3, 2), (2, 4, 0), (0, 5, 1), (5, 0, 4), (3, 1, 5), (4, 2, 3)]
_TET = [(0, 1, 2), (0, 3, 1), (0, 2, 3), (3, 2, 1)]
_TET_ADJ = [(1, 3, 2), (2, 3, 0), (0, 3, 1), (2, 0, 1)]
_HEX2 = [(0, 2, 3), (0, 4, 2), (0, 3, 4), (1, 3, 2), (1, 2, 4), (1, 4, 3)]


def _epa_support(support: Support, d, dnorm):
    unit = jnp.where(dnorm > MINVAL, d / jnp.where(dnorm > MINVAL, dnorm, 1.0), jnp.array([1.0, 0.0, 0.0], d.dtype))
    return support(unit)


def _start_polytope(support: Support, st: _Status, nv: int, nf: int):
    """polytope2/3/4: (polytope, ok) from the simplex GJK ended with."""
    sx, dtype = st.simplex, st.simplex.w.dtype
    verts = [tuple(x[k] for x in sx) for k in range(4)]

    # polytope4: the tetrahedron, unless the origin is on one of its faces
    tet_center = ((sx.w[0] + sx.w[1]) + sx.w[2] + sx.w[3]) * 0.25
    tet, tet_d2 = _polytope(verts, _TET, _TET_ADJ, tet_center, nv, nf)
    tet_bad = _first_degenerate(tet_d2)
    tet_ok = _contains_origin(*sx.w)

    # polytope2: a hexahedron around the segment, three support points at 120 degrees
    w1, w2 = sx.w[0], sx.w[1]
    diff = w2 - w1
    e = jnp.zeros(3, dtype).at[jnp.argmin(jnp.abs(diff))].set(1.0)
    d1 = jnp.cross(e, diff)
    u = diff / jnp.linalg.norm(diff)
    rot = COS120 * jnp.eye(3, dtype=dtype) + (1 - COS120) * jnp.outer(u, u) + SIN120 * jnp.array(
        [[0.0, -u[2], u[1]], [u[2], 0.0, -u[0]], [-u[1], u[0], 0.0]], dtype
    )
    d2 = rot @ d1
    d3 = rot @ d2
    extra = [_epa_support(support, d, jnp.linalg.norm(d)) for d in (d1, d2, d3)]
    seg_verts = verts[:2] + extra
    seg_center = (w1 + w2) * 0.5
    seg, seg_d2 = _polytope(seg_verts, _HEX2, _HEX_ADJ, seg_center, nv, nf)
    seg_bad = _first_degenerate(seg_d2)
    v1, v2, v3, v4, v5 = (x[0] for x in seg_verts)
    vols = jnp.stack([_det3(v3 - v1, v4 - v1, v2 - v1), _det3(v4 - v1, v5 - v1, v2 - v1), _det3(v5 - v1, v3 - v1, v2 - v1)])
    seg_ok = jnp.all(vols >= 0) | jnp.all(vols <= 0)

    # polytope3: a hexahedron on a triangle (GJK's, or the face of the above the origin lies on)
    tri_tet = jnp.asarray(_TET, jnp.int32)[jnp.maximum(tet_bad, 0)]
    tri_seg = jnp.asarray(_HEX2, jnp.int32)[jnp.maximum(seg_bad, 0)]
    all_verts = jax.tree.map(lambda *x: jnp.stack(x), *(verts + extra))  # (7, ...) each: 4 simplex + 3 hexahedron points
    seg_ids = jnp.array([0, 1, 4, 5, 6])  # polytope2's vertex k is all_verts[seg_ids[k]]
    tri = jnp.where(st.n == 3, jnp.arange(3), jnp.where(st.n == 4, tri_tet, seg_ids[tri_seg]))
    tri_verts = [jax.tree.map(lambda x: x[tri[i]], all_verts) for i in range(3)]
    t1, t2, t3 = (x[0] for x in tri_verts)
    normal = jnp.cross(t2 - t1, t3 - t1)
    n_norm = jnp.linalg.norm(normal)
    ahead = _epa_support(support, normal, n_norm)
    behind = _epa_support(support, -normal, n_norm)
    hex_verts = tri_verts + [ahead, behind]
    hex_center = ((t1 + t2) + t3) * (1.0 / 3.0)
    hexa, hex_d2 = _polytope(hex_verts, _HEX, _HEX_ADJ, hex_center, nv, nf)

    def on_triangle(p):
        lam = _tri_coords(t1, t2, t3, p)
        return jnp.all(lam >= 0) & (jnp.linalg.norm(lam[0] * t1 + lam[1] * t2 + lam[2] * t3 - p) < MINVAL)

    hex_ok = (n_norm >= MINVAL) & ~on_triangle(ahead[0]) & ~on_triangle(behind[0]) & jnp.all(hex_d2 >= MINVAL2)

    use_hex = (st.n == 3) | ((st.n == 4) & (tet_bad >= 0)) | ((st.n == 2) & (seg_bad >= 0))
    pt = tree_where(use_hex, hexa, tree_where(st.n == 4, tet, seg))
    ok = jnp.where(use_hex, hex_ok, jnp.where(st.n == 4, tet_ok, seg_ok))
    return pt, ok


def _delete(pt: _Polytope, f) -> _Polytope:
    """deleteFace: take f out of the polytope; the map's last entry fills its place there."""
    pos = pt.index[f]
    listed = pos >= 0
    last = pt.map[pt.nmap - 1]
    index = jnp.where(listed, pt.index.at[last].set(pos), pt.index).at[f].set(-2)
    return pt._replace(index=index, map=jnp.where(listed, pt.map.at[pos].set(last), pt.map), nmap=pt.nmap - listed)


def _horizon(pt: _Polytope, face, w):
    """MuJoCo's horizon(): delete `face`, then depth first the faces w sees across its edges.
    Returns (polytope, horizon faces, their edges, count, ok): the edges in the order met."""
    depth = STACK
    top_k = jnp.zeros(depth, jnp.int32).at[0].set(1)
    stack = (jnp.zeros(depth, jnp.int32).at[0].set(face), jnp.full(depth, 2, jnp.int32), top_k)
    hzn = (jnp.zeros(HORIZON + 1, jnp.int32), jnp.zeros(HORIZON + 1, jnp.int32))
    state = (_delete(pt, face), stack, jnp.asarray(0), hzn, jnp.asarray(0), jnp.asarray(True))

    def cond(s):
        return (s[2] >= 0) & s[5]

    def body(s):
        pt, (sf, se, sk), top, (hf, he), n, ok = s
        f, e, k = sf[top], se[top], sk[top]
        finished = k > jnp.where(top == 0, 3, 2)  # the start face has three neighbours to look at
        i = (e + k) % 3
        g = pt.adj[f, i]
        vert = pt.verts[f, (i + 1) % 3]
        gv = pt.verts[g]
        edge = jnp.where(gv[0] == vert, 0, jnp.where(gv[1] == vert, 1, 2))  # getEdge
        alive = pt.index[g] > -2
        visible = alive & (jnp.dot(pt.v[g], w) - pt.dist2[g] > MINVAL)
        sk = sk.at[top].set(k + 1)
        push = ~finished & visible
        add = ~finished & alive & ~visible
        pt = tree_where(push, _delete(pt, g), pt)
        child = jnp.minimum(top + 1, depth - 1)
        sf = jnp.where(push, sf.at[child].set(g), sf)
        se = jnp.where(push, se.at[child].set(edge), se)
        sk = jnp.where(push, sk.at[child].set(1), sk)
        slot = jnp.minimum(n, HORIZON)
        hf = jnp.where(add, hf.at[slot].set(g), hf)
        he = jnp.where(add, he.at[slot].set(edge), he)
        ok = ok & ~(push & (top + 1 >= depth)) & ~(add & (n >= HORIZON))
        top = jnp.where(finished, top - 1, jnp.where(push, top + 1, top))
        return pt, (sf, se, sk), top, (hf, he), n + add, ok

    pt, _, _, (hf, he), n, ok = jax.lax.while_loop(cond, body, state)
    return pt, hf[:HORIZON], he[:HORIZON], n, ok


def _expand(pt: _Polytope, face, wi, lower2, upper2):
    """Replace the faces vertex wi sees by the cone from wi over their horizon; (polytope, status):
    status 0 ok, 1 unrecoverable (horizon < 3 edges or a degenerate face), 2 out of face memory."""
    nf = pt.verts.shape[0]
    pt, keep, edge, nedges, ok = _horizon(pt, face, pt.w[wi])
    slot_ok = jnp.arange(HORIZON) < nedges
    t = jnp.arange(HORIZON)
    new_ids = (pt.nfaces + t).astype(jnp.int32)
    v1 = pt.verts[keep, edge]
    v2 = pt.verts[keep, (edge + 1) % 3]
    cyclic = lambda j: pt.nfaces + jnp.mod(j, jnp.maximum(nedges, 1))  # noqa: E731
    verts_new = jnp.stack([jnp.full(HORIZON, wi), v2, v1], axis=1).astype(jnp.int32)
    adj_new = jnp.stack([cyclic(t - 1), keep, cyclic(t + 1)], axis=1).astype(jnp.int32)
    v_new, d2_new = jax.vmap(lambda i, j, k: _face(pt.w, pt.center, i, j, k))(verts_new[:, 0], verts_new[:, 1], verts_new[:, 2])
    drop = jnp.where(slot_ok, new_ids, nf)  # out of range: dropped
    adj = pt.adj.at[jnp.where(slot_ok, keep, nf), edge].set(new_ids, mode="drop")  # the kept face now borders it
    adj = adj.at[drop].set(adj_new, mode="drop")
    listed = slot_ok & (d2_new >= lower2) & (d2_new <= upper2)
    pos = pt.nmap + jnp.cumsum(listed) - 1
    index = pt.index.at[drop].set(jnp.where(listed, pos, -1).astype(jnp.int32), mode="drop")
    map_ = pt.map.at[jnp.where(listed, pos, nf)].set(new_ids, mode="drop")
    new = pt._replace(
        verts=pt.verts.at[drop].set(verts_new, mode="drop"), adj=adj, v=pt.v.at[drop].set(v_new, mode="drop"),
        dist2=pt.dist2.at[drop].set(d2_new, mode="drop"), index=index, map=map_,
        nmap=pt.nmap + jnp.sum(listed).astype(jnp.int32), nfaces=pt.nfaces + nedges,
    )  # fmt: skip
    degenerate = jnp.any(slot_ok & (d2_new == 0))
    status = jnp.where((nedges < 3) | ~ok, 1, jnp.where(nedges > nf - pt.nfaces, 2, jnp.where(degenerate, 1, 0)))
    return new, status


def _epa(support: Support, pt: _Polytope, tol, kmax: int, discrete):
    """EPA: (face, found) with the polytope; the face closest to the origin when it stopped.
    discrete (two polytopes): it also stops at a support point it already has (same vertex ids)."""
    dtype = pt.w.dtype
    big = _big(dtype)

    def cond(s):
        k, _, _, _, _, done = s
        return (k < kmax) & ~done

    def body(s):
        k, pt, face, found, upper, _ = s
        pface = face
        d2 = jnp.where(jnp.arange(pt.map.shape[0]) < pt.nmap, pt.dist2[pt.map], jnp.inf)
        first = jnp.argmin(d2)  # the first candidate of least distance, in map order
        face = pt.map[first]
        lower2 = d2[first]
        upper2 = upper * upper
        invalid = (pt.nmap == 0) | (lower2 > upper2)
        on_hull = lower2 <= 0
        lower = jnp.sqrt(jnp.maximum(lower2, 0.0))
        w, a, b, ids = _epa_support(support, pt.v[face], lower)
        wi = pt.nverts
        pt_w = pt._replace(w=pt.w.at[wi].set(w), a=pt.a.at[wi].set(a), b=pt.b.at[wi].set(b), i=pt.i.at[wi].set(ids), nverts=wi + 1)
        upper_k = jnp.dot(pt.v[face], w) / lower
        upper = jnp.minimum(upper, upper_k)
        converged = upper_k - lower < tol  # this iteration's bound (MuJoCo 4.0)
        no_contact = converged & (k == 0) & (upper < lower - 1e-10)
        grown, status = _expand(pt_w, face, wi, lower2, upper * upper)
        left = grown.nmap > 0
        repeated = discrete & jnp.any(jnp.all(pt.i == ids, axis=1) & (jnp.arange(pt.i.shape[0]) < wi))
        stop_before = invalid | on_hull | converged | repeated
        done = stop_before | (status != 0) | ~left
        face = jnp.where(invalid, pface, face)
        found = jnp.where(invalid, found, ~(no_contact | (~stop_before & (status == 1))))
        pt = tree_where(~stop_before & (status == 0), grown, pt)
        return k + 1, pt, face, found, upper, done

    state = (jnp.asarray(0), pt, jnp.asarray(0), jnp.asarray(False), big, jnp.asarray(False))
    _, pt, face, found, _, _ = jax.lax.while_loop(cond, body, state)
    return pt, face, found


# --------------------------------------------------------------------------- mjc_ccd


class Result(NamedTuple):
    contact: jax.Array  # MuJoCo reports a contact
    dist: jax.Array  # its distance (margin included: mjc_penetration's margin + status dist)
    pos: jax.Array  # the witnesses' midpoint
    normal: jax.Array  # normalize(x1 - x2): from geom 1 to geom 2
    face_ids: jax.Array  # (3, 2) the final EPA face's vertices: each shape's support vertex id
    face_a: jax.Array  # (3, 3) those vertices' support points on geom 1 (multicontact's v1)
    face_b: jax.Array  # (3, 3) and on geom 2 (v2)


def penetration(core: Support, full: Support, c1, c2, rounded, discrete, margin, tol, iterations: int) -> Result:
    """mjc_penetration with nativeccd, one contact (max_contacts = 1).

    core/full: supports of the pair with spheres and capsules shrunk to their cores (the
    other shapes inflated by margin / 2) and of the whole, inflated shapes; c1, c2: the geoms'
    centres; rounded: (r1 + margin/2, r2 + margin/2) for sphere/capsule geoms (0 for others)
    when one is in the pair, else None; discrete: both geoms polytopes without margin (GJK and
    EPA then run to convergence, MuJoCo's discreteGeoms).
    """
    dtype = c1.dtype
    big = _big(dtype)
    nv, nf = 5 + iterations, 6 * iterations

    if rounded is not None:
        m1, m2 = rounded
        st = _gjk(core, c1, c2, tol, iterations, dist_cutoff=m1 + m2)
        n = st.x2 - st.x1
        n = n / jnp.where(jnp.linalg.norm(n) > 0, jnp.linalg.norm(n), 1.0)
        x1, x2 = st.x1 + m1 * n, st.x2 - m2 * n
        shallow_dist = st.dist - (m1 + m2)
        shallow_dist = jnp.where(shallow_dist > 0, big, shallow_dist)
        shallow = st.dist > tol
        shallow_parts = (shallow_dist < 0, margin + shallow_dist, 0.5 * (x1 + x2), _unit(x1 - x2))
    st = _gjk(full, c1, c2, tol, iterations, discrete=discrete)
    run = (st.dist <= tol) & (st.n > 1) & ~st.separated
    pt, ok = _start_polytope(full, st, nv, nf)
    pt, face, found = _epa(full, pt, jnp.where(discrete, MINVAL, tol), min(iterations, 1000), discrete)
    ids = pt.verts[face]
    lam = _tri_coords(pt.w[ids[0]], pt.w[ids[1]], pt.w[ids[2]], pt.v[face])
    x1, x2 = lam @ pt.a[ids], lam @ pt.b[ids]
    depth = -jnp.sqrt(pt.dist2[face])
    contact = run & ok & found & (depth < 0)
    face = (pt.i[ids], pt.a[ids], pt.b[ids])
    result = Result(contact, margin + depth, 0.5 * (x1 + x2), _unit(x1 - x2), *face)
    if rounded is not None:
        result = tree_where(shallow, Result(*shallow_parts, *face), result)
    return result


def _unit(v):
    n = jnp.linalg.norm(v)
    return v / jnp.where(n > 0, n, 1.0)
