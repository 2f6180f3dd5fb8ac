"""Sensors: Data.sensordata in MuJoCo's order (mj_sensorPos, mj_sensorVel, mj_sensorAcc).

Simulated (mjtSensor): joint, tendon and actuator position/velocity, ball joint quaternion
and angular velocity, frame position/axes/quaternion (optionally in a reference frame),
frame linear/angular velocity (world or reference frame: MuJoCo's relative velocity with
the rotating-frame term), subtree com, linear velocity and angular momentum, site
velocimeter, gyro and magnetometer, rangefinder (ray.py), camera projection, inside-site
flags, potential and kinetic energy, joint and tendon limit distance/velocity/force (the
Newton solver's limit rows), geom distance/normal/from-to, actuator force, actuator force at a joint or tendon, clock;
and the acceleration-stage sensors that need the constraint forces: accelerometer,
frame linear/angular acceleration, force and torque (the wrench a body receives from its
parent, mj_rnePostConstraint), touch (normal contact forces whose ray from the contact
point along the normal enters the site's zone) and contact (matched contacts reduced to fixed
slots, `_contact_sensor`). Objects: body (inertial frame), xbody,
geom, site. A sensor's `cutoff` clips real values to [-cutoff, cutoff] and positive ones
from above. Noise is not added (MuJoCo leaves it to the user). Other sensors are refused at
load (io.py), naming the sensor.
"""

from __future__ import annotations

import functools
from enum import IntEnum

import jax.numpy as jnp
import numpy as np

from . import collision, constraint, history, math, passive, ray, smooth
from .types import TRN_TENDON, Data, Model


class Obj(IntEnum):
    """mjtObj values the sensors refer to."""

    BODY = 1
    XBODY = 2
    GEOM = 5
    SITE = 6


class Sens(IntEnum):
    """The mjtSensor types simulated here (same numbers)."""

    TOUCH = 0
    ACCELEROMETER = 1
    VELOCIMETER = 2
    GYRO = 3
    FORCE = 4
    TORQUE = 5
    MAGNETOMETER = 6
    RANGEFINDER = 7
    CAMPROJECTION = 8
    JOINTPOS = 9
    JOINTVEL = 10
    TENDONPOS = 11
    TENDONVEL = 12
    ACTUATORPOS = 13
    ACTUATORVEL = 14
    ACTUATORFRC = 15
    JOINTACTFRC = 16
    TENDONACTFRC = 17
    BALLQUAT = 18
    BALLANGVEL = 19
    JOINTLIMITPOS = 20
    JOINTLIMITVEL = 21
    JOINTLIMITFRC = 22
    TENDONLIMITPOS = 23
    TENDONLIMITVEL = 24
    TENDONLIMITFRC = 25
    FRAMEPOS = 26
    FRAMEQUAT = 27
    FRAMEXAXIS = 28
    FRAMEYAXIS = 29
    FRAMEZAXIS = 30
    FRAMELINVEL = 31
    FRAMEANGVEL = 32
    FRAMELINACC = 33
    FRAMEANGACC = 34
    SUBTREECOM = 35
    SUBTREELINVEL = 36
    SUBTREEANGMOM = 37
    INSIDESITE = 38
    GEOMDIST = 39
    GEOMNORMAL = 40
    GEOMFROMTO = 41
    CONTACT = 42
    E_POTENTIAL = 43
    E_KINETIC = 44
    CLOCK = 45


_REAL, _POSITIVE = 0, 1  # mjtDataType
_FIXED, _TRACK, _TRACKCOM, _TARGETBODY, _TARGETBODYCOM = range(5)  # mjtCamLight
_SPHERE, _CAPSULE, _ELLIPSOID, _CYLINDER, _BOX = 2, 3, 4, 5, 6  # mjtGeom of a site's zone


def _body_of(model: Model, objtype: int, objid: int) -> int:
    topo = model.topology
    if objtype == Obj.GEOM:
        return topo.geom_bodyid[objid]
    if objtype == Obj.SITE:
        return topo.site_bodyid[objid]
    return objid


def _frame(data: Data, objtype: int, objid: int):
    """Position and rotation matrix of an object (get_xpos_xmat)."""
    if objtype == Obj.BODY:
        return data.xipos[objid], data.ximat[objid]
    if objtype == Obj.XBODY:
        return data.xpos[objid], data.xmat[objid]
    if objtype == Obj.GEOM:
        return data.geom_xpos[objid], data.geom_xmat[objid]
    return data.site_xpos[objid], data.site_xmat[objid]


def _quat(model: Model, data: Data, objtype: int, objid: int):
    """World orientation quaternion of an object (get_xquat)."""
    if objtype == Obj.XBODY:
        return data.xquat[objid]
    local = {Obj.BODY: model.body_iquat, Obj.GEOM: model.geom_quat, Obj.SITE: model.site_quat}[Obj(objtype)]
    return math.quat_mul(data.xquat[_body_of(model, objtype, objid)], local[objid])


def _velocity(model: Model, data: Data, objtype: int, objid: int, local: bool):
    """(angular, linear) velocity of an object at its position, world or object frame (mj_objectVelocity)."""
    pos, rot = _frame(data, objtype, objid)
    return smooth.object_velocity(model, data, _body_of(model, objtype, objid), pos, rot if local else None)


class _Shared:
    """Quantities several sensors read, computed on first use (once per forward)."""

    def __init__(self, model: Model, data: Data):
        self.model, self.data = model, data

    @functools.cached_property
    def contact_force(self):
        return constraint.contact_force(self.model, self.data)

    @functools.cached_property
    def rne_post(self):  # (cacc, cfrc_int)
        return smooth.rne_post_constraint(self.model, self.data, constraint.external_wrenches(self.model, self.data))

    @functools.cached_property
    def energy(self):  # (potential, kinetic)
        return energy(self.model, self.data)

    @functools.cached_property
    def subtree(self):  # (subtree_linvel, subtree_angmom)
        return smooth.subtree_momentum(self.model, self.data)


_MINVAL = 1e-15  # mjMINVAL


def _ray_interval(inside, a, b, c):
    """[lo, hi]: the t where a t^2 + 2 b t + c <= 0 (a ray inside a convex quadric); empty as lo > hi.
    `inside` (c <= 0) decides the degenerate a ~ 0 case (a ray along the quadric's free axis)."""
    det = b * b - a * c
    root = jnp.where(det > 0, jnp.sqrt(jnp.where(det > 0, det, 1.0)), 0.0)
    ok = a > _MINVAL
    safe_a = jnp.where(ok, a, 1.0)
    lo = jnp.where(ok, (-b - root) / safe_a, jnp.where(inside, -jnp.inf, jnp.inf))
    hi = jnp.where(ok, (-b + root) / safe_a, jnp.where(inside, jnp.inf, -jnp.inf))
    return jnp.where(ok & (det < 0), jnp.inf, lo), hi


def _slab_interval(p, v, half):
    """[lo, hi]: the t where |p + t v| <= half along one axis."""
    moving = jnp.abs(v) > _MINVAL
    safe_v = jnp.where(moving, v, 1.0)
    t1, t2 = (-half - p) / safe_v, (half - p) / safe_v
    inside = jnp.abs(p) <= half
    lo = jnp.where(moving, jnp.minimum(t1, t2), jnp.where(inside, -jnp.inf, jnp.inf))
    hi = jnp.where(moving, jnp.maximum(t1, t2), jnp.where(inside, jnp.inf, -jnp.inf))
    return lo, hi


def _ray_hits(zone: int, size, p, v):
    """Whether rays p + t v, t >= 0 (zone's frame, (n, 3)) meet the solid zone: mju_rayGeom >= 0."""

    def meets(*intervals):
        lo = functools.reduce(jnp.maximum, [i[0] for i in intervals])
        hi = functools.reduce(jnp.minimum, [i[1] for i in intervals])
        return (lo <= hi) & (hi >= 0)

    def ball(centre, radii):  # ellipsoid (a sphere with equal radii)
        q, w = (p - centre) / radii, v / radii
        c = jnp.sum(q * q, -1) - 1
        return meets(_ray_interval(c <= 0, jnp.sum(w * w, -1), jnp.sum(w * q, -1), c))

    def cylinder(radius, half_height):
        c = jnp.sum(p[:, :2] ** 2, -1) - radius**2
        a, b = jnp.sum(v[:, :2] ** 2, -1), jnp.sum(v[:, :2] * p[:, :2], -1)
        return meets(_ray_interval(c <= 0, a, b, c), _slab_interval(p[:, 2], v[:, 2], half_height))

    r = size[0]
    if zone == _SPHERE:
        return ball(jnp.zeros(3, p.dtype), r)
    if zone == _ELLIPSOID:
        return ball(jnp.zeros(3, p.dtype), size)
    if zone == _CYLINDER:
        return cylinder(r, size[1])
    if zone == _CAPSULE:
        cap = jnp.zeros(3, p.dtype).at[2].set(size[1])
        return cylinder(r, size[1]) | ball(cap, r) | ball(-cap, r)
    if zone == _BOX:
        return meets(*(_slab_interval(p[:, k], v[:, k], size[k]) for k in range(3)))
    raise ValueError(f"a touch sensor's site has geom type {zone}: not a solid zone")


def _touch(model: Model, data: Data, shared: _Shared, site: int):
    """Sum of the normal forces of contacts on the site's body whose ray from the contact point along
    the normal (oriented towards the other body) meets the site's zone (mjSENS_TOUCH); a zone
    that contains the contact point always counts."""
    topo = model.topology
    body = topo.site_bodyid[site]
    contact_body = constraint.geom_body(model, model.constraints.contact_geom)
    mine = np.flatnonzero((contact_body[:, 0] == body) | (contact_body[:, 1] == body))
    if mine.size == 0:
        return jnp.zeros(1, model.dtype)
    normal_force = shared.contact_force[mine, 0]
    flip = np.where(contact_body[mine, 1] == body, -1.0, 1.0)
    ray = data.contact.frame[mine, 0] * jnp.asarray(flip, model.dtype)[:, None]
    rot = data.site_xmat[site]
    hit = _ray_hits(topo.site_type[site], model.site_size[site], (data.contact.pos[mine] - data.site_xpos[site]) @ rot, ray @ rot)
    return jnp.sum(jnp.where(hit & (normal_force > 0), normal_force, 0.0), keepdims=True)


def camera_frame(model: Model, data: Data, cam: int):
    """A camera's world position and rotation (mj_camlight): fixed to its body; with a fixed world
    orientation following the body (track) or its subtree com (trackcom); or turned towards a target
    body (targetbody) or its subtree com (targetbodycom), its x axis horizontal."""
    topo = model.topology
    body, mode, target = topo.cam_bodyid[cam], topo.cam_mode[cam], topo.cam_targetbodyid[cam]
    pos = data.xpos[body] + data.xmat[body] @ model.cam_pos[cam]
    rot = data.xmat[body] @ math.quat_to_mat(model.cam_quat[cam])
    if mode in (_TRACK, _TRACKCOM):
        base = data.xpos[body] if mode == _TRACK else data.subtree_com[body]
        return base + (model.cam_pos0[cam] if mode == _TRACK else model.cam_poscom0[cam]), model.cam_mat0[cam]
    if mode in (_TARGETBODY, _TARGETBODYCOM) and target >= 0:
        z = math.normalize(pos - (data.xpos[target] if mode == _TARGETBODY else data.subtree_com[target]))
        x = math.normalize(jnp.cross(jnp.array([0.0, 0.0, 1.0], z.dtype), z))
        y = math.normalize(jnp.cross(z, x))
        rot = jnp.stack([x, y, z], axis=1)
    return pos, rot


def _camera_projection(model: Model, data: Data, site: int, cam: int):
    """The site's pixel coordinates in the camera's image (cam_project): pinhole projection with
    focal lengths from the intrinsics and sensor size, else from fovy (square pixels); u grows to
    the right, v downwards, the image center at half the resolution."""
    pos, rot = camera_frame(model, data, cam)
    width, height = model.topology.cam_resolution[cam]
    size, focal = model.cam_sensorsize[cam], model.cam_intrinsic[cam, :2]
    fovy_focal = 0.5 / jnp.tan(model.cam_fovy[cam] * jnp.pi / 360.0) * height
    physical = (size[0] != 0) & (size[1] != 0)
    safe_size = jnp.where(physical, size, 1.0)
    # MuJoCo stores intrinsics and sensor size as float32 and divides them in float32
    lens = (focal.astype(jnp.float32) / safe_size.astype(jnp.float32) * jnp.array([width, height], jnp.float32)).astype(focal.dtype)
    fx = jnp.where(physical, lens[0], fovy_focal)
    fy = jnp.where(physical, lens[1], fovy_focal)
    local = rot.T @ (data.site_xpos[site] - pos)
    depth = jnp.where(local[2] < 0, jnp.minimum(local[2], -_MINVAL), jnp.maximum(local[2], _MINVAL))
    return jnp.stack([-fx * local[0] / depth + 0.5 * width, fy * local[1] / depth + 0.5 * height])


def energy(model: Model, data: Data):
    """(potential, kinetic) energy (mj_energyPos, mj_energyVel): -sum_b m_b g . xipos_b plus the joint
    springs (1/2 k x^2; x the rotation angle for ball joints, and the distance plus the angle for free
    joints) and the tendon springs beyond their deadband; kinetic 1/2 qvel^T M qvel (armature included)."""
    potential = jnp.zeros((), model.dtype)
    if not model.opt.disabled("gravity"):
        potential = potential - jnp.sum(model.body_mass[1:] * (data.xipos[1:] @ model.opt.gravity))
    if not model.opt.disabled("spring"):
        jnt_of_dof = np.asarray(model.topology.dof_jntid, dtype=np.int64)
        displacement = passive.spring_displacement(model, data.qpos, passive.spring_references(model, data)[0])
        potential = potential + 0.5 * jnp.sum(model.jnt_stiffness[jnt_of_dof] * displacement**2)
        if model.topology.has_polynomial_springs:  # higher-order terms once per scalar dof or 3-vector
            extent, head = passive.spring_extent(model, displacement)
            poly = jnp.where(head[:, None], model.jnt_stiffnesspoly[jnt_of_dof], 0.0)
            potential = potential + jnp.sum(passive.polynomial_potential(0.0, poly, extent))
        if model.ntendon:
            stretch = passive.tendon_stretch(model, data)
            potential = potential + jnp.sum(passive.polynomial_potential(model.tendon_stiffness, model.tendon_stiffnesspoly, stretch))
    return potential, 0.5 * data.qvel @ (data.qM @ data.qvel)


def _limit_reading(model: Model, data: Data, joint: int | None, tendon: int | None, what: str):
    """The first active limit row of a joint or tendon (MuJoCo's efc order): its distance minus
    margin, velocity J qvel, or force; 0 when no limit row is active."""
    layout = model.constraints
    if joint is not None:
        rows = [k for k, j in enumerate(layout.limit_jnts) if j == joint]
    else:
        rows = [len(layout.limit_jnts) + k for k, t in enumerate(layout.limit_tendons) if t == tendon]
    if not rows:
        return jnp.zeros(1, model.dtype)
    rows = layout.ne + layout.nf + np.asarray(rows, dtype=np.int64)
    value = {
        "pos": lambda: data.efc_pos[rows] - data.efc_margin[rows],
        "vel": lambda: data.efc_J[rows] @ data.qvel,
        "frc": lambda: data.efc_force[rows],
    }[what]()
    active = data.efc_mask[rows]
    first = jnp.argmax(active)
    return jnp.where(jnp.any(active), value[first], 0.0)[None]


def _inside_site(model: Model, data: Data, objtype: int, objid: int, site: int):
    """1 if the object's position is strictly inside the site's zone (mju_insideGeom), else 0."""
    point, _ = _frame(data, objtype, objid)
    if objtype == Obj.BODY and objid > 0:  # a massless body with mass below it: its subtree com
        subtree_mass = smooth._subtree(model)[objid] @ model.body_mass
        massless = (model.body_mass[objid] < _MINVAL) & (subtree_mass >= _MINVAL)
        point = jnp.where(massless, data.subtree_com[objid], point)
    return _inside_zone(model, data, site, point[None]).astype(model.dtype)


def _inside_zone(model: Model, data: Data, site: int, points):
    """Whether points (n, 3) are strictly inside the site's zone (mju_insideGeom)."""
    size = model.site_size[site]
    local = (points - data.site_xpos[site]) @ data.site_xmat[site]
    kind = model.topology.site_type[site]
    if kind == _SPHERE:
        return jnp.sum(local**2, -1) < size[0] ** 2
    if kind == _CAPSULE:
        beyond = local[:, 2] - jnp.clip(local[:, 2], -size[1], size[1])
        return local[:, 0] ** 2 + local[:, 1] ** 2 + beyond**2 < size[0] ** 2
    if kind == _ELLIPSOID:
        return jnp.sum(local**2 / size**2, -1) < 1
    if kind == _CYLINDER:
        return (jnp.abs(local[:, 2]) < size[1]) & (local[:, 0] ** 2 + local[:, 1] ** 2 < size[0] ** 2)
    return jnp.all(jnp.abs(local) < size, -1)


_CONTACT_FIELDS = (1, 3, 3, 1, 3, 3, 3, 3, 3)  # mjtConDataField sizes: found force torque dist pos normal tangent linvel angvel
_REDUCE_NONE, _REDUCE_MINDIST, _REDUCE_MAXFORCE, _REDUCE_NETFORCE = range(4)
_NCP_CLOSED = 1e-5  # NCP: a contact exists for a contact sensor where its gap is below this many meansizes


def _contact_matches(model: Model, type1: int, id1: int, type2: int, id2: int):
    """Per contact slot, static: whether it involves both sensor objects, and whether its normal
    must be flipped to point from the first to the second (matchContact). A site matches any
    slot here (its volume is tested on the contact point)."""
    topo = model.topology
    geom = model.constraints.contact_geom
    body = constraint.geom_body(model, geom)

    def check(side: int, objtype: int, objid: int) -> np.ndarray:
        if objtype in (0, Obj.SITE):  # none (mjOBJ_UNKNOWN), or a site
            return np.ones(len(geom), bool)
        if objtype == Obj.GEOM:
            return geom[:, side] == objid
        if objtype == Obj.BODY:
            return body[:, side] == objid
        return np.asarray(topo.body_ancestor)[body[:, side], objid]  # XBODY: objid's subtree

    m11, m12, m21, m22 = check(0, type1, id1), check(1, type1, id1), check(0, type2, id2), check(1, type2, id2)
    match = (m11 | m12) & (m21 | m22)
    if type1 and type2:
        flip = m12 & m21 & ~(m11 & m22)  # both given: reversed order only where the regular one fails
    elif type1:
        flip = ~m11
    elif type2:
        flip = ~m22
    else:
        flip = np.zeros(len(geom), bool)
    return match, flip


def _contact_sensor(model: Model, data: Data, shared: _Shared, i: int):
    """A contact sensor (mjSENS_CONTACT): the contacts involving its objects, reduced to `num` slots
    (none: in MuJoCo's contact order, `constraint.mujoco_contact_rank`; mindist: the deepest first; maxforce:
    the largest force first; netforce: one synthetic contact at the force-weighted centroid, in the
    world frame), each reporting the fields of its data bits. A flipped contact (the sensor's first object is the contact's second) reports
    its normal and tangent negated and the force, torque and velocities with their third component
    negated (the same vectors in the frame turned 180 degrees about the second tangent)."""
    topo = model.topology
    spec, reduce = topo.sensor_intprm[i], topo.sensor_reduce[i]
    sizes = [n for bit, n in enumerate(_CONTACT_FIELDS) if spec & (1 << bit)]
    num = topo.sensor_dim[i] // sum(sizes)
    dtype = model.dtype
    type1, id1 = topo.sensor_objtype[i], topo.sensor_objid[i]
    type2, id2 = topo.sensor_reftype[i], topo.sensor_refid[i]
    match, flip = _contact_matches(model, type1, id1, type2, id2)
    con = data.contact
    valid = con.mask & jnp.asarray(match)
    if model.opt.solver == "ncp":  # its contact array holds every contact within the step's reach: the closed ones
        valid = valid & (con.dist - con.includemargin <= _NCP_CLOSED * model.opt.meansize)
    if type1 == Obj.SITE:
        valid = valid & _inside_zone(model, data, id1, con.pos)
    found = jnp.sum(valid).astype(dtype)
    sign = jnp.where(jnp.asarray(flip), -1.0, 1.0).astype(dtype)
    wrench = shared.contact_force  # (ncon, 6), contact frames

    if reduce == _REDUCE_NETFORCE:
        w = jnp.where(valid[:, None], wrench * sign[:, None], 0.0)
        weight = jnp.linalg.norm(w[:, :3], axis=-1)
        point = jnp.sum(weight[:, None] * con.pos, 0) / jnp.maximum(jnp.sum(weight), _MINVAL)
        force_j = jnp.einsum("cji,cj->ci", con.frame, w[:, :3])  # frame^T f: world
        torque = jnp.sum(jnp.einsum("cji,cj->ci", con.frame, w[:, 3:]) + jnp.cross(con.pos - point, force_j), 0)
        z3 = jnp.zeros(3, dtype)
        fields = (found[None], jnp.sum(force_j, 0), torque, jnp.zeros(1, dtype), point,
                  z3.at[0].set(1.0), z3.at[1].set(1.0), z3, z3)  # fmt: skip
        slot = jnp.concatenate([f for bit, f in enumerate(fields) if spec & (1 << bit)])
        slot = jnp.where(found > 0, slot, 0.0)  # no match: an empty slot (MuJoCo 4)
        return jnp.concatenate([slot, jnp.zeros((num - 1) * slot.shape[0], dtype)])

    rank = jnp.asarray(constraint.mujoco_contact_rank(model), dtype)
    criterion = {_REDUCE_MINDIST: con.dist, _REDUCE_MAXFORCE: -jnp.sum(wrench[:, :3] ** 2, -1)}.get(reduce, rank)
    order = jnp.lexsort((rank, jnp.where(valid, criterion, jnp.inf)))[:num]  # ties: MuJoCo's contact order
    filled = (jnp.arange(len(order)) < found)[:, None]
    c, s = order, sign[order][:, None]
    flip_z = jnp.concatenate([jnp.ones((len(c), 2), dtype), s], -1)
    velocity = [None, None]
    if spec & (3 << 7):  # linvel, angvel: body 2 relative to body 1 at the contact, in the contact frame
        body = constraint.geom_body(model, model.constraints.contact_geom)
        axes = con.frame.swapaxes(-1, -2)
        w1, v1 = smooth.object_velocity(model, data, body[:, 0], con.pos, axes)
        w2, v2 = smooth.object_velocity(model, data, body[:, 1], con.pos, axes)
        velocity = [(v2 - v1)[c] * flip_z, (w2 - w1)[c] * flip_z]
    fields = [jnp.broadcast_to(found, (len(c), 1)), wrench[c, :3] * flip_z, wrench[c, 3:] * flip_z, con.dist[c, None],
              con.pos[c], con.frame[c, 0] * s, con.frame[c, 1] * s, *velocity]  # fmt: skip
    slots = jnp.concatenate([f for bit, f in enumerate(fields) if spec & (1 << bit)], axis=-1)
    slots = jnp.where(filled, slots, 0.0)
    return jnp.concatenate([slots.reshape(-1), jnp.zeros((num - len(c)) * slots.shape[1], dtype)])


def distance_geoms(geom_bodyid, objtype: int, objid: int) -> list[int]:
    """The geoms a distance sensor names: one geom, or every geom of a body (in id order)."""
    if objtype == Obj.GEOM:
        return [int(objid)]
    return [g for g, b in enumerate(geom_bodyid) if b == objid]


def _geom_distance(model: Model, data: Data, i: int):
    """Smallest signed distance between two geoms or two bodies' geoms, up to the sensor's cutoff
    (mj_geomDistance), and the segment from the first's surface to the second's (zero if none is
    closer than the cutoff). Pairs MuJoCo sends to its convex collider (mjc_Convex, mjc_BoxBox)
    take the exact GJK/EPA distance; the others the smallest contact of their collision
    function run with the cutoff as margin."""
    topo = model.topology
    cutoff = model.sensor_cutoff[i]
    best, fromto = cutoff, jnp.zeros(6, model.dtype)
    for g1 in distance_geoms(topo.geom_bodyid, topo.sensor_objtype[i], topo.sensor_objid[i]):
        for g2 in distance_geoms(topo.geom_bodyid, topo.sensor_reftype[i], topo.sensor_refid[i]):
            flip = topo.geom_type[g1] > topo.geom_type[g2]
            ga, gb = (g2, g1) if flip else (g1, g2)
            fn = collision.distance_function(topo.geom_type[ga], topo.geom_type[gb])
            if fn is None:  # no collision function for the pair (two planes): MuJoCo reports the cutoff
                continue
            frames = [collision.geom_frame(model, data, g) for g in (ga, gb)]
            col = fn(*frames, cutoff)
            dist = jnp.where(col.valid, col.dist, jnp.inf)
            k = jnp.argmin(dist)  # the first smallest, as MuJoCo's strict comparison
            closer = dist[k] < best
            half = (-0.5 if flip else 0.5) * col.dist[k] * col.frame[k, 0]
            best = jnp.where(closer, col.dist[k], best)
            fromto = jnp.where(closer, jnp.concatenate([col.pos[k] - half, col.pos[k] + half]), fromto)
    kind = Sens(topo.sensor_type[i])
    if kind == Sens.GEOMDIST:
        return best[None]
    if kind == Sens.GEOMNORMAL:
        return math.normalize(fromto[3:] - fromto[:3])
    return fromto


def _rangefinder(model: Model, data: Data, site: int, fields: int):
    """A ray along the site's z axis (mj_ray, the site's own body excluded); the mjtRayDataField
    bits choose the outputs, in order: distance (-1: no hit), direction, origin, hit point,
    surface normal, depth (= distance for a site). Direction, point and normal are 0 without a hit."""
    origin, direction = data.site_xpos[site], data.site_xmat[site][:, 2]
    dist, normal = ray.ray(model, data, origin, direction, model.topology.site_bodyid[site])
    hit = dist >= 0
    outputs = (
        dist[None],
        jnp.where(hit, direction, 0.0),
        origin,
        jnp.where(hit, origin + dist * direction, 0.0),
        normal,
        dist[None],
    )  # fmt: skip
    return jnp.concatenate([out for bit, out in enumerate(outputs) if fields & (1 << bit)])


def _value(model: Model, data: Data, i: int, shared: _Shared):
    """The value of sensor i (a 1-D array of its dimension)."""
    topo = model.topology
    kind = Sens(topo.sensor_type[i])
    objtype, objid = topo.sensor_objtype[i], topo.sensor_objid[i]
    reftype, refid = topo.sensor_reftype[i], topo.sensor_refid[i]
    if kind in (Sens.JOINTPOS, Sens.JOINTVEL, Sens.BALLQUAT, Sens.BALLANGVEL):
        q, v = topo.jnt_qposadr[objid], topo.jnt_dofadr[objid]
        return {
            Sens.JOINTPOS: lambda: data.qpos[q : q + 1],
            Sens.JOINTVEL: lambda: data.qvel[v : v + 1],
            Sens.BALLQUAT: lambda: math.quat_normalize(data.qpos[q : q + 4]),
            Sens.BALLANGVEL: lambda: data.qvel[v : v + 3],
        }[kind]()
    scalar = {
        Sens.TENDONPOS: lambda: data.ten_length[objid],
        Sens.TENDONVEL: lambda: data.ten_velocity[objid],
        Sens.ACTUATORPOS: lambda: data.actuator_length[objid],
        Sens.ACTUATORVEL: lambda: data.actuator_velocity[objid],
        Sens.ACTUATORFRC: lambda: data.actuator_force[objid],
        Sens.JOINTACTFRC: lambda: data.qfrc_actuator[topo.jnt_dofadr[objid]],
        Sens.CLOCK: lambda: data.time,
    }
    if kind in scalar:
        return jnp.reshape(scalar[kind](), (1,))
    if kind == Sens.TENDONACTFRC:
        on = [a for a in range(model.nactuator) if topo.actuator_trntype[a] == TRN_TENDON and topo.actuator_trnid[a] == objid]
        return jnp.reshape(jnp.sum(data.actuator_force[np.asarray(on, dtype=np.int64)]), (1,))
    if kind == Sens.SUBTREECOM:
        return data.subtree_com[objid]
    if kind in (Sens.SUBTREELINVEL, Sens.SUBTREEANGMOM):
        return shared.subtree[kind - Sens.SUBTREELINVEL][objid]
    if kind == Sens.TOUCH:
        return _touch(model, data, shared, objid)
    if kind in (Sens.E_POTENTIAL, Sens.E_KINETIC):
        return shared.energy[kind - Sens.E_POTENTIAL][None]
    if kind in (Sens.GEOMDIST, Sens.GEOMNORMAL, Sens.GEOMFROMTO):
        return _geom_distance(model, data, i)
    if kind == Sens.INSIDESITE:
        return _inside_site(model, data, objtype, objid, refid)
    if kind == Sens.CONTACT:
        return _contact_sensor(model, data, shared, i)
    if Sens.JOINTLIMITPOS <= kind <= Sens.TENDONLIMITFRC:
        on_joint = kind <= Sens.JOINTLIMITFRC
        what = ("pos", "vel", "frc")[(kind - Sens.JOINTLIMITPOS) % 3]
        return _limit_reading(model, data, objid if on_joint else None, None if on_joint else objid, what)
    if kind == Sens.CAMPROJECTION:
        return _camera_projection(model, data, objid, refid)
    if kind == Sens.RANGEFINDER:
        return _rangefinder(model, data, objid, topo.sensor_intprm[i])
    if kind in (Sens.FORCE, Sens.TORQUE):  # cfrc_int at the site, in the site's axes
        body = topo.site_bodyid[objid]
        wrench = shared.rne_post[1][body]
        torque = wrench[:3] - jnp.cross(data.site_xpos[objid] - data.subtree_com[topo.body_rootid[body]], wrench[3:])
        return data.site_xmat[objid].T @ (wrench[3:] if kind == Sens.FORCE else torque)
    if kind in (Sens.ACCELEROMETER, Sens.FRAMELINACC, Sens.FRAMEANGACC):
        pos, rot = _frame(data, objtype, objid)
        local = rot if kind == Sens.ACCELEROMETER else None
        ang, lin = smooth.object_acceleration(model, data, shared.rne_post[0], _body_of(model, objtype, objid), pos, local)
        return ang if kind == Sens.FRAMEANGACC else lin
    if kind in (Sens.VELOCIMETER, Sens.GYRO):
        ang, lin = _velocity(model, data, Obj.SITE, objid, local=True)
        return lin if kind == Sens.VELOCIMETER else ang
    if kind == Sens.MAGNETOMETER:
        return data.site_xmat[objid].T @ model.opt.magnetic
    if kind in (Sens.FRAMEPOS, Sens.FRAMEXAXIS, Sens.FRAMEYAXIS, Sens.FRAMEZAXIS):
        pos, rot = _frame(data, objtype, objid)
        vec = pos if kind == Sens.FRAMEPOS else rot[:, kind - Sens.FRAMEXAXIS]
        if refid < 0:
            return vec
        ref_pos, ref_rot = _frame(data, reftype, refid)
        return ref_rot.T @ (vec - ref_pos if kind == Sens.FRAMEPOS else vec)
    if kind == Sens.FRAMEQUAT:
        quat = _quat(model, data, objtype, objid)
        if refid < 0:
            return quat
        return math.quat_mul(math.quat_conj(_quat(model, data, reftype, refid)), quat)
    # FRAMELINVEL, FRAMEANGVEL
    ang, lin = _velocity(model, data, objtype, objid, local=False)
    if refid >= 0:
        pos, _ = _frame(data, objtype, objid)
        ref_pos, ref_rot = _frame(data, reftype, refid)
        ref_ang, ref_lin = _velocity(model, data, reftype, refid, local=False)
        rel_lin = lin - ref_lin + jnp.cross(pos - ref_pos, ref_ang)
        ang, lin = ref_rot.T @ (ang - ref_ang), ref_rot.T @ rel_lin
    return lin if kind == Sens.FRAMELINVEL else ang


def sensors(model: Model, data: Data) -> Data:
    """Data.sensordata: every sensor's value in MuJoCo's order, with its cutoff applied, or what its
    history buffer holds for it (a delay or a sample interval, history.py). With sensors disabled
    (option/flag sensor) sensordata keeps its values, as MuJoCo's mj_sensor* return early."""
    if not model.topology.sensor_type or model.opt.disabled("sensor"):
        return data
    return data.replace(sensordata=history.sensor_readings(model, data, current_values(model, data)))


def current_values(model: Model, data: Data, which: tuple[int, ...] | None = None):
    """The values of sensors `which` (default: all) at data's state (mj_computeSensor), concatenated
    in that order, each with its cutoff applied."""
    topo = model.topology
    which = tuple(range(len(topo.sensor_type))) if which is None else which
    shared = _Shared(model, data)
    values = jnp.concatenate([jnp.asarray(_value(model, data, i, shared), model.dtype) for i in which])
    dim = np.asarray(topo.sensor_dim, dtype=np.int64)[list(which)]
    datatype = np.repeat(np.asarray(topo.sensor_datatype, dtype=np.int64)[list(which)], dim)
    cutoff = jnp.repeat(model.sensor_cutoff[np.asarray(which, dtype=np.int64)], dim, total_repeat_length=int(dim.sum()))
    # a from-to sensor's cutoff is its range; a contact sensor's is ignored
    on = (cutoff > 0) & ~np.isin(np.repeat(np.asarray(topo.sensor_type)[list(which)], dim), [Sens.GEOMFROMTO, Sens.CONTACT])
    clipped = jnp.where(datatype == _REAL, jnp.clip(values, -cutoff, cutoff), jnp.where(datatype == _POSITIVE, jnp.minimum(values, cutoff), values))
    return jnp.where(on, clipped, values)
