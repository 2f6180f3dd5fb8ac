"""Ray casting against geoms (mj_ray): the distance x >= 0 along pnt + x vec to the nearest
surface, and the surface normal there; -1 (and a zero normal) where nothing is hit.

Each primitive is intersected in its own frame, as MuJoCo's engine_ray does:
- plane: its front face only (rays going against +z), inside the rendered rectangle
  (size <= 0: unbounded);
- sphere, ellipsoid: the smaller non-negative root of |p + x v|^2_S = 1 (from inside: the exit);
- capsule: the cylinder's side between its caps (smaller non-negative root) and the two
  hemispherical caps; cylinder: the side and the two flat discs; box: its six faces;
- mesh: every triangle of the mesh (not only its convex hull); height field: its base box,
  its terrain triangles and its four side walls up to the terrain's edge profile.
Only visible geoms count (alpha of the geom or its material non-zero), and not the geoms of
the excluded body (the sensor's own). x is differentiable wherever the hit lies on a
smooth piece of a surface.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import math
from .types import Data, GeomType, Model

MINVAL = 1e-15  # mjMINVAL
_NO_HIT = -1.0


def _roots(a, b, c):
    """Both roots x0 <= x1 of a x^2 + 2 b x + c = 0 (ray_quad), -1 where none are real or a ~ 0."""
    det = b * b - a * c
    ok = (det >= 0) & (a >= MINVAL)
    sq = jnp.where(det > 0, jnp.sqrt(jnp.where(det > 0, det, 1.0)), 0.0)
    safe_a = jnp.where(ok, a, 1.0)
    return jnp.where(ok, (-b - sq) / safe_a, _NO_HIT), jnp.where(ok, (-b + sq) / safe_a, _NO_HIT)


def _first_root(a, b, c):
    """The smallest non-negative root, -1 if none."""
    x0, x1 = _roots(a, b, c)
    return jnp.where(x0 >= 0, x0, jnp.where(x1 >= 0, x1, _NO_HIT))


def _nearest(xs, normals):
    """Pick, along the first axis, the smallest non-negative x and its normal; -1 and 0 if none."""
    key = jnp.where(xs >= 0, xs, jnp.inf)
    k = jnp.argmin(key, axis=0)
    x = jnp.take_along_axis(xs, k[None], axis=0)[0]
    normal = jnp.take_along_axis(normals, jnp.broadcast_to(k[None, ..., None], (1,) + normals.shape[1:]), axis=0)[0]
    hit = jnp.isfinite(jnp.min(key, axis=0))
    return jnp.where(hit, x, _NO_HIT), jnp.where(hit[..., None], normal, 0.0)


def _axis(k: int, sign, like):
    e = jnp.zeros(like.shape[:-1] + (3,), like.dtype)
    return e.at[..., k].set(sign)


def _sphere_like(p, v, scale):
    """Ellipsoid (and sphere) hit: |p + x v|^2 weighted by scale = 1/size^2."""
    a = jnp.sum(scale * v * v, -1)
    b = jnp.sum(scale * v * p, -1)
    c = jnp.sum(scale * p * p, -1) - 1.0
    x = _first_root(a, b, c)
    return x, math.normalize(scale * (p + x[..., None] * v))


def _round_side(p, v, radius, half):
    """The side of a z-aligned cylinder of this radius between z = -half and half."""
    a = v[..., 0] ** 2 + v[..., 1] ** 2
    b = v[..., 0] * p[..., 0] + v[..., 1] * p[..., 1]
    c = p[..., 0] ** 2 + p[..., 1] ** 2 - radius**2
    x = _first_root(a, b, c)
    point = p + x[..., None] * v
    x = jnp.where((x >= 0) & (jnp.abs(point[..., 2]) <= half), x, _NO_HIT)
    return x, math.normalize(point * jnp.array([1.0, 1.0, 0.0], p.dtype))


def _capsule(p, v, size):
    radius, half = size[..., 0], size[..., 1]
    xs, ns = [], []
    x, n = _round_side(p, v, radius, half)
    xs.append(x), ns.append(n)
    for side in (1.0, -1.0):  # hemispherical caps: only the outer halves count
        center = jnp.stack([jnp.zeros_like(half), jnp.zeros_like(half), side * half], -1)
        q = p - center
        for root in _roots(jnp.sum(v * v, -1), jnp.sum(v * q, -1), jnp.sum(q * q, -1) - radius**2):
            z = p[..., 2] + root * v[..., 2]
            outer = (z >= half) if side > 0 else (z <= -half)
            xs.append(jnp.where((root >= 0) & outer, root, _NO_HIT))
            ns.append(math.normalize(q + root[..., None] * v))
    return _nearest(jnp.stack(xs), jnp.stack(ns))


def _cylinder(p, v, size):
    radius, half = size[..., 0], size[..., 1]
    xs, ns = [], []
    x, n = _round_side(p, v, radius, half)
    xs.append(x), ns.append(n)
    moving = jnp.abs(v[..., 2]) > MINVAL
    vz = jnp.where(moving, v[..., 2], 1.0)
    for side in (-1.0, 1.0):
        x = (side * half - p[..., 2]) / vz
        point = p + x[..., None] * v
        inside = point[..., 0] ** 2 + point[..., 1] ** 2 <= radius**2
        xs.append(jnp.where(moving & (x >= 0) & inside, x, _NO_HIT))
        ns.append(_axis(2, side, p))
    return _nearest(jnp.stack(xs), jnp.stack(ns))


def _box(p, v, size):
    xs, ns = [], []
    for k in range(3):
        moving = jnp.abs(v[..., k]) > MINVAL
        vk = jnp.where(moving, v[..., k], 1.0)
        others = [j for j in range(3) if j != k]
        for side in (-1.0, 1.0):
            x = (side * size[..., k] - p[..., k]) / vk
            point = p + x[..., None] * v
            inside = (jnp.abs(point[..., others[0]]) <= size[..., others[0]]) & (jnp.abs(point[..., others[1]]) <= size[..., others[1]])
            xs.append(jnp.where(moving & (x >= 0) & inside, x, _NO_HIT))
            ns.append(_axis(k, side, p))
    return _nearest(jnp.stack(xs), jnp.stack(ns))


def _plane(p, v, size):
    facing = v[..., 2] < -MINVAL
    x = -p[..., 2] / jnp.where(facing, v[..., 2], -1.0)
    point = p + x[..., None] * v
    inside = ((size[..., 0] <= 0) | (jnp.abs(point[..., 0]) <= size[..., 0])) & (
        (size[..., 1] <= 0) | (jnp.abs(point[..., 1]) <= size[..., 1])
    )
    return jnp.where(facing & (x >= 0) & inside, x, _NO_HIT), _axis(2, 1.0, p)


def primitive(geom_type: int, size, p, v):
    """Hit distance and normal (geom frame) of a ray (p, v in the geom frame) with a primitive."""
    if geom_type == GeomType.PLANE:
        return _plane(p, v, size)
    if geom_type == GeomType.SPHERE:
        return _sphere_like(p, v, 1.0 / size[..., :1] ** 2)
    if geom_type == GeomType.ELLIPSOID:
        return _sphere_like(p, v, 1.0 / size**2)
    if geom_type == GeomType.CAPSULE:
        return _capsule(p, v, size)
    if geom_type == GeomType.CYLINDER:
        return _cylinder(p, v, size)
    if geom_type == GeomType.BOX:
        return _box(p, v, size)
    raise ValueError(f"no ray intersection for geom type {geom_type}")


def triangles(tri: Float[Array, "ntri 3 3"], p, v):
    """Nearest hit of a ray with a triangle soup (ray_triangle): barycentric inside test, x >= 0;
    the normal is (v0 - v2) x (v1 - v2), normalized, as MuJoCo reports it."""
    e1, e2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    pvec = jnp.cross(v, e2)
    det = jnp.sum(e1 * pvec, -1)
    ok = jnp.abs(det) > MINVAL
    inv = 1.0 / jnp.where(ok, det, 1.0)
    s = p - tri[:, 0]
    u = jnp.sum(s * pvec, -1) * inv
    qvec = jnp.cross(s, e1)
    w = jnp.sum(v * qvec, -1) * inv
    x = jnp.sum(e2 * qvec, -1) * inv
    hit = ok & (u >= 0) & (w >= 0) & (u + w <= 1) & (x >= 0)
    normal = math.normalize(jnp.cross(tri[:, 0] - tri[:, 2], tri[:, 1] - tri[:, 2]))
    return _nearest(jnp.where(hit, x, _NO_HIT), normal)


def hfield_triangles(nrow: int, ncol: int, size: np.ndarray, elevation: np.ndarray) -> np.ndarray:
    """The terrain's triangles (mj_rayHfield's two per cell, counter-clockwise seen from above) and
    its side walls from z = 0 up to the edge profile, in the geom frame: (ntri, 3, 3)."""
    xs = np.linspace(-size[0], size[0], ncol)
    ys = np.linspace(-size[1], size[1], nrow)
    z = np.asarray(elevation, np.float64).reshape(nrow, ncol) * size[2]
    X, Y = np.meshgrid(xs, ys)
    grid = np.stack([X, Y, z], -1)
    v00, v01, v11, v10 = grid[:-1, :-1], grid[:-1, 1:], grid[1:, 1:], grid[1:, :-1]
    tris = [np.stack([v00, v01, v11], -2).reshape(-1, 3, 3), np.stack([v00, v11, v10], -2).reshape(-1, 3, 3)]
    # x = -sx, x = sx, y = -sy, y = sy; ordered so that the walls' normals point outwards
    for edge in (grid[::-1, 0], grid[:, -1], grid[0, :], grid[-1, ::-1]):
        top0, top1 = edge[:-1], edge[1:]
        bottom0, bottom1 = top0 * [1, 1, 0], top1 * [1, 1, 0]
        tris += [np.stack([bottom0, bottom1, top1], -2), np.stack([bottom0, top1, top0], -2)]
    return np.concatenate(tris)


def geom_ray_surfaces(m) -> tuple[np.ndarray, ...]:
    """Per geom of a compiled MjModel, the triangles a ray meets on a mesh or height field
    (geom frame); (0, 3, 3) for the primitives."""
    out = []
    for g in range(m.ngeom):
        kind, data_id = int(m.geom_type[g]), int(m.geom_dataid[g])
        if kind == GeomType.MESH:
            vert = np.asarray(m.mesh_vert[m.mesh_vertadr[data_id] : m.mesh_vertadr[data_id] + m.mesh_vertnum[data_id]])
            face = np.asarray(m.mesh_face[m.mesh_faceadr[data_id] : m.mesh_faceadr[data_id] + m.mesh_facenum[data_id]])
            out.append(vert[face].astype(np.float64))
        elif kind == GeomType.HFIELD:
            adr, nrow, ncol = int(m.hfield_adr[data_id]), int(m.hfield_nrow[data_id]), int(m.hfield_ncol[data_id])
            out.append(hfield_triangles(nrow, ncol, m.hfield_size[data_id], m.hfield_data[adr : adr + nrow * ncol]))
        else:
            out.append(np.zeros((0, 3, 3)))
    return tuple(out)


def ray(model: Model, data: Data, pnt, vec, exclude_body: int):
    """mj_ray over the visible geoms not on `exclude_body` (static geoms included, no group
    filter): (distance along vec, world normal), -1 and 0 where nothing is hit."""
    topo = model.topology
    gtype = np.asarray(topo.geom_type, dtype=np.int64)
    eligible = np.asarray(topo.geom_visible, bool) & (np.asarray(topo.geom_bodyid, dtype=np.int64) != exclude_body)
    xs, normals = [], []
    for kind in np.unique(gtype[eligible]):
        geoms = np.nonzero(eligible & (gtype == kind))[0]
        mat = data.geom_xmat[geoms]
        p = jnp.einsum("gji,gj->gi", mat, pnt - data.geom_xpos[geoms])  # into each geom's frame
        v = jnp.einsum("gji,j->gi", mat, vec)
        if kind in (GeomType.MESH, GeomType.HFIELD):
            for k, g in enumerate(geoms):
                x, n = triangles(model.geom_ray_triangles[g], p[k], v[k])
                if kind == GeomType.HFIELD:  # and the solid base box below z = 0
                    hsize = model.hfield_size[topo.geom_dataid[g]]
                    base = jnp.stack([hsize[0], hsize[1], 0.5 * hsize[3]])
                    xb, nb = _box(p[k] + jnp.stack([0.0, 0.0, 0.5 * hsize[3]]), v[k], base)
                    x, n = _nearest(jnp.stack([x, xb]), jnp.stack([n, nb]))
                xs.append(x[None]), normals.append((mat[k] @ n)[None])
        else:
            x, n = primitive(int(kind), model.geom_size[geoms], p, v)
            xs.append(x), normals.append(jnp.einsum("gij,gj->gi", mat, n))
    if not xs:
        return jnp.full((), _NO_HIT, pnt.dtype), jnp.zeros(3, pnt.dtype)
    return _nearest(jnp.concatenate(xs), jnp.concatenate(normals))
