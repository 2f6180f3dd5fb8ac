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
as MuJoCo makes for spheres and ellipsoids. MuJoCo's multiccd builds 2-4 point manifolds
for capsules, cylinders, boxes and meshes against a mesh; those are refused at load
(`io`) unless multiccd is disabled, when MuJoCo too makes one contact.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from .base import Collision, GeomFrame
from .convex import BOX, CAPSULE, CYLINDER, ELLIPSOID, MESH, SPHERE, convex_contact
from .multiccd import _quad
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
    contains = jnp.any(hull.poly == s, axis=1)
    facing = (hull.normal @ g2.mat.T) @ n
    face = jnp.argmin(jnp.where(contains, jax.lax.stop_gradient(facing), jnp.inf))
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


def _single(k1: int, k2: int) -> tuple[Callable, int]:
    return convex_contact(k1, k2), 1


# MuJoCo's multiccd makes manifolds for these (not reproduced: refused unless multiccd is disabled)
MULTICCD_PAIRS = [(CAPSULE, MESH), (CYLINDER, MESH), (BOX, MESH), (MESH, MESH)]

FUNCTIONS: dict[tuple[int, int], tuple[Callable, int]] = {
    (PLANE, MESH): (plane_mesh, 4),
    **{(k, MESH): _single(k, MESH) for k in (SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH)},
}
