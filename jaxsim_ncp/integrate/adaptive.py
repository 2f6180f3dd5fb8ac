"""Adaptive integration: one timestep of the continuous-time dynamics solved by Diffrax.

DiffMJX (Paulus, Geist et al., Sec. 4, Suppl. B.2): a fixed step through stiff soft
contact differentiates the *discretization* (time-of-impact gradients oscillate in sign
and size); an error-controlled solver keeps the gradient close to that of the ODE

    d/dt (q, v, act) = (v, qacc(q, v, act), act_dot(q, v, act))

with qacc from the forward pipeline (collision, constraint rows, Newton solve with its
implicit gradient) at every stage. The external interface stays fixed-step: `step`
advances `opt.timestep`, with as many substeps inside as the controller needs.

Quaternions (free and ball joints) are integrated on the manifold in local
coordinates: over one timestep the state is (delta, v, act) with q = q0 (+) delta, where
(+) is `smooth.integrate_pos` (q0 * exp(delta_rot) on each quaternion, q0 + delta
elsewhere) and q0 is the configuration at the start of the step. Its derivative is
exact, delta_dot = dexp^-1(delta_rot) omega on rotations (`fixed.dexp_inv(exact=True)`; right-trivialized,
omega in the body frame as MuJoCo's), v elsewhere, so the solver's order holds on
rotations too and quaternions stay unit (no renormalization drift). |delta_rot| stays far
below pi within a step.

Defaults: Tsit5 with a PID step-size controller (rtol = atol = 1e-5, the paper's),
`RecursiveCheckpointAdjoint` (reverse mode through the accepted substeps, checkpointed),
first trial substep = the whole timestep. Each Newton solve is warm-started from the
acceleration at the start of the step. A world that needs more than `max_steps`
substeps stops there; `step` flags it (WarningKind.INTEGRATOR, `diverged`) and keeps its
last good state. Stateful actuators integrate act_dot continuously (filters are exact
within the tolerance) and act is clamped to actrange at the end of the step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from ..actuation import clamp_activation, held
from ..types import Data, Model, make_data
from ..smooth import integrate_pos
from .fixed import dexp_inv


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """Static settings of the adaptive integrator (`Option.adaptive`)."""

    solver: Any  # diffrax.AbstractSolver
    controller: Any  # diffrax.AbstractStepSizeController
    adjoint: Any  # diffrax.AbstractAdjoint
    max_steps: int


def settings(rtol=None, atol=None, max_steps=None, ode_solver=None, stepsize_controller=None, adjoint=None) -> Adaptive:
    """The load-time overrides (rtol, atol, max_steps, ode_solver, stepsize_controller, adjoint), checked."""
    if stepsize_controller is not None and (rtol is not None or atol is not None):
        raise ValueError("pass either rtol/atol or stepsize_controller=..., not both (a controller carries its own tolerances)")
    rtol = 1e-5 if rtol is None else rtol
    atol = 1e-5 if atol is None else atol
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite tolerance > 0, got {value!r}")
    max_steps = 256 if max_steps is None else max_steps
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
    checks = (
        ("ode_solver", ode_solver, diffrax.AbstractSolver),
        ("stepsize_controller", stepsize_controller, diffrax.AbstractStepSizeController),
        ("adjoint", adjoint, diffrax.AbstractAdjoint),
    )
    for name, value, kind in checks:
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} must be a diffrax.{kind.__name__}, got {value!r}")
    return Adaptive(
        solver=diffrax.Tsit5() if ode_solver is None else ode_solver,
        controller=(
            diffrax.PIDController(rtol=float(rtol), atol=float(atol), pcoeff=0.3, icoeff=0.4)
            if stepsize_controller is None
            else stepsize_controller
        ),
        adjoint=diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint,
        max_steps=int(max_steps),
    )


def advance(model: Model, data: Data, forward_fn: Callable[[Model, Data], Data]) -> tuple[Data, jax.Array, jax.Array]:
    """Integrate one timestep from `data` (forward() already run there).

    Returns (new state, accepted substeps, ok): ok is False where `max_steps` was hit.
    """
    settings_ = model.opt.adaptive
    h = model.opt.timestep
    # what forward() reads besides the state; only float arrays, so that every adjoint (Backsolve's
    # custom_vjp included) sees them as differentiable arguments (eq_active as 0 / 1)
    inputs = dict(qpos=data.qpos, time=data.time, ctrl=data.ctrl, qfrc_applied=data.qfrc_applied,
                  xfrc_applied=data.xfrc_applied, qacc_warmstart=data.qacc, mocap_pos=data.mocap_pos,
                  mocap_quat=data.mocap_quat, history=data.history, plastic=data.plastic,
                  eq_active=data.eq_active.astype(h.dtype))  # fmt: skip

    def field(s, y, args):
        """d/ds of the state in the step's own time s = (t - t0) / h in [0, 1] (so the timestep,
        a model leaf, enters through args and every adjoint differentiates it)."""
        model, inputs = args
        h = model.opt.timestep
        delta, qvel, act = y
        qpos = integrate_pos(model, inputs["qpos"], delta, 1.0)
        d = make_data(model).replace(**inputs).replace(qpos=qpos, qvel=qvel, act=act, time=inputs["time"] + s * h,
                                                      eq_active=inputs["eq_active"] > 0.5)
        d = forward_fn(model, d)
        return h * dexp_inv(model, delta, qvel, exact=True), h * d.qacc, h * held(model, d.act_dot)

    y0 = (jnp.zeros_like(data.qvel), data.qvel, data.act)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        settings_.solver,
        t0=jnp.zeros((), h.dtype),  # the model's precision (python floats are float64 under x64)
        t1=jnp.ones((), h.dtype),
        dt0=jnp.ones((), h.dtype),
        y0=y0,
        args=(model, inputs),
        stepsize_controller=settings_.controller,
        adjoint=settings_.adjoint,
        max_steps=settings_.max_steps,
        throw=False,
    )
    delta, qvel, act = (y[-1] for y in sol.ys)
    new = data.replace(
        qpos=integrate_pos(model, data.qpos, delta, 1.0),
        qvel=qvel,
        act=clamp_activation(model, act),
        time=data.time + h,
    )
    ok = sol.result == diffrax.RESULTS.successful
    return new, sol.stats["num_accepted_steps"].astype(jnp.int32), ok
