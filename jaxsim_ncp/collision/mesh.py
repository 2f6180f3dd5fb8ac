"""Mesh geoms: MuJoCo collides a mesh as its convex hull (`GeomFrame.mesh`).

Plane-mesh (`plane_mesh`, up to 4 contacts, checked against MuJoCo 4):

1. The support vertex s of the hull in the direction -n (n the plane normal): the deepest
   vertex, the first in vertex order on ties.
2. Of the hull polygons containing s, the one whose normal is most anti-parallel to n.
3. Its vertices in polygon order starting at s; a polygon of more than 4 vertices is reduced
   to 4 by the greedy largest-area quadrilateral of `multiccd._quad`.
4. Each of those vertices v with signed distance d = n.(v - plane) <= margin is a contact
   at v - d/2 n, normal n (none at all when s is farther than margin).

Step 3 for polygons of more than 4 vertices is where we may differ from MuJoCo: MuJoCo 4
picks 4 of their vertices by a rule we could not reproduce from its output (it is not the
largest-area quadrilateral); ours are 4 points of the same face with the same normal, so a
body resting on such a face is supported the same way, but the contact points differ.

Every other convex geom against a mesh goes through `convex.convex_contact` (GJK, EPA and
the Newton polish, with the hull's vertex/edge/face features as its kinks): one contact,
as MuJoCo makes for spheres and ellipsoids. For capsules, cylinders, boxes and meshes
against a mesh, MuJoCo's multiccd (on by default) turns that contact into a 2-4 point
manifold where flat features touch (`mesh_manifold`, MuJoCo's multicontact):

1. Features of each shape at the contact, as MuJoCo reads them off its final EPA face where its
   contact is replayed (float64 with ccd; boxes and meshes): each shape's distinct support vertices
   on that face give its dimension (vertex, edge or face; simplexDim), the polygons common to them
   its candidate faces (a box's faces from its corner ids) and the edges at them its candidate edges
   (the face's edge, or at a vertex the edge to the previous vertex of each polygon there).
   Otherwise (float32, and capsules and cylinders) geometric: the support set in the contact
   direction (within 1e-6 of the shape's size), the faces containing it (a cylinder's facing cap; a
   capsule has none) and its edges (a capsule's surface line, a cylinder's side line).
2. Two faces anti-parallel within cos = 0.996 (the most anti-parallel pair): the second's polygon is
   clipped by the first's side planes (`multiccd._manifold`). Else, if the lower-dimensional
   feature is an edge or vertex, one of its edges within 0.0888 of parallel to a face of the other
   shape (MuJoCo's: the first face, then edge, in list order; geometric: the most parallel) is
   clipped against that face; where there is none, the other shape's edges are tried. Else the
   single contact.
3. At most 4 points (2 with a capsule), MuJoCo's largest-area quadrilateral.

Against MuJoCo along its own trajectories (`experiments/contacts_vs_mujoco.py`): 27 bunnies (612-
polygon hulls) every 20 of 400 steps, all 378 mesh-mesh, 64 capsule-mesh and 459 plane-mesh pair
samples alike (the geometric rule: 8 and 16 differ); the float32 geometric features agree wherever
the contact is not on a near-tie. Known difference: a cylinder cap lying fully inside a mesh face
clips to a regular 16-gon, and MuJoCo keeps a different 4 of its near-tied vertices than
`multiccd._quad` does here.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..math import make_frame, tree_where
from .base import Collision, GeomFrame
from .convex import BOX, CAPSULE, CYLINDER, ELLIPSOID, MESH, SPHERE, _bound, convex_contact
from .multiccd import EDGE_TOLERANCE, FACE_TOLERANCE, _edge, _faces, _manifold, _normalize, _pad, _pad_slots, _quad
from .primitives import PLANE, _collision, _compact


def plane_mesh(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
    """Plane (g1) against a mesh's hull (g2): up to 4 vertices of the face resting on the plane."""
    n = g1.mat[:, 2]
    hull = g2.mesh
    world = g2.pos + hull.vert @ g2.mat.T  # (V, 3)
    dist = (world - g1.pos) @ n
    s = jnp.argmax(hull.vert @ (g2.mat.T @ -n))

    # the face at s most anti-parallel to n
    k = hull.poly.shape[1]  # vertices of the largest polygon
    around = hull.vert_poly[s]  # the polygons containing s, ascending (ties go to the first)
    facing = (hull.normal[jnp.maximum(around, 0)] @ g2.mat.T) @ n
    face = around[jnp.argmin(jnp.where(around >= 0, jax.lax.stop_gradient(facing), jnp.inf))]
    ring = hull.poly[face]
    count = jnp.sum(ring >= 0)
    start = jnp.argmax(ring == s)
    order = ring[(start + jnp.arange(max(k, 4))) % jnp.maximum(count, 1)]  # from s, polygon order
    if k > 4:
        corners = _quad(world[order], count, jnp.ones((), n.dtype))
        order = jnp.where(count > 4, order[corners], order[:4])
    valid = (jnp.arange(4) < count) & (dist[order] <= margin) & (dist[s] <= margin)
    d = dist[order]
    pos = world[order] - (0.5 * d)[:, None] * n
    (d, pos), valid = _compact((d, pos), valid, 4)
    return _collision(list(d), list(pos), [n] * 4, list(valid))


class _Features(NamedTuple):
    """A shape's features at a contact: candidate faces (normals (F, 3), polygons (F, R, 3) in
    MuJoCo's vertex order, vertex counts, mask), the support set's dimension and candidate edges
    ((E, 2, 3) endpoints, mask)."""

    normals: jax.Array
    polys: jax.Array
    counts: jax.Array
    faces: jax.Array
    dim: jax.Array
    edges: jax.Array
    edge_ok: jax.Array


def _rows(polys, rows: int):
    """Polygons (F, R, 3) padded to `rows` rows by repeating each one's first vertex."""
    return jnp.concatenate([polys, jnp.repeat(polys[:, :1], rows - polys.shape[1], axis=1)], axis=1)


@functools.lru_cache(maxsize=8)
def vertex_polygons(mesh_polyvert: tuple, nvert: int) -> np.ndarray:
    """(nmesh, nvert, m): per hull vertex the polygons containing it, ascending, padded with -1
    (m the largest such count): a mesh's features at a vertex cost m polygons, not all of them."""
    around = [[[] for _ in range(nvert)] for _ in mesh_polyvert]
    for mesh, polys in enumerate(mesh_polyvert):
        for p, poly in enumerate(polys):
            for v in poly:
                if v >= 0:
                    around[mesh][v].append(p)
    width = max([len(a) for mesh in around for a in mesh] + [1])
    table = np.full((len(mesh_polyvert), nvert, width), -1, np.int32)
    for mesh, verts in enumerate(around):
        for v, polys in enumerate(verts):
            table[mesh, v, : len(polys)] = polys
    return table


def _simplex_dim(ids, points):
    """simplexDim: the dimension (1-3) of one shape's side of the final EPA face (its support vertex
    ids (3,) and points (3, 3)), reordered so that the first `dim` vertices are the distinct ones."""
    same01, same02, same12 = ids[0] == ids[1], ids[0] == ids[2], ids[1] == ids[2]
    dim = jnp.where(same01, jnp.where(same02, 1, 2), jnp.where(same02 | same12, 2, 3))
    move = same01 & ~same02  # (a, a, c) -> (a, c, c)
    order = jnp.where(move, jnp.array([0, 2, 2]), jnp.arange(3))
    return dim, ids[order], points[order]


def _first(mask):
    """The first True of a boolean array, alone (all False stays all False)."""
    return mask & (jnp.cumsum(mask) == 1)


def _mesh_features(g: GeomFrame, towards, rows: int, simplex=None) -> _Features:
    """A hull's features at a contact. Geometric (simplex None): the support set in direction
    `towards`, the polygons containing it and its edges: the support edge, or at a support vertex s
    the edge to the previous vertex of each polygon. From MuJoCo's final EPA face (simplex: this
    shape's vertex ids and support points): its dimension (simplexDim), the polygons common to its
    vertices (meshNormals: dim 3 the first common to all three, dim 2 the first two common to both,
    dim 1 all at the vertex) and its edges (meshEdgeNormals: dim 2 the face's edge, dim 1 the edge to
    the previous vertex of each polygon at the vertex). Either way only the polygons at one vertex s
    are candidates (`MeshShape.vert_poly`, in polygon order)."""
    hull = g.mesh
    world = g.pos + hull.vert @ g.mat.T
    if simplex is None:
        h = jax.lax.stop_gradient(hull.vert @ (g.mat.T @ towards))
        tol = 1e-6 * jax.lax.stop_gradient(_bound(MESH, g.size, hull))
        s = jnp.argmax(h)
        support = h >= h[s] - tol
    else:
        dim, ids, points = _simplex_dim(*simplex)
        s = ids[0]
        start = world[s] + jax.lax.stop_gradient(points[0] - world[s])  # MuJoCo's point, the vertex's derivative
    around = hull.vert_poly[s]  # (m,) polygon ids, -1 padded
    contains = around >= 0
    poly = hull.poly[jnp.maximum(around, 0)]  # (m, K), -1 padded
    k = poly.shape[1]
    real = poly >= 0
    count = jnp.sum(real, axis=1)
    at = jnp.argmax(poly == s, axis=1)  # s's slot in each polygon containing it
    prev = jnp.take_along_axis(poly, ((at + count - 1) % jnp.maximum(count, 1))[:, None], axis=1)[:, 0]
    edges = jnp.stack([jnp.broadcast_to(world[s], (prev.shape[0], 3)), world[jnp.maximum(prev, 0)]], axis=1)
    if simplex is None:
        in_support = jnp.sum(real & support[jnp.maximum(poly, 0)], axis=1)
        dim = jnp.minimum(jnp.max(jnp.where(contains, in_support, 1)), 3)
        faces = contains & (in_support >= dim) & (count > 0)
        # the edge from s to its previous vertex in each polygon containing s: every edge at s once (its
        # two polygons run along it in opposite directions), the support edge among them
        ok = contains & jnp.where(dim == 2, support[jnp.maximum(prev, 0)], dim == 1)
    else:
        share = lambda v: contains & jnp.any((around[:, None] == hull.vert_poly[v][None, :]), axis=1)  # noqa: E731
        edge_set = share(ids[1]) & (jnp.cumsum(share(ids[1])) <= 2)
        faces = jnp.where(dim == 1, contains, jnp.where(dim == 2, edge_set, _first(edge_set & share(ids[2]))))
        single = jnp.arange(prev.shape[0]) == 0
        edges = edges.at[:, 0].set(start)
        end = world[ids[1]] + jax.lax.stop_gradient(points[1] - world[ids[1]])
        edges = jnp.where((dim == 2) & single[:, None, None], jnp.stack([start, end]), edges)
        ok = jnp.where(dim == 1, contains, (dim == 2) & single)
    j = jnp.arange(k)
    reverse = jnp.where(j[None, :] < count[:, None], count[:, None] - 1 - j[None, :], count[:, None] - 1)  # meshFace's order
    polys = _rows(world[jnp.take_along_axis(jnp.maximum(poly, 0), reverse, axis=1)], rows)
    return _Features(hull.normal[jnp.maximum(around, 0)] @ g.mat.T, polys, count, faces, dim, edges, ok)


def _box_features(g: GeomFrame, towards, rows: int, one, simplex=None) -> _Features:
    """A box's features at a contact. Geometric (simplex None): its support corner, edge or face in
    direction `towards`, the faces containing it and its edges (the support edge, or the 3 at the
    corner). From MuJoCo's final EPA face (corner ids: bit k set = +size along axis k): its dimension
    (simplexDim), the faces common to its corners (boxNormals: all 3 at a corner, 2 at an edge, 1 for
    a face; other counts: the face within cos 0.996 of `towards`) and its edges (boxEdgeNormals: the
    face's edge, or the 3 at the corner)."""
    normals, polys, counts = _faces(BOX, g, one)
    to_world = lambda local: g.pos + (local * g.size) @ g.mat.T  # noqa: E731
    if simplex is None:
        m = jax.lax.stop_gradient(g.mat.T @ towards)
        zero = jnp.abs(m) <= 1e-6
        dim = jnp.minimum(1 + jnp.sum(zero), 3)
        faces = jnp.stack([m > 0, m < 0], axis=1).reshape(-1) & ~jnp.repeat(zero, 2)
        corner = jnp.where(m >= 0, 1.0, -1.0)
        start = to_world(corner)
        ok = jnp.where(dim == 1, True, jnp.where(dim == 2, zero, False))
    else:
        dim, ids, points = _simplex_dim(*simplex)
        bits = (ids[:, None] >> jnp.arange(3)) & 1  # (vertex, axis)
        used = (jnp.arange(3) < dim)[:, None]
        common = jnp.stack([jnp.all(~used | (bits == 1), axis=0), jnp.all(~used | (bits == 0), axis=0)], axis=1).reshape(-1)
        near = _first(jax.lax.stop_gradient(normals @ towards) > FACE_TOLERANCE)  # boxNormals2 (towards: a unit vector)
        faces = jnp.where(jnp.sum(common) == jnp.array([0, 3, 2, 1])[dim], common, near)
        corner = 2.0 * bits[0] - 1.0
        start = to_world(corner)
        start = start + jax.lax.stop_gradient(points[0] - start)  # MuJoCo's point, the corner's derivative
        ok = jnp.where(dim == 1, True, (dim == 2) & (jnp.arange(3) == 0))
    flips = corner[None, :] * jnp.where(jnp.eye(3, dtype=bool), -1.0, 1.0)
    edges = jnp.stack([jnp.broadcast_to(start, (3, 3)), to_world(flips)], axis=1)
    if simplex is not None:
        end = to_world(2.0 * bits[1] - 1.0)
        end = end + jax.lax.stop_gradient(points[1] - end)
        edges = jnp.where((dim == 2) & (jnp.arange(3) == 0)[:, None, None], jnp.stack([start, end]), edges)
    return _Features(normals, _rows(polys, rows), counts, faces, dim, edges, ok)


def _round_features(kind: int, g: GeomFrame, witness, towards, rows: int, one) -> _Features:
    """A capsule (no faces; its surface line through the witness) or a cylinder (the cap facing
    the other shape unless the contact is on the side; its side line), as in `multiccd`."""
    if kind == CAPSULE:  # its surface line facing the other shape: only the witness's offset from the
        # axis matters, r towards (exact, where the witness's place along a lying capsule is not unique)
        witness = g.pos + g.size[0] * towards
    edge, _ = _edge(kind, g, witness, towards, one)
    if kind == CAPSULE:
        dtype = g.pos.dtype
        return _Features(jnp.zeros((1, 3), dtype), jnp.zeros((1, rows, 3), dtype), jnp.zeros(1, jnp.int32),
                         jnp.zeros(1, bool), jnp.asarray(1), edge[None], jnp.ones(1, bool))  # fmt: skip
    normals, polys, counts = _faces(CYLINDER, g, one)
    facing = jax.lax.stop_gradient(normals @ towards)
    has = jnp.abs(jax.lax.stop_gradient(jnp.dot(g.mat[:, 2], towards))) > EDGE_TOLERANCE
    faces = has & (facing == jnp.max(facing))
    return _Features(normals, _rows(polys, rows), counts, faces, jnp.where(has, 1, 2), edge[None], jnp.ones(1, bool))


def mesh_manifold(k1: int, k2: int) -> tuple[Callable, int]:
    """Narrow phase of a capsule, cylinder, box or mesh (k1) against a mesh (k2) with MuJoCo's
    multiccd manifold (module docstring), and its slot count."""
    limit = 2 if k1 == CAPSULE else 4
    single = convex_contact(k1, k2, with_face=True)

    def features(kind, g, witness, towards, rows, one, simplex):
        if kind == MESH:
            return _mesh_features(g, towards, rows, simplex)
        if kind == BOX:
            return _box_features(g, towards, rows, one, simplex)
        return _round_features(kind, g, witness, towards, rows, one)

    def fn(g1: GeomFrame, g2: GeomFrame, margin, ccd=None) -> Collision:
        base, mj, reported = single(g1, g2, margin, ccd)
        one = (g1.pos[0] + g2.pos[0]) * 0.0 + 1.0  # see multiccd._mul
        n, dist = base.frame[0, 0], base.dist[0]
        ns = jax.lax.stop_gradient(n)
        rows = max(16, g2.mesh.poly.shape[1], g1.mesh.poly.shape[1] if k1 == MESH else 0)
        # MuJoCo's features come from its final EPA face: where its contact is replayed (float64) ours do
        # too, for boxes and meshes; else (and for capsules and cylinders) they are the geometric ones
        epa = mj is not None
        simplex1 = (mj.face_ids[:, 0], mj.face_a) if epa and k1 in (BOX, MESH) else None
        simplex2 = (mj.face_ids[:, 1], mj.face_b) if epa else None
        f1 = features(k1, g1, base.pos[0] - 0.5 * dist * n, ns, rows, one, simplex1)
        f2 = features(k2, g2, base.pos[0] + 0.5 * dist * n, -ns, rows, one, simplex2)
        # face-face: the most anti-parallel pair of candidate faces, within FACE_TOLERANCE
        dots = jax.lax.stop_gradient(f1.normals @ f2.normals.T)
        pairs = f1.faces[:, None] & f2.faces[None, :]
        i, j = jnp.unravel_index(jnp.argmin(jnp.where(pairs, dots, jnp.inf)), dots.shape)
        aligned = pairs[i, j] & (dots[i, j] < -FACE_TOLERANCE)

        def edge_on_face(edges, edge_ok, normals, faces):
            """(edge, face, found): a candidate edge within EDGE_TOLERANCE of parallel to a candidate face
            (MuJoCo's alignedFaceEdge: the first face, then edge, in order; geometric: the most parallel)."""
            axis = jax.vmap(lambda e: _normalize(e[1] - e[0], one))(edges)
            cos = jnp.abs(jax.lax.stop_gradient(normals @ axis.T))  # (face, edge)
            both = faces[:, None] & edge_ok[None, :]
            if epa:
                f, e = jnp.unravel_index(jnp.argmax(both & (cos < EDGE_TOLERANCE)), cos.shape)
            else:
                f, e = jnp.unravel_index(jnp.argmin(jnp.where(both, cos, jnp.inf)), cos.shape)
            return e, f, both[f, e] & (cos[f, e] < EDGE_TOLERANCE)

        e1, f2e, found1 = edge_on_face(f1.edges, f1.edge_ok, f2.normals, f2.faces)
        e2, f1e, found2 = edge_on_face(f2.edges, f2.edge_ok, f1.normals, f1.faces)
        # the lower-dimensional feature's edges (geom 1's on a tie); where they lie on no face, the other
        # shape's (MuJoCo 4 does: the bunnies' edge contacts)
        first1 = (f1.dim < 3) & (f1.dim <= f2.dim)
        edge1, edge2 = (f1.dim < 3) & found1, (f2.dim < 3) & found2
        use1 = ~aligned & edge1 & (first1 | ~edge2)
        use2 = ~aligned & ~use1 & edge2

        edges1 = f1.edges[e1]
        if k1 == CAPSULE:  # as multiccd's: inflated witness, deflated along the face normal; the offset
            # follows the normal's derivative (the face's, on a moving mesh), not only the capsule's pose
            edges1 = _edge(CAPSULE, g1, g1.pos + (g1.size[0] + 0.5 * margin) * n, None, one)[0]
            edges1 = edges1 + (0.5 * margin) * jax.lax.stop_gradient(f2.normals[f2e])
        if k1 == CYLINDER:  # its side line towards the face it lies on (MuJoCo 4.0.1), not along the contact normal
            edges1 = _edge(CYLINDER, g1, None, -f2.normals[f2e], one)[0]
        size = 2 * rows + 4
        # reference polygon and normal, incident polygon (or edge), witness direction
        ref, nref, rn = tree_where(use1, (f2.polys[f2e], f2.counts[f2e], f2.normals[f2e]),
                              tree_where(use2, (f1.polys[f1e], f1.counts[f1e], f1.normals[f1e]),
                                    (f1.polys[i], f1.counts[i], f1.normals[i])))  # fmt: skip
        edge = tree_where(use1, edges1, f2.edges[e2])
        if epa:  # MuJoCo's EPA points lie on the margin-inflated shapes; it deflates them along the face normal
            from_epa = jnp.where(use1, k1 in (BOX, MESH), True) & jnp.stack([True, jnp.where(use1, f1.dim, f2.dim) == 2])
            edge = edge + jnp.where(from_epa[:, None], (0.5 * margin) * jax.lax.stop_gradient(rn), 0.0)
        inc, ninc = tree_where(aligned, _pad(f2.polys[j], f2.counts[j], size), _pad(edge, 2, size))
        rdir = jnp.where(aligned, f2.normals[j], -rn)
        edge_axis = jax.lax.stop_gradient(edge[1] - edge[0])
        w1, w2, w2i, d, ok = _manifold(ref, nref, inc, ninc, rn, rdir, edge_axis, limit, margin, one)
        p1, p2 = tree_where(use1, (w2, w1), (w1, w2))
        gap = jnp.where(use1, w2i - w1, w1 - w2i)  # geom 1 -> geom 2 on the inflated shapes
        active = (aligned | use1 | use2) & jnp.any(ok) & (jnp.min(jnp.where(ok, d, jnp.inf)) < margin)
        if epa:
            active = active & reported
        normal = _normalize(_normalize(gap, one), one)
        slots = Collision(dist=jnp.where(ok, d, 0.0), pos=(p1 + p2) * 0.5, frame=jax.vmap(make_frame)(normal), valid=ok)
        return tree_where(active, slots, _pad_slots(base, limit))

    fn.__name__ = f"mesh_manifold_{k1}_{k2}"
    return fn, limit


def _single(k1: int, k2: int) -> tuple[Callable, int]:
    return convex_contact(k1, k2), 1


# MuJoCo's multiccd makes manifolds for these (one contact each with multiccd disabled, `driver`)
MULTICCD_PAIRS = [(CAPSULE, MESH), (CYLINDER, MESH), (BOX, MESH), (MESH, MESH)]

FUNCTIONS: dict[tuple[int, int], tuple[Callable, int]] = {
    (PLANE, MESH): (plane_mesh, 4),
    **{(k, MESH): _single(k, MESH) for k in (SPHERE, ELLIPSOID)},
    **{pair: mesh_manifold(*pair) for pair in MULTICCD_PAIRS},
}
