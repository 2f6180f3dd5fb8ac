"""Actuators: transmissions, activation dynamics, force generation (mj_fwdActuation).

force = gain * input + bias with gain = g0 + g1 l + g2 dl/dt (affine), g0 (fixed) or the
muscle's active force-length-velocity curve; bias = b0 + b1 l + b2 dl/dt (affine), 0 or
the muscle's passive force; input is ctrl, or the activation for stateful actuators
(integrator: act_dot = ctrl; filter: act_dot = (ctrl - act) / tau; muscle: a filter whose
time constant depends on act and on the sign of ctrl - act).
Transmissions (mj_transmission): a hinge/slide joint, l = gear q, moment = gear e_dof; a
ball joint, l = rotvec(q) . gear[:3], moment = gear[:3] on its dofs; a free joint, l = 0,
moment = gear (force, torque) on its dofs (jointinparent: the rotational gear in the parent
frame); a tendon, l = gear ten_length, moment = gear ten_J; or a site (no refsite): the
wrench (gear[:3], gear[3:]) in the site's frame, l = 0, moment = Jp^T R gear[:3] + Jr^T R gear[3:].
qfrc_actuator = moment^T force.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool

from . import constraint, dcmotor, history, math, passive, smooth
from .dcmotor import INPUT_FF, INPUT_POS, INPUT_VEL, anti_windup, slew_limit
from .types import TRN_BODY, TRN_JOINT, TRN_JOINTINPARENT, TRN_SITE, TRN_SLIDERCRANK, TRN_TENDON, BiasType, Data, DynType, GainType, JointType, Model

MINVAL = 1e-15  # mjMINVAL


def transmission(model: Model, data: Data):
    """actuator_length (nactuator,) and moment (nactuator, nv): d length / d qpos in velocity coordinates."""
    topo = model.topology
    gear = model.actuator_gear
    obj = np.asarray(topo.actuator_trnid, dtype=np.int64)
    trntype = np.asarray(topo.actuator_trntype, dtype=np.int64)
    rows = np.arange(model.nactuator)
    on_joint = (trntype == TRN_JOINT) | (trntype == TRN_JOINTINPARENT)
    jnt = np.where(on_joint, obj, 0)
    jtype = np.where(on_joint, np.asarray(topo.jnt_type, dtype=np.int64)[jnt], -1)
    qadr = np.asarray(topo.jnt_qposadr, dtype=np.int64)[jnt]
    dadr = np.asarray(topo.jnt_dofadr, dtype=np.int64)[jnt]
    # hinge and slide (and the placeholder for the other kinds): l = gear q, moment = gear e_dof
    length = gear[:, 0] * data.qpos[qadr]
    moment = jnp.zeros((model.nactuator, model.nv), model.dtype).at[rows, dadr].set(gear[:, 0])
    in_parent = (trntype == TRN_JOINTINPARENT)[:, None]

    def gear_axis(g, quat_adr):  # the gear's rotational part, in the parent frame for jointinparent
        quat = math.quat_normalize(data.qpos[quat_adr[:, None] + np.arange(4)])
        return jnp.where(in_parent, math.quat_rotate(math.quat_conj(quat), g), g), quat

    ball = jtype == JointType.BALL
    if ball.any():  # 3-D gear: l = rotation vector . axis, moment = axis on the 3 dofs
        axis, quat = gear_axis(gear[:, :3], qadr)
        length = jnp.where(ball, jnp.sum(math.quat_to_rotvec(quat) * axis, axis=-1), length)
        ball_moment = jnp.zeros_like(moment).at[rows[:, None], dadr[:, None] + np.arange(3)].set(axis)
        moment = jnp.where(ball[:, None], ball_moment, moment)
    free = jtype == JointType.FREE
    if free.any():  # 6-D gear: force gear[:3] (world), torque axis; no meaningful length: 0
        axis, _ = gear_axis(gear[:, 3:], qadr + 3)
        free_moment = jnp.zeros_like(moment).at[rows[:, None], dadr[:, None] + np.arange(6)].set(
            jnp.concatenate([gear[:, :3], axis], axis=-1))
        length = jnp.where(free, 0.0, length)
        moment = jnp.where(free[:, None], free_moment, moment)
    on_tendon = trntype == TRN_TENDON
    if on_tendon.any():
        ten = np.where(on_tendon, obj, 0)
        length = jnp.where(on_tendon, gear[:, 0] * data.ten_length[ten], length)
        moment = jnp.where(on_tendon[:, None], gear[:, :1] * data.ten_J[ten], moment)
    on_site = trntype == TRN_SITE
    if on_site.any():  # a wrench, the 6-D gear in the site's frame; length 0 (no refsite)
        site = np.where(on_site, obj, 0)
        rot = data.site_xmat[site]
        wrench_moment = smooth.wrench_moment(
            model, data, np.asarray(topo.site_bodyid, dtype=np.int64)[site], data.site_xpos[site],
            jnp.einsum("nij,nj->ni", rot, gear[:, :3]), jnp.einsum("nij,nj->ni", rot, gear[:, 3:]),
        )  # fmt: skip
        length = jnp.where(on_site, 0.0, length)
        moment = jnp.where(on_site[:, None], wrench_moment, moment)
        for a in np.flatnonzero(np.asarray(topo.actuator_refsite) >= 0):
            ref_length, ref_moment = _refsite_transmission(model, data, int(a))
            length, moment = length.at[a].set(ref_length), moment.at[a].set(ref_moment)
    crank = trntype == TRN_SLIDERCRANK
    if crank.any():
        crank_length, crank_moment = _slider_crank(model, data, np.flatnonzero(crank))
        length = length.at[np.flatnonzero(crank)].set(crank_length)
        moment = moment.at[np.flatnonzero(crank)].set(crank_moment)
    on_body = trntype == TRN_BODY
    if on_body.any():  # no meaningful length: 0
        length = jnp.where(on_body, 0.0, length)
        for a in np.flatnonzero(on_body):
            moment = moment.at[a].set(_body_transmission(model, data, int(obj[a])))
    return length, moment


def _slider_crank(model: Model, data: Data, actuators: np.ndarray):
    """Slider-crank transmissions (mj_transmission, mjTRN_SLIDERCRANK): with v the crank site minus
    the slider site, a the slider site's z axis and r the rod's length, l = a.v - sqrt(det),
    det = (a.v)^2 + r^2 - v.v (l = a.v where det <= 0, the crank "broken"); the moment is dl/dq by
    the chain rule through v (the sites' Jacobians) and a (the slider's rotation: da = w x a), both
    times gear[0]. Returns lengths (k,) and moments (k, nv)."""
    topo = model.topology
    crank_site = np.asarray(topo.actuator_trnid, dtype=np.int64)[actuators]
    slider_site = np.asarray(topo.actuator_slidersite, dtype=np.int64)[actuators]
    axis = data.site_xmat[slider_site][:, :, 2]
    vec = data.site_xpos[crank_site] - data.site_xpos[slider_site]
    rod = model.actuator_cranklength[actuators]
    av = jnp.sum(vec * axis, axis=-1)
    det = av * av + rod * rod - jnp.sum(vec * vec, axis=-1)
    ok = det > 0
    sdet = jnp.sqrt(jnp.where(ok, det, 1.0))
    length = jnp.where(ok, av - sdet, av)
    dldv = jnp.where(ok[:, None], axis * (1 - av / sdet)[:, None] + vec / sdet[:, None], axis)
    dlda = jnp.where(ok[:, None], vec * (1 - av / sdet)[:, None], vec)
    site_body = np.asarray(topo.site_bodyid, dtype=np.int64)
    jac_crank, _ = smooth.point_jacobian(model, data, site_body[crank_site], data.site_xpos[crank_site])
    jac_slider, jacr_slider = smooth.point_jacobian(model, data, site_body[slider_site], data.site_xpos[slider_site])
    jac_axis = jnp.cross(jnp.swapaxes(jacr_slider, 1, 2), axis[:, None, :])  # (k, nv, 3): w_j x a
    moment = jnp.einsum("ki,kni->kn", dlda, jac_axis) + jnp.einsum("ki,kin->kn", dldv, jac_crank - jac_slider)
    gear = model.actuator_gear[actuators, 0]
    return gear * length, gear[:, None] * moment


def body_transmissions(model: Model) -> bool:
    """Whether an actuator acts through a body (adhesion): its moment needs the contacts first."""
    return bool(np.any(np.asarray(model.topology.actuator_trntype, dtype=np.int64) == TRN_BODY))


def _body_transmission(model: Model, data: Data, body: int):
    """Adhesion's moment (mj_transmission, mjTRN_BODY): minus the mean over the body's contacts of
    their normal Jacobians n^T (J_body2(p) - J_body1(p)); the contacts in the gap (no constraint
    rows) count too, those that move no dof do not. data.contact must hold this state's contacts."""
    bodies = constraint.geom_body(model, model.constraints.contact_geom)  # (slots, 2)
    slots = np.flatnonzero(np.any(bodies == body, axis=1) & constraint.slots_make_rows(model))
    if slots.size == 0:
        return jnp.zeros(model.nv, model.dtype)
    weight = jnp.where(data.contact.mask[slots], 1.0, 0.0).astype(model.dtype)
    return -(weight @ constraint.normal_jacobians(model, data, slots)) / jnp.maximum(jnp.sum(weight), 1.0)


def _refsite_transmission(model: Model, data: Data, a: int):
    """Site transmission measured from a reference site (mj_transmission): length = gear . (the
    site's position in the refsite's frame, the rotation vector from the refsite's orientation to
    the site's); moment = the site-minus-refsite Jacobians, with the columns of the dofs both
    hang from cleared, projected on the gear in the refsite's frame."""
    topo = model.topology
    site, ref = topo.actuator_trnid[a], topo.actuator_refsite[a]
    body = np.asarray(topo.site_bodyid, dtype=np.int64)[[site, ref]]
    gear, ref_rot = model.actuator_gear[a], data.site_xmat[ref]
    offset = ref_rot.T @ (data.site_xpos[site] - data.site_xpos[ref])
    quat = math.quat_mul(data.xquat[body[0]], model.site_quat[site])
    ref_quat = math.quat_mul(data.xquat[body[1]], model.site_quat[ref])
    rotation = math.quat_to_rotvec(math.quat_mul(math.quat_conj(ref_quat), quat))
    jacp, jacr = smooth.point_jacobian(model, data, body, data.site_xpos[np.array([site, ref])])
    keep = np.ones(model.nv)
    keep[list(topo.actuator_refsite_shared_dofs[a])] = 0.0
    keep = jnp.asarray(keep, model.dtype)
    moment = ((jacp[0] - jacp[1]) * keep).T @ (ref_rot @ gear[:3]) + ((jacr[0] - jacr[1]) * keep).T @ (ref_rot @ gear[3:])
    return offset @ gear[:3] + rotation @ gear[3:], moment


def _muscle_length_curve(L, lmin, lmax):
    """Normalized active force vs normalized length (mju_muscleGainLength): four half-quadratics,
    1 at L = 1, 0 outside [lmin, lmax]."""
    a, b = 0.5 * (lmin + 1.0), 0.5 * (1.0 + lmax)
    rising = (L - lmin) / jnp.maximum(MINVAL, a - lmin)
    below_top = (1.0 - L) / jnp.maximum(MINVAL, 1.0 - a)
    above_top = (L - 1.0) / jnp.maximum(MINVAL, b - 1.0)
    falling = (lmax - L) / jnp.maximum(MINVAL, lmax - b)
    curve = jnp.where(L <= a, 0.5 * rising**2, jnp.where(L <= 1.0, 1.0 - 0.5 * below_top**2,
                      jnp.where(L <= b, 1.0 - 0.5 * above_top**2, 0.5 * falling**2)))  # fmt: skip
    return jnp.where((L >= lmin) & (L <= lmax), curve, 0.0)


def _muscle_scales(model: Model, length, prm):
    """Peak force (force, or scale / acc0 when force < 0), normalized length L and the optimal
    length L0 = (lengthrange span) / (range span), prm = (range[2], force, scale, lmin, lmax,
    vmax, fpmax, fvmax) as in mju_muscleGain."""
    lengthrange = model.actuator_lengthrange
    force = jnp.where(prm[:, 2] < 0, prm[:, 3] / jnp.maximum(MINVAL, model.actuator_acc0), prm[:, 2])
    L0 = (lengthrange[:, 1] - lengthrange[:, 0]) / jnp.maximum(MINVAL, prm[:, 1] - prm[:, 0])
    L = prm[:, 0] + (length - lengthrange[:, 0]) / jnp.maximum(MINVAL, L0)
    return force, L, L0


def muscle_gain(model: Model, length, velocity):
    """Active muscle force per unit activation (mju_muscleGain): -force FL(L) FV(V), V = v / (L0 vmax)."""
    prm = model.actuator_gainprm
    force, L, L0 = _muscle_scales(model, length, prm)
    V = velocity / jnp.maximum(MINVAL, L0 * prm[:, 6])
    fvmax = prm[:, 8]
    y = fvmax - 1.0
    FV = jnp.where(V <= -1.0, 0.0, jnp.where(V <= 0.0, (V + 1.0) ** 2,
                   jnp.where(V <= y, fvmax - (y - V) ** 2 / jnp.maximum(MINVAL, y), fvmax)))  # fmt: skip
    return -force * _muscle_length_curve(L, prm[:, 4], prm[:, 5]) * FV


def muscle_bias(model: Model, length):
    """Passive muscle force (mju_muscleBias): 0 up to L = 1, half-quadratic up to b = (1 + lmax) / 2,
    linear beyond, peaking at -force fpmax (1/2 + ...)."""
    prm = model.actuator_biasprm
    force, L, _ = _muscle_scales(model, length, prm)
    b = 0.5 * (1.0 + prm[:, 5])
    width = jnp.maximum(MINVAL, b - 1.0)
    passive = jnp.where(L <= b, 0.5 * ((L - 1.0) / width) ** 2, 0.5 + (L - b) / width)
    return jnp.where(L <= 1.0, 0.0, -force * prm[:, 7] * passive)


def muscle_activation_rate(ctrl, act, dynprm):
    """act_dot of a muscle (mju_muscleDynamics, Millard et al. 2013): (ctrl - act) / tau with
    tau = tau_act (0.5 + 1.5 act) when ctrl > act, tau_deact / (0.5 + 1.5 act) otherwise; the
    switch is blended by a quintic sigmoid of width dynprm[2] when that width is positive."""
    act_clamped = jnp.clip(act, 0.0, 1.0)
    tau_act = dynprm[:, 0] * (0.5 + 1.5 * act_clamped)
    tau_deact = dynprm[:, 1] / (0.5 + 1.5 * act_clamped)
    width = dynprm[:, 2]
    excess = jnp.clip(ctrl, 0.0, 1.0) - act
    x = jnp.clip(excess / jnp.where(width < MINVAL, 1.0, width) + 0.5, 0.0, 1.0)
    blend = x**3 * (3.0 * x * (2.0 * x - 5.0) + 10.0)  # mju_sigmoid
    tau = jnp.where(width < MINVAL, jnp.where(excess > 0, tau_act, tau_deact), tau_deact + (tau_act - tau_deact) * blend)
    return excess / jnp.maximum(MINVAL, tau)


def _gain_and_bias(model: Model, length, velocity):
    topo = model.topology
    gaintype, biastype = np.asarray(topo.actuator_gaintype), np.asarray(topo.actuator_biastype)
    g, b = model.actuator_gainprm, model.actuator_biasprm
    gain = jnp.where(gaintype == GainType.AFFINE, g[:, 0] + g[:, 1] * length + g[:, 2] * velocity,
                     jnp.where(gaintype == GainType.PID, 0.0, g[:, 0]))  # fmt: skip
    bias = jnp.where(biastype == BiasType.AFFINE, b[:, 0] + b[:, 1] * length + b[:, 2] * velocity, 0.0)
    if (gaintype == GainType.MUSCLE).any():
        gain = jnp.where(gaintype == GainType.MUSCLE, muscle_gain(model, length, velocity), gain)
    if (biastype == BiasType.MUSCLE).any():
        bias = jnp.where(biastype == BiasType.MUSCLE, muscle_bias(model, length), bias)
    return gain, bias


def _time_constant(model: Model):
    return jnp.maximum(MINVAL, model.actuator_dynprm[:, 0])


def _actnum(topo) -> np.ndarray:
    """Activation states per actuator (one per stateful actuator where the topology predates actnum)."""
    if topo.actuator_actnum:
        return np.asarray(topo.actuator_actnum, dtype=np.int64)
    return (np.asarray(topo.actuator_dyntype) != DynType.NONE).astype(np.int64)


def _activation_slots(model: Model):
    """(act addresses, owning actuator) of every activation state (static)."""
    topo = model.topology
    adr, num = np.asarray(topo.actuator_actadr, dtype=np.int64), _actnum(topo)
    owners = [a for a in range(model.nactuator) if num[a] > 0 and adr[a] >= 0]
    slots = np.array([adr[a] + k for a in owners for k in range(num[a])], dtype=np.int64)
    owner = np.array([a for a in owners for _ in range(num[a])], dtype=np.int64)
    return slots, owner


def _last_act(topo) -> np.ndarray:
    """Each actuator's last activation state (the one its gain multiplies); 0 where it has none."""
    adr, num = np.asarray(topo.actuator_actadr, dtype=np.int64), _actnum(topo)
    return np.where(num > 0, adr + num - 1, 0)


def _round(x):
    """C's round (half away from zero), as mju_round."""
    return jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)


def _wrap(u, reference, period):
    """The representative of setpoint u nearest reference on a circle of the period (wrapSetpoint);
    u where the period is 0."""
    safe = jnp.where(period > 0, period, 1.0)
    return jnp.where(period > 0, u - period * _round((u - reference) / safe), u)


def wrap_period(model: Model):
    """Per actuator, the period of its setpoint on a rotational transmission (wrapPeriod), or None
    when no actuator has one: servos (fixed gain = -kp of an affine bias, no or integrator
    dynamics) and pid actuators on a ball joint (2 pi |gear[:3]|) or on a site with a refsite and a
    purely rotational gear (2 pi |gear[3:]|)."""
    topo = model.topology
    trntype = np.asarray(topo.actuator_trntype, dtype=np.int64)
    on_joint = (trntype == TRN_JOINT) | (trntype == TRN_JOINTINPARENT)
    ball = on_joint & (np.asarray(topo.jnt_type, dtype=np.int64)[np.where(on_joint, topo.actuator_trnid, 0)] == JointType.BALL)
    refsite = (trntype == TRN_SITE) & (np.asarray(topo.actuator_refsite, dtype=np.int64) >= 0)
    gaintype, dyntype = np.asarray(topo.actuator_gaintype), np.asarray(topo.actuator_dyntype)
    pid = gaintype == GainType.PID
    servo_shape = (gaintype == GainType.FIXED) & (np.asarray(topo.actuator_biastype) == BiasType.AFFINE)
    servo_shape &= (dyntype == DynType.NONE) | (dyntype == DynType.INTEGRATOR)
    candidate = (ball | refsite) & (pid | servo_shape)
    if not candidate.any():
        return None
    gear = model.actuator_gear
    servo = pid | (model.actuator_gainprm[:, 0] == -model.actuator_biasprm[:, 1])
    rotational = jnp.all(gear[:, :3] == 0, axis=-1)
    period = jnp.where(ball, 2 * jnp.pi * math.safe_norm(gear[:, :3]),
                       jnp.where(rotational, 2 * jnp.pi * math.safe_norm(gear[:, 3:]), 0.0))  # fmt: skip
    return jnp.where(candidate & servo, period, 0.0)


def control_inputs(model: Model, ctrl):
    """(nactuator, 3): each actuator's control block as (first, vel, ff). A pid's block is unpacked
    as (pos, vel, ff), an input it lacks 0 (unpackServoInputs); another actuator's is its one control."""
    topo = model.topology
    n = model.nactuator
    adr = np.asarray(topo.actuator_ctrladr or range(n), dtype=np.int64)
    num = np.asarray(topo.actuator_ctrlnum or (1,) * n, dtype=np.int64)
    spec = np.asarray(topo.actuator_ctrlspec or (0,) * n, dtype=np.int64)
    spec = np.where(np.asarray(topo.actuator_gaintype) == GainType.PID, spec, 0)
    has = np.stack([((spec & INPUT_POS) != 0) | ((spec == 0) & (num > 0)), (spec & INPUT_VEL) != 0, (spec & INPUT_FF) != 0], axis=1)
    offset = np.stack([np.zeros(n, np.int64), has[:, 0].astype(np.int64), has[:, :2].sum(axis=1)], axis=1)
    index = np.where(has, adr[:, None] + offset, 0)
    return jnp.where(has, ctrl[index] if model.nu else 0.0, 0.0)


def _pid_slots(topo):
    """Per actuator, the act addresses of a pid's slew-limited setpoint and integral (-1: none); the
    slots are laid out in that order (mjDYN_PID)."""
    adr, num = np.asarray(topo.actuator_actadr, dtype=np.int64), _actnum(topo)
    pid = (np.asarray(topo.actuator_dyntype) == DynType.PID) & (num > 0)
    slew = np.asarray(topo.actuator_pid_slew or (False,) * len(adr), dtype=bool) & pid
    integral = pid & (num > slew)
    return np.where(slew, adr, -1), np.where(integral, adr + slew, -1)


def _activation_rates(model: Model, data: Data, inputs, length, period):
    """act_dot and the inputs after a pid's slew limit (mj_fwdActuation's dynamics): integrator
    act_dot = u; filter (u - act) / tau; muscle its own rate; pid: the slew-limited setpoint's rate
    (u clipped to act +- slewmax h) and the position error (wrapped on a rotational transmission,
    not accumulated beyond imax)."""
    topo = model.topology
    dyntype = np.asarray(topo.actuator_dyntype)
    act_dot = jnp.zeros(model.na, model.dtype)
    simple = np.nonzero((dyntype != DynType.NONE) & (dyntype != DynType.PID) & (dyntype != DynType.DCMOTOR))[0]
    if len(simple):
        adr = _last_act(topo)[simple]
        act, u = data.act[adr], inputs[simple, 0]
        rate = jnp.where(dyntype[simple] == DynType.INTEGRATOR, u, (u - act) / _time_constant(model)[simple])
        if (dyntype == DynType.MUSCLE).any():
            muscle = muscle_activation_rate(u, act, model.actuator_dynprm[simple])
            rate = jnp.where(dyntype[simple] == DynType.MUSCLE, muscle, rate)
        act_dot = act_dot.at[adr].set(rate)
    slew_adr, integral_adr = _pid_slots(topo)
    h = model.opt.timestep
    period = jnp.zeros(model.nactuator, model.dtype) if period is None else period
    if (slew_adr >= 0).any():
        a = np.nonzero(slew_adr >= 0)[0]
        prev, limit = data.act[slew_adr[a]], model.actuator_dynprm[a, 1]
        limited, rate = slew_limit(_wrap(inputs[a, 0], prev, period[a]), prev, limit, h)
        act_dot = act_dot.at[slew_adr[a]].set(jnp.where(limit > 0, rate, 0.0))
        inputs = inputs.at[a, 0].set(jnp.where(limit > 0, limited, inputs[a, 0]))
    if (integral_adr >= 0).any():
        a = np.nonzero(integral_adr >= 0)[0]
        err = _wrap(inputs[a, 0] - length[a], 0.0, period[a])  # the error on the circle
        err = anti_windup(err, data.act[integral_adr[a]], model.actuator_dynprm[a, 0])
        act_dot = act_dot.at[integral_adr[a]].set(jnp.where(model.actuator_gainprm[a, 0] > 0, err, 0.0))
    return inputs, act_dot


def next_activation(model: Model, act, act_dot, length=None, velocity=None):
    """Activation after one timestep (mj_nextActivation for every state): Euler or exact filter,
    then actrange clamp (a DC motor's states: `dcmotor.next_activation`, which reads the actuator
    velocities); given the actuator lengths, an integrator servo's setpoint on a rotational
    transmission is then wrapped to the representative nearest its length (mj_advance)."""
    slots, owner = _activation_slots(model)
    if len(slots) == 0 or model.opt.disabled("actuation"):
        return act
    h = model.opt.timestep
    tau = _time_constant(model)[owner]
    exact = np.asarray(model.topology.actuator_dyntype)[owner] == DynType.FILTEREXACT
    step = jnp.where(exact, tau * (1.0 - jnp.exp(-h / tau)), h)
    act_dot, previous = held(model, act_dot), act
    act = clamp_activation(model, act.at[slots].set(act[slots] + act_dot[slots] * step))
    if len(dcmotor.actuators(model)):
        act = dcmotor.next_activation(model, act, previous, act_dot, velocity)
    period = wrap_period(model) if length is not None else None
    integrator = np.nonzero(np.asarray(model.topology.actuator_dyntype) == DynType.INTEGRATOR)[0]
    if period is None or len(integrator) == 0:
        return act
    adr = _last_act(model.topology)[integrator]
    return act.at[adr].set(_wrap(act[adr], length[integrator], period[integrator]))


def held(model: Model, act_dot):
    """act_dot with the activations of disabled actuators (actuator groups) held: mj_advance
    integrates them with a zero rate."""
    slots, owner = _activation_slots(model)
    held_slots = slots[np.asarray(model.topology.actuator_disabled, dtype=bool)[owner]] if len(slots) else slots
    return act_dot.at[held_slots].set(0.0) if len(held_slots) else act_dot


def clamp_activation(model: Model, act):
    """act clamped to its actuator's actrange where actlimited (the last part of mj_nextActivation)."""
    slots, owner = _activation_slots(model)
    if len(slots) == 0 or model.opt.disabled("actuation"):
        return act
    limited = np.asarray(model.topology.actuator_actlimited)[owner]
    limited = limited & (np.asarray(model.topology.actuator_dyntype)[owner] != DynType.DCMOTOR)
    lo, hi = model.actuator_actrange[owner, 0], model.actuator_actrange[owner, 1]
    return act.at[slots].set(jnp.where(limited, jnp.clip(act[slots], lo, hi), act[slots]))


def clamped_ctrl(model: Model, ctrl):
    """ctrl clamped to ctrlrange where ctrllimited (unless the "clampctrl" flag is disabled)."""
    if model.opt.disabled("clampctrl") or model.nu == 0:
        return ctrl
    limited = np.asarray(model.topology.actuator_ctrllimited)
    lo, hi = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    return jnp.where(limited, jnp.clip(ctrl, lo, hi), ctrl)


def _activation_input(model: Model, data: Data, first, act_next=None):
    """The scalar each actuator's gain multiplies: its (first) control, or its last activation
    (the next one if actearly)."""
    if model.na == 0:
        return first
    topo = model.topology
    stateful = np.asarray(topo.actuator_dyntype) != DynType.NONE
    adr = _last_act(topo)
    act = data.act[adr]
    if act_next is not None:
        act = jnp.where(np.asarray(topo.actuator_actearly), act_next[adr], act)
    return jnp.where(stateful, act, first)


def _pid_force(model: Model, data: Data, inputs, length, period, act_next):
    """A pid's input-side force: kp qref + kv vref + ff + ki z (kp = -biasprm[1], kv = -biasprm[2];
    qref wrapped to the length on a rotational transmission; z the integral, next one if actearly);
    the affine bias adds -kp l - kv dl/dt."""
    b, ki = model.actuator_biasprm, model.actuator_gainprm[:, 0]
    qref = inputs[:, 0] if period is None else _wrap(inputs[:, 0], length, period)
    force = -b[:, 1] * qref - b[:, 2] * inputs[:, 1] + inputs[:, 2]
    _, integral_adr = _pid_slots(model.topology)
    if (integral_adr >= 0).any():
        adr = np.maximum(integral_adr, 0)
        z = data.act[adr] if act_next is None else jnp.where(np.asarray(model.topology.actuator_actearly), act_next[adr], data.act[adr])
        force = force + jnp.where((integral_adr >= 0) & (ki > 0), ki * z, 0.0)
    return force


def actuation(model: Model, data: Data) -> Data:
    """actuator_length/velocity/force, act_dot and qfrc_actuator."""
    topo = model.topology
    zeros_u = jnp.zeros(model.nactuator, model.dtype)
    if model.nactuator == 0 or model.opt.disabled("actuation"):
        return data.replace(
            actuator_length=zeros_u, actuator_velocity=zeros_u, actuator_force=zeros_u,
            act_dot=jnp.zeros(model.na, model.dtype), qfrc_actuator=jnp.zeros(model.nv, model.dtype),
        )
    length, moment = transmission(model, data)
    velocity = moment @ data.qvel
    ctrl = clamped_ctrl(model, history.delayed_ctrl(model, data))
    inputs = control_inputs(model, ctrl)
    period = wrap_period(model)
    motors = dcmotor.actuators(model)
    drive = dcmotor.inputs(model, data.act, ctrl, length, velocity) if len(motors) else None

    act_dot, act_next = data.act_dot, None
    if model.na:
        inputs, act_dot = _activation_rates(model, data, inputs, length, period)
        if len(motors):
            act_dot = dcmotor.activation_rates(model, data.act, act_dot, drive, length, velocity)
        if np.any(topo.actuator_actearly):
            act_next = next_activation(model, data.act, act_dot, velocity=velocity)
    inp = _activation_input(model, data, inputs[:, 0], act_next)
    if period is not None:
        inp = _wrap(inp, length, period)

    gain, bias = _gain_and_bias(model, length, velocity)
    force = gain * inp
    pid = np.asarray(topo.actuator_gaintype) == GainType.PID
    if pid.any():
        force = jnp.where(pid, _pid_force(model, data, inputs, length, period, act_next), force)
    if len(motors):
        force = force.at[motors].set(dcmotor.force(model, data.act, act_next, drive.volts, velocity))
    force = _clamp_tendon_totals(model, _enabled(model, force + bias))
    limited = np.asarray(topo.actuator_forcelimited)
    force = jnp.where(limited, jnp.clip(force, model.actuator_forcerange[:, 0], model.actuator_forcerange[:, 1]), force)
    if len(motors):  # cogging and LuGre friction, outside the current limit
        force = force + _enabled(model, jnp.zeros_like(force).at[motors].set(dcmotor.mechanical(model, data.act, act_dot, length)))

    qfrc = moment.T @ force
    if any(topo.jnt_actgravcomp):  # actuator-level gravity compensation, before the joint force clamp
        to_actuators = np.asarray(topo.jnt_actgravcomp, dtype=bool)[np.asarray(topo.dof_jntid, dtype=np.int64)]
        qfrc = qfrc + jnp.where(to_actuators, passive.gravcomp(model, data), 0.0)
    jnt, d = _limited_joints(model)
    if len(jnt):
        qfrc = qfrc.at[d].set(jnp.clip(qfrc[d], model.jnt_actfrcrange[jnt, 0], model.jnt_actfrcrange[jnt, 1]))
    return data.replace(
        actuator_length=length, actuator_velocity=velocity, actuator_force=force,
        act_dot=act_dot, qfrc_actuator=qfrc,
    )


def _limited_joints(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """The joints with actuatorfrclimited and their dofs."""
    jnt = np.nonzero(np.asarray(model.topology.jnt_actfrclimited, dtype=bool))[0]
    return jnt, np.asarray(model.topology.jnt_dofadr, dtype=np.int64)[jnt]


def _tendon_actuators(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """Whether each actuator drives a tendon with actuatorfrclimited, and its tendon (0 if none)."""
    topo = model.topology
    on_tendon = np.asarray(topo.actuator_trntype, dtype=np.int64) == TRN_TENDON
    ten = np.where(on_tendon, np.asarray(topo.actuator_trnid, dtype=np.int64), 0)
    limited = on_tendon & np.asarray(topo.tendon_actfrclimited + (False,), dtype=bool)[np.where(on_tendon, ten, -1)]
    return limited, ten


def _saturated_by_joint_or_tendon(model: Model, data: Data) -> Bool[Array, " nactuator"] | None:
    """MuJoCo 4.0.1's mjd_actuator_vel skips actuators saturated by a joint's or tendon's actuatorfrcrange
    (probed against d.qDeriv): a joint (or jointinparent) actuator whose joint's total (moment^T force plus
    the actuator-level gravity compensation) is at or beyond its range, i.e. whose clamped qfrc_actuator sits
    on a bound, and a tendon actuator whose tendon's total actuator_force is within 1e-10 of
    a bound (relative to it) or beyond. Actuators on other transmissions through such a joint count
    towards its total but are not skipped."""
    topo = model.topology
    saturated = jnp.zeros(model.nactuator, bool)
    jnt, dofs = _limited_joints(model)
    if len(jnt):
        total = data.qfrc_actuator[dofs]  # clamped: on a bound exactly where the total reached it
        at_limit = (total <= model.jnt_actfrcrange[jnt, 0]) | (total >= model.jnt_actfrcrange[jnt, 1])
        trntype = np.asarray(topo.actuator_trntype, dtype=np.int64)
        on_joint = (trntype == TRN_JOINT) | (trntype == TRN_JOINTINPARENT)
        slot = np.full(model.njnt + 1, -1)  # each limited joint's entry in at_limit; the last: none
        slot[jnt] = np.arange(len(jnt))
        entry = slot[np.where(on_joint, np.asarray(topo.actuator_trnid, dtype=np.int64), -1)]
        saturated = jnp.where(entry >= 0, at_limit[np.maximum(entry, 0)], False)
    limited, ten = _tendon_actuators(model)
    if limited.any():
        total = jnp.zeros(model.ntendon, data.actuator_force.dtype).at[ten[limited]].add(data.actuator_force[limited])[ten]
        lo, hi = model.tendon_actfrcrange[ten, 0], model.tendon_actfrcrange[ten, 1]
        saturated = saturated | (limited & ((total <= lo + 1e-10 * jnp.abs(lo)) | (total >= hi - 1e-10 * jnp.abs(hi))))
    return saturated if len(jnt) or limited.any() else None


def _clamp_tendon_totals(model: Model, force):
    """Tendons with actuatorfrcrange: the actuators on such a tendon are scaled together so that
    their total lies in the range (before each actuator's own forcerange clamp, as mj_fwdActuation)."""
    limited, ten = _tendon_actuators(model)
    if not limited.any():
        return force
    total = jnp.zeros(model.ntendon, force.dtype).at[ten[limited]].add(force[limited])[ten]
    lo, hi = model.tendon_actfrcrange[ten, 0], model.tendon_actfrcrange[ten, 1]
    safe = jnp.where(total == 0, 1.0, total)
    scale = jnp.where(total < lo, lo / safe, jnp.where(total > hi, hi / safe, 1.0))
    return jnp.where(limited & (total != 0), force * scale, force)


def actuator_velocity_derivative(model: Model, data: Data):
    """d qfrc_actuator / d qvel (mjd_actuator_vel): moment^T diag(dgain/dv u + dbias/dv) moment,
    with the gain's and bias's velocity slopes (affine: g2, b2; muscle: the slope of FV; a pid's
    gain is 0, its kv in the bias; a DC motor's `dcmotor.velocity_slope`) and u the clamped control
    or the activation (the next one if actearly). An actuator whose force is at its forcerange adds
    nothing (a DC motor: its electrical force, at its current limit), nor one its joint's or tendon's
    actuatorfrcrange saturates (`_saturated_by_joint_or_tendon`)."""
    if model.nactuator == 0 or model.opt.disabled("actuation"):
        return jnp.zeros((model.nv, model.nv), model.dtype)
    length, moment = transmission(model, data)
    # the current ctrl even for a delayed actuator, as mjd_actuator_vel reads d->ctrl
    ctrl = clamped_ctrl(model, data.ctrl)
    velocity = moment @ data.qvel
    act_next = None
    if model.na and np.any(model.topology.actuator_actearly):  # the gain multiplies the next activation
        act_next = next_activation(model, data.act, data.act_dot, velocity=velocity)
    inp = _activation_input(model, data, control_inputs(model, ctrl)[:, 0], act_next)
    slope = jax.jvp(lambda v: _gain_and_bias(model, length, v), (velocity,), (jnp.ones_like(velocity),))[1]
    slope = slope[0] * inp + slope[1]
    motors = dcmotor.actuators(model)
    if len(motors):
        slope = slope.at[motors].set(dcmotor.velocity_slope(model, data.act, dcmotor.inputs(model, data.act, ctrl, length, velocity), velocity))
    slope = _enabled(model, slope)
    limited = np.asarray(model.topology.actuator_forcelimited)
    if limited.any():
        lo, hi = model.actuator_forcerange[:, 0], model.actuator_forcerange[:, 1]
        force = data.actuator_force
        if len(motors):  # a DC motor's current limit: its electrical force, without cogging and friction
            applied = dcmotor.inputs(model, data.act, clamped_ctrl(model, history.delayed_ctrl(model, data)), length, velocity)
            force = force.at[motors].set(dcmotor.force(model, data.act, act_next, applied.volts, velocity))
        slope = jnp.where(limited & ((force <= lo) | (force >= hi)), 0.0, slope)
    saturated = _saturated_by_joint_or_tendon(model, data)
    if saturated is not None:
        slope = jnp.where(saturated, 0.0, slope)
    return moment.T @ (slope[:, None] * moment)


def _enabled(model: Model, per_actuator):
    """Zero for the actuators of disabled groups (option/actuatorgroupdisable): MuJoCo skips them."""
    disabled = np.asarray(model.topology.actuator_disabled, dtype=bool)
    return jnp.where(disabled, 0.0, per_actuator) if disabled.any() else per_actuator
