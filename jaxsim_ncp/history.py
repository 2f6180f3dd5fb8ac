"""Delays and sample intervals: MuJoCo 4's history buffers (mju_historyInsert / mju_historyRead).

An actuator or sensor with `nsample` > 0 keeps its last nsample values and their times in
`Data.history`, in MuJoCo's layout and addresses (so it copies to or from `mjData.history`):
[user, cursor, times(n), values(n x dim)], a ring whose newest sample sits at `cursor`.
`step` records each buffer at the start of the step, as mj_advance does: an actuator's ctrl;
a sensor's current (undelayed) value, every step, or with an `interval` only once the
previous sample (`user`, advanced by the period) is a period old.
Reads, at a time t: held (interp 0), linear (1) or a cubic Hermite spline with Catmull-Rom
slopes (2) between the bracketing samples, the oldest or newest sample outside them. An
actuator with a nonzero `delay` acts on its buffer read at time - delay (mj_readCtrl); a
sensor with a positive delay reports its buffer read at time - delay, and an interval sensor
between its samples reports its buffer read at the current time (compute_or_read_sensor).
Reads are differentiable in the stored values and, where interpolated, in the delay.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from .types import Data, Model

MINVAL = 1e-15  # mjMINVAL: times closer than this are one sample


class Buffer(NamedTuple):
    index: int  # actuator or sensor
    n: int  # samples
    dim: int
    interp: int
    start: int  # address in Data.history

    @property
    def where(self) -> slice:
        return slice(self.start, self.start + 2 + self.n * (1 + self.dim))


def _logical(buf: jnp.ndarray, n: int, dim: int):
    """(physical index of each logical slot, oldest first; times (n,); values (n, dim))."""
    cursor = buf[1].astype(jnp.int32)
    phys = (cursor + 1 + jnp.arange(n)) % n
    return phys, buf[2 : 2 + n][phys], buf[2 + n :].reshape(n, dim)[phys]


def read(buf: jnp.ndarray, n: int, dim: int, t, interp: int):
    """The buffer's (dim,) value at time t (mju_historyRead)."""
    _, times, values = _logical(buf, n, dim)
    i = jnp.clip(jnp.sum(times < t), 1, n - 1)  # times[i-1] < t <= times[i] where it matters
    lo, hi = values[i - 1], values[i]
    span = times[i] - times[i - 1]
    inside = (t > times[0] + MINVAL) & (t < times[-1] - MINVAL) & (jnp.abs(t - times[i]) >= MINVAL)
    alpha = jnp.where(inside, (t - times[i - 1]) / jnp.where(inside, span, 1.0), 0.0)
    if interp == 0:
        between = lo
    elif interp == 1:
        between = lo + alpha * (hi - lo)
    else:  # Hermite basis, Catmull-Rom slopes from the neighbours, zero at the ends
        before, after = jnp.maximum(i - 2, 0), jnp.minimum(i + 1, n - 1)
        slope_lo = jnp.where(i > 1, (hi - values[before]) / jnp.where(i > 1, times[i] - times[before], 1.0), 0.0)
        slope_hi = jnp.where(i < n - 1, (values[after] - lo) / jnp.where(i < n - 1, times[after] - times[i - 1], 1.0), 0.0)
        a2 = alpha * alpha
        a3 = a2 * alpha
        between = ((2 * a3 - 3 * a2 + 1) * lo + (a3 - 2 * a2 + alpha) * span * slope_lo
                   + (-2 * a3 + 3 * a2) * hi + (a3 - a2) * span * slope_hi)  # fmt: skip
    at = jnp.where(t <= times[0] + MINVAL, values[0], jnp.where(t >= times[-1] - MINVAL, values[-1], values[i]))
    return jnp.where(inside, between, at)


def insert(buf: jnp.ndarray, n: int, dim: int, t, value) -> jnp.ndarray:
    """The buffer with (t, value) recorded (mju_historyInsert): a time within MINVAL of a sample
    overwrites its value; a time before the oldest replaces the oldest; otherwise the samples
    before t move one slot towards the old end, dropping the oldest, and t takes the freed slot
    (after the newest: the ring's cursor advances)."""
    phys, times, values = _logical(buf, n, dim)
    i = jnp.sum(times < t)  # historyFindIndex
    exact = (i < n) & (jnp.abs(t - times[jnp.minimum(i, n - 1)]) < MINVAL)
    slot = jnp.where(exact, i, jnp.maximum(i - 1, 0))
    j = jnp.arange(n)
    shifted = ~exact & (j < slot)  # 0 < i: logical j takes j + 1
    new_times = jnp.where(j == slot, jnp.where(exact, times, t), jnp.where(shifted, jnp.roll(times, -1), times))
    new_values = jnp.where((j == slot)[:, None], value, jnp.where(shifted[:, None], jnp.roll(values, -1, axis=0), values))
    advance = ~exact & (i == n)  # MuJoCo moves the cursor instead of the samples
    cursor = jnp.where(advance, (buf[1].astype(jnp.int32) + 1) % n, buf[1].astype(jnp.int32))
    phys = jnp.where(advance, (cursor + 1 + j) % n, phys)
    return jnp.concatenate([
        buf[:1], cursor.astype(buf.dtype)[None],
        jnp.zeros(n, buf.dtype).at[phys].set(new_times), jnp.zeros((n, dim), buf.dtype).at[phys].set(new_values).reshape(-1),
    ])  # fmt: skip


def actuator_buffers(model: Model) -> list[Buffer]:
    topo = model.topology
    return [Buffer(a, n, 1, interp, adr) for a, (n, interp, adr)
            in enumerate(zip(topo.actuator_nsample, topo.actuator_interp, topo.actuator_historyadr)) if n]  # fmt: skip


def sensor_buffers(model: Model) -> list[Buffer]:
    topo = model.topology
    return [Buffer(s, n, dim, interp, adr) for s, (n, dim, interp, adr)
            in enumerate(zip(topo.sensor_nsample, topo.sensor_dim, topo.sensor_interp, topo.sensor_historyadr)) if n]  # fmt: skip


def initial(model: Model) -> jnp.ndarray:
    """mj_resetData's buffers: values 0, the newest at slot n - 1, times -n dt, ..., -dt (`user` 0 for
    an actuator, -dt for a sensor); an interval sensor's times a period apart up to its phase (or
    -period), rounded up to the timestep, and that time as its last sample time (`user`)."""
    dt, dtype = model.opt.timestep, model.dtype
    out = jnp.zeros((model.topology.nhistory,), dtype)

    def reset(b: Buffer, user, times):
        head = jnp.stack([jnp.asarray(user, dtype), jnp.asarray(b.n - 1, dtype)])
        return out.at[b.where].set(jnp.concatenate([head, times, jnp.zeros(b.n * b.dim, dtype)]))

    for b in actuator_buffers(model):
        out = reset(b, 0.0, -(b.n - jnp.arange(b.n, dtype=dtype)) * dt)
    for b in sensor_buffers(model):
        logical = jnp.arange(b.n, dtype=dtype)
        period, phase = model.sensor_interval[b.index, 0], model.sensor_interval[b.index, 1]
        last = jnp.where(phase == 0, -period, phase)
        spaced = jnp.ceil((last - (b.n - 1 - logical) * period) / dt) * dt
        out = reset(b, jnp.where(period > 0, last, -dt), jnp.where(period > 0, spaced, -(b.n - logical) * dt))
    return out


def _ctrl_index(model: Model, actuator: int) -> int:
    """The control an actuator's buffer records (its block's first: a delayed actuator has one)."""
    adr = model.topology.actuator_ctrladr
    return adr[actuator] if adr else actuator


def delayed_ctrl(model: Model, data: Data):
    """The controls the actuators act on: ctrl, or for a delayed actuator (nonzero actuator_delay,
    a buffer) its buffer read at time - delay (mj_fwdActuation via mj_readCtrl)."""
    ctrl = data.ctrl
    for b in actuator_buffers(model):
        delay = model.actuator_delay[b.index]
        delayed = read(data.history[b.where], b.n, 1, data.time - delay, b.interp)[0]
        u = _ctrl_index(model, b.index)
        ctrl = ctrl.at[u].set(jnp.where(delay != 0, delayed, ctrl[u]))
    return ctrl


def sensor_readings(model: Model, data: Data, values: jnp.ndarray) -> jnp.ndarray:
    """sensordata from the sensors' current values: a sensor with a positive delay reads its buffer
    at time - delay; an interval sensor reads it at the current time until its next sample is due
    (compute_or_read_sensor)."""
    adr = model.topology.sensor_adr
    for b in sensor_buffers(model):
        delay, period = model.sensor_delay[b.index], model.sensor_interval[b.index, 0]
        buf = data.history[b.where]
        delayed = read(buf, b.n, b.dim, data.time - jnp.maximum(delay, 0.0), b.interp)  # the current time: interval
        now = values[adr[b.index] : adr[b.index] + b.dim]
        due = (period <= 0) | (buf[0] + period <= data.time)
        values = values.at[adr[b.index] : adr[b.index] + b.dim].set(jnp.where((delay > 0) | ~due, delayed, now))
    return values


def unrefreshed(model: Model, data: Data, sensor_values: jnp.ndarray) -> jnp.ndarray:
    """The buffered sensors' values mj_advance records while sensors are disabled (option/flag sensor):
    a delayed sensor's is computed for its buffer all the same, an interval sensor's is its sensordata,
    which is not refreshed."""
    adr, offset = model.topology.sensor_adr, 0
    for b in sensor_buffers(model):
        stale = data.sensordata[adr[b.index] : adr[b.index] + b.dim]
        part = sensor_values[offset : offset + b.dim]
        sensor_values = sensor_values.at[offset : offset + b.dim].set(jnp.where(model.sensor_delay[b.index] > 0, part, stale))
        offset += b.dim
    return sensor_values


def record(model: Model, data: Data, sensor_values: jnp.ndarray | None) -> jnp.ndarray:
    """Data.history after mj_advance's recording at data.time: every buffered actuator's ctrl and,
    given the buffered sensors' current values (concatenated in `sensor_buffers` order), every
    buffered sensor's (an interval sensor's only when due, its last sample time advanced by the period)."""
    history = data.history
    for b in actuator_buffers(model):
        u = _ctrl_index(model, b.index)
        history = history.at[b.where].set(insert(history[b.where], b.n, 1, data.time, data.ctrl[u : u + 1]))
    offset = 0
    for b in sensor_buffers(model):
        buf = history[b.where]
        period = model.sensor_interval[b.index, 0]
        due = (period <= 0) | (buf[0] + period <= data.time)
        recorded = insert(buf, b.n, b.dim, data.time, sensor_values[offset : offset + b.dim])
        offset += b.dim
        recorded = recorded.at[0].set(jnp.where(period > 0, buf[0] + period, buf[0]))
        history = history.at[b.where].set(jnp.where(due, recorded, buf))
    return history
