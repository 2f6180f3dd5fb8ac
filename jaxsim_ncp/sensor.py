"""Sensors: Data.sensordata in MuJoCo's order (mj_sensorPos, mj_sensorVel, mj_sensorAcc).

Simulated (mjtSensor): joint, tendon and actuator position/velocity, ball joint quaternion
and angular velocity, frame position/axes/quaternion (optionally in a reference frame),
frame linear/angular velocity (world or reference frame: MuJoCo's relative velocity with
the rotating-frame term), subtree com, site velocimeter, gyro and magnetometer, actuator
force, actuator force at a joint or tendon, clock. Objects: body (inertial frame), xbody,
geom, site. A sensor's `cutoff` clips real values to [-cutoff, cutoff] and positive ones
from above. Noise is not added (MuJoCo leaves it to the user). Other sensors are refused at
load (io.py), naming the sensor.
"""

from __future__ import annotations

from enum import IntEnum

import jax.numpy as jnp
import numpy as np

from . import math, smooth
from .types import TRN_TENDON, Data, Model


class Obj(IntEnum):
    """mjtObj values the sensors refer to."""

    BODY = 1
    XBODY = 2
    GEOM = 5
    SITE = 6


class Sens(IntEnum):
    """The mjtSensor types simulated here (same numbers)."""

    VELOCIMETER = 2
    GYRO = 3
    MAGNETOMETER = 6
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
    FRAMEPOS = 26
    FRAMEQUAT = 27
    FRAMEXAXIS = 28
    FRAMEYAXIS = 29
    FRAMEZAXIS = 30
    FRAMELINVEL = 31
    FRAMEANGVEL = 32
    SUBTREECOM = 35
    CLOCK = 45


_REAL, _POSITIVE = 0, 1  # mjtDataType


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


def _value(model: Model, data: Data, i: int):
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
            Sens.BALLQUAT: lambda: math.normalize(data.qpos[q : q + 4]),
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
        on = [a for a in range(model.nu) if topo.actuator_trntype[a] == TRN_TENDON and topo.actuator_trnid[a] == objid]
        return jnp.reshape(jnp.sum(data.actuator_force[np.asarray(on, dtype=np.int64)]), (1,))
    if kind == Sens.SUBTREECOM:
        return data.subtree_com[objid]
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
    """Data.sensordata: every sensor's value in MuJoCo's order, with its cutoff applied."""
    topo = model.topology
    if not topo.sensor_type:
        return data
    values = jnp.concatenate([jnp.asarray(_value(model, data, i), model.dtype) for i in range(len(topo.sensor_type))])
    dim = np.asarray(topo.sensor_dim, dtype=np.int64)
    datatype = np.repeat(np.asarray(topo.sensor_datatype, dtype=np.int64), dim)
    cutoff = jnp.repeat(model.sensor_cutoff, dim, total_repeat_length=int(dim.sum()))
    on = cutoff > 0
    clipped = jnp.where(datatype == _REAL, jnp.clip(values, -cutoff, cutoff), jnp.where(datatype == _POSITIVE, jnp.minimum(values, cutoff), values))
    return data.replace(sensordata=jnp.where(on, clipped, values))
