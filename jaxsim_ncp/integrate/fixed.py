"""Fixed-step integrators: semi-implicit Euler, implicitfast, implicit, RK4 (Computation chapter, "Numerical integration").

All three advance the state with mj_advance semantics: act first (mj_nextActivation),
then v' = v + h a, then q' = q (+) h v' on the configuration manifold (quaternions
are integrated with the body-frame angular velocity, mj_integratePos).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import fluid, linalg, math, passive, smooth
from ..actuation import actuator_velocity_derivative, next_activation
from ..smooth import integrate_pos
from ..types import Data, JointType, Model


def advance(model: Model, data: Data, act_dot, qacc, qvel=None) -> Data:
    """mj_advance: act, then qvel += h qacc, then qpos integrated with qvel (new qvel unless given)."""
    h = model.opt.timestep
    act = next_activation(model, data.act, act_dot, data.actuator_length, data.actuator_velocity)
    new_qvel = data.qvel + h * qacc
    qpos = integrate_pos(model, data.qpos, new_qvel if qvel is None else qvel, h)
    return data.replace(qpos=qpos, qvel=new_qvel, act=act, time=data.time + h)


def euler(model: Model, data: Data) -> Data:
    """Semi-implicit Euler with implicit joint damping: (M + h B) a = f (eq. 5 with D = -B).

    As mj_Euler, the solver's qacc is used as it is when no dof is damped (the two differ
    when the solver stopped short of convergence); the "eulerdamp" disable flag turns the
    implicit damping off as in MuJoCo.
    """
    if model.opt.disabled("eulerdamp") or model.opt.disabled("damper") or model.nv == 0:
        return advance(model, data, data.act_dot, data.qacc)
    force = data.qfrc_smooth + data.qfrc_constraint
    qacc = linalg.solve_spd(effective_mass(model, data), force)
    damped = jnp.any(model.dof_damping_total > 0)
    if model.topology.has_polynomial_dampers:
        damped = damped | jnp.any(model.dof_dampingpoly_total != 0)
    qacc = jnp.where(damped, qacc, data.qacc)
    return advance(model, data, data.act_dot, qacc)


def _rigid_free_joints(model: Model) -> list[int]:
    """Free joints whose tree is one rigid body (no dofs below the free joint's own six)."""
    topo = model.topology
    dof_body = np.asarray(topo.dof_bodyid, dtype=np.int64)
    subtree_dofs = lambda b: int(np.sum(topo.body_ancestor[dof_body, b]))  # noqa: E731  dofs below body b
    return [j for j, (t, b) in enumerate(zip(topo.jnt_type, topo.jnt_bodyid)) if t == JointType.FREE and subtree_dofs(b) == 6]


def _rigid_free_tree_gyroscopic(model: Model, data: Data):
    """-d(qfrc_bias)/d(qvel) of free joints whose tree is one rigid body, as an nv x nv matrix.

    Such a tree (a free body plus any welded, jointless descendants) has composite mass
    m, com offset r from the joint origin and com inertia I (world frame); with
    omega = R omega_b, bias_trans = m w x (w x r) and bias_rot = R^T (w x I w + m r x
    (w x (w x r))). Its Jacobian in omega_b is taken with jax.jacfwd (3 columns).
    mujoco>=4's implicitfast includes this term (checked against mj_step); Coriolis
    terms of articulated trees stay explicit, as the Computation chapter describes.
    """
    joints = _rigid_free_joints(model)
    if not joints:
        return None
    topo = model.topology
    bodies = np.asarray([topo.jnt_bodyid[j] for j in joints], dtype=np.int64)
    dofs = np.asarray([topo.jnt_dofadr[j] for j in joints], dtype=np.int64)
    # composite spatial inertia about the tree's com (the free body is the root: cinert's origin)
    composite = smooth.composite_inertia(model, data)[bodies]
    inertia, mass = composite[:, :3, :3], composite[:, 3, 3]
    r = data.subtree_com[bodies] - data.xpos[bodies]

    def bias(omega_b, R, r, inertia, m):
        w = R @ omega_b
        centripetal = jnp.cross(w, jnp.cross(w, r))
        rot_w = jnp.cross(w, inertia @ w) + m * jnp.cross(r, centripetal)
        return jnp.concatenate([m * centripetal, R.T @ rot_w])

    omega_b = data.qvel[dofs[:, None] + 3 + np.arange(3)]
    jac = jax.vmap(jax.jacfwd(bias))(omega_b, data.xmat[bodies], r, inertia, mass)  # (n, 6, 3)
    rows = dofs[:, None, None] + np.arange(6)[None, :, None]
    cols = dofs[:, None, None] + 3 + np.arange(3)[None, None, :]
    return jnp.zeros((model.nv, model.nv), model.dtype).at[rows, cols].set(-jac)


def _fluid_velocity_derivative(model: Model, data: Data, symmetric: bool) -> jax.Array:
    """d qfrc_fluid / d qvel (mjd_passive_vel's fluid terms): per body J^T B J with B the local
    wrench's velocity derivative. implicitfast (symmetric) takes (B + B^T) / 2 for its symmetric
    factorization, except in a rigid free tree, whose 6x6 block is solved whole."""

    def force(qvel):
        return fluid.fluid_force(model, smooth.com_vel(model, data.replace(qvel=qvel)))

    deriv = jax.jacfwd(force)(data.qvel)
    if not symmetric:
        return deriv
    free = np.zeros((model.nv, model.nv), bool)
    for j in _rigid_free_joints(model):
        adr = model.topology.jnt_dofadr[j]
        free[adr : adr + 6, adr : adr + 6] = True
    return jnp.where(jnp.asarray(free), deriv, 0.5 * (deriv + deriv.T))


def _bias_velocity_derivative(model: Model, data: Data) -> jax.Array:
    """d qfrc_bias / d qvel (mjd_rne_vel): the Coriolis and centrifugal forces' exact Jacobian (they
    are quadratic in qvel; forward-mode AD through mj_comVel and RNE, one column per dof)."""

    def bias(qvel):
        return smooth.rne(model, smooth.com_vel(model, data.replace(qvel=qvel))).qfrc_bias

    return jax.jacfwd(bias)(data.qvel)


def implicit(model: Model, data: Data) -> Data:
    """Implicit-in-velocity Euler: (M - h D) a = f (Computation chapter, eq. 5).

    implicitfast: D = d(qfrc_passive + qfrc_actuator)/d qvel = -B + moment^T diag(dforce/dvel) moment
    (mjd_smooth_vel with the RNE term skipped), plus the gyroscopic derivative of free joints of
    rigid trees (`_rigid_free_tree_gyroscopic`), as mujoco>=4 does. implicit: D also has
    -d qfrc_bias/d qvel (mjd_rne_vel) and the unsymmetrized fluid derivative, and M - h D is
    solved by LU (MuJoCo's mjINT_IMPLICIT).
    """
    if model.nv == 0:
        return advance(model, data, data.act_dot, data.qacc)
    force = data.qfrc_smooth + data.qfrc_constraint
    mass = effective_mass(model, data)
    if model.opt.integrator == "implicitfast" and not _rigid_free_joints(model):
        qacc = linalg.solve_spd(mass, force)
    else:  # not symmetric: LU
        qacc = linalg.solve(mass, force)
    return advance(model, data, data.act_dot, qacc)


def effective_mass(model: Model, data: Data, always_damp: bool = False) -> jax.Array:
    """The matrix the integrator solves with: M + h B (euler), M - h D (implicitfast, implicit), M otherwise.

    The hard-contact solver uses it as its mass so that its velocity update is the
    integrator's (implicit damping, implicitfast's velocity derivatives); it passes
    always_damp=True: its step is implicit in velocity, so Euler's damping is implicit
    even where the model disables MuJoCo's eulerdamp (explicit damping at a large step
    is unstable, e.g. the MJX humanoid at dt = 0.05).
    """
    h = model.opt.timestep
    integrator = model.opt.integrator
    if integrator == "euler":
        if model.opt.disabled("damper") or (model.opt.disabled("eulerdamp") and not always_damp):
            return data.qM
        return data.qM + h * jnp.diag(passive.damping(model, data.qvel, derivative=True))
    if integrator not in ("implicitfast", "implicit"):
        return data.qM
    qderiv = actuator_velocity_derivative(model, data)
    if not model.opt.disabled("damper"):
        qderiv = qderiv - jnp.diag(passive.damping(model, data.qvel, derivative=True))
        if model.ntendon:  # tendon dampers: d(J^T (-b J v)) / dv (mjd_passive_vel)
            b = passive.damping(model, data.ten_velocity, tendon=True, derivative=True)
            qderiv = qderiv - data.ten_J.T @ (b[:, None] * data.ten_J)
    if fluid.enabled(model):
        qderiv = qderiv + _fluid_velocity_derivative(model, data, symmetric=integrator == "implicitfast")
    if integrator == "implicit":
        qderiv = qderiv - _bias_velocity_derivative(model, data)
    if model.ntendon:  # MuJoCo keeps D's sparsity (dof pairs on one ancestor chain): tendon
        anc = model.topology.dof_ancestor  # couplings across branches or trees stay explicit
        qderiv = jnp.where(jnp.asarray(anc | anc.T), qderiv, 0.0)
    gyro = _rigid_free_tree_gyroscopic(model, data) if integrator == "implicitfast" else None
    return data.qM - h * (qderiv if gyro is None else qderiv + gyro)


_RK4_A = ((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))
_RK4_B = (1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0)
_RK4_C = (0.5, 0.5, 1.0)


def dexp_inv(model: Model, theta, qvel, exact: bool = False):
    """Tangent-space velocity on rotations: v + [theta, v] / 2 + c [theta, [theta, v]] per quaternion block.

    [a, b] = a x b and theta the rotation vector from the initial pose; hinge/slide/free-
    position coordinates commute and are left unchanged. c = 1/12 (exact=False) is the
    truncated series of Munthe-Kaas RK that mujoco>=4's RK4 uses (verified to 1e-16
    against mj_step); exact=True takes the inverse right Jacobian of SO(3),
    c(t) = (1 - (t/2) cot(t/2)) / t^2, with its Taylor series 1/12 + t^2/720 + t^4/30240
    below t = 0.01 (smooth at 0): the adaptive integrator's exact local coordinates.
    """
    _, dadr = model.topology.quat_coords
    if len(dadr) == 0:
        return qvel
    blocks = dadr[:, None] + np.arange(3)
    th, v = theta[blocks], qvel[blocks]
    first = jnp.cross(th, v)
    if not exact:
        return qvel.at[blocks].set(v + 0.5 * first + jnp.cross(th, first) / 12.0)
    t2 = jnp.sum(th * th, axis=-1)
    small = t2 < 1e-4
    half = 0.5 * jnp.sqrt(jnp.where(small, 1.0, t2))
    c_exact = (1.0 - half * jnp.cos(half) / jnp.sin(half)) / jnp.where(small, 1.0, t2)
    c = jnp.where(small, 1.0 / 12.0 + t2 / 720.0 + t2 * t2 / 30240.0, c_exact)
    return qvel.at[blocks].set(v + 0.5 * first + c[:, None] * jnp.cross(th, first))


def rk4(model: Model, data: Data, forward_fn: Callable[[Model, Data], Data]) -> Data:
    """Classical 4th-order Runge-Kutta on (q, v, act) (mj_RungeKutta), Lie-group aware.

    Stage positions are q0 (+) h sum_j a_ij k_j, where k_j is stage j's velocity mapped
    to the initial pose's tangent space (`dexp_inv`); the final update is
    q0 (+) h sum_j b_j k_j, v0 + h sum_j b_j a_j. `data` must already hold forward()
    at the initial state. As after MuJoCo's mj_step, the returned derived fields (kinematics,
    forces, contacts, constraint rows, qacc, energy, solver statistics) are the last stage's,
    whose forward ran last, while sensordata stays the initial state's (the stages skip
    sensors); qacc is the step's (the weighted sum of the stages', as MuJoCo 4 reports it) and
    qacc_warmstart the last stage's, from which the next solve starts, as in mj_advance.
    """
    h = model.opt.timestep
    dtype = data.qvel.dtype
    # the three stages run in one loop, so forward() is traced (and compiled) once for them; stage i
    # reads a_ij k_j over all four slots (a_ij = 0 for j > i: the same sums, bit for bit)
    a = jnp.asarray([row + (0.0,) * (4 - len(row)) for row in _RK4_A], dtype)
    c = jnp.asarray(_RK4_C, dtype)
    first = (data.qvel, data.qacc, data.act_dot)  # (k: tangent velocity, qacc, act_dot)
    slots = tuple(jnp.zeros((4,) + x.shape, x.dtype).at[0].set(x) for x in first)

    def stage(i, carry):
        slots, _ = carry
        dv, da, dact = (sum(a[i, j] * s[j] for j in range(4)) for s in slots)
        new = data.replace(
            qpos=integrate_pos(model, data.qpos, dv, h),
            qvel=data.qvel + h * da,
            act=data.act + h * dact,
            time=data.time + c[i] * h,
        )
        new = forward_fn(model, new)
        k = (dexp_inv(model, h * dv, new.qvel), new.qacc, new.act_dot)
        return tuple(s.at[i + 1].set(x) for s, x in zip(slots, k)), new

    slots, last = jax.lax.fori_loop(0, 3, stage, (slots, data))
    dv, da, dact = (sum(b * s[j] for j, b in enumerate(_RK4_B)) for s in slots)
    new = advance(model, data, dact, da, qvel=dv)
    return last.replace(qpos=new.qpos, qvel=new.qvel, act=new.act, time=new.time, sensordata=data.sensordata,
                        qacc=da, qacc_warmstart=last.qacc)  # fmt: skip
