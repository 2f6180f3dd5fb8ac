"""Passive joint forces: springs and dampers (mj_passive).

qfrc_passive = -stiffness (q - qpos_spring) - damping qvel, with the spring of a
ball joint (and the rotational part of a free joint) acting on the quaternion
difference expressed as a rotation vector (mju_subQuat). Tendons add
J^T (-k x - b ten_velocity), x = how far ten_length lies outside the spring's
deadband [lengthspring[0], lengthspring[1]] (0 inside it). Gravity compensation adds
J^T (-m gravcomp g) at each body's centre of mass (mj_gravcomp); at the dofs of joints
with actuatorgravcomp it is added to qfrc_actuator instead (actuation.py). With a medium
(option/density, viscosity) the fluid forces of fluid.py are added.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import fluid, math, smooth
from .types import Data, JointType, Model


def spring_force(model: Model, qpos):
    """-k (q - q_spring) per dof; quaternion coordinates use the rotation-vector difference."""
    jnt_of_dof = np.asarray(model.topology.dof_jntid, dtype=np.int64)
    return -model.jnt_stiffness[jnt_of_dof] * spring_displacement(model, qpos)


def spring_displacement(model: Model, qpos):
    """q - q_spring per dof (the rotation vector of q_spring^-1 q on ball and free rotations)."""
    topo = model.topology
    qidx, didx = topo.scalar_coords
    displacement = jnp.zeros(model.nv, model.dtype).at[didx].set(qpos[qidx] - model.qpos_spring[qidx])
    qadr, dadr = topo.quat_coords
    if len(qadr):
        blocks = qadr[:, None] + np.arange(4)
        rotvec = math.quat_sub(math.normalize(qpos[blocks]), model.qpos_spring[blocks])
        displacement = displacement.at[dadr[:, None] + np.arange(3)].set(rotvec)
    return displacement


def tendon_stretch(model: Model, data: Data):
    """How far each tendon's length lies beyond its spring deadband [lower, upper] (signed)."""
    lower, upper = model.tendon_lengthspring[:, 0], model.tendon_lengthspring[:, 1]
    length = data.ten_length
    return jnp.where(length > upper, length - upper, jnp.where(length < lower, length - lower, 0.0))


def tendon_force(model: Model, data: Data):
    """Scalar spring + damper force along each tendon (mj_springdamper's tendon loop)."""
    force = jnp.zeros(model.ntendon, model.dtype)
    if not model.opt.disabled("spring"):
        force = force - model.tendon_stiffness * tendon_stretch(model, data)
    if not model.opt.disabled("damper"):
        force = force - model.tendon_damping_total * data.ten_velocity
    return force


def passive(model: Model, data: Data) -> Data:
    """qfrc_passive = spring + damper (+ gravcomp, fluid) forces (flags "spring" and "damper" disable
    each; the fluid only when both are set, as mj_passive)."""
    qfrc = jnp.zeros(model.nv, model.dtype)
    if not model.opt.disabled("spring"):
        qfrc = qfrc + spring_force(model, data.qpos)
    if not model.opt.disabled("damper"):
        qfrc = qfrc - model.dof_damping_total * data.qvel
    if model.ntendon:
        qfrc = qfrc + data.ten_J.T @ tendon_force(model, data)
    if model.topology.has_gravcomp:
        to_actuators = np.asarray(model.topology.jnt_actgravcomp, dtype=bool)[np.asarray(model.topology.dof_jntid, dtype=np.int64)]
        qfrc = qfrc + jnp.where(to_actuators, 0.0, gravcomp(model, data))
    if fluid.enabled(model):
        qfrc = qfrc + fluid.fluid_force(model, data)
    return data.replace(qfrc_passive=qfrc)


def gravcomp(model: Model, data: Data):
    """qfrc_gravcomp: the generalized force cancelling gravcomp x each body's weight (zero with gravity off)."""
    if not model.topology.has_gravcomp or model.opt.disabled("gravity"):
        return jnp.zeros(model.nv, model.dtype)
    force = -(model.body_mass * model.body_gravcomp)[:, None] * model.opt.gravity
    return smooth.xfrc_to_qfrc(model, data, jnp.concatenate([force, jnp.zeros_like(force)], axis=-1))
