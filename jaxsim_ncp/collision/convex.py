"""General convex narrow phase: the ellipsoid and mesh pairs MuJoCo sends to mjc_Convex (GJK + EPA).

Sphere-, capsule-, ellipsoid-, cylinder- and box-ellipsoid, and every convex shape against a
mesh's convex hull (`mesh.py`). MuJoCo returns one contact
for them (multiccd off): the minimum-translation direction n between the two shapes (pointing
from g1 to g2), the signed distance d along it (negative in penetration) and the
midpoint of the two witness points. With the support functions h_1, h_2,

    d = max_{|n| = 1}  s(n),     s(n) = -h_1(n) - h_2(-n),                          (1)

and the witnesses a (on g1) and b (on g2) satisfy b - a = d n. The contact exists when
d < margin (MuJoCo inflates both shapes by margin/2, which moves neither n nor the
midpoint).

Three stages:

1. GJK (Gilbert-Johnson-Keerthi) on the Minkowski difference K = A - B with MuJoCo's
   core trick (spheres shrink to their centre, capsules to their segment; the radii are
   added back). It returns the distance and witnesses when the cores are apart, or a
   tetrahedron of K that contains the origin.
2. EPA (expanding polytope) from that tetrahedron when the shapes penetrate.
3. A Newton solve of the optimality conditions of (1). It starts from the GJK/EPA
   answer and uses each shape's exact support function, in which boxes, cylinders and
   capsules have kinks (faces, edges, caps, the capsule side). Where the witness lies
   on such a feature, the subgradient coordinate sigma of that kink is an unknown and
   the kink equation (n . axis = 0) is a constraint. A mesh hull's features are its
   vertices, edges and faces: the support set in the start direction (`_mesh_feature`)
   gives a vertex v0 and up to two spanning edges e_k, the witness is v0 + sum sigma_k e_k
   and the kink equations are n . e_k = 0. The system is, with n(u, v) =
   normalize(n0 + u t1 + v t2),

       t_i . (a(n, sigma) - b(n, sigma)) = 0   (i = 1, 2),    n . axis_k = 0  (active kinks).

Stages 1-2 are discrete searches run in bounded `while_loop`s on stop-gradient inputs. In
float64 models (MuJoCo's GJK/EPA replayed by `ccd.py` for the contact's value) MuJoCo's contact
is the polish's start instead, its witnesses pos -+ d n / 2, and stages 1-2 do not run; the value
is then MuJoCo's and the polish runs only in the contact's custom JVP, for the derivative
(programs that differentiate nothing, plain rollouts, neither compile nor run it).
Stage 3 ends with one differentiable Newton step from the converged point: at a root,
its derivative is the implicit-function derivative of (n, d, pos). The gradients are
therefore exact where the contact is unique. Where it is not (two parallel flat faces,
where MuJoCo's EPA picks some point of the patch), the damped Newton step keeps EPA's
witness. Our answer is converged to round-off; MuJoCo's is within its `ccd_tolerance`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .. import linalg
from . import ccd
from ..math import make_frame, prefix_count, safe_norm, tree_where
from .base import Collision, GeomFrame

SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH = 2, 3, 4, 5, 6, 7
MINVAL = 1e-15  # mjMINVAL

GJK_ITERATIONS = 64
EPA_ITERATIONS = 48
PASS_ITERATIONS = (5, 4, 2)  # the polish's settling steps per pass (`_polish`); then one differentiable
EPA_FACES = 2 * EPA_ITERATIONS + 4  # a closed convex triangulation of V vertices has 2V - 4 faces
KINK_TOLERANCE = 1e-6  # |sigma| < 1 - this: the witness is inside a face / edge / side (relative)
KINK_ANGLE = 0.05  # |m_k| < this: the direction is near enough the kink m_k = 0 for it to be active

# the 15 non-empty subsets of a 4-point simplex, as masks
_SUBSETS = np.array([[(s >> i) & 1 for i in range(4)] for s in range(1, 16)], dtype=bool)


# ------------------------------------------------------------------------- shapes


def _radius(kind: int, size) -> Float[Array, ""]:
    """Radius MuJoCo's GJK removes from the shape (sphere and capsule) and adds back."""
    return size[0] if kind in (SPHERE, CAPSULE) else jnp.zeros((), size.dtype)


def _core_support(kind: int, g: GeomFrame, d: Float[Array, "3"]) -> Float[Array, "3"]:
    """Support point of the core (sphere: centre, capsule: segment) or of the whole shape.

    Ties are broken as in MuJoCo's support functions (engine_collision_convex.c).
    """
    m = g.mat.T @ d
    s = g.size
    if kind == SPHERE:
        local = jnp.zeros(3, d.dtype)
    elif kind == CAPSULE:
        local = jnp.array([0.0, 0.0, 1.0], d.dtype) * jnp.where(m[2] >= 0, s[1], -s[1])
    elif kind == ELLIPSOID:
        sm = s * m
        local = s * sm / jnp.maximum(safe_norm(sm), MINVAL)
    elif kind == CYLINDER:
        n2 = m[0] ** 2 + m[1] ** 2
        ok = n2 >= MINVAL**2
        scl = jnp.where(ok, s[0] / jnp.sqrt(jnp.where(ok, n2, 1.0)), 0.0)
        local = jnp.array([scl * m[0], scl * m[1], jnp.where(m[2] >= 0, s[1], -s[1])])
    elif kind == BOX:
        local = jnp.where(m >= 0, s, -s)
    elif kind == MESH:  # the first hull vertex of largest projection (mjc_meshSupport's search)
        local = g.mesh.vert[jnp.argmax(g.mesh.vert @ m)]
    else:
        raise ValueError(kind)
    return g.pos + g.mat @ local


def _pair_support(k1: int, g1: GeomFrame, k2: int, g2: GeomFrame, core: bool) -> Callable:
    """Support of K = A - B: n -> (w, a, b) with a = s_A(n), b = s_B(-n), w = a - b."""
    r1, r2 = (0.0, 0.0) if core else (_radius(k1, g1.size), _radius(k2, g2.size))

    def support(n):
        a = _core_support(k1, g1, n) + r1 * n
        b = _core_support(k2, g2, -n) - r2 * n
        return a - b, a, b

    return support


# ----------------------------------------------------------------------------- GJK


def _closest_on_simplex(w: Float[Array, "4 3"], mask: Bool[Array, " 4"]):
    """Barycentric coordinates of the point of conv(w[mask]) closest to the origin.

    Brute force over the sub-simplices: the closest point is the projection of the origin
    onto the affine hull of the sub-simplex whose projection has all-positive coordinates
    and the smallest norm (every such projection lies in the hull). Each projection is solved
    in edge coordinates, x = w_r + sum_i mu_i (w_i - w_r) with (D D^T) mu = -D w_r, whose
    conditioning is the simplex's own: in a KKT system of the points themselves the pivots
    fall as 1/|w|^2 against entries growing as |w|^2, and in float32 every sub-simplex of
    shapes ~10 m apart was rejected as singular. The whole tetrahedron is tested by signed
    volumes instead (`_tetrahedron_coordinates`).
    """
    subsets = jnp.asarray(_SUBSETS[:-1])  # points, segments, triangles (the full subset is last)
    tiny = jnp.finfo(w.dtype).tiny

    def project(sub):
        ref = jnp.argmax(sub)  # the sub-simplex's first point
        edges = w - w[ref]
        others = sub & (jnp.arange(4) != ref)
        both = others[:, None] & others[None, :]
        gram = jnp.where(both, edges @ edges.T, 0.0)
        scale = jnp.maximum(jnp.max(jnp.abs(jax.lax.stop_gradient(gram))), tiny)
        # an affinely dependent sub-simplex has a singular system: it is rejected below, but a
        # solve with it would put 0/0 into the gradient even with a zero cotangent; solve with I
        system = gram + jnp.where(both, 0.0, scale * jnp.eye(4, dtype=w.dtype))
        pivots = jnp.abs(jnp.diagonal(linalg.lu_factor(jax.lax.stop_gradient(system))[0]))
        singular = ~(jnp.min(pivots) > 1e3 * jnp.finfo(w.dtype).eps * scale)  # NaN: singular
        rhs = jnp.where(others, -(edges @ w[ref]), 0.0)
        mu = jnp.where(others, linalg.solve(jnp.where(singular, scale * jnp.eye(4, dtype=w.dtype), system), rhs), 0.0)
        lam = mu + jnp.where(jnp.arange(4) == ref, 1.0 - jnp.sum(mu), 0.0)
        ok = jnp.all(mask | ~sub) & jnp.all(jnp.where(sub, lam > 0, True)) & ~singular
        return lam, jnp.where(ok, jnp.sum((w[ref] + mu @ edges) ** 2), jnp.inf)

    lams, dist2 = jax.vmap(project)(subsets)
    # a tetrahedron that contains the origin: distance 0 exactly (its round-off must not lose
    # against a face that passes through the origin)
    lam_tet, inside = _tetrahedron_coordinates(w)
    lams = jnp.concatenate([lams, lam_tet[None]])
    dist2 = jnp.concatenate([dist2, jnp.where(inside & jnp.all(mask), 0.0, jnp.inf)[None]])
    best = jnp.argmin(dist2[::-1])
    best = len(_SUBSETS) - 1 - best  # ties go to the larger subset (the full one is last)
    found = jnp.isfinite(dist2[best])
    # every solve failed (never seen): the simplex's point nearest the origin, never a
    # tetrahedron (all coordinates positive would read as "contains the origin")
    nearest = jnp.argmin(jnp.where(mask, jnp.sum(w**2, axis=1), jnp.inf))
    return jnp.where(found, lams[best], (jnp.arange(4) == nearest).astype(w.dtype))


def _tetrahedron_coordinates(w: Float[Array, "4 3"]):
    """Barycentric coordinates of the origin in the tetrahedron w by signed volumes (Cramer's
    rule: mu_k = det(edges, row k the origin - w_0) / det(edges)), and whether it contains it.
    Each volume is exact to eps |e|^3, so a flat tetrahedron (float32: 0.4 m edges, 5e-4 m
    high) still tells inside from outside, where its edge-coordinate system counts as singular:
    GJK then stalled 2e-4 m short of a 2.5e-4 m contact and EPA, started from a polytope
    without the origin, returned one 0.16 m deep (fuzz, cylinder on box)."""
    e = w[1:] - w[0]
    det = ccd._det3
    volume = det(e[0], e[1], e[2])
    ok = jnp.abs(volume) > jnp.finfo(w.dtype).tiny
    safe = jnp.where(ok, volume, 1.0)
    mu = jnp.stack([det(-w[0], e[1], e[2]), det(e[0], -w[0], e[2]), det(e[0], e[1], -w[0])]) / safe
    lam = jnp.concatenate([(1.0 - jnp.sum(mu))[None], mu])
    return lam, ok & jnp.all(lam > 0)


class _Simplex(NamedTuple):
    w: Float[Array, "4 3"]
    a: Float[Array, "4 3"]
    b: Float[Array, "4 3"]
    lam: Float[Array, " 4"]


def _gjk(support: Callable, n0: Float[Array, "3"], tol: Float[Array, ""]):
    """GJK distance (Frank-Wolfe gap stopping rule, as mjc_ccd's gjk).

    Returns (simplex, x, inside): x = sum lam w is the point of K closest to the origin;
    inside means the simplex is a tetrahedron containing the origin.
    """
    w0, a0, b0 = support(n0)
    zeros = jnp.zeros((4, 3), n0.dtype)
    simplex = _Simplex(zeros.at[0].set(w0), zeros.at[0].set(a0), zeros.at[0].set(b0), jnp.zeros(4, n0.dtype).at[0].set(1.0))

    def cond(state):
        k, _, done = state
        return (k < GJK_ITERATIONS) & ~done

    def body(state):
        k, sx, _ = state
        x = sx.lam @ sx.w
        xnorm = safe_norm(x)
        n = -x / jnp.maximum(xnorm, MINVAL)
        w, a, b = support(n)
        gap = jnp.dot(x, x - w)  # Frank-Wolfe duality gap
        converged = (gap <= tol * jnp.maximum(xnorm, tol)) | (xnorm <= tol * 1e-3)
        mask = sx.lam > 0
        slot = jnp.argmin(mask)  # first free slot (a non-inside simplex has at most 3 points)
        new = _Simplex(sx.w.at[slot].set(w), sx.a.at[slot].set(a), sx.b.at[slot].set(b), sx.lam)
        new_mask = mask.at[slot].set(True)
        lam = _closest_on_simplex(new.w, new_mask)
        new = new._replace(lam=lam)
        no_progress = safe_norm(lam @ new.w) >= xnorm
        keep = converged | no_progress
        sx = jax.tree.map(lambda old, upd: jnp.where(keep, old, upd), sx, new)
        inside = jnp.all(sx.lam > 0)
        return k + 1, sx, converged | no_progress | inside

    _, simplex, _ = jax.lax.while_loop(cond, body, (0, simplex, jnp.array(False)))
    return simplex, simplex.lam @ simplex.w, jnp.all(simplex.lam > 0)


def _complete_tetrahedron(support: Callable, sx: _Simplex) -> _Simplex:
    """Tetrahedron for EPA when GJK stopped on a segment or triangle through the origin
    (touching within its tolerance): a segment gets a third point off its line, then the
    triangle the support point on the far side of its plane."""
    order = jnp.argsort(~(sx.lam > 0))  # the active slots first
    sx = jax.tree.map(lambda a: a[order], sx)
    edge = sx.w[1] - sx.w[0]
    perp = jnp.cross(edge, jnp.eye(3, dtype=edge.dtype)[jnp.argmin(jnp.abs(edge))])
    third = support(perp / jnp.maximum(safe_norm(perp), MINVAL))
    segment = jnp.sum(sx.lam > 0) == 2
    sx = _Simplex(*(jnp.where(segment, a.at[2].set(t), a) for a, t in zip(sx[:3], third)), sx.lam)
    normal = jnp.cross(sx.w[1] - sx.w[0], sx.w[2] - sx.w[0])
    normal = normal / jnp.maximum(safe_norm(normal), MINVAL)
    up, down = support(normal), support(-normal)
    use_up = jnp.dot(up[0], normal) >= -jnp.dot(down[0], normal)
    apex = tree_where(use_up, up, down)
    return _Simplex(sx.w.at[3].set(apex[0]), sx.a.at[3].set(apex[1]), sx.b.at[3].set(apex[2]), jnp.full(4, 0.25, sx.w.dtype))


# ----------------------------------------------------------------------------- EPA


def _face_plane(v: Float[Array, "3 3"]):
    normal = jnp.cross(v[1] - v[0], v[2] - v[0])
    norm = safe_norm(normal)
    ok = norm > MINVAL
    normal = normal / jnp.where(ok, norm, 1.0)
    return normal, jnp.where(ok, jnp.dot(normal, v[0]), jnp.inf)


def _epa(support: Callable, simplex: _Simplex, tol: Float[Array, ""], run: Bool[Array, ""]):
    """Expanding polytope from a tetrahedron containing the origin (penetration depth).

    Returns (normal, depth, a, b): the normal of the polytope's face closest to the origin, the
    depth along it (the support's) and the witnesses at the origin's projection onto the face;
    or, where EPA stopped short of converging, those of the iteration whose face normal had the
    least depth.
    """
    dtype = simplex.w.dtype
    nv = 4 + EPA_ITERATIONS
    verts = jnp.zeros((nv, 3, 3), dtype).at[:4].set(jnp.stack([simplex.w, simplex.a, simplex.b], axis=1))
    # initial tetrahedron faces, oriented outwards (away from the fourth vertex)
    tet = np.array([[0, 1, 2, 3], [0, 3, 1, 2], [0, 2, 3, 1], [1, 3, 2, 0]])
    w4 = simplex.w

    def orient(f):
        n = jnp.cross(w4[f[1]] - w4[f[0]], w4[f[2]] - w4[f[0]])
        flip = jnp.dot(n, w4[f[3]] - w4[f[0]]) > 0
        return jnp.where(flip, jnp.stack([f[0], f[2], f[1]]), f[:3])

    faces = jnp.zeros((EPA_FACES, 3), jnp.int32).at[:4].set(jax.vmap(orient)(jnp.asarray(tet, jnp.int32)))
    valid = jnp.zeros(EPA_FACES, bool).at[:4].set(True)

    normals, dists = jax.vmap(lambda f: _face_plane(verts[f, 0]))(faces)

    def closest(valid, dists):
        return jnp.argmin(jnp.where(valid, dists, jnp.inf))

    def cond(state):
        k, _, _, _, _, _, done, _ = state
        return (k < EPA_ITERATIONS) & ~done

    def body(state):
        k, verts, faces, valid, normals, dists, _, best = state
        f = closest(valid, dists)
        n = normals[f]
        w, a, b = support(n)
        depth = jnp.dot(w, n)  # the depth along n: an upper bound of the penetration depth
        best = tree_where(depth < best[1], (n, depth, faces[f]), best)  # (vertices are never overwritten)
        converged = depth - dists[f] <= tol
        idx = 4 + k
        verts_new = verts.at[idx].set(jnp.stack([w, a, b]))
        visible = valid & (jnp.einsum("fi,i->f", normals, w) - dists > tol * 1e-3)
        # directed edges (i -> j) of every face; an edge of a visible face is on the horizon
        # when its reverse belongs to a valid face that is not visible
        edges = jnp.stack([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]], axis=1).reshape(-1, 2)
        owner_vis = jnp.repeat(visible, 3)
        owner_keep = jnp.repeat(valid & ~visible, 3)
        # kept[i, j]: the directed edge i -> j belongs to a kept face (a vertex-pair table, not an
        # all-pairs edge comparison: 300 x 300 per iteration was most of a float32 EPA's time)
        kept = jnp.zeros((nv, nv), bool).at[jnp.where(owner_keep, edges[:, 0], nv), edges[:, 1]].set(True, mode="drop")
        horizon = owner_vis & kept[edges[:, 1], edges[:, 0]]
        free = ~valid | visible
        n_new, n_free = jnp.sum(horizon), jnp.sum(free)
        fits = n_new <= n_free
        hrank = prefix_count(horizon) - 1
        frank = prefix_count(free) - 1
        take = free & (frank < n_new)
        # the k-th horizon edge closes the k-th free face slot
        slot_of_rank = jnp.zeros(EPA_FACES, jnp.int32).at[jnp.where(free, frank, EPA_FACES)].set(
            jnp.arange(EPA_FACES, dtype=jnp.int32), mode="drop")
        target = jnp.where(horizon & (hrank < n_free), slot_of_rank[jnp.clip(hrank, 0, EPA_FACES - 1)], EPA_FACES)
        src = jnp.zeros(EPA_FACES, jnp.int32).at[target].set(jnp.arange(edges.shape[0], dtype=jnp.int32), mode="drop")
        new_faces = jnp.concatenate([edges[src], jnp.full((EPA_FACES, 1), idx, jnp.int32)], axis=1)
        faces_new = jnp.where(take[:, None], new_faces, faces)
        valid_new = (valid & ~visible) | take
        normals_new, dists_new = jax.vmap(lambda fc: _face_plane(verts_new[fc, 0]))(faces_new)
        # an expansion that loses the origin (a face has it outside now, none had before) is
        # wrong (float32, a horizon through near-coplanar faces): keep the polytope before it
        lost = jnp.any(valid_new & (dists_new < -tol)) & ~jnp.any(valid & (dists < -tol))
        stop = converged | ~fits | (n_new < 3) | lost
        keep = lambda old, upd: jnp.where(stop, old, upd)  # noqa: E731
        return (k + 1, keep(verts, verts_new), keep(faces, faces_new), keep(valid, valid_new),
                keep(normals, normals_new), keep(dists, dists_new), stop, best)

    best = (jnp.zeros(3, dtype), jnp.asarray(jnp.inf, dtype), faces[0])  # the queried face of least depth (n, depth, face)
    state = (jnp.int32(0), verts, faces, valid, normals, dists, ~run, best)
    _, verts, faces, valid, normals, dists, _, best = jax.lax.while_loop(cond, body, state)
    f = closest(valid, dists)
    n = normals[f]
    # Not converged (curved shapes in EPA_ITERATIONS), the closest face's normal can lie far from
    # the minimum where the depth varies little with the direction (two nearly coincident
    # cylinders: 113 degrees off, 0.0023 deeper, and the polish, a local method, kept it): the
    # answer at the iteration whose face normal had the least depth is taken where that depth is
    # below the final normal's by more than tol. Converged, the final normal's depth is within
    # tol of the least: unchanged.
    final = (n, jnp.dot(support(n)[0], n), faces[f])
    n, depth, face = tree_where(best[1] < final[1] - tol, best, final)
    tri = verts[face]  # (3 vertices, (w, a, b), 3)
    lam = _closest_on_simplex(jnp.concatenate([tri[:, 0], tri[:1, 0]]), jnp.array([True, True, True, False]))[:3]
    return n, depth, lam @ tri[:, 1], lam @ tri[:, 2]


# ------------------------------------------------------------------ Newton polish


def _mesh_feature(g: GeomFrame, witness: Float[Array, "3"], d: Float[Array, "3"], scale):
    """The hull feature supporting direction d (a vertex, an edge or a face) as (sigma0, active,
    vertex ids (v0, v1, v2)): the witness is v0 + sigma_1 (v1 - v0) + sigma_2 (v2 - v0) with the
    active edges; the kink equations are d . (v_k - v0) = 0."""
    vert = g.mesh.vert
    h = vert @ (g.mat.T @ d)
    tol = max(1e-6, 100 * float(jnp.finfo(h.dtype).eps)) * scale
    support = h >= jnp.max(h) - tol
    i0 = jnp.argmax(h)
    rel = vert - vert[i0]
    i1 = jnp.argmax(jnp.where(support, safe_norm(rel), -1.0))
    e1 = rel[i1]
    edge = safe_norm(e1) > tol
    u = e1 / jnp.where(edge, safe_norm(e1), 1.0)
    perp = safe_norm(rel - (rel @ u)[:, None] * u)
    i2 = jnp.argmax(jnp.where(support, perp, -1.0))
    face = edge & (perp[i2] > tol)
    e2 = rel[i2]
    p = g.mat.T @ (witness - g.pos) - vert[i0]
    # the face's coordinates: the 2x2 Gram system by Cramer's rule (its determinant |e1|^2 |e2 perp|^2 > 0)
    g11, g12, g22 = e1 @ e1, e1 @ e2, e2 @ e2
    det = jnp.where(face, g11 * g22 - g12**2, 1.0)
    coef = jnp.array([g22 * (e1 @ p) - g12 * (e2 @ p), g11 * (e2 @ p) - g12 * (e1 @ p)]) / det
    s1 = jnp.where(face, coef[0], jnp.where(edge, (e1 @ p) / jnp.where(edge, e1 @ e1, 1.0), 0.0))
    s2 = jnp.where(face, coef[1], 0.0)
    return jnp.array([s1, s2, 0.0]), jnp.array([edge, face, False]), jnp.stack([i0, i1, i2])


def _solve3(mat: Float[Array, "3 3"], v: Float[Array, "3"]) -> Float[Array, "3"]:
    """mat^-1 v by Cramer's rule: mat is a geom's rotation (or, in finite differences, a perturbed
    one, so not its transpose); an LU solve's loops cost seconds of compile in every convex pair."""
    c0, c1, c2 = mat[:, 0], mat[:, 1], mat[:, 2]
    det = ccd._det3
    return jnp.stack([det(v, c1, c2), det(c0, v, c2), det(c0, c1, v)]) / det(c0, c1, c2)


def _active_kinks(kind: int, g: GeomFrame, witness: Float[Array, "3"], d: Float[Array, "3"], radius, scale,
                  closed: Bool[Array, ""] | bool = False):
    """(sigma0, active, feature): the witness's subgradient coordinates, which kinks it sits in
    and (meshes) the vertices of its hull feature. closed: a witness at its feature's end counts
    as in it (`_polish`'s middle pass), so a direction that has reached a kink from one side,
    whose witness sits at the end of the kink's segment, gets the kink's equation."""
    s = g.size
    none = jnp.zeros(3, jnp.int32)
    if kind == MESH:
        return _mesh_feature(g, witness, d, scale)
    local = _solve3(g.mat, witness - g.pos - radius * d)  # inverse of the support's map
    inside = jnp.where(closed, 1.0 + KINK_TOLERANCE, 1.0 - KINK_TOLERANCE)
    # A kink is active where the witness is inside its feature and the direction near the kink
    # (m_k = 0 at the solution; `_kink_residual`). An EPA witness, a convex combination of support
    # points, sits inside the surface by its tolerance (3e-6 and more deep in a flat landscape):
    # read alone, a witness on a cylinder's side or rim was taken for one on its cap (normal at
    # 90 degrees from the axis), and the polish solved for the cap's normal, ending below its
    # start or, at the solution, with a step it could not take (the frame's derivative 0)
    m = g.mat.T @ d
    if kind == CAPSULE:
        sigma = jnp.array([0.0, 0.0, local[2] / s[1]])
        return sigma, jnp.array([False, False, (jnp.abs(sigma[2]) < inside) & (jnp.abs(m[2]) < KINK_ANGLE)]), none
    if kind == CYLINDER:  # of the cap and the side, the one the witness is nearer (at least one is at its bound)
        radial = jnp.array([local[0], local[1]]) / s[0]
        z = local[2] / s[1]
        off_side, off_cap = s[0] * (1.0 - safe_norm(radial)), s[1] * (1.0 - jnp.abs(z))
        cap = (safe_norm(radial) < inside) & ((off_cap < off_side) | closed) & (safe_norm(m[:2]) < KINK_ANGLE)
        side = (jnp.abs(z) < inside) & ~cap & (jnp.abs(m[2]) < KINK_ANGLE)
        return jnp.array([radial[0], radial[1], z]), jnp.array([cap, cap, side]), none
    if kind == BOX:  # never the axis of the face the witness is nearest
        sigma = local / s
        nearest_face = (jnp.arange(3) == jnp.argmin(s * (1.0 - jnp.abs(sigma)))) & ~closed
        return sigma, (jnp.abs(sigma) < inside) & ~nearest_face & (jnp.abs(m) < KINK_ANGLE), none
    return jnp.zeros(3, witness.dtype), jnp.zeros(3, bool), none


def _witness(kind: int, g: GeomFrame, d: Float[Array, "3"], sigma: Float[Array, "3"], active: Bool[Array, " 3"], feature):
    """Support point in unit direction d with active kinks at their subgradient sigma.

    This is grad h(d) of the shape's support function h, with the kink terms
    s_k |m_k| (m = R^T d) replaced by s_k sigma_k e_k where they are active.
    """
    m = g.mat.T @ d
    s = g.size
    r = _radius(kind, s)
    if kind == SPHERE:
        local = jnp.zeros(3, d.dtype)
    elif kind == CAPSULE:
        z = jnp.where(active[2], sigma[2], jnp.sign(m[2])) * s[1]
        local = jnp.array([0.0, 0.0, 1.0], d.dtype) * z
    elif kind == ELLIPSOID:
        sm = s * m
        local = s * sm / jnp.maximum(safe_norm(sm), MINVAL)
    elif kind == CYLINDER:
        mperp = jnp.array([m[0], m[1]])
        norm = jnp.maximum(safe_norm(mperp), MINVAL)
        radial = jnp.where(active[0], jnp.array([sigma[0], sigma[1]]), mperp / norm) * s[0]
        z = jnp.where(active[2], sigma[2], jnp.sign(m[2])) * s[1]
        local = jnp.array([radial[0], radial[1], z])
    elif kind == BOX:
        local = jnp.where(active, sigma, jnp.sign(m)) * s
    elif kind == MESH:
        v = g.mesh.vert[feature]
        local = v[0] + jnp.where(active[0], sigma[0], 0.0) * (v[1] - v[0]) + jnp.where(active[1], sigma[1], 0.0) * (v[2] - v[0])
    else:
        raise ValueError(kind)
    return g.pos + r * d + g.mat @ local


def _kink_residual(kind: int, g: GeomFrame, d, sigma, active, feature):
    """Equations of the kinks: m_k = 0 where active (m = R^T d; for a mesh, m_k = d . unit edge k
    of its feature), sigma_k (pinned at 0) elsewhere."""
    m = g.mat.T @ d
    if kind == MESH:
        edges = g.mesh.vert[feature[1:]] - g.mesh.vert[feature[0]]
        unit = edges / jnp.maximum(safe_norm(edges), MINVAL)[:, None]
        m = jnp.concatenate([unit @ m, jnp.zeros(1, m.dtype)])
    return jnp.where(active, m, sigma)


def _outside_kinks(kind: int, size, sigma: Float[Array, "3"], active: Bool[Array, " 3"]):
    """(over, past_end, within): per active kink, how far its witness at subgradient coordinate sigma
    lies beyond its feature, as a length (sigma's excess times the half-length or radius: a capsule's
    or a cylinder's side past its end, a cylinder's cap past its rim, a box's edge past its corner;
    <= 0 inside), sigma moved just past the end, where a witness reads as off the kink
    (`_active_kinks`), and sigma pulled just inside the end, where it reads as on the kink."""
    if kind == CYLINDER:  # the cap's radial pair (sigma_0, sigma_1), the side's axial sigma_2
        radial = safe_norm(sigma[:2])
        extent = jnp.array([radial, radial, jnp.abs(sigma[2])])
        end = jnp.concatenate([sigma[:2] / jnp.maximum(radial, MINVAL), jnp.sign(sigma[2:])])
        half = jnp.stack([size[0], size[0], size[1]])
    elif kind in (CAPSULE, BOX):
        extent, end = jnp.abs(sigma), jnp.sign(sigma)
        half = jnp.stack([size[0], size[1], size[1]]) if kind == CAPSULE else size
    else:  # spheres and ellipsoids have no kinks; a mesh's features are re-read from its hull
        return jnp.zeros(3, sigma.dtype), sigma, sigma
    within = jnp.where(extent > 1.0 - 2 * KINK_TOLERANCE, (1.0 - 2 * KINK_TOLERANCE) * end, sigma)
    return jnp.where(active, (extent - 1.0) * half, 0.0), (1.0 + 2 * KINK_TOLERANCE) * end, within


def _crossed_kinks(kind: int, g: GeomFrame, d_from: Float[Array, "3"], d_to: Float[Array, "3"], active: Bool[Array, " 3"]):
    """The inactive one-dimensional kinks (a capsule's or a cylinder's side, a box's edges) that the
    direction crosses on its way from d_from, where it is near them, to d_to: m_k (m = R^T d)
    changes sign."""
    if kind not in (CAPSULE, CYLINDER, BOX):
        return jnp.zeros(3, bool)
    m_from, m_to = g.mat.T @ d_from, g.mat.T @ d_to
    line = jnp.array([kind == BOX, kind == BOX, True])
    return line & ~active & (m_from * m_to < 0) & (jnp.abs(m_from) < KINK_ANGLE)


def _polish(k1: int, g1: GeomFrame, k2: int, g2: GeomFrame, n0, a0, b0, scale):
    """Newton on the optimality conditions of (1) from (n0, a0, b0); returns (n, a, b).

    Unknowns x = (u, v, sigma_1, sigma_2) with n = normalize(n0 + u t1 + v t2). The last
    step is taken on the differentiable inputs (see the module docstring).

    The settling steps are safeguarded to ascend s(n) of (1), which the exact supports give
    whatever the kinks: the longest of the Newton step's fractions 1, 1/2, 1/4, 1/8 that does
    not lower s, else the best of four gradient-ascent steps on (u, v) that raises it, else
    none. Newton alone finds the stationary point nearest the start, and from EPA's start
    deep inside a flat landscape (an ellipsoid inside a cylinder: local maxima of s within
    1e-3 of each other) that was at times a saddle below the start, whose contact
    `polished` then had to replace by the start with a frozen normal (the frame's
    derivative 0 against finite differences of 939; fuzz seed 12).
    """
    g1s, g2s, scale = jax.lax.stop_gradient((g1, g2, scale))
    r1, r2 = _radius(k1, g1s.size), _radius(k2, g2s.size)
    support = _pair_support(k1, g1s, k2, g2s, core=False)
    # s is read to round-off of the support points, whose size is that of the positions
    s_slack = 100 * float(jnp.finfo(n0.dtype).eps) * (scale + jnp.max(jnp.abs(g1s.pos)) + jnp.max(jnp.abs(g2s.pos)))
    newton_fractions = jnp.asarray([1.0, 0.5, 0.25, 0.125], n0.dtype)
    ascent_lengths = jnp.asarray([4.0, 1.0, 0.25, 0.0625], n0.dtype) / scale  # angle per unit of |grad s|

    def setup(n0, a0, b0, closed=False, add1=False, add2=False):
        """The pass's tangent frame at n0, the kinks the witnesses a0, b0 sit in (and the kinks
        add1, add2), and the start x."""
        frame = make_frame(n0)
        sig1, act1, feat1 = _active_kinks(k1, g1s, a0, n0, r1, scale, closed)
        sig2, act2, feat2 = _active_kinks(k2, g2s, b0, -n0, r2, scale, closed)
        act1, act2 = act1 | add1, act2 | add2
        x = jnp.zeros(8, n0.dtype).at[2:5].set(jnp.where(act1, sig1, 0.0)).at[5:8].set(jnp.where(act2, sig2, 0.0))
        return (n0, frame[1], frame[2], act1, feat1, act2, feat2), x

    def direction(ctx, x):
        n0, t1, t2 = ctx[:3]
        n = n0 + x[0] * t1 + x[1] * t2
        return n / safe_norm(n)

    def contact(ctx, x, g1, g2):
        """(n, a, b) at x."""
        n = direction(ctx, x)
        _, _, _, act1, feat1, act2, feat2 = ctx
        return n, _witness(k1, g1, n, x[2:5], act1, feat1), _witness(k2, g2, -n, x[5:8], act2, feat2)

    def residual(x, ctx, g1, g2):
        n, a, b = contact(ctx, x, g1, g2)
        _, t1, t2, act1, feat1, act2, feat2 = ctx
        gap = a - b
        gap_t = gap - n * jnp.dot(n, gap)  # must vanish: b - a = d n
        tangential = jnp.stack([jnp.dot(t1, gap_t), jnp.dot(t2, gap_t)]) / scale
        kinks = (_kink_residual(k1, g1, n, x[2:5], act1, feat1), _kink_residual(k2, g2, -n, x[5:8], act2, feat2))
        r = jnp.concatenate([tangential, *kinks])
        return r, r

    def step(ctx, x, differentiable=None):
        """One damped Newton step; differentiable: the geoms (g1, g2) whose derivative the step carries
        (through the residual only: the Jacobian is held fixed, as differentiating its jacfwd would
        trace second derivatives)."""
        jac, r = jax.jacfwd(residual, has_aux=True)(x, ctx, g1s, g2s)  # one evaluation for both
        if differentiable is not None:
            r = residual(x, ctx, *differentiable)[0]
        # damped least squares: exact Newton where the solution is unique, minimal change
        # (keeping EPA's witness) where it is not (parallel faces). The damping must stay
        # above round-off of jac^T jac, or a float32 solve there is singular (NaN)
        mu = max(1e-12, 10 * float(jnp.finfo(x.dtype).eps)) * (1.0 + jnp.trace(jac.T @ jac))
        dx = linalg.solve(jac.T @ jac + mu * jnp.eye(8, dtype=x.dtype), jac.T @ r)
        return x - dx, r

    def separation(ctx, x):
        """s(n) of (1) at x's direction, and its gradient in (u, v) up to a positive factor."""
        n = direction(ctx, x)
        _, a, b = support(n)
        gap = b - a
        tangential = gap - n * jnp.dot(n, gap)
        return jnp.dot(n, gap), jnp.stack([jnp.dot(ctx[1], tangential), jnp.dot(ctx[2], tangential)])

    def newton_fraction(ctx, x, dx, s0):
        """The longest of `newton_fractions` of the step dx that does not lower s below s0 (0: none)."""
        s_newton = jax.vmap(lambda f: separation(ctx, x + f * dx)[0])(newton_fractions)
        ok = s_newton >= s0 - s_slack
        return jnp.where(jnp.any(ok), newton_fractions[jnp.argmax(ok)], 0.0)

    def safe_step(ctx, x):
        """One settling step that never lowers s (see the docstring), the full Newton step's target
        and the residual at x."""
        s0, ascent = separation(ctx, x)
        target, r = step(ctx, x)
        dx = target - x
        fraction = newton_fraction(ctx, x, dx, s0)
        gradient = jnp.broadcast_to(x, (4, 8)).at[:, :2].add(ascent_lengths[:, None] * ascent)
        s_gradient = jax.vmap(lambda y: separation(ctx, y)[0])(gradient)
        best = jnp.argmax(s_gradient)
        # at a maximum of s on kinks that pin n (two crossed sides: n along the cross product of their
        # axes), the step's change of n is the solve's round-off, along which the kinked s drops
        # linearly: no fraction passed, and the witnesses kept EPA's tangential gap (crossed cylinders:
        # 0.1, the position's derivative that of witnesses fixed on their bodies). Such a step is taken
        # on the witnesses alone, n and s unchanged
        pinned = jnp.max(jnp.abs(dx[:2])) < jnp.sqrt(jnp.finfo(x.dtype).eps)
        fallback = jnp.where(s_gradient[best] > s0, gradient[best], jnp.where(pinned, x + dx.at[:2].set(0.0), x))
        return jnp.where(fraction > 0, x + fraction * dx, fallback), target, jnp.max(jnp.abs(r))

    def settle(p, carry):
        """Pass p (0, 1, 2) on stop-gradient inputs: PASS_ITERATIONS[p] steps from its start.
        Pass 0 settles the witnesses from EPA's reading of the kinks. Pass 1 re-reads them, with
        the features closed where pass 0 stalled (residual above sqrt(eps)): a direction that
        reached a kink (a capsule's side nearly parallel to a cylinder's) has its witness at the
        segment's end, read as off the kink, and the polish could only oscillate across it (the
        frame's derivative 0 against differences of 14; fuzz_fd seed 26). Pass 2 re-reads strictly
        and leaves its last step to the differentiable one below. Before a re-read, a kink whose
        Newton solution lies beyond its feature (EPA's witness 1e-6 inside a capsule's end, the
        direction 0.1 degree off the kink: no step could be taken) has its witness moved past the
        end, so it is read as off the kink; the kinks kept are read at sigma pulled inside their
        features (a pass that stalled far out on two nearly parallel sides, sigma at 18 and 21,
        dropped the one farther out and lost the other with it: the frame's derivative 0 against
        differences of up to 40).
        Where pass 0's Newton step crosses an inactive kink, that kink is added for pass 1 and none
        is dropped: EPA's witness on a cylinder's rim, the solution on its side against a capsule's,
        2 degrees away; pass 0 had only the capsule's side, whose Newton target lay 87 degrees off
        and beyond the capsule's end, and dropped it (derivative 0 against 21). Later passes only
        drop: a kink added after pass 0 could not be dropped again.
        One loop over the passes: their steps are traced (and compiled) once."""
        start, _, stuck, add1, add2 = carry
        ctx, x = setup(*start, (p == 1) & stuck, add1, add2)
        steps = jnp.asarray(PASS_ITERATIONS)[p]
        x, target, r = jax.lax.fori_loop(0, steps, lambda _, c: safe_step(ctx, c[0]), (x, x, stuck_above))
        over1, end1, _ = _outside_kinks(k1, g1s.size, target[2:5], ctx[3])
        over2, end2, _ = _outside_kinks(k2, g2s.size, target[5:8], ctx[5])
        within1, within2 = _outside_kinks(k1, g1s.size, x[2:5], ctx[3])[2], _outside_kinks(k2, g2s.size, x[5:8], ctx[5])[2]
        # pass 0's step crossing an inactive kink: add it, drop none (a target past a missing kink is no guide)
        n_x, n_target = direction(ctx, x), direction(ctx, target)
        add1 = _crossed_kinks(k1, g1s, n_x, n_target, ctx[3]) & (p == 0)
        add2 = _crossed_kinks(k2, g2s, -n_x, -n_target, ctx[5]) & (p == 0)
        # else one kink at a time, the farthest out: a wrong kink distorts the others' solution.
        # Out by a length, not by sigma: two nearly parallel sides whose lines meet beyond both ends
        # touch at the end of the one that ends first, the one farther from where the lines meet
        worst = jnp.where(jnp.any(add1) | jnp.any(add2), jnp.inf, jnp.maximum(jnp.max(over1), jnp.max(over2)))
        out1, out2 = (over1 > 0) & (over1 >= worst), (over2 > 0) & (over2 >= worst)
        sigma1 = jnp.where(out1, end1, jnp.where(ctx[3], within1, x[2:5]))
        sigma2 = jnp.where(out2, end2, jnp.where(ctx[5], within2, x[5:8]))
        read = x.at[2:5].set(sigma1).at[5:8].set(sigma2)
        n, a, b = contact(ctx, read, g1s, g2s)
        # a pass that converged onto the dropped kink leaves m_k = 0 up to round-off, where the
        # kink's witness, now read as off it, jumps between its feature's ends (`_witness`: sign(m_k))
        # and a 1e-7 change of pose sent the next pass to the wrong end (a 0.05 rad error in the
        # normal): the direction is tilted a hair toward the end the kink was dropped at
        tilt = g1s.mat @ jnp.where(out1, end1, 0.0) - g2s.mat @ jnp.where(out2, end2, 0.0)
        n = n + 100 * jnp.finfo(n.dtype).eps * tilt
        return tree_where(p < 2, (n / safe_norm(n), a, b), start), x, r > stuck_above, add1, add2

    n0, a0, b0 = jax.lax.stop_gradient((n0, a0, b0))
    stuck_above = jnp.sqrt(jnp.finfo(n0.dtype).eps)  # a pass's residual (dimensionless) above this: it stalled
    no_kinks = jnp.zeros(3, bool)
    start, x, *_ = jax.lax.fori_loop(0, 3, settle, ((n0, a0, b0), jnp.zeros(8, n0.dtype), jnp.array(False), no_kinks, no_kinks))
    ctx, _ = setup(*start)
    # the differentiable step, as far along as it does not lower s (all of it at a solution)
    dx = step(ctx, x, (g1, g2))[0] - x
    fraction = newton_fraction(ctx, x, jax.lax.stop_gradient(dx), separation(ctx, x)[0])
    return contact(ctx, x + fraction * dx, g1, g2)


# ------------------------------------------------------------------------- driver


def _bound(kind: int, size, mesh=None) -> Float[Array, ""]:
    """A length scale of the shape (MuJoCo's rbound for these types)."""
    if kind == SPHERE:
        return size[0]
    if kind == CAPSULE:
        return size[0] + size[1]
    if kind == CYLINDER:
        return jnp.sqrt(size[0] ** 2 + size[1] ** 2)
    if kind == MESH:
        return jnp.max(safe_norm(mesh.vert))
    return safe_norm(size)


POLYTOPES = (BOX, MESH)  # (a height field's prisms are meshes)


def _vertex_id(kind: int, g: GeomFrame, d, prism: bool):
    """The support vertex's id MuJoCo records (box corner bits, mesh vertex; -1 else and for a
    height field's prism, whose support function leaves it unset)."""
    m = g.mat.T @ d
    if kind == BOX:
        return jnp.sum(jnp.where(m >= 0, jnp.array([1, 2, 4]), 0)).astype(jnp.int32)
    if kind == MESH and not prism:
        return jnp.argmax(g.mesh.vert @ m).astype(jnp.int32)
    return jnp.asarray(-1, jnp.int32)


def _mujoco_contact(k1: int, g1: GeomFrame, k2: int, g2: GeomFrame, margin, tolerance: float, iterations: int, prism: bool) -> ccd.Result:
    """MuJoCo's contact (mjc_penetration, nativeccd) between the two geoms (`ccd.py`); prism:
    g1 is a height field's prism."""
    half = 0.5 * margin
    r1, r2 = _radius(k1, g1.size), _radius(k2, g2.size)

    def support(core: bool):
        e1 = half if k1 not in (SPHERE, CAPSULE) else (0.0 if core else r1 + half)
        e2 = half if k2 not in (SPHERE, CAPSULE) else (0.0 if core else r2 + half)

        def fn(d):
            a = _core_support(k1, g1, d) + e1 * d
            b = _core_support(k2, g2, -d) - e2 * d
            return a - b, a, b, jnp.stack([_vertex_id(k1, g1, d, prism), _vertex_id(k2, g2, -d, False)])

        return fn

    rounded = None
    if k1 in (SPHERE, CAPSULE) or k2 in (SPHERE, CAPSULE):
        rounded = tuple(r + half if k in (SPHERE, CAPSULE) else jnp.zeros_like(r) for k, r in ((k1, r1), (k2, r2)))
    discrete = (margin == 0) & (k1 in POLYTOPES) & (k2 in POLYTOPES)
    tol = jnp.asarray(tolerance, g1.pos.dtype)
    return ccd.penetration(support(True), support(False), g1.pos, g2.pos, rounded, discrete, margin, tol, iterations)


def _search_start(k1: int, g1: GeomFrame, k2: int, g2: GeomFrame, n_init, tol):
    """Stages 1-2 (stop-gradient inputs): the polish's start (n0, a0, b0) from our GJK and EPA."""
    # 1. GJK on the cores (sphere -> centre, capsule -> segment)
    core = _pair_support(k1, g1, k2, g2, core=True)
    sx, x, core_inside = _gjk(core, n_init, tol)
    dist_core = safe_norm(x)
    n_core = -x / jnp.maximum(dist_core, MINVAL)
    # apart, the support gap along n_core is the distance; below it and negative (the shapes
    # overlap along GJK's own direction), GJK stalled short of the origin (float32, touching:
    # 4e-6 off, gap -0.73 m) and the pair goes to EPA like a touching one. (Far apart, float32
    # round-off can also leave the gap below the distance, but positive: still apart.)
    gap_core = -jnp.dot(n_core, core(n_core)[0])
    stalled = (gap_core < dist_core - 10 * tol) & (gap_core < 0)
    apart = ~core_inside & (dist_core > tol) & ~stalled  # inside: x is 0 up to round-off
    r1, r2 = _radius(k1, g1.size), _radius(k2, g2.size)
    a_core = sx.lam @ sx.a + r1 * n_core
    b_core = sx.lam @ sx.b - r2 * n_core

    # 2. GJK on the whole shapes when the cores touch, then EPA
    rounded = k1 in (SPHERE, CAPSULE) or k2 in (SPHERE, CAPSULE)
    full = _pair_support(k1, g1, k2, g2, core=False)
    if rounded:
        sx, x, inside = _gjk(full, n_init, tol)
    else:
        inside = jnp.all(sx.lam > 0)
    on_triangle = ~inside & (jnp.sum(sx.lam > 0) >= 2) & ((safe_norm(x) <= tol) | (stalled & (not rounded)))
    sx = tree_where(on_triangle, _complete_tetrahedron(full, sx), sx)
    inside = inside | on_triangle
    n_epa, _, a_epa, b_epa = _epa(full, sx, tol, ~apart & inside)
    xnorm = safe_norm(x)
    n_touch = jnp.where(xnorm > MINVAL, -x / jnp.maximum(xnorm, MINVAL), n_init)
    n0 = jnp.where(apart, n_core, jnp.where(inside, n_epa, n_touch))
    a0 = jnp.where(apart, a_core, jnp.where(inside, a_epa, sx.lam @ sx.a))
    b0 = jnp.where(apart, b_core, jnp.where(inside, b_epa, sx.lam @ sx.b))
    return n0, a0, b0


def convex_contact(k1: int, k2: int, prism: bool = False, with_face: bool = False) -> Callable:
    """Narrow-phase function (base contract, one slot) for geom types k1 <= k2; prism: g1 is a
    height field's prism (a 6-vertex mesh). with_face: the function returns (contact, MuJoCo's
    `ccd.Result` (stop-gradient, with its final EPA face) or None, whether MuJoCo reports the contact);
    the Result is there where MuJoCo's contact is replayed (float64 with ccd)."""

    def search(g1: GeomFrame, g2: GeomFrame, margin, ccd):
        """Stop-gradient stages: (scale, tol, the polish's start (n0, a0, b0), MuJoCo's contact or None,
        where it holds)."""
        dtype = g1.pos.dtype
        gs1, gs2 = jax.lax.stop_gradient((g1, g2))
        scale = _bound(k1, gs1.size, gs1.mesh) + _bound(k2, gs2.size, gs2.mesh)
        tol = scale * jnp.sqrt(jnp.finfo(dtype).eps) * 1e-2  # GJK / EPA stopping tolerance (length)
        centre = gs2.pos - gs1.pos
        n_init = jnp.where(safe_norm(centre) > MINVAL, centre, jnp.array([1.0, 0.0, 0.0], dtype))
        n_init = n_init / safe_norm(n_init)
        if ccd is None:
            return scale, tol, _search_start(k1, gs1, k2, gs2, n_init, tol), None, None
        # MuJoCo's contact is the start: its witnesses are pos -+ dist n / 2 (b - a = dist n).
        # Where it reports none, the contact is invalid and the polish only has to stay finite
        mj = _mujoco_contact(k1, gs1, k2, gs2, jax.lax.stop_gradient(margin), *ccd, prism)
        finite = jnp.isfinite(mj.dist) & jnp.all(jnp.isfinite(mj.pos)) & jnp.all(jnp.isfinite(mj.normal))
        use = mj.contact & finite
        _, a_far, b_far = _pair_support(k1, gs1, k2, gs2, core=False)(n_init)
        n0 = jnp.where(use, mj.normal, n_init)
        a0 = jnp.where(use, mj.pos - 0.5 * mj.dist * mj.normal, a_far)
        b0 = jnp.where(use, mj.pos + 0.5 * mj.dist * mj.normal, b_far)
        return scale, tol, (n0, a0, b0), mj, use

    def polished(g1: GeomFrame, g2: GeomFrame, margin, found) -> Collision:
        """Stage 3 from the start, differentiable. The polish's steps do not lower s(n) of (1);
        should its witnesses (those of the kinks it read) still give a dist worse than the start's,
        the start is kept (then only dist is differentiable: by the envelope theorem at fixed n0).
        With MuJoCo's contact, its value with the exact contact's derivative."""
        scale, tol, (n0, a0, b0), mj, use = found
        n, a, b = _polish(k1, g1, k2, g2, n0, a0, b0, scale)
        dist = jnp.dot(n, b - a)
        _, a_start, b_start = _pair_support(k1, g1, k2, g2, core=False)(n0)
        dist_start = jnp.dot(n0, b_start - a_start)
        worse = dist < dist_start - 10 * tol
        n = jnp.where(worse, n0, n)
        dist = jnp.where(worse, dist_start, dist)
        pos = 0.5 * jnp.where(worse, a_start + b_start, a + b)
        valid = dist < margin
        if mj is not None:
            straight = lambda exact, value: jnp.where(use, exact + jax.lax.stop_gradient(value - exact), exact)  # noqa: E731
            dist, pos, n = straight(dist, mj.dist), straight(pos, mj.pos), straight(n, mj.normal)
            valid = use
        return Collision(dist=dist[None], pos=pos[None], frame=make_frame(n)[None], valid=valid[None])

    def value(found) -> Collision:
        """MuJoCo's contact from `search` (no contact: the start, finite, never read: invalid)."""
        _, _, (n0, a0, b0), mj, use = found
        dist = jnp.where(use, mj.dist, jnp.dot(n0, b0 - a0))
        pos = jnp.where(use, mj.pos, 0.5 * (a0 + b0))
        return Collision(dist=dist[None], pos=pos[None], frame=make_frame(n0)[None], valid=use[None])

    @jax.custom_jvp
    def replayed(g1: GeomFrame, g2: GeomFrame, margin, found) -> Collision:
        """MuJoCo's contact as the value (`ccd.py`); the polish runs only where a derivative is taken
        (a custom JVP: forward-only programs, such as plain rollouts, neither trace nor run it).
        `found` (stop-gradient) is an argument, not computed inside: under differentiation JAX
        traces a custom JVP's function and its rule separately, and MuJoCo's replay would be
        traced twice (the mesh manifold scene's collide gradient: 32 -> 23 s of tracing)."""
        return value(found)

    @replayed.defjvp
    def _replayed_jvp(primals, tangents):
        g1, g2, margin, found = primals
        exact = lambda g1, g2: polished(g1, g2, margin, found)  # noqa: E731
        _, tangent = jax.jvp(exact, (g1, g2), tangents[:2])
        return value(found), tangent

    def fn(g1: GeomFrame, g2: GeomFrame, margin: Float[Array, ""], ccd: tuple[float, int] | None = None) -> Collision:
        """ccd: MuJoCo's (ccd_tolerance, ccd_iterations): in float64 the contact's value is then
        MuJoCo's (`ccd.py`: within ccd_tolerance of the exact one for curved shapes), its
        derivative the exact contact's, polished from MuJoCo's (our GJK and EPA do not run)."""
        if ccd is not None and g1.pos.dtype == jnp.float64:
            found = search(g1, g2, margin, ccd)
            contact = replayed(g1, g2, margin, found)
            return (contact, found[3], found[4]) if with_face else contact
        contact = polished(g1, g2, margin, search(g1, g2, margin, None))
        return (contact, None, None) if with_face else contact

    fn.__name__ = f"convex_{k1}_{k2}"
    return fn


# MuJoCo 4 sends capsule-cylinder, cylinder-cylinder and cylinder-box to mjc_Convex too,
# and builds 2-4 point manifolds for them: `multiccd` wraps this single contact for those.
PAIRS = [
    (SPHERE, ELLIPSOID),
    (CAPSULE, ELLIPSOID),
    (ELLIPSOID, ELLIPSOID),
    (ELLIPSOID, CYLINDER),
    (ELLIPSOID, BOX),
]

FUNCTIONS: dict[tuple[int, int], tuple[Callable, int]] = {pair: (convex_contact(*pair), 1) for pair in PAIRS}
