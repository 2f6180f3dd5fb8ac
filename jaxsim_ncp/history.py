"""Delayed actuators: MuJoCo 4's control history buffers (mju_historyInsert / mju_historyRead).

An actuator with `nsample` > 0 keeps its last nsample controls and their times in
`Data.history`, in MuJoCo's layout (so a buffer copies to or from `mjData.history`):
[user, cursor, times(n), values(n)], a ring whose newest sample sits at `cursor`. `step`
records (time, ctrl) at the start of each step, as mj_advance does; the actuator reads its
control at time - delay (`actuator_delay`, when nonzero), held (interp 0), linear (1) or a
cubic Hermite spline with Catmull-Rom slopes (2) between the bracketing samples, and the
oldest or newest sample outside them (mj_readCtrl). Reads are differentiable in the stored
controls and, where interpolated, in the delay.
"""

from __future__ import annotations

import jax.numpy as jnp

from .types import Data, Model

MINVAL = 1e-15  # mjMINVAL: times closer than this are one sample


def _logical(buf: jnp.ndarray, n: int):
    """(physical index of each logical slot, oldest first; times; values) of one buffer."""
    cursor = buf[1].astype(jnp.int32)
    phys = (cursor + 1 + jnp.arange(n)) % n
    return phys, buf[2 : 2 + n][phys], buf[2 + n : 2 + 2 * n][phys]


def read(buf: jnp.ndarray, n: int, t, interp: int):
    """The buffer's value at time t (mju_historyRead with dim = 1)."""
    _, times, values = _logical(buf, n)
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


def insert(buf: jnp.ndarray, n: int, t, value) -> jnp.ndarray:
    """The buffer with (t, value) recorded (mju_historyInsert): a time within MINVAL of a sample
    overwrites its value; a time before the oldest replaces the oldest; otherwise the samples
    before t move one slot towards the old end, dropping the oldest, and t takes the freed slot
    (after the newest: the ring's cursor advances)."""
    phys, times, values = _logical(buf, n)
    i = jnp.sum(times < t)  # historyFindIndex
    exact = (i < n) & (jnp.abs(t - times[jnp.minimum(i, n - 1)]) < MINVAL)
    slot = jnp.where(exact, i, jnp.maximum(i - 1, 0))
    j = jnp.arange(n)
    shifted = ~exact & (j < slot)  # 0 < i: logical j takes j + 1
    new_times = jnp.where(j == slot, jnp.where(exact, times, t), jnp.where(shifted, jnp.roll(times, -1), times))
    new_values = jnp.where(j == slot, value, jnp.where(shifted, jnp.roll(values, -1), values))
    advance = ~exact & (i == n)  # MuJoCo moves the cursor instead of the samples
    cursor = jnp.where(advance, (buf[1].astype(jnp.int32) + 1) % n, buf[1].astype(jnp.int32))
    phys = jnp.where(advance, (cursor + 1 + j) % n, phys)
    return jnp.concatenate([
        buf[:1], cursor.astype(buf.dtype)[None],
        jnp.zeros(n, buf.dtype).at[phys].set(new_times), jnp.zeros(n, buf.dtype).at[phys].set(new_values),
    ])  # fmt: skip


def initial(model: Model) -> jnp.ndarray:
    """mj_resetData's buffers: times -n dt, ..., -dt, values 0, the newest at slot n - 1."""
    parts = []
    for n in model.topology.actuator_nsample:
        if n:
            times = -(n - jnp.arange(n, dtype=model.dtype)) * model.opt.timestep
            parts.append(jnp.concatenate([jnp.array([0.0, n - 1], model.dtype), times, jnp.zeros(n, model.dtype)]))
    return jnp.concatenate(parts) if parts else jnp.zeros((0,), model.dtype)


def _buffers(model: Model):
    """(actuator, nsample, interp, slice of Data.history) of each actuator with a buffer."""
    topo = model.topology
    adr = 0
    for a, (n, interp) in enumerate(zip(topo.actuator_nsample, topo.actuator_interp)):
        if n:
            yield a, n, interp, slice(adr, adr + 2 + 2 * n)
            adr += 2 + 2 * n


def delayed_ctrl(model: Model, data: Data):
    """The controls the actuators act on: ctrl, or for a delayed actuator (nonzero actuator_delay,
    a buffer) its buffer read at time - delay (mj_fwdActuation via mj_readCtrl)."""
    ctrl = data.ctrl
    for a, n, interp, where in _buffers(model):
        delay = model.actuator_delay[a]
        ctrl = ctrl.at[a].set(jnp.where(delay != 0, read(data.history[where], n, data.time - delay, interp), ctrl[a]))
    return ctrl


def record_ctrl(model: Model, data: Data) -> jnp.ndarray:
    """Data.history with each buffered actuator's (time, ctrl) recorded (mj_advance)."""
    parts = [insert(data.history[where], n, data.time, data.ctrl[a]) for a, n, _, where in _buffers(model)]
    return jnp.concatenate(parts) if parts else data.history


def nhistory(model: Model) -> int:
    return int(sum(2 + 2 * n for n in model.topology.actuator_nsample if n))
