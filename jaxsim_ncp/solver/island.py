"""Constraint islands (MuJoCo's mj_island): kinematic trees coupled by constraint rows.

MuJoCo's Newton solver runs each island as its own problem: its own line search (one
step length per island), tolerance scale (1 / the island's summed mass-matrix
diagonal) and iteration count; dofs of trees no row touches take qacc_smooth. With a
converged solver this changes nothing (the cost separates over islands), but with a
truncated one (`iterations=1`, as many shipped models set) a joint line search over all
islands gives a different trajectory.

A contact row couples the trees of its two geoms' bodies; any other row (equality,
friction loss, limit) the trees its Jacobian touches. Islands are the connected
components, found by min-label propagation (a bounded `while_loop`, never
differentiated) and numbered by their smallest tree, so island slots are static
(`ntree` of them, unused ones empty).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..types import Model


class Islands(NamedTuple):
    """Island of each dof and row (`count` means none: an unconstrained dof, an absent row)."""

    dof: Int[Array, " nv"]
    row: Int[Array, " nefc"]
    count: int  # static number of island slots


def monolithic(model: Model) -> bool:
    """One island of everything: islands disabled (`<flag island="disable"/>`), no rows or no dofs at all."""
    return model.opt.disabled("island") or model.constraints.nefc == 0 or model.nv == 0


def find(model: Model, J: Float[Array, "nefc nv"], mask: Bool[Array, " nefc"], contact_geom=None) -> Islands:
    """Islands of the rows present (mask), or one island of everything (`monolithic`).

    contact_geom (nefc_contact, 2): the geoms of each efc contact (default: the layout's slots)."""
    layout, topo = model.constraints, model.topology
    nefc = layout.nefc
    if monolithic(model):
        return Islands(jnp.zeros(model.nv, jnp.int32), jnp.zeros(nefc, jnp.int32), 1)
    dof_tree = np.asarray(topo.dof_treeid, np.int64)
    ntree = int(dof_tree.max()) + 1
    body_tree = np.asarray(topo.body_treeid, np.int64)
    big = jnp.int32(ntree)

    # contact rows: the trees of the two geoms' bodies; -1 is the static world
    n_other = nefc - len(layout.row_contact)
    geom_tree = body_tree[np.asarray(topo.geom_bodyid, np.int64)]
    contact_geom = layout.contact_geom if contact_geom is None else contact_geom  # with a capacity: traced
    pair_trees = jnp.asarray(geom_tree)[contact_geom[layout.row_contact]]  # (ncontact_rows, 2)
    t1, t2 = pair_trees[:, 0], pair_trees[:, 1]
    c_mask = mask[n_other:]
    # other rows: every tree their Jacobian touches
    tree_of_dof = jnp.asarray(dof_tree[:, None] == np.arange(ntree)[None, :])
    touches = ((J[:n_other] != 0).astype(jnp.int32) @ tree_of_dof.astype(jnp.int32) > 0) & mask[:n_other, None]

    def label_of(trees, labels):
        return jnp.where(trees >= 0, labels[jnp.maximum(trees, 0)], big)

    def propagate(labels):
        contact_label = jnp.where(c_mask, jnp.minimum(label_of(t1, labels), label_of(t2, labels)), big)
        other_label = jnp.min(jnp.where(touches, labels[None, :], big), axis=1, initial=big)
        new = labels
        for trees in (t1, t2):
            new = new.at[jnp.where(trees >= 0, trees, ntree)].min(contact_label, mode="drop")
        return jnp.minimum(new, jnp.min(jnp.where(touches, other_label[:, None], big), axis=0, initial=big)), (
            contact_label,
            other_label,
        )

    def changed(c):
        return c[1] & (c[2] < ntree)

    def body(c):
        labels, _, i = c
        new, _ = propagate(labels)
        return new, jnp.any(new != labels), i + 1

    start = jnp.arange(ntree, dtype=jnp.int32)
    if ntree == 1:  # one tree is its own island: no loop (on a GPU, no predicate read back per trip)
        labels = start
    else:
        labels, _, _ = jax.lax.while_loop(changed, body, (start, jnp.asarray(True), jnp.int32(0)))
    _, (contact_label, other_label) = propagate(labels)
    touched = (jnp.zeros(ntree, bool).at[jnp.where(t1 >= 0, t1, ntree)].max(c_mask, mode="drop")
               .at[jnp.where(t2 >= 0, t2, ntree)].max(c_mask, mode="drop") | jnp.any(touches, axis=0))  # fmt: skip
    tree_island = jnp.where(touched, labels, big)
    dof = tree_island[dof_tree]
    row = jnp.concatenate([other_label, contact_label]).astype(jnp.int32)
    return Islands(dof.astype(jnp.int32), row, ntree)


def tolerance_scale(model: Model, M: Float[Array, "nv nv"], islands: Islands) -> Array:
    """MuJoCo's solver scale per island: 1 / the island's summed mass-matrix diagonal, or
    1 / (meaninertia nv) for the single monolithic problem."""
    if monolithic(model):
        return jnp.full((1,), 1.0 / (model.opt.meaninertia * max(1, model.nv)))
    inertia = segment_sum(jnp.diagonal(M), islands.dof, islands)
    return jnp.where(inertia > 0, 1.0 / jnp.where(inertia > 0, inertia, 1.0), 1.0)


def segment_sum(values: Array, ids: Array, islands: Islands) -> Array:
    """Per-island sums of per-dof or per-row values (entries of no island are dropped).

    With one island slot (one kinematic tree, e.g. a humanoid) a masked reduction: a scatter-add
    is a slow kernel on a GPU (8% of the humanoid's device time on an H100 at B=8192)."""
    if islands.count == 1:
        inside = (ids == 0).reshape(ids.shape + (1,) * (values.ndim - 1))
        return jnp.sum(jnp.where(inside, values, 0), axis=0, keepdims=True)
    return jax.ops.segment_sum(values, ids, num_segments=islands.count)


def spread(per_island: Array, ids: Array) -> Array:
    """A per-island value at each dof or row (0 where there is no island)."""
    return jnp.concatenate([per_island, jnp.zeros((1,), per_island.dtype)])[ids]
