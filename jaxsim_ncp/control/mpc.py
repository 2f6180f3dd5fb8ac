"""Receding-horizon gradient MPC: optimize a control plan by gradient descent through the
simulator (optax; Adam by default), with global-norm gradient clipping, control bounds by
projection, the best iterate kept (the landscape is non-convex: contact switches it), warm
start by shifting the previous plan, and optional contacts from distance (`cfd`) so plans
that do not touch the object yet still get a gradient. Optionally the plan is a linear
interpolation of a few knots (`knots`: the optimizer moves the whole stroke) and each
update is line-searched over a few scales by parallel rollouts (`line_search`). One `plan`
call is one jittable, vmappable planning step."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array

from ..cfd import CFD
from ..types import Data, Model
from .base import clip_plan, plan_cost, shift
from .tasks import Task


class MPCState(NamedTuple):
    plan: Array  # (H, nu) the plan to execute (the best iterate of the last planning step)
    key: Array


@dataclasses.dataclass(frozen=True, eq=False)
class GradientMPC:
    """task: what to control; horizon: plan length in steps; iterations: optimizer steps per
    planning step; optimizer: any optax transformation (default `optax.adam(learning_rate)`);
    clip_norm: global-norm clipping of the plan gradient (None: off); cfd: a `jsn.CFD` used by
    the planning model only (the forward pass, hence the executed motion, is unchanged);
    tie_rtol: an iterate whose cost is within this relative amount of the best replaces it;
    line_search: scales of the optimizer's update tried in parallel at each iteration (vmapped
    rollouts of the task's own model, no gradient), the cheapest taken (None: the update as is);
    knots: plans are the linear interpolation of this many knots, and the optimizer moves the
    knots (None: every step's control is free)."""

    task: Task
    horizon: int = 30
    iterations: int = 10
    learning_rate: float = 0.1
    optimizer: optax.GradientTransformation | None = None
    clip_norm: float | None = 1.0
    cfd: CFD | None = None
    tie_rtol: float = 1e-4
    line_search: tuple[float, ...] | list[float] | None = None
    knots: int | None = None

    def __post_init__(self):
        knots, scales = self.knots, self.line_search
        if knots is not None and not (isinstance(knots, int) and 2 <= knots <= self.horizon):
            raise ValueError(f"knots must be None or an integer from 2 to the horizon ({self.horizon}), got {knots!r}")
        positive = isinstance(scales, (tuple, list)) and all(isinstance(s, (int, float)) and s > 0 for s in scales)
        if scales is not None and not positive:
            raise ValueError(f"line_search must be a list of positive scales of the update, got {scales!r}")

    @property
    def model(self) -> Model:
        """The planning model: the task's, with contacts from distance when `cfd` is set."""
        model = self.task.model
        if self.cfd is None:
            return model
        return eqx.tree_at(lambda m: m.opt, model, dataclasses.replace(model.opt, cfd=self.cfd))

    def _optimizer(self) -> optax.GradientTransformation:
        opt = self.optimizer if self.optimizer is not None else optax.adam(self.learning_rate)
        return optax.chain(optax.clip_by_global_norm(self.clip_norm), opt) if self.clip_norm else opt

    def init(self, key: Array) -> MPCState:
        return MPCState(plan=jnp.zeros((self.horizon, self.task.model.nu), self.task.model.dtype), key=key)

    def advance(self, state: MPCState, k: int = 1) -> MPCState:
        return state._replace(plan=shift(state.plan, k))

    def knot_weights(self) -> np.ndarray | None:
        """(H, knots): linear interpolation of the knots (evenly spaced over the horizon, the
        first at step 0, the last at step H - 1) to per-step controls; None without knots."""
        if self.knots is None:
            return None
        where = np.linspace(0.0, self.knots - 1, self.horizon)
        return np.maximum(0.0, 1.0 - np.abs(where[:, None] - np.arange(self.knots)[None, :]))

    def plan(self, state: MPCState, data: Data) -> tuple[MPCState, Array]:
        """`iterations` projected optimizer steps from the warm-start plan; returns the best
        plan seen (by its evaluated cost; the latest among equals) and that cost.

        With `knots` the optimizer moves the knots (the warm-start plan sampled at the knot
        steps) and plans are their interpolation; with `line_search` each step tries the
        update at every scale (rollouts without gradient, in parallel) and moves to the cheapest."""
        model, opt, weights = self.model, self._optimizer(), self.knot_weights()
        dtype = state.plan.dtype
        to_plan = (lambda x: x) if weights is None else (lambda x: jnp.asarray(weights, dtype) @ x)
        cost_and_grad = jax.value_and_grad(lambda x: plan_cost(self.task, model, data, to_plan(x)))
        trial_costs = jax.vmap(lambda x: plan_cost(self.task, self.task.model, data, to_plan(x)))
        scales = jnp.asarray(self.line_search or (), dtype)

        def keep_best(x, cost, best):
            # ties (within round-off) go to the later iterate: where the simulated cost is flat (no contact
            # yet) the plan still moves along its (CFD) gradient instead of staying at the warm start
            better = cost <= best[1] + self.tie_rtol * jnp.abs(best[1])
            return jax.tree.map(lambda new, old: jnp.where(better, new, old), (x, cost), best)

        def iterate(carry, _):
            x, opt_state, best = carry
            cost, grad = cost_and_grad(x)
            best = keep_best(x, cost, best)
            updates, opt_state = opt.update(jnp.where(jnp.isfinite(grad), grad, 0.0), opt_state, x)
            if not self.line_search:
                return (clip_plan(model, optax.apply_updates(x, updates)), opt_state, best), cost
            trials = clip_plan(model, x[None] + scales[:, None, None] * updates[None])
            costs = trial_costs(trials)
            i = jnp.argmin(costs)
            return (trials[i], opt_state, keep_best(trials[i], costs[i], best)), cost

        plan0 = clip_plan(model, state.plan)
        x0 = plan0 if weights is None else plan0[np.round(np.linspace(0, self.horizon - 1, self.knots)).astype(int)]
        inf = jnp.asarray(jnp.inf, dtype)
        (_, _, (best_x, best_cost)), _ = jax.lax.scan(
            iterate, (x0, opt.init(x0), (x0, inf)), None, length=self.iterations
        )
        return state._replace(plan=to_plan(best_x)), best_cost
