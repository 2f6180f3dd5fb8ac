"""MuJoCo 4's DC motor actuator (`<dcmotor>`: mjDYN/mjGAIN/mjBIAS_DCMOTOR; MuJoCo's dcmotor tech note).

Parameters (MuJoCo's compiled layout): gainprm = [R, K, alpha, T0, kp, ki, kd, Vmax],
dynprm = [te, dimax, RT, C, Ta, sigma0, sigma1, slewmax, Imax], biasprm = [A, Np, phi, F_C, F_S, v_S].
Activation slots, each present when its parameter is positive, in this order: slew-limited first
input (slewmax), controller integral (ki), winding temperature (RT), LuGre bristle (sigma0),
armature current (te).

- Drive voltage (dcmotorVoltage): with a controller input, tau = kp (u_pos - l) + kd (u_vel - dl/dt)
  + ki x_I + u_ff, V = (R/K) tau + K dl/dt, clipped to +-Vmax; plus the raw `voltage` input.
- Resistance with the thermal model: R (1 + alpha (T + Ta - T0)).
- Force: stateful current (te > 0): K i; else K/R (V - K dl/dt). Then the actuator's forcerange, then
  the mechanical terms outside it: cogging A sin(Np l + phi) and LuGre friction -(sigma0 z + sigma1 dz/dt).
- Rates: current di/dt = (V/R - K/R dl/dt - i) / te (clipped to +-dimax); temperature
  dT/dt = (R i^2 - T/RT) / C; bristle dz/dt = v - sigma0 |v| / g(v) z with the Stribeck curve
  g(v) = F_C + (F_S - F_C) exp(-(v/v_S)^2); integral d x_I/dt = u_pos - l (anti-windup at Imax);
  slew: the first input clipped to prev +- slewmax h.
- Next activation (mj_nextActivation): the current exactly (filter), the bristle exactly under a
  held velocity, the integral by Euler clipped to +-Imax, the others by Euler; no actrange clamp.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from .types import DynType, Model

MINVAL = 1e-15
INPUT_POS, INPUT_VEL, INPUT_FF, INPUT_VOLTAGE = 1, 2, 4, 8  # mjtCtrlInput bits of a control block
SLEW, INTEGRAL, TEMPERATURE, BRISTLE, CURRENT = range(5)
# the parameter whose sign decides each slot (present when positive; mj_dcmotorSlots): (array, column, name)
SLOT_PARAMETERS = (("dynprm", 7, "slewmax"), ("gainprm", 5, "ki"), ("dynprm", 2, "thermal resistance"),
                   ("dynprm", 5, "LuGre stiffness"), ("dynprm", 0, "electrical time constant"))  # fmt: skip


def slew_limit(u, previous, slewmax, h):
    """slewLimit (a pid's or DC motor's first input): u clipped to previous +- slewmax h, and its rate."""
    step = slewmax * h
    limited = jnp.clip(u, previous - step, previous + step)
    return limited, (limited - previous) / h


def anti_windup(error, integral, imax):
    """A controller integral's rate: the error, not accumulated beyond +-imax where imax > 0."""
    return jnp.where((imax > 0) & (integral >= imax), jnp.minimum(error, 0.0),
                     jnp.where((imax > 0) & (integral <= -imax), jnp.maximum(error, 0.0), error))  # fmt: skip


class Drive(NamedTuple):
    """Per DC motor: its inputs (pos, vel, ff, voltage) after the slew limit, the slew state's rate,
    the drive voltage V and whether the controller's V is at Vmax."""

    u4: jnp.ndarray
    slew_rate: jnp.ndarray
    volts: jnp.ndarray
    saturated: jnp.ndarray


def actuators(model: Model) -> np.ndarray:
    """Indices of the DC motor actuators (static)."""
    return np.nonzero(np.asarray(model.topology.actuator_dyntype) == DynType.DCMOTOR)[0]


def slot_addresses(model: Model) -> np.ndarray:
    """(n_dcmotor, 5) act address of each slot (SLEW ... CURRENT), -1 where absent (static)."""
    topo = model.topology
    a = actuators(model)
    offsets = np.asarray(topo.actuator_dcmotor_slots, dtype=np.int64).reshape(-1, 5)[a]
    adr = np.asarray(topo.actuator_actadr, dtype=np.int64)[a]
    return np.where(offsets >= 0, adr[:, None] + offsets, -1)


def _block(model: Model, ctrl, a) -> jnp.ndarray:
    """The actuators' raw control blocks, (n, 4) padded with 0."""
    topo = model.topology
    adr = np.asarray(topo.actuator_ctrladr, dtype=np.int64)[a]
    num = np.asarray(topo.actuator_ctrlnum, dtype=np.int64)[a]
    present = np.arange(4)[None, :] < num[:, None]
    index = np.where(present, adr[:, None] + np.arange(4)[None, :], 0)
    return jnp.where(present, ctrl[index] if model.nu else 0.0, 0.0)


def _unpack(model: Model, block, a):
    """(pos, vel, ff, voltage) of each block in canonical order, an absent input 0 (unpackServoInputs)."""
    spec = np.asarray(model.topology.actuator_ctrlspec, dtype=np.int64)[a]
    bits = np.stack([(spec & b) != 0 for b in (INPUT_POS, INPUT_VEL, INPUT_FF, INPUT_VOLTAGE)], axis=1)
    position = np.cumsum(bits, axis=1) - 1  # index of each present input within its block
    return jnp.where(bits, jnp.take_along_axis(block, np.maximum(position, 0), axis=1), 0.0), spec


def _voltage(model: Model, a, u4, spec, length, velocity, x_integral):
    """dcmotorVoltage: the on-board controller's drive voltage (Vmax-clipped) plus the raw voltage
    input; and where the clip is active."""
    g = model.actuator_gainprm[a]
    resistance, k = g[:, 0], g[:, 1]
    torque = g[:, 4] * (u4[:, 0] - length) + g[:, 6] * (u4[:, 1] - velocity) + g[:, 5] * x_integral + u4[:, 2]
    controlled = (spec & (INPUT_POS | INPUT_VEL | INPUT_FF)) != 0
    safe_k = jnp.where(controlled, k, 1.0)  # the compiler requires K > 0 on this path
    drive = resistance / safe_k * torque + k * velocity
    vmax = g[:, 7]
    saturated = controlled & (vmax > 0) & (jnp.abs(drive) > vmax)
    drive = jnp.where(vmax > 0, jnp.clip(drive, -vmax, vmax), drive)
    return jnp.where(controlled, drive, 0.0) + u4[:, 3], saturated


def _resistance(model: Model, a, act, slots):
    """R, scaled by 1 + alpha (T + Ta - T0) with the thermal model."""
    g, d = model.actuator_gainprm[a], model.actuator_dynprm[a]
    temperature = _state(act, slots, TEMPERATURE)
    scale = 1.0 + g[:, 2] * (temperature + d[:, 4] - g[:, 3])
    return jnp.where(slots[:, TEMPERATURE] >= 0, g[:, 0] * scale, g[:, 0])


def _stribeck(model: Model, a, velocity):
    """The LuGre decay rate a(v) = -sigma0 |v| / g(v), with g(v) = F_C + (F_S - F_C) exp(-(v/v_S)^2)."""
    b, sigma0 = model.actuator_biasprm[a], model.actuator_dynprm[a, 5]
    ratio = velocity / jnp.maximum(MINVAL, b[:, 5])
    g = b[:, 3] + (b[:, 4] - b[:, 3]) * jnp.exp(-ratio * ratio)
    return -sigma0 * jnp.abs(velocity) / jnp.maximum(MINVAL, g)


def _state(act, slots, which):
    """Each motor's state in slot `which` (0 where it has none)."""
    if not (slots[:, which] >= 0).any():
        return jnp.zeros(slots.shape[0], act.dtype)
    return jnp.where(slots[:, which] >= 0, act[np.maximum(slots[:, which], 0)], 0.0)


def inputs(model: Model, act, ctrl, length, velocity) -> Drive:
    """Each DC motor's `Drive` from the (clamped, delayed) controls."""
    a, slots = actuators(model), slot_addresses(model)
    block = _block(model, ctrl, a)
    limited, rate = slew_limit(block[:, 0], _state(act, slots, SLEW), model.actuator_dynprm[a, 7], model.opt.timestep)
    slew = slots[:, SLEW] >= 0
    block = block.at[:, 0].set(jnp.where(slew, limited, block[:, 0]))
    u4, spec = _unpack(model, block, a)
    volts, saturated = _voltage(model, a, u4, spec, length[a], velocity[a], _state(act, slots, INTEGRAL))
    return Drive(u4, jnp.where(slew, rate, 0.0), volts, saturated)


def activation_rates(model: Model, act, act_dot, drive: Drive, length, velocity):
    """act_dot of every DC motor slot (mj_fwdActuation's mjDYN_DCMOTOR case)."""
    a, slots = actuators(model), slot_addresses(model)
    volts = drive.volts
    g, d = model.actuator_gainprm[a], model.actuator_dynprm[a]
    length, velocity = length[a], velocity[a]
    k, te = g[:, 1], d[:, 0]
    resistance = _resistance(model, a, act, slots)
    current = _state(act, slots, CURRENT)

    error = anti_windup(drive.u4[:, 0] - length, _state(act, slots, INTEGRAL), d[:, 8])
    safe_r = jnp.where(resistance == 0, 1.0, resistance)
    stateless_current = (volts - k * velocity) / safe_r
    i_now = jnp.where(slots[:, CURRENT] >= 0, current, stateless_current)
    safe_rt, safe_c = jnp.where(d[:, 2] > 0, d[:, 2], 1.0), jnp.where(d[:, 3] == 0, 1.0, d[:, 3])
    heating = (resistance * i_now * i_now - _state(act, slots, TEMPERATURE) / safe_rt) / safe_c
    bristle = _stribeck(model, a, velocity) * _state(act, slots, BRISTLE) + velocity
    safe_te = jnp.where(te > 0, te, 1.0)
    i_dot = (volts / safe_r - k / safe_r * velocity - current) / safe_te
    i_dot = jnp.where(d[:, 1] > 0, jnp.clip(i_dot, -d[:, 1], d[:, 1]), i_dot)
    for which, rate in ((SLEW, drive.slew_rate), (INTEGRAL, error), (TEMPERATURE, heating), (BRISTLE, bristle), (CURRENT, i_dot)):
        has = slots[:, which] >= 0
        if has.any():
            act_dot = act_dot.at[slots[has, which]].set(rate[has])
    return act_dot


def force(model: Model, act, act_next, volts, velocity):
    """The DC motors' electrical force before the forcerange clamp: K i (the next current if
    actearly), or K/R (V - K dl/dt) without a current state."""
    a, slots = actuators(model), slot_addresses(model)
    k = model.actuator_gainprm[a, 1]
    current = _state(act, slots, CURRENT)
    if act_next is not None:
        early = np.asarray(model.topology.actuator_actearly, dtype=bool)[a]
        current = jnp.where(early, _state(act_next, slots, CURRENT), current)
    gain = k / jnp.maximum(MINVAL, _resistance(model, a, act, slots))
    stateless = gain * volts - gain * k * velocity[a]
    return jnp.where(model.actuator_dynprm[a, 0] > 0, k * current, stateless)


def mechanical(model: Model, act, act_dot, length):
    """Cogging A sin(Np l + phi) and LuGre friction -(sigma0 z + sigma1 dz/dt), outside the forcerange."""
    a, slots = actuators(model), slot_addresses(model)
    b, d = model.actuator_biasprm[a], model.actuator_dynprm[a]
    cogging = jnp.where(b[:, 0] != 0, b[:, 0] * jnp.sin(b[:, 1] * length[a] + b[:, 2]), 0.0)
    lugre = d[:, 5] * _state(act, slots, BRISTLE) + d[:, 6] * _state(act_dot, slots, BRISTLE)
    return cogging - jnp.where(slots[:, BRISTLE] >= 0, lugre, 0.0)


def next_activation(model: Model, act, previous, act_dot, velocity):
    """`act` with the DC motor slots advanced from `previous` by one timestep (mj_nextActivation's
    mjDYN_DCMOTOR case)."""
    a, slots = actuators(model), slot_addresses(model)
    h, d = model.opt.timestep, model.actuator_dynprm[a]
    euler = previous + act_dot * h
    for which in (SLEW, TEMPERATURE):
        has = slots[:, which] >= 0
        if has.any():
            act = act.at[slots[has, which]].set(euler[slots[has, which]])
    has = slots[:, INTEGRAL] >= 0
    if has.any():
        s, imax = slots[has, INTEGRAL], d[has, 8]
        act = act.at[s].set(jnp.where(imax > 0, jnp.clip(euler[s], -imax, imax), euler[s]))
    has = slots[:, CURRENT] >= 0
    if has.any():
        s, te = slots[has, CURRENT], jnp.maximum(MINVAL, d[has, 0])
        act = act.at[s].set(previous[s] + act_dot[s] * te * (1.0 - jnp.exp(-h / te)))
    has = slots[:, BRISTLE] >= 0
    if has.any():  # exact under the held velocity: z(h) = e^(ah) z + (e^(ah) - 1)/a v
        s, v = slots[has, BRISTLE], velocity[a[has]]
        rate = _stribeck(model, a, velocity[a])[has]
        decay = jnp.exp(rate * h)
        small = jnp.abs(rate) <= MINVAL
        integral = jnp.where(small, h, (decay - 1.0) / jnp.where(small, 1.0, rate))
        act = act.at[s].set(decay * previous[s] + integral * v)
    return act


def velocity_slope(model: Model, act, drive: Drive, velocity):
    """d force / d(dl/dt) of each DC motor as MuJoCo 4.0.1's mjd_actuator_vel: K/R (dV/dw - K), times
    1 - exp(-h/te) through a current state (zero while di/dt is at its limit), with the controller's
    dV/dw = -kd R/K + K (zero while V is at Vmax) and R at the winding's temperature; -sigma1 for
    LuGre's damping (its bristle-rate term neglected, as MuJoCo)."""
    a, slots = actuators(model), slot_addresses(model)
    volts = drive.volts
    g, d = model.actuator_gainprm[a], model.actuator_dynprm[a]
    k, te, dimax = g[:, 1], d[:, 0], d[:, 1]
    controlled = (np.asarray(model.topology.actuator_ctrlspec, dtype=np.int64)[a] & (INPUT_POS | INPUT_VEL | INPUT_FF)) != 0
    dv_dw = jnp.where(controlled & ~drive.saturated, -g[:, 6] * g[:, 0] / jnp.where(controlled, k, 1.0) + k, 0.0)
    resistance = jnp.maximum(MINVAL, _resistance(model, a, act, slots))
    slope = k / resistance * (dv_dw - k)
    i_dot = (volts - k * velocity[a]) / resistance - _state(act, slots, CURRENT)  # times te
    free = (dimax <= 0) | (jnp.abs(i_dot) <= dimax * te)
    safe_te = jnp.where(te > 0, te, 1.0)
    smoothing = 1.0 - jnp.exp(-model.opt.timestep / safe_te)
    slope = jnp.where(te > 0, jnp.where(free, slope * smoothing, 0.0), slope)
    return slope - jnp.where(d[:, 6] > 0, d[:, 6], 0.0)
