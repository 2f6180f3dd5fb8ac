"""Passive joint forces: springs and dampers (mj_passive).

qfrc_passive = -stiffness (q - qpos_spring) - damping qvel, with the spring of a
ball joint (and the rotational part of a free joint) acting on the quaternion
difference expressed as a rotation vector (mju_subQuat). Tendons add
J^T (-k x - b ten_velocity), x = how far ten_length lies outside the spring's
deadband [lengthspring[0], lengthspring[1]] (0 inside it). Polynomial profiles (MuJoCo's
"Polynomial forces"): a stiffness "k b c" gives -x (k + b x + c x^2), a damping "d b c" gives
-v (d + b |v| + c v^2); on a ball joint or a free joint's translation or rotation x is the
length r of the displacement vector and the force -(k + b r + c r^2) times that vector.
Gravity compensation adds J^T (-m gravcomp g) at each body's centre of mass (mj_gravcomp);
at the dofs of joints with actuatorgravcomp it is added to qfrc_actuator instead
(actuation.py). With a medium (option/density, viscosity) the fluid forces of fluid.py are
added.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import constraint, fluid, math, smooth
from .types import Data, JointType, Model


def spring_force(model: Model, qpos, qpos_spring):
    """-k (q - q_spring) per dof; quaternion coordinates use the rotation-vector difference."""
    jnt_of_dof = np.asarray(model.topology.dof_jntid, dtype=np.int64)
    displacement = spring_displacement(model, qpos, qpos_spring)
    stiffness = model.jnt_stiffness[jnt_of_dof]
    if model.topology.has_polynomial_springs:
        stiffness = polynomial(stiffness, model.jnt_stiffnesspoly[jnt_of_dof], spring_extent(model, displacement)[0])
    return -stiffness * displacement


def polynomial(linear, poly, x):
    """k + b x + c x^2: the coefficient of a polynomial force f(x) = x (k + b x + c x^2)."""
    return linear + poly[..., 0] * x + poly[..., 1] * x * x


def polynomial_potential(linear, poly, x):
    """The integral of the polynomial force: k x^2 / 2 + b x^3 / 3 + c x^4 / 4."""
    return x * x * (0.5 * linear + poly[..., 0] * x / 3.0 + 0.25 * poly[..., 1] * x * x)


def spring_extent(model: Model, displacement):
    """(x, head) per dof: the argument of the stiffness polynomial (the signed displacement of hinge
    and slide dofs, the length of the 3-vector a ball joint's or a free joint's translation or
    rotation dof belongs to) and a static mask of one dof per such vector (every scalar dof)."""
    topo = model.topology
    jnt_type, dofadr = np.asarray(topo.jnt_type), np.asarray(topo.jnt_dofadr, dtype=np.int64)
    starts = np.concatenate([dofadr[jnt_type == JointType.BALL], dofadr[jnt_type == JointType.FREE],
                             dofadr[jnt_type == JointType.FREE] + 3]).astype(np.int64)  # fmt: skip
    head = np.ones(model.nv, bool)
    if not len(starts):
        return displacement, head
    blocks = starts[:, None] + np.arange(3)
    head[blocks[:, 1:]] = False
    length = math.safe_norm(displacement[blocks])
    return displacement.at[blocks].set(jnp.broadcast_to(length[:, None], blocks.shape)), head


def damping(model: Model, velocity, tendon: bool = False, derivative: bool = False):
    """Per dof (or tendon) the damping coefficient d + b |v| + c v^2 (joint or tendon plus actuator
    damping); derivative: d(v (d + b |v| + c v^2)) / dv = d + 2 b |v| + 3 c v^2, what the implicit
    integrators use."""
    linear = model.tendon_damping_total if tendon else model.dof_damping_total
    if not model.topology.has_polynomial_dampers:
        return linear
    poly = model.tendon_dampingpoly_total if tendon else model.dof_dampingpoly_total
    return polynomial(linear, poly * jnp.asarray([2.0, 3.0], poly.dtype) if derivative else poly, jnp.abs(velocity))


def spring_displacement(model: Model, qpos, qpos_spring):
    """q - q_spring per dof (the rotation vector of q_spring^-1 q on ball and free rotations)."""
    topo = model.topology
    qidx, didx = topo.scalar_coords
    displacement = jnp.zeros(model.nv, model.dtype).at[didx].set(qpos[qidx] - qpos_spring[qidx])
    qadr, dadr = topo.quat_coords
    if len(qadr):
        blocks = qadr[:, None] + np.arange(4)
        rotvec = math.quat_sub(math.quat_normalize(qpos[blocks]), qpos_spring[blocks])
        displacement = displacement.at[dadr[:, None] + np.arange(3)].set(rotvec)
    return displacement


def tendon_stretch(model: Model, data: Data):
    """How far each tendon's length lies beyond its spring deadband [lower, upper] (signed)."""
    lower, upper = spring_references(model, data)[1].T
    length = data.ten_length
    return jnp.where(length > upper, length - upper, jnp.where(length < lower, length - lower, 0.0))


# ------------------------------------------------------------------ plasticity


def _plastic_joints(model: Model):
    """Static (qpos address, plastic address, width, joint) of plastic joints: width 4 for ball joints, else 1."""
    topo = model.topology
    return [(topo.jnt_qposadr[j], adr, 4 if topo.jnt_type[j] == JointType.BALL else 1, j)
            for j, adr in enumerate(topo.jnt_plasticadr) if adr >= 0]  # fmt: skip


def initial_plastic(model: Model):
    """mjData.plastic at reset: the joints' qpos_spring (a quaternion for ball joints) and the tendons'
    spring deadbands [lower, upper]."""
    plastic = jnp.zeros(model.topology.nplastic, model.dtype)
    for qadr, adr, width, _ in _plastic_joints(model):
        plastic = plastic.at[adr : adr + width].set(model.qpos_spring[qadr : qadr + width])
    for t, adr in enumerate(model.topology.tendon_plasticadr):
        if adr >= 0:
            plastic = plastic.at[adr : adr + 2].set(model.tendon_lengthspring[t])
    return plastic


def spring_references(model: Model, data: Data):
    """(qpos_spring, tendon_lengthspring) with the plastic joints' and tendons' references from data.plastic."""
    qpos_spring, lengthspring = model.qpos_spring, model.tendon_lengthspring
    for qadr, adr, width, _ in _plastic_joints(model):
        qpos_spring = qpos_spring.at[qadr : qadr + width].set(data.plastic[adr : adr + width])
    for t, adr in enumerate(model.topology.tendon_plasticadr):
        if adr >= 0:
            lengthspring = lengthspring.at[t].set(data.plastic[adr : adr + 2])
    return qpos_spring, lengthspring


def plasticity(model: Model, data: Data, qpos):
    """Ideal elasto-plasticity (MuJoCo 4's springyield), after a step at its new qpos: a spring whose
    displacement from its reference exceeds the yield y keeps displacement y and moves its reference
    along: hinge and slide r <- q -+ y; ball r <- q exp(-y v / |v|) with v = q - r (mju_subQuat);
    a tendon's deadband [lo, hi] shifts by length - y - hi beyond it (length + y - lo below), except
    the lower bound of a slack deadband [0, L] when stretched, which stays 0; the new length is
    MuJoCo's first-order one, ten_length + ten_J dq with dq the step's displacement (probed). `data`
    holds the step's forward at its start (plastic, ten_length, ten_J), qpos its new configuration."""
    topo = model.topology
    plastic = data.plastic
    if model.opt.disabled("spring"):  # no spring, nothing yields (MuJoCo's references stay put)
        return plastic
    for qadr, adr, width, j in _plastic_joints(model):
        y, q, r = model.jnt_springyield[j], qpos[qadr : qadr + width], plastic[adr : adr + width]
        if width == 1:
            new = jnp.where(q - r > y, q - y, jnp.where(q - r < -y, q + y, r))
        else:
            q = math.quat_normalize(q)
            v = math.quat_sub(q, r)
            angle, axis = math.safe_norm(v), math.normalize(v)
            new = jnp.where(angle > y, math.quat_mul(q, math.axis_angle_to_quat(axis, -y)), r)
        plastic = plastic.at[adr : adr + width].set(new)
    if any(adr >= 0 for adr in topo.tendon_plasticadr):
        lengths = data.ten_length + data.ten_J @ spring_displacement(model, qpos, data.qpos)
        for t, adr in enumerate(topo.tendon_plasticadr):
            if adr < 0:
                continue
            y, length, (lo, hi) = model.tendon_springyield[t], lengths[t], plastic[adr : adr + 2]
            stretched, compressed = length > hi + y, length < lo - y
            shift = jnp.where(stretched, length - y - hi, jnp.where(compressed, length + y - lo, 0.0))
            slack = (lo == 0) & (hi > 0)  # a slack deadband [0, L] stretched: only L moves
            plastic = plastic.at[adr : adr + 2].set(jnp.stack([jnp.where(slack & stretched, lo, lo + shift), hi + shift]))
    return plastic


def tendon_force(model: Model, data: Data):
    """Scalar spring + damper force along each tendon (mj_springdamper's tendon loop)."""
    force = jnp.zeros(model.ntendon, model.dtype)
    if not model.opt.disabled("spring"):
        stretch = tendon_stretch(model, data)
        stiffness = model.tendon_stiffness
        if model.topology.has_polynomial_springs:
            stiffness = polynomial(stiffness, model.tendon_stiffnesspoly, stretch)
        force = force - stiffness * stretch
    if not model.opt.disabled("damper"):
        force = force - damping(model, data.ten_velocity, tendon=True) * data.ten_velocity
    return force


def passive(model: Model, data: Data) -> Data:
    """qfrc_passive = spring + damper (+ gravcomp, fluid, contact adhesion) forces (flags "spring" and "damper" disable
    each; the fluid only when both are set, as mj_passive)."""
    qfrc = jnp.zeros(model.nv, model.dtype)
    if not model.opt.disabled("spring"):
        qfrc = qfrc + spring_force(model, data.qpos, spring_references(model, data)[0])
    if not model.opt.disabled("damper"):
        qfrc = qfrc - damping(model, data.qvel) * data.qvel
    if model.ntendon:
        qfrc = qfrc + data.ten_J.T @ tendon_force(model, data)
    if model.topology.has_gravcomp:
        to_actuators = np.asarray(model.topology.jnt_actgravcomp, dtype=bool)[np.asarray(model.topology.dof_jntid, dtype=np.int64)]
        qfrc = qfrc + jnp.where(to_actuators, 0.0, gravcomp(model, data))
    if fluid.enabled(model):
        qfrc = qfrc + fluid.fluid_force(model, data)
    if model.topology.has_adhesion and model.constraints.ncon and not (model.opt.disabled("spring") and model.opt.disabled("damper")):
        qfrc = qfrc + constraint.adhesion_force(model, data)  # data.contact: found first (forward)
    return data.replace(qfrc_passive=qfrc)


def gravcomp(model: Model, data: Data):
    """qfrc_gravcomp: the generalized force cancelling gravcomp x each body's weight (zero with gravity off)."""
    if not model.topology.has_gravcomp or model.opt.disabled("gravity"):
        return jnp.zeros(model.nv, model.dtype)
    force = -(model.body_mass * model.body_gravcomp)[:, None] * model.opt.gravity
    return smooth.xfrc_to_qfrc(model, data, jnp.concatenate([force, jnp.zeros_like(force)], axis=-1))
