"""Smooth dynamics: kinematics, com-based quantities, inertia (CRBA) and bias forces (RNE).

Follows MuJoCo's mj_kinematics, mj_comPos, mj_crb, mj_comVel and mj_rne
(Computation chapter, "Forward dynamics" and "Simulation pipeline"). Tree
recursions are written as static masked matmuls (`Topology` masks) or as one
vectorized update per tree depth, so nothing loops over bodies or dofs at run time.
Spatial vectors are (angular; linear) and expressed about the centre of mass of
each kinematic tree (`subtree_com` of its root body), as in MuJoCo.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import math
from .types import Data, JointType, Model


def _mask(model: Model, mask: np.ndarray) -> jnp.ndarray:
    """A static 0/1 structure matrix in the model's dtype (no float64 promotion in float32 models)."""
    return jnp.asarray(mask, dtype=model.dtype)


def _subtree(model: Model) -> jnp.ndarray:
    """S[b, c] = 1 where body c is in the subtree of body b."""
    return _mask(model, model.topology.body_ancestor.T)


def _joint_transforms(model: Model, qpos):
    """Per joint: the displacement (t, r) it applies in its body's frame.

    Hinge and ball rotate by r about the anchor jnt_pos, so t = p - r p; slide
    translates along its axis by (q - qpos0); a free joint sets the absolute pose.
    """
    topo = model.topology
    nq = model.nq
    jtype = np.asarray(topo.jnt_type, dtype=np.int64)
    qadr = np.asarray(topo.jnt_qposadr, dtype=np.int64)
    clip = lambda idx: np.minimum(idx, nq - 1)  # noqa: E731  (indices of other joint types are masked)

    scalar = qpos[qadr] - model.qpos0[qadr]
    hinge_r = math.axis_angle_to_quat(model.jnt_axis, scalar)
    ball_r = math.quat_normalize(qpos[clip(qadr[:, None] + np.arange(4))])
    free_r = math.quat_normalize(qpos[clip(qadr[:, None] + 3 + np.arange(4))])
    free_t = qpos[clip(qadr[:, None] + np.arange(3))]

    is_t = lambda t: (jtype == t)[:, None]  # noqa: E731
    identity = jnp.zeros_like(hinge_r).at[:, 0].set(1.0)
    r = jnp.where(is_t(JointType.HINGE), hinge_r, identity)
    r = jnp.where(is_t(JointType.BALL), ball_r, r)
    r = jnp.where(is_t(JointType.FREE), free_r, r)
    t = model.jnt_pos - math.quat_rotate(r, model.jnt_pos)
    t = jnp.where(is_t(JointType.SLIDE), model.jnt_axis * scalar[:, None], t)
    t = jnp.where(is_t(JointType.FREE), free_t, t)
    return t, r


def integrate_pos(model: Model, qpos, qvel, h):
    """q (+) h v: Euler on hinge/slide/free-position coordinates, quaternion exponential on rotations."""
    qidx, didx = model.topology.scalar_coords
    qpos = qpos.at[qidx].add(h * qvel[didx])
    qadr, dadr = model.topology.quat_coords
    if len(qadr):
        qblocks = qadr[:, None] + np.arange(4)
        vblocks = dadr[:, None] + np.arange(3)
        qpos = qpos.at[qblocks].set(math.quat_integrate(qpos[qblocks], qvel[vblocks], h))
    return qpos


def kinematics(model: Model, data: Data) -> Data:
    """Global body, joint and geom frames from qpos (mj_kinematics)."""
    topo = model.topology
    nbody, njnt = model.nbody, model.njnt
    dt = model.dtype
    jnt_t, jnt_r = _joint_transforms(model, data.qpos)

    # Local pose of each body in its parent's frame: body offset, then its joints in order.
    has_free = np.zeros(nbody, dtype=bool)
    for jtype, b in zip(topo.jnt_type, topo.jnt_bodyid):
        has_free[b] |= jtype == JointType.FREE
    identity_q = jnp.zeros((nbody, 4), dt).at[:, 0].set(1.0)
    local_p = jnp.where(has_free[:, None], 0.0, model.body_pos)
    local_q = jnp.where(has_free[:, None], identity_q, model.body_quat)
    if topo.nmocap:  # mocap bodies (children of the world, no joints) take their pose from Data
        mocap = np.nonzero(np.asarray(topo.body_mocapid) >= 0)[0]
        ids = np.asarray(topo.body_mocapid)[mocap]
        local_p = local_p.at[mocap].set(data.mocap_pos[ids])
        local_q = local_q.at[mocap].set(math.quat_normalize(data.mocap_quat[ids]))
    jntadr = np.asarray(topo.body_jntadr, dtype=np.int64)
    jntnum = np.asarray(topo.body_jntnum, dtype=np.int64)
    looped_joints = topo.max_body_jntnum > 2
    if looped_joints:
        jntadr, jntnum = jnp.asarray(jntadr), jnp.asarray(jntnum)

    def apply_joint(k, pose):
        """Every body's k-th joint, if it has one (the same entries as one body at a time)."""
        local_p, local_q, pre_p, pre_q = pose
        has = jntnum > k
        j = (jnp if looped_joints else np).where(has, jntadr + k, njnt)  # njnt: no joint, writes dropped
        pre_p = pre_p.at[j].set(local_p, mode="drop")  # body-local frame just before the joint acts
        pre_q = pre_q.at[j].set(local_q, mode="drop")
        t, r = jnt_t.at[j].get(mode="clip"), jnt_r.at[j].get(mode="clip")
        local_p = jnp.where(has[:, None], local_p + math.quat_rotate(local_q, t), local_p)
        local_q = jnp.where(has[:, None], math.quat_mul(local_q, r), local_q)
        return local_p, local_q, pre_p, pre_q

    # at most a handful of joints per body; more than two in a loop (one copy of the program)
    pose = (local_p, local_q, jnp.zeros((njnt, 3), dt), jnp.zeros((njnt, 4), dt))
    if looped_joints:
        pose = jax.lax.fori_loop(0, topo.max_body_jntnum, jax.checkpoint(apply_joint), pose)
    else:
        for k in range(topo.max_body_jntnum):
            pose = apply_joint(k, pose)
    local_p, local_q, pre_p, pre_q = pose

    # Compose along the tree, one vectorized update per depth level, in a loop over the levels: the
    # program's size does not grow with the tree's depth (a loop of one or two levels is unrolled).
    parent = np.asarray(topo.body_parentid, dtype=np.int64)
    level_bodies, level_parents = topo.depth_level_table
    looped = len(level_bodies) > 2
    if looped:  # the row is traced: index the tables as arrays
        level_bodies, level_parents = jnp.asarray(level_bodies), jnp.asarray(level_parents)

    def compose(row, frames):
        xpos, xquat = frames
        bodies, p = level_bodies[row], level_parents[row]
        own = (jnp if looped else np).minimum(bodies, nbody - 1)  # padding reads some body; its writes are dropped
        xpos = xpos.at[bodies].set(xpos[p] + math.quat_rotate(xquat[p], local_p[own]), mode="drop")
        xquat = xquat.at[bodies].set(math.normalize(math.quat_mul(xquat[p], local_q[own])), mode="drop")
        return xpos, xquat

    # reverse mode stores each level's frames (the loop's carry), not the level's intermediates
    compose = jax.checkpoint(compose, static_argnums=() if looped else (0,))
    frames = (jnp.zeros((nbody, 3), dt), identity_q)
    if looped:
        frames = jax.lax.fori_loop(0, len(level_bodies), compose, frames)
    else:
        for row in range(len(level_bodies)):
            frames = compose(row, frames)
    xpos, xquat = frames

    # Joint anchors and axes, from the global frame just before each joint acts.
    jbody_parent = parent[np.asarray(topo.jnt_bodyid, dtype=np.int64)]
    frame_q = math.quat_mul(xquat[jbody_parent], pre_q)
    # every rotation matrix of the step in one call (one kernel instead of five)
    quats = (xquat, frame_q, model.body_iquat, model.geom_quat, model.site_quat)
    xmat, frame_mat, body_imat, geom_mat, site_mat = jnp.split(
        math.quat_to_mat(jnp.concatenate(quats)), np.cumsum([q.shape[0] for q in quats[:-1]]))
    frame_p = xpos[jbody_parent] + jnp.einsum("jik,jk->ji", xmat[jbody_parent], pre_p)
    is_free = (np.asarray(topo.jnt_type, dtype=np.int64) == JointType.FREE)[:, None]
    xanchor = jnp.where(is_free, jnt_t, frame_p + jnp.einsum("jik,jk->ji", frame_mat, model.jnt_pos))
    xaxis = jnp.where(is_free, jnp.array([0.0, 0.0, 1.0], dt), jnp.einsum("jik,jk->ji", frame_mat, model.jnt_axis))

    xipos = xpos + jnp.einsum("bij,bj->bi", xmat, model.body_ipos)
    ximat = xmat @ body_imat
    gbody = np.asarray(topo.geom_bodyid, dtype=np.int64)
    geom_xpos = xpos[gbody] + jnp.einsum("gij,gj->gi", xmat[gbody], model.geom_pos)
    geom_xmat = xmat[gbody] @ geom_mat
    sbody = np.asarray(topo.site_bodyid, dtype=np.int64)
    site_xpos = xpos[sbody] + jnp.einsum("sij,sj->si", xmat[sbody], model.site_pos)
    site_xmat = xmat[sbody] @ site_mat
    return data.replace(
        xpos=xpos, xquat=xquat, xmat=xmat, xipos=xipos, ximat=ximat,
        xanchor=xanchor, xaxis=xaxis, geom_xpos=geom_xpos, geom_xmat=geom_xmat, site_xpos=site_xpos, site_xmat=site_xmat,
    )


def com_pos(model: Model, data: Data) -> Data:
    """Subtree centres of mass, com-based body inertias and motion dofs (mj_comPos)."""
    topo = model.topology
    subtree = _subtree(model)
    mass = model.body_mass
    subtree_mass = subtree @ mass
    weighted = subtree @ (mass[:, None] * data.xipos)
    has_mass = subtree_mass > 1e-15
    safe_mass = jnp.where(has_mass, subtree_mass, 1.0)[:, None]
    subtree_com = jnp.where(has_mass[:, None], weighted / safe_mass, data.xipos)

    root_com = subtree_com[np.asarray(topo.body_rootid, dtype=np.int64)]
    inertia_world = jnp.einsum("bij,bj,bkj->bik", data.ximat, model.body_inertia, data.ximat)
    cinert = math.spatial_inertia(mass, inertia_world, data.xipos - root_com)

    # cdof: hinge [a; a x (c - anchor)], slide [0; a], ball / free rotation: body axes.
    dof_jnt = np.asarray(topo.dof_jntid, dtype=np.int64)
    dof_body = np.asarray(topo.dof_bodyid, dtype=np.int64)
    jtype = np.asarray(topo.jnt_type, dtype=np.int64)[dof_jnt]
    k = np.arange(model.nv) - np.asarray(topo.jnt_dofadr, dtype=np.int64)[dof_jnt]
    rot_k = np.where(jtype == JointType.FREE, k - 3, k) % 3
    body_axis = data.xmat[dof_body, :, rot_k]  # column rot_k of the body frame
    axis = jnp.where((jtype == JointType.HINGE)[:, None] | (jtype == JointType.SLIDE)[:, None],
                     data.xaxis[dof_jnt], body_axis)
    offset = root_com[dof_body] - data.xanchor[dof_jnt]
    rotational = (jtype == JointType.HINGE) | (jtype == JointType.BALL) | ((jtype == JointType.FREE) & (k >= 3))
    free_trans = jnp.asarray(np.eye(3)[np.minimum(k, 2)], dtype=model.dtype)
    lin = jnp.where(rotational[:, None], jnp.cross(axis, offset), axis)
    lin = jnp.where(((jtype == JointType.FREE) & (k < 3))[:, None], free_trans, lin)
    ang = jnp.where(rotational[:, None], axis, 0.0)
    cdof = jnp.concatenate([ang, lin], axis=-1)
    return data.replace(subtree_com=subtree_com, cinert=cinert, cdof=cdof)


def composite_inertia(model: Model, data: Data):
    """Icrb[b]: spatial inertia of body b's subtree, about its tree's com (sum of cinert)."""
    return jnp.einsum("bc,cij->bij", _subtree(model), data.cinert)


def crb(model: Model, data: Data) -> Data:
    """Joint-space inertia M via composite rigid bodies (mj_crb), plus armature.

    M[i, j] = cdof_j^T Icrb[body(i)] cdof_i for dof j an ancestor of dof i.
    """
    topo = model.topology
    icrb = composite_inertia(model, data)
    dof_body = np.asarray(topo.dof_bodyid, dtype=np.int64)
    force = jnp.einsum("dij,dj->di", icrb[dof_body], data.cdof)
    lower = jnp.where(topo.dof_ancestor, force @ data.cdof.T, 0.0)
    qM = lower + lower.T - jnp.diag(jnp.diag(lower)) + jnp.diag(model.dof_armature_total)
    return data.replace(qM=qM)


def com_vel(model: Model, data: Data) -> Data:
    """Body velocities cvel and dof derivatives cdof_dot (mj_comVel)."""
    topo = model.topology
    dof_motion = data.cdof * data.qvel[:, None]
    cvel = _mask(model, topo.body_dof_chain) @ dof_motion
    before = _mask(model, topo.dof_velocity_before) @ dof_motion
    cdof_dot = jnp.where(topo.dof_free_translation[:, None], 0.0, math.cross_motion(before, data.cdof))
    return data.replace(cvel=cvel, cdof_dot=cdof_dot)


def body_forces_to_joints(model: Model, data: Data, cfrc_body):
    """Generalized force of com-based body wrenches: qfrc[d] = cdof[d] . sum over subtree(body(d))."""
    topo = model.topology
    cfrc = _subtree(model) @ cfrc_body
    return jnp.sum(data.cdof * cfrc[np.asarray(topo.dof_bodyid, dtype=np.int64)], axis=-1)


def rne(model: Model, data: Data) -> Data:
    """Bias force c(q, v) = Coriolis + centrifugal + gravity, by RNE with qacc = 0 (mj_rne)."""
    _, cfrc_body = _body_accelerations_and_forces(model, data, data.cdof_dot * data.qvel[:, None])
    return data.replace(qfrc_bias=body_forces_to_joints(model, data, cfrc_body))


def _body_accelerations_and_forces(model: Model, data: Data, dof_acc):
    """RNE's forward pass: cacc = -gravity + the dof accelerations `dof_acc` (nv, 6) summed down
    each body's chain, and cfrc_body = cinert cacc + cvel x* (cinert cvel)."""
    gravity = jnp.zeros(3, model.dtype) if model.opt.disabled("gravity") else model.opt.gravity
    world_acc = jnp.concatenate([jnp.zeros(3, model.dtype), -gravity])
    cacc = world_acc + _mask(model, model.topology.body_dof_chain) @ dof_acc
    momentum = jnp.einsum("bij,bj->bi", data.cinert, data.cvel)
    return cacc, jnp.einsum("bij,bj->bi", data.cinert, cacc) + math.cross_force(data.cvel, momentum)


def xfrc_to_qfrc(model: Model, data: Data, xfrc=None):
    """Generalized force of Cartesian wrenches (nbody, 6): force; torque at each body's com
    (mj_applyFT at xipos). Default: data.xfrc_applied."""
    xfrc = data.xfrc_applied if xfrc is None else xfrc
    root_com = data.subtree_com[np.asarray(model.topology.body_rootid, dtype=np.int64)]
    force, torque = xfrc[:, :3], xfrc[:, 3:]
    wrench = jnp.concatenate([torque + jnp.cross(data.xipos - root_com, force), force], axis=-1)
    return body_forces_to_joints(model, data, wrench)


def point_jacobian(model: Model, data: Data, body, point: Float[Array, "n 3"], dofs=None):
    """Translational and rotational Jacobians (n, 3, nv) of points fixed to `body` (mj_jac;
    body: static or traced indices). With `dofs` (n, w): only those columns, (n, 3, w), where
    an index nv is padding (a zero column)."""
    topo = model.topology
    static = isinstance(body, np.ndarray) or np.isscalar(body)
    chain = topo.body_dof_chain if static else jnp.asarray(topo.body_dof_chain)
    root = (np.asarray(topo.body_rootid, dtype=np.int64) if static else jnp.asarray(topo.body_rootid))[body]
    offset = point - data.subtree_com[root]
    if dofs is None:
        chain = jnp.asarray(chain[body], dtype=model.dtype)  # (n, nv)
        cdof = jnp.broadcast_to(data.cdof, (1,) + data.cdof.shape)
    else:
        pad = np.zeros((chain.shape[0], 1), bool)
        chain = jnp.asarray(jnp.concatenate([chain, pad], axis=1)[body[:, None], dofs], dtype=model.dtype)  # (n, w)
        cdof = data.cdof.at[dofs].get(mode="fill", fill_value=0)  # (n, w, 6)
    ang, lin = cdof[..., :3], cdof[..., 3:]
    jacp = lin + jnp.cross(ang, offset[:, None, :])
    return jnp.swapaxes(jacp * chain[..., None], 1, 2), jnp.swapaxes(ang * chain[..., None], 1, 2)


def _motion_at(model: Model, data: Data, motion, body, pos, rot=None):
    """A com-based motion vector (angular; linear at the root's subtree com) of `body`, moved to
    `pos` and, given `rot`, expressed in that frame's axes (mju_transformSpatial of a motion)."""
    root = np.asarray(model.topology.body_rootid, dtype=np.int64)[body]
    ang = motion[body, :3]
    lin = motion[body, 3:] + jnp.cross(ang, pos - data.subtree_com[root])
    if rot is None:
        return ang, lin
    return jnp.einsum("...ji,...j->...i", rot, ang), jnp.einsum("...ji,...j->...i", rot, lin)


def object_velocity(model: Model, data: Data, body, pos, rot=None):
    """(angular, linear) velocity of frames at `pos` fixed to `body` (scalars or arrays), in the
    world axes or, given `rot`, in the frames' own axes (mj_objectVelocity)."""
    return _motion_at(model, data, data.cvel, body, pos, rot)


def object_acceleration(model: Model, data: Data, cacc, body: int, pos, rot=None):
    """(angular, linear) acceleration of a frame at `pos` fixed to `body` (mj_objectAcceleration):
    cacc moved to `pos` plus the rotating-frame term w x v (a static body reads -gravity)."""
    ang, lin = _motion_at(model, data, cacc, body, pos, rot)
    w, v = object_velocity(model, data, body, pos, rot)
    return ang, lin + jnp.cross(w, v)


def rne_post_constraint(model: Model, data: Data, cfrc_ext):
    """Body accelerations cacc and the wrench each body receives from its parent, cfrc_int, with
    the final qacc and the external wrenches cfrc_ext (com-based, nbody x 6; mj_rnePostConstraint):

        cacc[b]      = -gravity + sum over b's dofs and their ancestors' of cdof_dot qvel + cdof qacc
        cfrc_int[b]  = sum over b's subtree of (cinert cacc + cvel x* cinert cvel - cfrc_ext)
    """
    dof_acc = data.cdof_dot * data.qvel[:, None] + data.cdof * data.qacc[:, None]
    cacc, cfrc_body = _body_accelerations_and_forces(model, data, dof_acc)
    cfrc_body = cfrc_body.at[0].set(0.0)  # the world body's own term (MuJoCo starts it at zero)
    return cacc, _subtree(model) @ (cfrc_body - cfrc_ext.at[0].set(0.0))


def subtree_momentum(model: Model, data: Data):
    """Per body: its subtree's linear velocity (momentum / subtree mass) and angular momentum about
    the subtree com (mj_subtreeVel), sum over the subtree of I_c w_c + m_c (x_c - com) x v_c."""
    nbody = model.nbody
    body = np.arange(nbody)
    w, v = object_velocity(model, data, body, data.xipos)  # each body's com velocity
    mass = model.body_mass
    subtree = _subtree(model)
    subtree_mass = subtree @ mass
    momentum = subtree @ (mass[:, None] * v)
    linvel = momentum / jnp.maximum(1e-15, subtree_mass)[:, None]  # mjMINVAL
    spin = jnp.einsum("bij,bj,bkj,bk->bi", data.ximat, model.body_inertia, data.ximat, w)
    angmom = subtree @ (spin + mass[:, None] * jnp.cross(data.xipos, v)) - jnp.cross(data.subtree_com, momentum)
    return linvel, angmom


def wrench_moment(model: Model, data: Data, body: np.ndarray, pos, force, torque):
    """Generalized force (n, nv) of each world-frame force and torque applied at `pos` on `body`
    (mj_applyFT, one row per wrench)."""
    jacp, jacr = point_jacobian(model, data, body, pos)
    return jnp.einsum("nkv,nk->nv", jacp, force) + jnp.einsum("nkv,nk->nv", jacr, torque)
