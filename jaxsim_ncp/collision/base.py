"""Shared types of the narrow phase: a geom's world frame in, a fixed-size contact set out.

Every collision function has the signature

    fn(g1: GeomFrame, g2: GeomFrame, margin: Float[Array, ""]) -> Collision

for one geom pair, where g1's MuJoCo geom type is <= g2's (mjtGeom order: plane,
hfield, sphere, capsule, ellipsoid, cylinder, box). It returns a static number n of
candidate contacts (MuJoCo's maximum for that pair); `valid` marks the ones MuJoCo
would emit (dist <= margin and the geometric case produces that point). Normals
point from g1 to g2 (MuJoCo's convention), `frame` rows are (normal, tangent1,
tangent2) exactly as in mjData.contact.frame. Mesh geoms (type 7) carry their hull in
`GeomFrame.mesh`. Functions are pure, jit/vmap-able, and
have finite gradients everywhere.
"""

from __future__ import annotations

from typing import NamedTuple

from jaxtyping import Array, Bool, Float, Int


class MeshShape(NamedTuple):
    """A mesh geom's convex hull (MuJoCo collides meshes as their hull), in the geom frame."""

    vert: Float[Array, "v 3"]  # hull vertices (padded by repeating the first)
    poly: Int[Array, "p k"]  # hull polygons as indices into vert, padded with -1
    normal: Float[Array, "p 3"]  # outward polygon normals
    vert_poly: Int[Array, "v m"]  # the polygons containing each vertex, ascending, padded with -1


class GeomFrame(NamedTuple):
    pos: Float[Array, "3"]  # geom_xpos
    mat: Float[Array, "3 3"]  # geom_xmat; column k is the geom's k-th local axis in world
    size: Float[Array, "3"]  # geom_size
    mesh: MeshShape | None = None  # mesh geoms only


class Collision(NamedTuple):
    dist: Float[Array, " n"]  # signed distance, negative in penetration
    pos: Float[Array, "n 3"]  # contact point (MuJoCo's midpoint convention)
    frame: Float[Array, "n 3 3"]  # rows: normal (g1 -> g2), tangent1, tangent2
    valid: Bool[Array, " n"]
