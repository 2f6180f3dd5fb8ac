"""Model, Option, Data: equinox Modules (pytrees).

Every physical parameter is a float array leaf, so `jax.grad` of a loss with
respect to a whole `Model` works and `eqx.tree_at` swaps any parameter. Sizes,
types, index structure and iteration counts are static (hashable, part of the
jit cache key). Field names follow MuJoCo's mjModel / mjData.
"""

from __future__ import annotations

import dataclasses
import functools
from enum import IntEnum
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .cfd import CFD


class UnsupportedFeatureError(ValueError):
    """The model uses a MuJoCo feature that jaxsim_ncp does not simulate."""


class JointType(IntEnum):
    """Same numbering as mujoco.mjtJoint."""

    FREE = 0
    BALL = 1
    SLIDE = 2
    HINGE = 3


JOINT_NQ = {JointType.FREE: 7, JointType.BALL: 4, JointType.SLIDE: 1, JointType.HINGE: 1}
JOINT_NV = {JointType.FREE: 6, JointType.BALL: 3, JointType.SLIDE: 1, JointType.HINGE: 1}
TRN_JOINT, TRN_JOINTINPARENT = 0, 1  # mjtTrn: the actuator's transmission is a joint
TRN_SLIDERCRANK = 2  # mjtTrn.mjTRN_SLIDERCRANK: a crank site and a slider site (actuation.transmission)
TRN_TENDON = 3  # mjtTrn.mjTRN_TENDON: the actuator's transmission is a tendon
TRN_SITE = 4  # mjtTrn.mjTRN_SITE: a wrench at a site (actuation.transmission)
TRN_BODY = 5  # mjtTrn.mjTRN_BODY: adhesion, along the normals of the body's contacts


class DynType(IntEnum):
    """Actuator activation dynamics (subset of mujoco.mjtDyn, same numbers)."""

    NONE = 0
    INTEGRATOR = 1
    FILTER = 2
    FILTEREXACT = 3
    MUSCLE = 4
    DCMOTOR = 5  # the dcmotor's optional states (dcmotor.py)
    PID = 6  # the pid actuator's states: slew-limited setpoint, integral of the position error


class WarningKind(IntEnum):
    """Per-world runtime checks: index into `Data.warning` (counts) and `Data.warning_time` (first firing).

    Like MuJoCo's mjtWarning: BAD_QPOS/QVEL/QACC fire when a value is non-finite or
    larger than `opt.maxval` in magnitude (MuJoCo's mjMAXVAL, 1e10).
    """

    BAD_INPUT = 0  # ctrl, qfrc_applied, xfrc_applied, mocap_pos or mocap_quat non-finite or beyond sqrt(dtype max) (zeroed)
    BAD_QPOS = 1
    BAD_QVEL = 2
    BAD_QACC = 3
    SOLVER = 4  # the constraint solver stopped at its iteration limit without converging
    INTEGRATOR = 5  # the adaptive integrator hit max_steps before the end of the step (the world diverges)
    CONTACTFULL = 6  # more candidate pairs than opt.max_geom_pairs (the farthest were not collided), or more
    # contacts of a condim than opt.max_contact_points (the shallowest got no rows)
    BAD_MODEL = 7  # a parameter no step can be computed with (non-finite; timestep, impratio, a moving body's mass
    # or inertia or a geom size not positive), e.g. set inside jit or vmap: the world diverges at once
    # (check_model on the host names the field)


NWARNING = len(WarningKind)


class GeomType(IntEnum):
    """mujoco.mjtGeom values of the simulated geoms."""

    PLANE = 0
    HFIELD = 1
    SPHERE = 2
    CAPSULE = 3
    ELLIPSOID = 4
    CYLINDER = 5
    BOX = 6
    MESH = 7


class WrapType(IntEnum):
    """Tendon path elements (mujoco.mjtWrap, same numbers)."""

    NONE = 0
    JOINT = 1
    PULLEY = 2
    SITE = 3
    SPHERE = 4
    CYLINDER = 5


class GainType(IntEnum):
    FIXED = 0
    AFFINE = 1
    MUSCLE = 2
    DCMOTOR = 3  # K i or K/R (V - K dl/dt) (dcmotor.py)
    PID = 5  # force = kp (qref - l) + kv (vref - dl/dt) + ff + ki z: kp, kv in the affine bias


class BiasType(IntEnum):
    NONE = 0
    AFFINE = 1
    MUSCLE = 2
    DCMOTOR = 3  # with GainType.DCMOTOR (dcmotor.py)


@dataclasses.dataclass(frozen=True)
class Topology:
    """Static index structure of a model: the kinematic tree and address tables.

    All fields are tuples (hashable); derived masks are cached numpy arrays used as
    compile-time constants, so tree recursions become dense masked matmuls.
    """

    body_parentid: tuple[int, ...]
    body_rootid: tuple[int, ...]
    body_jntnum: tuple[int, ...]
    body_jntadr: tuple[int, ...]
    jnt_type: tuple[int, ...]
    jnt_bodyid: tuple[int, ...]
    jnt_qposadr: tuple[int, ...]
    jnt_dofadr: tuple[int, ...]
    dof_bodyid: tuple[int, ...]
    dof_jntid: tuple[int, ...]
    geom_bodyid: tuple[int, ...]
    geom_type: tuple[int, ...]
    actuator_trnid: tuple[int, ...]
    actuator_trntype: tuple[int, ...]  # mjtTrn: 0 joint, 3 tendon
    actuator_dyntype: tuple[int, ...]
    actuator_gaintype: tuple[int, ...]
    actuator_biastype: tuple[int, ...]
    actuator_actadr: tuple[int, ...]
    actuator_ctrllimited: tuple[bool, ...]
    actuator_forcelimited: tuple[bool, ...]
    actuator_actlimited: tuple[bool, ...]
    actuator_actearly: tuple[bool, ...]
    jnt_actfrclimited: tuple[bool, ...]
    body_names: tuple[str, ...]
    jnt_names: tuple[str, ...]
    geom_names: tuple[str, ...]
    actuator_names: tuple[str, ...]
    site_bodyid: tuple[int, ...] = ()
    body_mocapid: tuple[int, ...] = ()  # -1, or the body's row in Data.mocap_pos / mocap_quat
    has_gravcomp: bool = False  # some body has gravcomp != 0 (passive.py)
    has_surfacevel: bool = False  # some geom has a surface velocity (constraint.py, contact rows' aref)
    has_adhesion: bool = False  # some geom or pair has contact adhesion (passive force, contact rows' aref)
    has_polynomial_springs: bool = False  # some joint or tendon stiffness has higher-order terms (passive.py)
    has_polynomial_dampers: bool = False  # some joint, tendon or actuator damping has higher-order terms
    jnt_actgravcomp: tuple[bool, ...] = ()  # the joint's gravity compensation counts as actuation
    tendon_adr: tuple[int, ...] = ()  # first path element of each tendon in wrap_*
    tendon_num: tuple[int, ...] = ()
    wrap_type: tuple[int, ...] = ()  # WrapType of each path element
    wrap_objid: tuple[int, ...] = ()  # joint (fixed tendon) or site id
    wrap_side: tuple[int, ...] = ()  # side site of a sphere/cylinder element, -1: none
    tendon_names: tuple[str, ...] = ()
    body_treeid: tuple[int, ...] = ()  # kinematic tree of each body (-1: static), MuJoCo's numbering
    dof_treeid: tuple[int, ...] = ()
    tendon_actfrclimited: tuple[bool, ...] = ()  # the total actuator force on the tendon is clamped
    tendon_with_armature: tuple[int, ...] = ()  # tendons whose armature is non-zero (tendon.armature)
    # sensors (sensor.py): mjtSensor type, object and reference frame, address and size in sensordata
    sensor_type: tuple[int, ...] = ()
    sensor_objtype: tuple[int, ...] = ()
    sensor_objid: tuple[int, ...] = ()
    sensor_reftype: tuple[int, ...] = ()
    sensor_refid: tuple[int, ...] = ()
    sensor_dim: tuple[int, ...] = ()
    sensor_datatype: tuple[int, ...] = ()  # mjtDataType: real, positive, axis, quaternion
    cam_bodyid: tuple[int, ...] = ()
    cam_mode: tuple[int, ...] = ()  # mjtCamLight: fixed, track, trackcom, targetbody, targetbodycom
    cam_targetbodyid: tuple[int, ...] = ()
    cam_resolution: tuple[tuple[int, int], ...] = ()  # pixels (width, height)
    sensor_intprm: tuple[int, ...] = ()  # first integer parameter (a rangefinder's mjtRayDataField bits)
    sensor_reduce: tuple[int, ...] = ()  # second integer parameter (a contact sensor's reduction)
    site_type: tuple[int, ...] = ()  # mjtGeom of each site's shape (a touch sensor's zone)
    hfield_nrow: tuple[int, ...] = ()
    hfield_ncol: tuple[int, ...] = ()
    # site transmissions with a reference site (actuation.py): the refsite (-1: none) and the dofs
    # both sites share as ancestors, whose Jacobian columns MuJoCo clears in the moment
    actuator_refsite: tuple[int, ...] = ()
    actuator_refsite_shared_dofs: tuple[tuple[int, ...], ...] = ()
    actuator_slidersite: tuple[int, ...] = ()  # slider-crank transmissions: the slider site (-1: none)
    # history buffers (history.py; nsample 0: none), at their addresses in Data.history (nhistory values)
    actuator_nsample: tuple[int, ...] = ()
    actuator_interp: tuple[int, ...] = ()  # read as 0 held, 1 linear, 2 cubic
    actuator_historyadr: tuple[int, ...] = ()
    sensor_nsample: tuple[int, ...] = ()
    sensor_interp: tuple[int, ...] = ()
    sensor_historyadr: tuple[int, ...] = ()
    nhistory: int = 0
    actuator_disabled: tuple[bool, ...] = ()
    # MuJoCo 4's control blocks: an actuator reads ctrl[ctrladr : ctrladr + ctrlnum], whose entries
    # ctrlspec names (mjtCtrlInput bits, 0: one plain control); its actnum states start at actadr
    actuator_ctrladr: tuple[int, ...] = ()
    actuator_ctrlnum: tuple[int, ...] = ()
    actuator_ctrlspec: tuple[int, ...] = ()
    actuator_actnum: tuple[int, ...] = ()
    actuator_dcmotor_slots: tuple[tuple[int, ...], ...] = ()  # per actuator: offsets of a dcmotor's slew, integral, temperature, bristle, current states (-1: none)
    actuator_pid_slew: tuple[bool, ...] = ()  # a pid's first state is its slew-limited setpoint (slewmax > 0 at load)  # in a group of option/actuatorgroupdisable (mj_actuatorDisabled)
    # fluid.py: bodies using the ellipsoid model (a geom with fluidshape="ellipsoid"), and those geoms
    body_fluid_ellipsoid: tuple[bool, ...] = ()
    geom_fluid_interaction: tuple[bool, ...] = ()
    # mesh collision (collision/mesh.py): each geom's mesh (-1: none), and per mesh its convex hull's
    # polygons as vertex indices into Model.mesh_vert[mesh], padded with -1
    geom_dataid: tuple[int, ...] = ()
    geom_visible: tuple[bool, ...] = ()  # alpha of the geom (or its material) non-zero: rays see it
    mesh_names: tuple[str, ...] = ()
    mesh_polyvert: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # spring plasticity (passive.py): each joint's and tendon's first entry in Data.plastic (-1: elastic)
    jnt_plasticadr: tuple[int, ...] = ()
    tendon_plasticadr: tuple[int, ...] = ()
    nplastic: int = 0
    key_names: tuple[str, ...] = ()  # keyframes (Model.keyframes), "" where unnamed

    @property
    def nsensordata(self) -> int:
        return sum(self.sensor_dim)

    @property
    def sensor_adr(self) -> tuple[int, ...]:
        return tuple(int(a) for a in np.cumsum((0,) + self.sensor_dim[:-1])) if self.sensor_dim else ()

    # ------------------------------------------------------------ derived structure
    @property
    def nmocap(self) -> int:
        return sum(i >= 0 for i in self.body_mocapid)

    @functools.cached_property
    def body_depth(self) -> np.ndarray:
        depth = np.zeros(len(self.body_parentid), dtype=np.int64)
        for b in range(1, len(depth)):  # MuJoCo orders parents before children
            depth[b] = depth[self.body_parentid[b]] + 1
        return depth

    @functools.cached_property
    def depth_levels(self) -> tuple[np.ndarray, ...]:
        """Body ids (world excluded) grouped by depth 1, 2, ...: one vectorized update per level."""
        depth = self.body_depth
        return tuple(np.nonzero(depth == d)[0] for d in range(1, int(depth.max(initial=0)) + 1))

    @functools.cached_property
    def depth_level_table(self) -> tuple[np.ndarray, np.ndarray]:
        """`depth_levels` as two (depth, width) tables, bodies and their parents, one row per level;
        rows padded with body id nbody (out of range: writes there are dropped) and parent 0."""
        width = max((len(level) for level in self.depth_levels), default=0)
        bodies = np.full((len(self.depth_levels), width), len(self.body_parentid), dtype=np.int32)
        parents = np.zeros_like(bodies)
        for row, level in enumerate(self.depth_levels):
            bodies[row, : len(level)] = level
            parents[row, : len(level)] = np.asarray(self.body_parentid)[level]
        return bodies, parents

    @functools.cached_property
    def body_ancestor(self) -> np.ndarray:
        """A[b, c] = body c is b or an ancestor of b (world is everyone's ancestor)."""
        n = len(self.body_parentid)
        anc = np.eye(n, dtype=bool)
        for b in range(1, n):
            anc[b] |= anc[self.body_parentid[b]]
        return anc

    @functools.cached_property
    def body_dof_chain(self) -> np.ndarray:
        """C[b, d] = dof d moves body b (belongs to b or one of its ancestors)."""
        return self.body_ancestor[:, np.asarray(self.dof_bodyid, dtype=np.int64)]

    @functools.cached_property
    def body_dof_chain_id(self) -> np.ndarray:
        """An id per distinct `body_dof_chain` row: two bodies share it when the same dofs move both."""
        return np.unique(self.body_dof_chain, axis=0, return_inverse=True)[1].reshape(-1)

    @functools.cached_property
    def dof_ancestor(self) -> np.ndarray:
        """D[i, j] = dof j is i or an ancestor of i in the dof tree (MuJoCo's dof_parentid chain)."""
        body = np.asarray(self.dof_bodyid, dtype=np.int64)
        idx = np.arange(len(body))
        strict = self.body_ancestor[body][:, body] & (body[:, None] != body[None, :])
        same_body = (body[:, None] == body[None, :]) & (idx[None, :] <= idx[:, None])
        return strict | same_body

    @functools.cached_property
    def dof_velocity_before(self) -> np.ndarray:
        """P[i, j] = dof j contributes to the body velocity used for cdof_dot of dof i.

        mj_comVel: cdof_dot of a joint's dofs uses the velocity accumulated *before*
        that joint (parent bodies and earlier joints of the same body); the rotational
        dofs of a free joint also see its own translational dofs.
        """
        body = np.asarray(self.dof_bodyid, dtype=np.int64)
        jnt = np.asarray(self.dof_jntid, dtype=np.int64)
        strict = self.body_ancestor[body][:, body] & (body[:, None] != body[None, :])
        earlier_joint = (body[:, None] == body[None, :]) & (jnt[None, :] < jnt[:, None])
        is_free = np.asarray(self.jnt_type, dtype=np.int64)[jnt] == JointType.FREE
        offset = np.arange(len(body)) - np.asarray(self.jnt_dofadr, dtype=np.int64)[jnt]
        free_trans_to_rot = (
            (jnt[:, None] == jnt[None, :]) & is_free[:, None] & (offset[None, :] < 3) & (offset[:, None] >= 3)
        )
        return strict | earlier_joint | free_trans_to_rot

    @functools.cached_property
    def dof_free_translation(self) -> np.ndarray:
        jnt = np.asarray(self.dof_jntid, dtype=np.int64)
        is_free = np.asarray(self.jnt_type, dtype=np.int64)[jnt] == JointType.FREE
        offset = np.arange(len(jnt)) - np.asarray(self.jnt_dofadr, dtype=np.int64)[jnt]
        return is_free & (offset < 3)

    @functools.cached_property
    def max_body_jntnum(self) -> int:
        return max(self.body_jntnum, default=0)

    @functools.cached_property
    def scalar_coords(self) -> tuple[np.ndarray, np.ndarray]:
        """(qpos index, dof index) of coordinates integrated as q += h v (hinge, slide, free position)."""
        qidx, didx = [], []
        for jtype, qadr, dadr in zip(self.jnt_type, self.jnt_qposadr, self.jnt_dofadr):
            n = 3 if jtype == JointType.FREE else (1 if jtype in (JointType.HINGE, JointType.SLIDE) else 0)
            qidx += range(qadr, qadr + n)
            didx += range(dadr, dadr + n)
        return np.asarray(qidx, dtype=np.int64), np.asarray(didx, dtype=np.int64)

    @functools.cached_property
    def quat_coords(self) -> tuple[np.ndarray, np.ndarray]:
        """(qpos start, dof start) of each quaternion block (ball joints, free-joint rotation)."""
        qadr, dadr = [], []
        for jtype, qa, da in zip(self.jnt_type, self.jnt_qposadr, self.jnt_dofadr):
            if jtype == JointType.FREE:
                qadr.append(qa + 3)
                dadr.append(da + 3)
            elif jtype == JointType.BALL:
                qadr.append(qa)
                dadr.append(da)
        return np.asarray(qadr, dtype=np.int64), np.asarray(dadr, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class PairGroup:
    """Candidate geom pairs that share one narrow-phase function (types[0] <= types[1])."""

    types: tuple[int, int]
    geom1: tuple[int, ...]
    geom2: tuple[int, ...]
    pair_id: tuple[int, ...]  # index into Model.pair_* for explicit <pair>s, -1 for geom mixing
    condim: tuple[int, ...]
    n_slots: int  # contacts the function can return per pair
    hfield: int = -1  # height-field groups (collision/hfield.py): the height field asset
    cells: tuple[int, ...] = ()  # and the (rows, columns) window of grid cells collided per pair


@dataclasses.dataclass(frozen=True)
class ConstraintLayout:
    """Static layout of the contact array and of the constraint rows (efc), fixed at load time.

    Contacts: the concatenation over `groups` of (pair, slot). Rows: MuJoCo's order,
    equality, friction loss, limits, contacts; rows that do not exist at a given
    state are masked, never removed, so shapes never change.

    Contact rows belong to "efc contacts". Without a capacity there is one per slot, in
    slot order. With `max_geom_pairs` (the broad phase collides at most that many pairs
    per group, collision/driver.py) fewer slots can hold contacts at once than there
    are: then the efc contacts are `capacity_by_dim` places per condim, and each step
    fills them with the occupied slots of that condim (`constraint.efc_slots`), so
    the rows, and the solver's work, follow the capacity, not the number of pairs. With
    `max_contact_points` (MJX's option) at most that many per condim get rows: the
    deepest, as MJX keeps them; a step with more flags WarningKind.CONTACTFULL.
    """

    groups: tuple[PairGroup, ...] = ()
    eq_ids: tuple[int, ...] = ()  # the equality constraints with rows: all of them (none with equality disabled)
    eq_active0: tuple[bool, ...] = ()  # their eq_active0 (the initial Data.eq_active)
    eq_types: tuple[int, ...] = ()  # mjtEq of each (connect 0, weld 1, joint 2, tendon 3)
    eq_sites: tuple[bool, ...] = ()  # connect/weld between two sites (MJCF site1/site2): eq_obj*id are site ids
    friction_dofs: tuple[int, ...] = ()
    friction_tendons: tuple[int, ...] = ()  # friction-loss rows after the dofs'
    limit_jnts: tuple[int, ...] = ()  # one entry per joint limit row
    limit_sides: tuple[int, ...] = ()  # -1 lower, +1 upper, 0 ball
    limit_tendons: tuple[int, ...] = ()  # one entry per tendon limit row, after the joints'
    limit_tendon_sides: tuple[int, ...] = ()  # -1 lower, +1 upper
    cone: str = "pyramidal"
    max_geom_pairs: int | None = None  # Option.max_geom_pairs: the broad phase's capacity per group
    max_contact_points: int | None = None  # Option.max_contact_points: the efc contacts per condim, the deepest

    @functools.cached_property
    def contact_geom(self) -> np.ndarray:
        """(ncon, 2) geom ids of each contact slot."""
        rows = [np.repeat(np.stack([g.geom1, g.geom2], -1), g.n_slots, axis=0) for g in self.groups]
        return np.concatenate(rows) if rows else np.zeros((0, 2), np.int64)

    @functools.cached_property
    def contact_dim(self) -> np.ndarray:
        rows = [np.repeat(np.asarray(g.condim, np.int64), g.n_slots) for g in self.groups]
        return np.concatenate(rows) if rows else np.zeros((0,), np.int64)

    @property
    def ncon(self) -> int:
        return len(self.contact_dim)

    @functools.cached_property
    def occupiable_by_dim(self) -> dict[int, int]:
        """{condim: the most slots of that condim that can hold contacts at once}: all of them, or
        with `max_geom_pairs` those of the pairs the broad phase keeps."""
        capacity: dict[int, int] = {}
        for g in self.groups:
            dims = np.asarray(g.condim, np.int64)
            for d in np.unique(dims):
                pairs = int(np.sum(dims == d))
                culled = self.max_geom_pairs is not None and g.hfield < 0  # height fields: never culled
                kept = min(pairs, self.max_geom_pairs) if culled else pairs
                capacity[int(d)] = capacity.get(int(d), 0) + kept * g.n_slots
        return dict(sorted(capacity.items()))

    @functools.cached_property
    def capacity_by_dim(self) -> dict[int, int] | None:
        """{condim: the efc contacts of that condim}: the occupiable slots, at most `max_contact_points`
        of them; None when every slot is one (no capacity, or one that limits nothing)."""
        limit = self.max_contact_points
        capacity = {d: n if limit is None else min(n, limit) for d, n in self.occupiable_by_dim.items()}
        return capacity if sum(capacity.values()) < self.ncon else None

    @functools.cached_property
    def efc_contact_dim(self) -> np.ndarray:
        """condim of each efc contact (the contacts that have rows; see the class docstring)."""
        if self.capacity_by_dim is None:
            return self.contact_dim
        return np.concatenate([np.full(n, d, np.int64) for d, n in self.capacity_by_dim.items()])

    @property
    def nefc_contact(self) -> int:
        return len(self.efc_contact_dim)

    @functools.cached_property
    def contact_rows(self) -> np.ndarray:
        """Rows per efc contact: 1 frictionless, condim elliptic, 2(condim-1) pyramidal."""
        dim = self.efc_contact_dim
        if self.cone == "elliptic":
            return dim
        return np.where(dim == 1, 1, 2 * (dim - 1))

    @functools.cached_property
    def _row_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each contact row: its efc contact, its frame axis (0 normal, 1..5 friction) and
        pyramid edge sign (+1/-1; 0 for elliptic and frictionless rows)."""
        rows = self.contact_rows
        contact = np.repeat(np.arange(self.nefc_contact), rows)
        local = np.arange(len(contact)) - np.repeat(np.cumsum(rows) - rows, rows)
        dim = self.efc_contact_dim[contact]
        if self.cone == "elliptic":
            return contact, local, np.zeros_like(local)
        pyramid = dim > 1
        axis = np.where(pyramid, local // 2 + 1, 0)
        sign = np.where(pyramid, 1 - 2 * (local % 2), 0)
        return contact, axis, sign

    @property
    def row_contact(self) -> np.ndarray:
        return self._row_index[0]

    @property
    def row_axis(self) -> np.ndarray:
        return self._row_index[1]

    @property
    def row_sign(self) -> np.ndarray:
        return self._row_index[2]

    @functools.cached_property
    def contact_row_start(self) -> np.ndarray:
        return self.ne + self.nf + self.nl + np.concatenate([[0], np.cumsum(self.contact_rows)[:-1]]).astype(np.int64)

    @property
    def ne(self) -> int:
        return int(sum({0: 3, 1: 6, 2: 1, 3: 1}[t] for t in self.eq_types))

    @property
    def nf(self) -> int:
        return len(self.friction_dofs) + len(self.friction_tendons)

    @property
    def nl(self) -> int:
        return len(self.limit_jnts) + len(self.limit_tendons)

    @property
    def nefc(self) -> int:
        return self.ne + self.nf + self.nl + int(np.sum(self.contact_rows))


class Option(eqx.Module):
    """Physics options (mjOption). timestep and gravity are differentiable leaves."""

    timestep: Float[Array, ""]
    gravity: Float[Array, "3"]
    magnetic: Float[Array, "3"]  # the magnetometer's field
    impratio: Float[Array, ""]
    meaninertia: Float[Array, ""]  # mjStatistic.meaninertia: scales the solver's tolerances
    meansize: Float[Array, ""]  # mjStatistic.meansize: the NCP solver's length scale
    density: Float[Array, ""]  # of the medium (fluid.py)
    viscosity: Float[Array, ""]
    wind: Float[Array, "3"]
    # <flag override="enable"/>: every contact's margin, solref (and solreffriction), solimp and friction
    o_margin: Float[Array, ""] | None = None
    o_solref: Float[Array, "2"] | None = None
    o_solimp: Float[Array, "5"] | None = None
    o_friction: Float[Array, "5"] | None = None
    override: bool = eqx.field(static=True, default=False)
    integrator: str = eqx.field(static=True, default="euler")
    solver: str = eqx.field(static=True, default="newton")  # "newton" | "cg" (MuJoCo's primal solvers) | "ncp"
    iterations: int = eqx.field(static=True, default=100)
    ls_iterations: int = eqx.field(static=True, default=50)
    cone: str = eqx.field(static=True, default="pyramidal")
    disableflags: tuple[str, ...] = eqx.field(static=True, default=())
    diag_exact: bool = eqx.field(static=True, default=False)  # <flag diagexact="enable"/>: exact A_ii in R (constraint.py)
    energy: bool = eqx.field(static=True, default=False)  # <flag energy="enable"/>: forward fills Data.energy
    tolerance: float = eqx.field(static=True, default=1e-8)
    ls_tolerance: float = eqx.field(static=True, default=0.01)
    grad_mode: str = eqx.field(static=True, default="implicit")  # solver reverse mode: "implicit" | "unroll"
    collision_smoothing: float = eqx.field(static=True, default=0.0)  # length; 0: off (collision.smoothing)
    jacobian: str = eqx.field(static=True, default="auto")  # contact rows "dense", "sparse" or "auto" (constraint.contact_dofs)
    maxval: float = eqx.field(static=True, default=1e10)  # |qpos|, |qvel|, |qacc| above this: diverged (mjMAXVAL)
    auto_reset: bool = eqx.field(static=True, default=False)  # a diverged world restarts from qpos0 (mj_resetData)
    kappa: float = eqx.field(static=True, default=1e-8)  # NCP: complementarity the forward solve converges to (scaled)
    kappa_grad: float = eqx.field(static=True, default=1e-4)  # NCP: central-path point the gradient is taken at
    newton_early_exit: bool | None = eqx.field(static=True, default=None)  # Newton, implicit mode: while_loops or scans (None: by platform)
    ncp_passes: int = eqx.field(static=True, default=4)  # NCP: solves per step (re-linearized where one penetrates)
    ncp_nonlinear_gap: bool = eqx.field(static=True, default=True)  # NCP: passes after the first evaluate the gap at every iterate
    ncp_early_exit: bool = eqx.field(static=True, default=True)  # NCP: stop iterating once every world converged
    ncp_recovery_speed: float = eqx.field(static=True, default=1.0)  # NCP: penetration undone at most this fast (inf: in one step)
    cfd: CFD | None = eqx.field(static=True, default=None)  # contacts from distance, gradient only (cfd.py)
    max_geom_pairs: int | None = eqx.field(static=True, default=None)  # narrow-phase capacity per pair group
    max_contact_points: int | None = eqx.field(static=True, default=None)  # contacts with rows per condim (the deepest)
    adaptive: Any = eqx.field(static=True, default=None)  # integrate.adaptive.Adaptive with integrator="adaptive"
    fluid: bool = eqx.field(static=True, default=False)  # density or viscosity nonzero in the MJCF: fluid forces on
    ccd_tolerance: float = eqx.field(static=True, default=1e-6)  # MuJoCo's GJK/EPA stop (collision/ccd.py)
    ccd_iterations: int = eqx.field(static=True, default=35)
    noslip_iterations: int = eqx.field(static=True, default=0)  # MuJoCo's noslip post-processor (solver/noslip.py); 0: off
    noslip_tolerance: float = eqx.field(static=True, default=1e-6)

    def disabled(self, flag: str) -> bool:
        """True when MuJoCo's disable flag `flag` (e.g. "gravity", "eulerdamp") is set."""
        return flag in self.disableflags


class Keyframes(eqx.Module):
    """The model's keyframes (mjModel.key_*), one row per keyframe: the states `make_data(model, key)`
    starts from (mj_resetDataKeyframe)."""

    time: Float[Array, " nkey"]
    qpos: Float[Array, "nkey nq"]
    qvel: Float[Array, "nkey nv"]
    act: Float[Array, "nkey na"]
    ctrl: Float[Array, "nkey nu"]
    mocap_pos: Float[Array, "nkey nmocap 3"]
    mocap_quat: Float[Array, "nkey nmocap 4"]
    plastic: Float[Array, "nkey nplastic"]


class Model(eqx.Module):
    """Static model description (mjModel subset). Float leaves are differentiable."""

    # sizes
    nq: int = eqx.field(static=True)
    nv: int = eqx.field(static=True)
    nu: int = eqx.field(static=True)
    na: int = eqx.field(static=True)
    nbody: int = eqx.field(static=True)
    njnt: int = eqx.field(static=True)
    ngeom: int = eqx.field(static=True)
    ntendon: int = eqx.field(static=True)
    topology: Topology = eqx.field(static=True)
    constraints: ConstraintLayout = eqx.field(static=True)
    opt: Option
    # bodies
    body_pos: Float[Array, "nbody 3"]
    body_quat: Float[Array, "nbody 4"]
    body_ipos: Float[Array, "nbody 3"]
    body_iquat: Float[Array, "nbody 4"]
    body_mass: Float[Array, " nbody"]
    body_inertia: Float[Array, "nbody 3"]
    body_invweight0: Float[Array, "nbody 2"]
    body_gravcomp: Float[Array, " nbody"]  # fraction of the body's weight cancelled (passive force)
    # joints and dofs
    jnt_pos: Float[Array, "njnt 3"]
    jnt_axis: Float[Array, "njnt 3"]
    jnt_stiffness: Float[Array, " njnt"]
    jnt_stiffnesspoly: Float[Array, "njnt 2"]  # higher-order stiffness: f(x) = k x + b x^2 + c x^3
    jnt_actfrcrange: Float[Array, "njnt 2"]
    jnt_springyield: Float[Array, " njnt"]  # elastic limit of a plastic joint's spring (topology.jnt_plasticadr)
    qpos0: Float[Array, " nq"]
    qpos_spring: Float[Array, " nq"]
    dof_damping: Float[Array, " nv"]
    dof_dampingpoly: Float[Array, "nv 2"]  # higher-order damping: f(v) = d v + b v |v| + c v^3
    dof_armature: Float[Array, " nv"]
    dof_frictionloss: Float[Array, " nv"]
    dof_solref: Float[Array, "nv 2"]
    dof_solimp: Float[Array, "nv 5"]
    dof_invweight0: Float[Array, " nv"]
    jnt_range: Float[Array, "njnt 2"]
    jnt_margin: Float[Array, " njnt"]
    jnt_solref: Float[Array, "njnt 2"]
    jnt_solimp: Float[Array, "njnt 5"]
    # geoms (stored for collision and rendering)
    geom_pos: Float[Array, "ngeom 3"]
    geom_quat: Float[Array, "ngeom 4"]
    geom_size: Float[Array, "ngeom 3"]
    geom_friction: Float[Array, "ngeom 3"]
    geom_surfacevel: Float[Array, "ngeom 6"]  # MuJoCo 4's moving surfaces: linear, angular, geom frame
    geom_adhesion: Float[Array, " ngeom"]  # MuJoCo 4's contact adhesion: a constant normal attraction
    geom_solref: Float[Array, "ngeom 2"]
    geom_solimp: Float[Array, "ngeom 5"]
    geom_margin: Float[Array, " ngeom"]
    geom_gap: Float[Array, " ngeom"]
    geom_rbound: Float[Array, " ngeom"]
    geom_solmix: Float[Array, " ngeom"]
    geom_fluid: Float[Array, "ngeom 12"]  # ellipsoid fluid model: interaction, drag and lift coefficients, virtual mass, inertia
    # meshes that collide: convex-hull vertices in the geom frame (padded by repeating the first)
    # and hull polygon normals (padded with zeros); see Topology.mesh_polyvert
    mesh_vert: Float[Array, "nmesh nhullvert 3"]
    mesh_polynormal: Float[Array, "nmesh npoly 3"]
    hfield_size: Float[Array, "nhfield 4"]  # x and y half-extents, elevation scale, base depth
    hfield_data: Float[Array, "nhfield ncell"]  # elevations in [0, 1], row-major, zero-padded
    # explicit contact pairs (<contact><pair>)
    pair_friction: Float[Array, "npair 5"]
    pair_solref: Float[Array, "npair 2"]
    pair_solreffriction: Float[Array, "npair 2"]
    pair_solimp: Float[Array, "npair 5"]
    pair_margin: Float[Array, " npair"]
    pair_gap: Float[Array, " npair"]
    pair_adhesion: Float[Array, " npair"]
    geom_priority: tuple[int, ...] = eqx.field(static=True)
    # equality constraints
    eq_obj1id: tuple[int, ...] = eqx.field(static=True)
    eq_obj2id: tuple[int, ...] = eqx.field(static=True)
    eq_data: Float[Array, "neq 12"]
    eq_solref: Float[Array, "neq 2"]
    eq_solimp: Float[Array, "neq 5"]
    # sites and tendons (path elements: wrap_prm is a fixed tendon's joint coefficient or a pulley's divisor)
    site_pos: Float[Array, "nsite 3"]
    site_quat: Float[Array, "nsite 4"]
    # cameras (camprojection sensors): pose in the body frame, the track modes' world offsets and
    # orientation, vertical field of view (degrees), intrinsics (focal x, y, principal x, y; length
    # units) and sensor size (0: use fovy)
    cam_pos: Float[Array, "ncam 3"]
    cam_quat: Float[Array, "ncam 4"]
    cam_pos0: Float[Array, "ncam 3"]
    cam_poscom0: Float[Array, "ncam 3"]
    cam_mat0: Float[Array, "ncam 3 3"]
    cam_fovy: Float[Array, " ncam"]
    cam_intrinsic: Float[Array, "ncam 4"]
    cam_sensorsize: Float[Array, "ncam 2"]
    site_size: Float[Array, "nsite 3"]
    wrap_prm: Float[Array, " nwrap"]
    tendon_stiffness: Float[Array, " ntendon"]
    tendon_stiffnesspoly: Float[Array, "ntendon 2"]
    tendon_lengthspring: Float[Array, "ntendon 2"]  # spring deadband [lower, upper]
    tendon_springyield: Float[Array, " ntendon"]  # elastic limit of a plastic tendon's spring
    tendon_damping: Float[Array, " ntendon"]
    tendon_dampingpoly: Float[Array, "ntendon 2"]
    tendon_armature: Float[Array, " ntendon"]  # inertia along the tendon (used on tendon_with_armature)
    tendon_frictionloss: Float[Array, " ntendon"]
    tendon_range: Float[Array, "ntendon 2"]
    tendon_margin: Float[Array, " ntendon"]
    tendon_solref_lim: Float[Array, "ntendon 2"]
    tendon_solimp_lim: Float[Array, "ntendon 5"]
    tendon_solref_fri: Float[Array, "ntendon 2"]
    tendon_solimp_fri: Float[Array, "ntendon 5"]
    tendon_length0: Float[Array, " ntendon"]
    tendon_invweight0: Float[Array, " ntendon"]
    tendon_actfrcrange: Float[Array, "ntendon 2"]
    # actuators
    sensor_cutoff: Float[Array, " nsensor"]
    actuator_gear: Float[Array, "nactuator 6"]
    actuator_gainprm: Float[Array, "nactuator 10"]
    actuator_biasprm: Float[Array, "nactuator 10"]
    actuator_dynprm: Float[Array, "nactuator 10"]
    actuator_ctrlrange: Float[Array, "nu 2"]
    actuator_forcerange: Float[Array, "nactuator 2"]
    actuator_actrange: Float[Array, "nactuator 2"]
    actuator_lengthrange: Float[Array, "nactuator 2"]  # muscles: the length range the compiler found
    actuator_acc0: Float[Array, " nactuator"]  # muscles: |M^-1 moment| at qpos0, scales force = scale / acc0
    actuator_damping: Float[Array, " nactuator"]  # added, times gear^2, to the damping of what it drives
    actuator_dampingpoly: Float[Array, "nactuator 2"]  # likewise, to the higher-order damping coefficients
    actuator_armature: Float[Array, " nactuator"]  # added, times gear^2, to the armature of what it drives
    actuator_cranklength: Float[Array, " nactuator"]  # slider-crank transmissions: the rod's length
    actuator_delay: Float[Array, " nactuator"]  # control delay, read from the actuator's history buffer (history.py)
    sensor_delay: Float[Array, " nsensor"]  # reading delay (history.py)
    sensor_interval: Float[Array, "nsensor 2"]  # sample period and phase (history.py)
    # rangefinders only (ray.py): each geom's mesh or height-field triangles, geom frame; None without
    geom_ray_triangles: tuple[Float[Array, "ntri 3 3"], ...] | None = None
    keyframes: Keyframes | None = None  # None without keyframes (names: topology.key_names)

    @property
    def dtype(self):
        return self.body_mass.dtype

    @property
    def nactuator(self) -> int:
        """Number of actuators (MuJoCo 4's nu counts controls: an actuator may read several)."""
        return len(self.topology.actuator_trntype)

    def _actuator_shares(self, per_actuator):
        """(per dof, per tendon) sums of per_actuator ((nactuator,) or (nactuator, k)) * gear[0]^2 over the actuators
        on each joint (each of its dofs) or tendon: how MuJoCo 4 adds an actuator's damping and
        armature to what it drives (mj_actuatorDamping, mj_actuatorArmature)."""
        topo = self.topology
        trntype, trnid = np.asarray(topo.actuator_trntype, np.int64), np.asarray(topo.actuator_trnid, np.int64)
        on_joint = (trntype == TRN_JOINT) | (trntype == TRN_JOINTINPARENT)
        dof_map = on_joint[None, :] & (trnid[None, :] == np.asarray(topo.dof_jntid, np.int64)[:, None])
        tendon_map = (trntype == TRN_TENDON)[None, :] & (trnid[None, :] == np.arange(self.ntendon)[:, None])
        gear2 = self.actuator_gear[:, 0] ** 2
        weight = per_actuator * gear2.reshape(gear2.shape + (1,) * (per_actuator.ndim - 1))  # (nactuator, ...)
        return jnp.asarray(dof_map, self.dtype) @ weight, jnp.asarray(tendon_map, self.dtype) @ weight

    def _plus_actuators(self, own, per_actuator, on_tendons: bool):
        """A joint (or tendon) parameter plus the shares of the actuators on it."""
        return own + self._actuator_shares(per_actuator)[int(on_tendons)] if self.nactuator else own

    @property
    def dof_damping_total(self):
        """Joint damping plus that of the actuators on the joint."""
        return self._plus_actuators(self.dof_damping, self.actuator_damping, False)

    @property
    def dof_armature_total(self):
        return self._plus_actuators(self.dof_armature, self.actuator_armature, False)

    @property
    def tendon_damping_total(self):
        return self._plus_actuators(self.tendon_damping, self.actuator_damping, True)

    @property
    def dof_dampingpoly_total(self):
        """Higher-order joint damping plus that of the actuators on the joint (nv, 2)."""
        return self._plus_actuators(self.dof_dampingpoly, self.actuator_dampingpoly, False)

    @property
    def tendon_dampingpoly_total(self):
        return self._plus_actuators(self.tendon_dampingpoly, self.actuator_dampingpoly, True)

    @property
    def tendon_armature_total(self):
        return self._plus_actuators(self.tendon_armature, self.actuator_armature, True)


class Contact(eqx.Module):
    """Fixed-size contact array (mjData.contact); `mask` marks the contacts that exist.

    Geom ids and condim of each slot are static: `model.constraints.contact_geom`,
    `model.constraints.contact_dim`.
    """

    dist: Float[Array, " ncon"]
    pos: Float[Array, "ncon 3"]
    frame: Float[Array, "ncon 3 3"]  # rows: normal (geom1 -> geom2), tangent1, tangent2
    includemargin: Float[Array, " ncon"]
    friction: Float[Array, "ncon 5"]
    solref: Float[Array, "ncon 2"]
    solreffriction: Float[Array, "ncon 2"]
    solimp: Float[Array, "ncon 5"]
    adhesion: Float[Array, " ncon"]  # the pair's contact adhesion (mixed as mj_contactParam)
    mask: Bool[Array, " ncon"]
    overflow: Bool[Array, ""]  # the broad phase found more candidate pairs than opt.max_geom_pairs

    def replace(self, **changes) -> "Contact":
        return dataclasses.replace(self, **changes)


def empty_contact(ncon: int, dtype) -> Contact:
    z = lambda *shape: jnp.zeros(shape, dtype=dtype)  # noqa: E731
    return Contact(
        dist=z(ncon),
        pos=z(ncon, 3),
        frame=jnp.broadcast_to(jnp.eye(3, dtype=dtype), (ncon, 3, 3)),
        includemargin=z(ncon),
        friction=z(ncon, 5),
        solref=z(ncon, 2),
        solreffriction=z(ncon, 2),
        solimp=z(ncon, 5),
        adhesion=z(ncon),
        mask=jnp.zeros((ncon,), bool),
        overflow=jnp.zeros((), bool),
    )


class Data(eqx.Module):
    """Simulation state and everything `forward` derives from it (mjData subset).

    After `step`, qpos/qvel/act/time are the new state while the derived fields
    (xpos, qacc, ...) describe the state the step started from, as in MuJoCo.
    `diverged` is a per-world flag: it is set (and the state is frozen at its last
    finite value) once a control or the integrated state is non-finite or beyond
    `opt.maxval`; with `opt.auto_reset` the world restarts from qpos0 instead.
    `warning[k]` counts the steps in which check `WarningKind(k)` fired and
    `warning_time[k]` is the simulation time it first fired (-1: never).
    """

    time: Float[Array, ""]
    qpos: Float[Array, " nq"]
    qvel: Float[Array, " nv"]
    act: Float[Array, " na"]
    ctrl: Float[Array, " nu"]
    qfrc_applied: Float[Array, " nv"]
    xfrc_applied: Float[Array, "nbody 6"]
    mocap_pos: Float[Array, "nmocap 3"]  # poses of the mocap bodies (world frame), set per world
    mocap_quat: Float[Array, "nmocap 4"]
    eq_active: Bool[Array, " neq"]  # which equality constraints act (mjData.eq_active; none with equality disabled), per world
    qacc: Float[Array, " nv"]
    act_dot: Float[Array, " na"]
    diverged: Bool[Array, ""]
    warning: Int[Array, " nwarning"]
    warning_time: Float[Array, " nwarning"]
    solver_niter: Int[Array, ""]  # iterations the constraint solver used in the last forward
    solver_converged: Bool[Array, ""]
    solver_residual: Float[Array, ""]  # the solver's scaled optimality residual at its solution
    substeps: Int[Array, ""]  # integrator substeps the last step took (accepted ones; 1 for fixed-step integrators)
    energy: Float[Array, "2"]  # (potential, kinetic) of forward's state, with opt.energy (mjData.energy); else 0
    # kinematics
    xpos: Float[Array, "nbody 3"]
    xquat: Float[Array, "nbody 4"]
    xmat: Float[Array, "nbody 3 3"]
    xipos: Float[Array, "nbody 3"]
    ximat: Float[Array, "nbody 3 3"]
    xanchor: Float[Array, "njnt 3"]
    xaxis: Float[Array, "njnt 3"]
    geom_xpos: Float[Array, "ngeom 3"]
    geom_xmat: Float[Array, "ngeom 3 3"]
    site_xpos: Float[Array, "nsite 3"]
    site_xmat: Float[Array, "nsite 3 3"]
    # tendons (tendon.py)
    ten_length: Float[Array, " ntendon"]
    ten_velocity: Float[Array, " ntendon"]
    ten_J: Float[Array, "ntendon nv"]
    # com-based quantities
    subtree_com: Float[Array, "nbody 3"]
    cinert: Float[Array, "nbody 6 6"]
    cdof: Float[Array, "nv 6"]
    cvel: Float[Array, "nbody 6"]
    cdof_dot: Float[Array, "nv 6"]
    # dynamics
    qM: Float[Array, "nv nv"]
    qfrc_bias: Float[Array, " nv"]
    qfrc_passive: Float[Array, " nv"]
    actuator_length: Float[Array, " nactuator"]
    actuator_velocity: Float[Array, " nactuator"]
    actuator_force: Float[Array, " nactuator"]
    qfrc_actuator: Float[Array, " nv"]
    qfrc_smooth: Float[Array, " nv"]
    qacc_smooth: Float[Array, " nv"]
    qfrc_constraint: Float[Array, " nv"]
    qacc_warmstart: Float[Array, " nv"]
    # collision and constraints (fixed sizes; see ConstraintLayout). Contact rows belong to efc
    # contacts: one per slot, or with a capacity those of `constraint.efc_slots(model, contact)`
    contact: Contact
    efc_J: Float[Array, "nefc nv"]
    efc_pos: Float[Array, " nefc"]
    efc_margin: Float[Array, " nefc"]
    efc_D: Float[Array, " nefc"]
    efc_aref: Float[Array, " nefc"]
    efc_force: Float[Array, " nefc"]
    efc_mask: Bool[Array, " nefc"]
    sensordata: Float[Array, " nsensordata"]  # in MuJoCo's order (sensor.py)
    history: Float[Array, " nhistory"]  # actuators' and sensors' history buffers (history.py), as mjData.history
    plastic: Float[Array, " nplastic"]  # plastic springs' references (mjData.plastic; passive.plasticity)

    def replace(self, **changes) -> "Data":
        return dataclasses.replace(self, **changes)


def make_data(model: Model, key: int | str | None = None) -> Data:
    """Data at qpos0 with zero velocity, activation and controls (mj_resetData), or, with `key` (a
    keyframe's index or name), at that keyframe: its time, qpos, qvel, act, ctrl, mocap poses and
    plastic state (mj_resetDataKeyframe)."""
    data = _reset_data(model)
    if key is None:
        return data
    k, frames = keyframe_index(model, key), model.keyframes
    return data.replace(time=frames.time[k], qpos=frames.qpos[k], qvel=frames.qvel[k], act=frames.act[k],
                        ctrl=frames.ctrl[k], mocap_pos=frames.mocap_pos[k], mocap_quat=frames.mocap_quat[k],
                        plastic=frames.plastic[k])


def keyframe_index(model: Model, key: int | str) -> int:
    """The index of a keyframe given by index or name; a clear error for one the model lacks."""
    names = model.topology.key_names
    if isinstance(key, str):
        if not key or key not in names:
            raise ValueError(f"no keyframe named {key!r}; the model's keyframes: {[n for n in names if n] or 'none named'} "
                             f"({len(names)} in all)")
        return names.index(key)
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)):
        raise TypeError(f"key must be a keyframe's index (int) or name (str), got {type(key).__name__}")
    if not -len(names) <= key < len(names):
        raise ValueError(f"keyframe index {key} out of range: the model has {len(names)} keyframe(s)")
    return int(key) % len(names)


@jax.jit
def _reset_data(model: Model) -> Data:
    """make_data's state at qpos0 (one compiled program per model
    structure: called eagerly, its ~40 array constructors would otherwise each compile one)."""
    from . import history, passive  # they read Model and Data

    dt = model.dtype
    z = lambda *shape: jnp.zeros(shape, dtype=dt)  # noqa: E731
    nb, nj, ng = model.nbody, model.njnt, model.ngeom
    mocap = np.argsort(np.asarray(model.topology.body_mocapid))[nb - model.topology.nmocap :]  # bodies by mocap id
    eye = jnp.broadcast_to(jnp.eye(3, dtype=dt), (nb, 3, 3))
    return Data(
        time=jnp.zeros((), dt),
        qpos=jnp.asarray(model.qpos0, dt),
        qvel=z(model.nv),
        act=z(model.na),
        ctrl=z(model.nu),
        qfrc_applied=z(model.nv),
        xfrc_applied=z(nb, 6),
        mocap_pos=jnp.asarray(model.body_pos[mocap], dt),
        mocap_quat=jnp.asarray(model.body_quat[mocap], dt),
        eq_active=jnp.asarray(model.constraints.eq_active0, bool).reshape(-1),
        qacc=z(model.nv),
        act_dot=z(model.na),
        diverged=jnp.zeros((), bool),
        warning=jnp.zeros((NWARNING,), jnp.int32),
        warning_time=jnp.full((NWARNING,), -1.0, dt),
        solver_niter=jnp.zeros((), jnp.int32),
        solver_converged=jnp.ones((), bool),
        solver_residual=jnp.zeros((), dt),
        substeps=jnp.zeros((), jnp.int32),
        energy=z(2),
        xpos=z(nb, 3),
        xquat=jnp.tile(jnp.array([1.0, 0, 0, 0], dt), (nb, 1)),
        xmat=eye,
        xipos=z(nb, 3),
        ximat=eye,
        xanchor=z(nj, 3),
        xaxis=z(nj, 3),
        geom_xpos=z(ng, 3),
        geom_xmat=jnp.broadcast_to(jnp.eye(3, dtype=dt), (ng, 3, 3)),
        site_xpos=z(len(model.topology.site_bodyid), 3),
        site_xmat=jnp.broadcast_to(jnp.eye(3, dtype=dt), (len(model.topology.site_bodyid), 3, 3)),
        ten_length=z(model.ntendon),
        ten_velocity=z(model.ntendon),
        ten_J=z(model.ntendon, model.nv),
        subtree_com=z(nb, 3),
        cinert=z(nb, 6, 6),
        cdof=z(model.nv, 6),
        cvel=z(nb, 6),
        cdof_dot=z(model.nv, 6),
        qM=z(model.nv, model.nv),
        qfrc_bias=z(model.nv),
        qfrc_passive=z(model.nv),
        actuator_length=z(model.nactuator),
        actuator_velocity=z(model.nactuator),
        actuator_force=z(model.nactuator),
        qfrc_actuator=z(model.nv),
        qfrc_smooth=z(model.nv),
        qacc_smooth=z(model.nv),
        qfrc_constraint=z(model.nv),
        qacc_warmstart=z(model.nv),
        contact=empty_contact(model.constraints.ncon, dt),
        efc_J=z(model.constraints.nefc, model.nv),
        efc_pos=z(model.constraints.nefc),
        efc_margin=z(model.constraints.nefc),
        efc_D=z(model.constraints.nefc),
        efc_aref=z(model.constraints.nefc),
        efc_force=z(model.constraints.nefc),
        efc_mask=jnp.zeros((model.constraints.nefc,), bool),
        sensordata=z(model.topology.nsensordata),
        history=history.initial(model),
        plastic=passive.initial_plastic(model).astype(dt),
    )


def default_dtype():
    """float64 when jax_enable_x64 is on, else float32."""
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32
