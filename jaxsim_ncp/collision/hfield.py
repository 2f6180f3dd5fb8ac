"""Height fields against convex geoms (mjc_ConvexHField): one contact per triangular prism.

A height field of nrow x ncol elevations e in [0, 1] spans [-size0, size0] x [-size1, size1]
in its frame; grid point (r, c) is at (c dx - size0, r dy - size1, e[r, c] size2) with
dx = 2 size0 / (ncol - 1), dy = 2 size1 / (nrow - 1). Each cell (r, c-1)..(r+1, c) is split
along its (c-1, r)-(c, r+1) diagonal into two triangles, in MuJoCo's order

    T1 = (c-1, r+1), (c-1, r), (c, r+1)        T2 = (c-1, r), (c, r+1), (c, r)

and each triangle extruded down to z = -size3 is a convex prism. The other geom (in the
height field's frame) is bounded by its support points along the axes; the cells under
that box (rows rmin..rmax-1, columns cmin+1..cmax, floor/ceil of its extent in grid units)
are collided prism by prism with the general convex narrow phase (`convex.convex_contact`,
the prism as a 6-vertex hull), skipping prisms whose top lies entirely below the geom;
at most mjMAXCONPAIR = 50 contacts, the first in that (row, column, triangle) order.
Normals point from the height field to the geom.

With a margin m (MuJoCo 4.0.1, probed): the sub-grid comes from the box grown by m, the
height test raises the prism tops by m, and each prism is collided with the margin as any
convex pair (distances are the true ones, positive within the margin).

The window of cells is static: (rows, columns) = ceil(2 (rbound + m) / (dy, dx)) + 1 for the
largest geom (and margin) of the group at load, which covers any pose (`io`).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .base import Collision, GeomFrame, MeshShape
from .convex import MESH, _core_support, _radius, convex_contact

HFIELD = 1
PARTNERS = (2, 3, 4, 5, 6, MESH)  # sphere, capsule, ellipsoid, cylinder, box, mesh
MAX_CONTACTS = 50  # mjMAXCONPAIR

# the two triangles of a cell as (row offset, column offset) of their corners, MuJoCo's order
_TRIANGLES = np.array([[(1, -1), (0, -1), (1, 0)], [(0, -1), (1, 0), (0, 0)]])


def window(rbound: float, size: np.ndarray, nrow: int, ncol: int) -> tuple[int, int]:
    """(rows, columns) of grid cells a geom of bounding radius `rbound` can overlap."""
    dx, dy = 2 * size[0] / (ncol - 1), 2 * size[1] / (nrow - 1)
    return int(np.ceil(2 * rbound / dy)) + 1, int(np.ceil(2 * rbound / dx)) + 1


def collider(kind: int, nrow: int, ncol: int, cells: tuple[int, int], elevation, size, ccd=None) -> Callable:
    """Narrow-phase function (base contract) of a height field (g1) against a geom of `kind`,
    with 2 * rows * columns contact slots; `elevation` (nrow * ncol) and `size` (4) are the
    height field's (model leaves, so differentiable); ccd as `convex.convex_contact`'s."""
    prism_contact = jax.vmap(functools.partial(convex_contact(MESH, kind, prism=True), ccd=ccd), in_axes=(0, None, None))
    rows, cols = cells

    def fn(g1: GeomFrame, g2: GeomFrame, margin) -> Collision:
        # the geom in the height field's frame and its bounding box there (support along the axes)
        local = GeomFrame(g1.mat.T @ (g2.pos - g1.pos), g1.mat.T @ g2.mat, g2.size, g2.mesh)
        axes = jnp.eye(3, dtype=g1.pos.dtype)
        radius = _radius(kind, g2.size)
        hi = jnp.stack([_core_support(kind, local, a)[k] + radius for k, a in enumerate(axes)])
        lo = jnp.stack([_core_support(kind, local, -a)[k] - radius for k, a in enumerate(axes)])
        s0, s1, s2, s3 = size[0], size[1], size[2], size[3]
        apart = (jnp.any(lo[:2] - margin > size[:2]) | jnp.any(hi[:2] + margin < -size[:2])
                 | (lo[2] - margin > s2) | (hi[2] + margin < -s3))  # fmt: skip

        grid = lambda x, s, n: (x + s) / (2 * s) * (n - 1)  # noqa: E731  (grid units)
        # the sub-grid under the box grown by the margin (MuJoCo 4.0.1, probed)
        cmin = jnp.clip(jnp.floor(grid(lo[0] - margin, s0, ncol)), 0, ncol - 1).astype(jnp.int32)
        cmax = jnp.clip(jnp.ceil(grid(hi[0] + margin, s0, ncol)), 0, ncol - 1).astype(jnp.int32)
        rmin = jnp.clip(jnp.floor(grid(lo[1] - margin, s1, nrow)), 0, nrow - 1).astype(jnp.int32)
        rmax = jnp.clip(jnp.ceil(grid(hi[1] + margin, s1, nrow)), 0, nrow - 1).astype(jnp.int32)
        cell_r = rmin + jnp.arange(rows)[:, None, None]  # (rows, 1, 1): cell rows r, columns c - 1..c
        cell_c = cmin + 1 + jnp.arange(cols)[None, :, None]
        in_window = jnp.broadcast_to((cell_r < rmax) & (cell_c <= cmax) & ~apart, (rows, cols, 2))
        r = jnp.clip(cell_r[..., None] + _TRIANGLES[:, :, 0], 0, nrow - 1)  # (rows, cols, 2 triangles, 3 corners)
        c = jnp.clip(cell_c[..., None] + _TRIANGLES[:, :, 1], 0, ncol - 1)
        r, c = jnp.broadcast_arrays(r, c)
        x = c * (2 * s0 / (ncol - 1)) - s0
        y = r * (2 * s1 / (nrow - 1)) - s1
        top = jnp.stack([x, y, elevation[r * ncol + c] * s2], -1)  # (rows, cols, 2, 3 corners, 3)
        bottom = top.at[..., 2].set(-s3)
        vert = jnp.concatenate([top, bottom], axis=-2).reshape(-1, 6, 3)  # top first: MuJoCo's tie-break
        high_enough = jnp.any(top[..., 2] + margin >= lo[2], axis=-1).reshape(-1)  # MuJoCo's prism height test (tops raised by the margin)

        centre = jnp.mean(vert, axis=1)  # each prism in a frame at its centroid: scale-free tolerances
        n = vert.shape[0]
        dummy_poly = jnp.zeros((n, 1, 3), jnp.int32)
        prisms = GeomFrame(
            g1.pos + centre @ g1.mat.T, jnp.broadcast_to(g1.mat, (n, 3, 3)), jnp.broadcast_to(g1.size, (n, 3)),
            MeshShape(vert - centre[:, None], dummy_poly, jnp.zeros((n, 1, 3), g1.pos.dtype), jnp.zeros((n, 6, 1), jnp.int32)),
        )  # fmt: skip
        col = prism_contact(prisms, g2, margin)
        valid = col.valid[:, 0] & in_window.reshape(-1) & high_enough
        valid = valid & (jnp.cumsum(valid) <= MAX_CONTACTS)
        return Collision(dist=col.dist[:, 0], pos=col.pos[:, 0], frame=col.frame[:, 0], valid=valid)

    fn.__name__ = f"hfield_{kind}"
    return fn
