"""Collision driver: run the static pair table through the narrow phase.

Pairs were generated and filtered at load time (`io._candidate_pairs`) and grouped
by geom-type pair; each group is one vmapped call of its narrow-phase function, so
the contact array has a fixed size (`model.constraints.ncon`) and `mask` says which
slots hold a contact. Contact parameters follow MuJoCo's mixing rules (Modeling
chapter, "Contact parameters"): explicit <pair> values, else the higher-priority
geom's, else max friction and condim and solmix-weighted solref/solimp.

Capacity (`opt.max_geom_pairs`, MJX's option of that name): when set, each group's
narrow phase runs on at most that many pairs per step, chosen by a broad phase (a pair
is a candidate when the world-axis-aligned bounding boxes of its geoms, or a plane and
the other geom's box, are within the pair's reach; the closest candidates are kept). Results
go back into the pair's static slots, so the contact array keeps its layout. When a
world has more candidates than capacity, the farthest are dropped and
`Contact.overflow` is set (`step` counts it as WarningKind.CONTACTFULL): never a silent
drop. `opt.max_contact_points` (MJX's option, given to `load_mjcf`) caps the contacts of each condim that
get constraint rows at the deepest that many (`constraint.efc_slots`); more occupied slots set
the same flag.

Margins and gaps (MuJoCo 4 semantics, checked against mj_forward): a pair's margin
and gap are the sums of its geoms' (or the <pair>'s own); the narrow phase reports
contacts closer than margin + gap, and only those closer than margin
(`includemargin`) become constraint rows, the others stay in the contact list.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool

from .. import constraint
from ..types import Contact, Data, Model, PairGroup, empty_contact
from . import box, convex, hfield, mesh, multiccd, primitives
from .base import Collision, GeomFrame, MeshShape
from .primitives import BOX, CAPSULE, CYLINDER, ELLIPSOID, PLANE, SPHERE

# (type1, type2) -> (narrow-phase function, contact slots per pair), type1 <= type2
FUNCTIONS = {**primitives.FUNCTIONS, **box.FUNCTIONS, **convex.FUNCTIONS, **multiccd.FUNCTIONS, **mesh.FUNCTIONS}

_MINVAL = 1e-15  # mjMINVAL
_MINMU = 1e-5  # mjMINMU: contact friction is clamped below by this


def _geom_params(model: Model, g1: np.ndarray, g2: np.ndarray):
    """Mixed (friction[5], solref, solreffriction, solimp, margin, gap, adhesion) of default geom
    pairs (mj_contactParam; adhesion: the sum, or the higher priority's)."""
    prio = np.asarray(model.geom_priority)
    p1, p2 = prio[g1], prio[g2]
    first = jnp.asarray((p1 > p2)[:, None])
    second = jnp.asarray((p2 > p1)[:, None])

    def pick(a1, a2, mixed):
        return jnp.where(first, a1, jnp.where(second, a2, mixed))

    f1, f2 = model.geom_friction[g1], model.geom_friction[g2]
    friction3 = pick(f1, f2, jnp.maximum(f1, f2))
    friction = friction3[:, jnp.array([0, 0, 1, 2, 2])]

    s1, s2 = model.geom_solmix[g1], model.geom_solmix[g2]
    ok1, ok2 = s1 >= _MINVAL, s2 >= _MINVAL
    mix = jnp.where(ok1 & ok2, s1 / jnp.where(ok1 & ok2, s1 + s2, 1.0), jnp.where(ok1, 1.0, jnp.where(ok2, 0.0, 0.5)))
    mix = mix[:, None]
    r1, r2 = model.geom_solref[g1], model.geom_solref[g2]
    standard = (r1[:, :1] > 0) & (r2[:, :1] > 0)
    solref = pick(r1, r2, jnp.where(standard, mix * r1 + (1 - mix) * r2, jnp.minimum(r1, r2)))
    i1, i2 = model.geom_solimp[g1], model.geom_solimp[g2]
    solimp = pick(i1, i2, mix * i1 + (1 - mix) * i2)
    margin = model.geom_margin[g1] + model.geom_margin[g2]
    gap = model.geom_gap[g1] + model.geom_gap[g2]
    a1, a2 = model.geom_adhesion[g1], model.geom_adhesion[g2]
    adhesion = pick(a1[:, None], a2[:, None], (a1 + a2)[:, None])[:, 0]
    return friction, solref, jnp.zeros_like(solref), solimp, margin, gap, adhesion


def _group_params(model: Model, group: PairGroup):
    params = _explicit_params(model, group)
    opt = model.opt
    if not opt.override:
        return params
    # <flag override="enable"/> (mj_assignFriction/Ref/Imp/Margin): the option's values for every contact
    friction, solref, solreffriction, solimp, margin, gap, adhesion = params
    n = len(group.geom1)
    tile = lambda v: jnp.broadcast_to(v, (n,) + jnp.shape(v))  # noqa: E731
    return tile(opt.o_friction), tile(opt.o_solref), tile(opt.o_solref), tile(opt.o_solimp), tile(opt.o_margin), gap, adhesion


def _explicit_params(model: Model, group: PairGroup):
    """The group's contact parameters: its geoms' mixed, an explicit <pair>'s own."""
    g1, g2 = np.asarray(group.geom1), np.asarray(group.geom2)
    pid = np.asarray(group.pair_id)
    params = _geom_params(model, g1, g2)
    if np.all(pid < 0):
        return params
    explicit = jnp.asarray(pid >= 0)
    p = np.maximum(pid, 0)
    pair = (
        model.pair_friction[p],
        model.pair_solref[p],
        model.pair_solreffriction[p],
        model.pair_solimp[p],
        model.pair_margin[p],
        model.pair_gap[p],
        model.pair_adhesion[p],
    )
    return tuple(
        jnp.where(explicit.reshape((-1,) + (1,) * (a.ndim - 1)), b, a) for a, b in zip(params, pair)
    )


@jax.jit
def collide(model: Model, data: Data, lookahead: jax.Array | None = None, pair_reach: np.ndarray | None = None) -> Contact:
    """Narrow phase over every candidate pair (mj_collision); returns the fixed-size contact array.

    lookahead (ngeom,): extra detection distance per geom (a pair reports contacts
    closer than margin + gap + lookahead[g1] + lookahead[g2]); the hard-contact solver
    uses it to see contacts the step can reach. pair_reach (ngeom, ngeom): extra
    detection distance per pair (contacts from distance, `cfd.pair_reach`).
    includemargin is unchanged.
    """
    parts, overflow = [], jnp.zeros((), bool)
    ccd = (model.opt.ccd_tolerance, model.opt.ccd_iterations)  # convex pairs: MuJoCo's GJK/EPA values
    for group in model.constraints.groups:
        if group.hfield >= 0:
            topo, h = model.topology, group.hfield
            fn = hfield.collider(group.types[1], topo.hfield_nrow[h], topo.hfield_ncol[h], group.cells,
                                 model.hfield_data[h], model.hfield_size[h], ccd)  # fmt: skip
            n_slots = group.n_slots
        else:
            fn, n_slots = FUNCTIONS[group.types]
        if model.opt.disabled("multiccd") and (group.types in multiccd.FUNCTIONS or group.types in mesh.MULTICCD_PAIRS):
            fn = multiccd.single_contact(*group.types)
        if "ccd" in inspect.signature(fn).parameters:
            fn = functools.partial(fn, ccd=ccd)
        if model.opt.collision_smoothing > 0 and group.types in primitives.SMOOTHED:
            fn = functools.partial(fn, smoothing=model.opt.collision_smoothing)
        g1, g2 = np.asarray(group.geom1), np.asarray(group.geom2)
        friction, solref, solreffriction, solimp, margin, gap, adhesion = _group_params(model, group)
        reach = margin + gap if lookahead is None else margin + gap + lookahead[g1] + lookahead[g2]
        if pair_reach is not None:
            reach = reach + jnp.asarray(pair_reach[g1, g2], reach.dtype)
        capacity = model.opt.max_geom_pairs
        if capacity is not None and capacity < len(g1) and group.hfield < 0:  # (no box for a height field)
            col, full = _narrow_phase_culled(fn, model, data, group.types, g1, g2, reach, capacity)
            overflow = overflow | full
        else:
            col = jax.vmap(fn)(_frames(model, data, g1, group.types[0]), _frames(model, data, g2, group.types[1]), reach)
        rep = lambda a: jnp.repeat(a, n_slots, axis=0)  # noqa: E731
        mask = col.valid.reshape(-1)
        parts.append(
            dict(
                dist=jnp.where(mask, col.dist.reshape(-1), 0.0),
                pos=col.pos.reshape(-1, 3),
                frame=col.frame.reshape(-1, 3, 3),
                includemargin=rep(margin),
                friction=jnp.maximum(rep(friction), _MINMU),
                solref=rep(solref),
                solreffriction=rep(solreffriction),
                solimp=rep(solimp),
                adhesion=rep(adhesion),
                mask=mask,
            )
        )
    if not parts:
        return empty_contact(0, model.dtype)
    contact = Contact(**{k: jnp.concatenate([p[k] for p in parts]) for k in parts[0]}, overflow=overflow)
    return contact.replace(overflow=overflow | _more_than_max_contact_points(model, contact))


def _more_than_max_contact_points(model: Model, contact: Contact) -> Bool[Array, ""]:
    """Whether a condim has more occupied slots than `max_contact_points` (the rest get no rows:
    `constraint.efc_slots`)."""
    layout = model.constraints
    if layout.max_contact_points is None or layout.capacity_by_dim is None:
        return jnp.zeros((), bool)
    occupied = contact.mask & constraint.slots_make_rows(model)
    counts = [jnp.sum(occupied[np.nonzero(layout.contact_dim == dim)[0]]) for dim in layout.capacity_by_dim]
    return jnp.any(jnp.stack(counts) > layout.max_contact_points)


def distance_function(type1: int, type2: int):
    """The narrow phase mj_geomDistance runs for a geom-type pair (type1 <= type2), or None:
    the exact convex distance where MuJoCo uses its convex collider (mjc_Convex, mjc_BoxBox,
    with nativeccd), else the pair's collision function."""
    if PLANE not in (type1, type2) and (type1, type2) not in primitives.FUNCTIONS:
        return convex.convex_contact(type1, type2)
    entry = FUNCTIONS.get((type1, type2))
    return None if entry is None else entry[0]


def geom_frame(model: Model, data: Data, geom: int) -> GeomFrame:
    """One geom's narrow-phase input (pose, size and, for a mesh, its hull)."""
    frame = _frames(model, data, np.array([geom]), model.topology.geom_type[geom])
    return jax.tree.map(lambda x: x[0], frame)


def _frames(model: Model, data: Data, geoms, geom_type: int) -> GeomFrame:
    hull = None
    if geom_type == mesh.MESH:
        ids = jnp.asarray(model.topology.geom_dataid)[geoms]
        polyvert = model.topology.mesh_polyvert
        vert_poly = mesh.vertex_polygons(polyvert, model.mesh_vert.shape[1])
        hull = MeshShape(model.mesh_vert[ids], jnp.asarray(polyvert)[ids], model.mesh_polynormal[ids], jnp.asarray(vert_poly)[ids])
    return GeomFrame(data.geom_xpos[geoms], data.geom_xmat[geoms], model.geom_size[geoms], hull)


def _half_extents(geom_type: int, mat: jax.Array, size: jax.Array, hull: MeshShape | None = None) -> jax.Array:
    """Half-widths (n, 3) of the geoms' world-axis-aligned bounding boxes, from the current
    sizes (so they follow a size changed at run time). Meshes: the bounding box of the hull's
    rotated vertices, centred on the geom frame (the hull need not be centred there)."""
    if geom_type == mesh.MESH:
        return jnp.max(jnp.abs(jnp.einsum("nij,nvj->nvi", mat, hull.vert)), axis=1)
    axis = jnp.abs(mat[..., 2])  # |z axis| components: the length direction of capsules and cylinders
    if geom_type == SPHERE:
        return jnp.broadcast_to(size[..., :1], axis.shape)
    if geom_type == CAPSULE:
        return axis * size[..., 1:2] + size[..., :1]
    if geom_type == CYLINDER:
        return axis * size[..., 1:2] + size[..., :1] * jnp.sqrt(jnp.maximum(0.0, 1 - axis**2))
    if geom_type == BOX:
        return jnp.einsum("nij,nj->ni", jnp.abs(mat), size)
    return jnp.sqrt(jnp.einsum("nij,nj->ni", mat**2, size**2))  # ellipsoid


def broad_phase_distance(model: Model, data: Data, types: tuple[int, int], g1: np.ndarray, g2: np.ndarray):
    """A lower bound on each pair's distance (MuJoCo's broad phase): the gap between their
    world-axis-aligned bounding boxes along the most separating axis, or, against a plane
    (infinite, as MuJoCo collides it), the height of the other's box above the plane."""
    pos1, pos2 = data.geom_xpos[g1], data.geom_xpos[g2]
    e2 = _geom_half_extents(model, data, types[1], g2)
    if types[0] == PLANE:
        normal = data.geom_xmat[g1, :, 2]
        return jnp.sum(normal * (pos2 - pos1), axis=-1) - jnp.sum(jnp.abs(normal) * e2, axis=-1)
    e1 = _geom_half_extents(model, data, types[0], g1)
    return jnp.max(jnp.abs(pos2 - pos1) - e1 - e2, axis=-1)


def _geom_half_extents(model: Model, data: Data, geom_type: int, geoms: np.ndarray) -> jax.Array:
    """`_half_extents` of each of `geoms` (pairs repeat a geom many times: each distinct geom's box
    is computed once and gathered)."""
    distinct, which = np.unique(geoms, return_inverse=True)
    f = _frames(model, data, distinct, geom_type)
    return _half_extents(geom_type, f.mat, f.size, f.mesh)[which.reshape(-1)]


def _narrow_phase_culled(fn, model: Model, data: Data, types, g1, g2, reach, capacity: int):
    """Narrow phase on the `capacity` pairs closest by the broad phase; (collisions in every
    pair's slots, more candidates than capacity). Pairs left out report no contact."""
    distance = jax.lax.stop_gradient(broad_phase_distance(model, data, types, g1, g2) - reach)
    candidates = distance <= 0
    _, chosen = jax.lax.top_k(-jnp.where(jnp.isnan(distance), jnp.inf, distance), capacity)
    chosen_g1, chosen_g2 = jnp.asarray(g1)[chosen], jnp.asarray(g2)[chosen]
    col = jax.vmap(fn)(_frames(model, data, chosen_g1, types[0]), _frames(model, data, chosen_g2, types[1]), reach[chosen])
    n_slots = col.valid.shape[1]
    dtype = col.dist.dtype
    empty = Collision(
        dist=jnp.zeros((len(g1), n_slots), dtype),
        pos=jnp.zeros((len(g1), n_slots, 3), dtype),
        frame=jnp.broadcast_to(jnp.eye(3, dtype=dtype), (len(g1), n_slots, 3, 3)),
        valid=jnp.zeros((len(g1), n_slots), bool),
    )
    col = jax.tree.map(lambda full, part: full.at[chosen].set(part), empty, col)
    return col, jnp.sum(candidates) > capacity
