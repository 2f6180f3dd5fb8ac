"""Receding-horizon gradient MPC: optimize a control plan by gradient descent through the
simulator (optax; Adam by default), with global-norm gradient clipping, control bounds by
projection, the best iterate kept (the landscape is non-convex: contact switches it), warm
start by shifting the previous plan, and optional contacts from distance (`cfd`) so plans
that do not touch the object yet still get a gradient. One `plan` call is one jittable,
vmappable planning step."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
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
    tie_rtol: an iterate whose cost is within this relative amount of the best replaces it."""

    task: Task
    horizon: int = 30
    iterations: int = 10
    learning_rate: float = 0.1
    optimizer: optax.GradientTransformation | None = None
    clip_norm: float | None = 1.0
    cfd: CFD | None = None
    tie_rtol: float = 1e-4

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

    def plan(self, state: MPCState, data: Data) -> tuple[MPCState, Array]:
        """`iterations` projected optimizer steps from the warm-start plan; returns the best
        plan seen (by its evaluated cost; the latest among equals) and that cost."""
        model, opt = self.model, self._optimizer()
        cost_and_grad = jax.value_and_grad(lambda p: plan_cost(self.task, model, data, p))

        def iterate(carry, _):
            plan, opt_state, best_plan, best_cost = carry
            cost, grad = cost_and_grad(plan)
            grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
            # ties (within round-off) go to the later iterate: where the simulated cost is flat (no contact
            # yet) the plan still moves along its (CFD) gradient instead of staying at the warm start
            better = cost <= best_cost + self.tie_rtol * jnp.abs(best_cost)
            best_plan = jnp.where(better, plan, best_plan)
            best_cost = jnp.where(better, cost, best_cost)
            updates, opt_state = opt.update(grad, opt_state, plan)
            plan = clip_plan(model, optax.apply_updates(plan, updates))
            return (plan, opt_state, best_plan, best_cost), cost

        plan0 = clip_plan(model, state.plan)
        inf = jnp.asarray(jnp.inf, plan0.dtype)
        (_, _, best_plan, best_cost), _ = jax.lax.scan(
            iterate, (plan0, opt.init(plan0), plan0, inf), None, length=self.iterations
        )
        return state._replace(plan=best_plan), best_cost
