"""What both planners share: the cost of a control plan, control bounds, warm-start shifting,
and the closed loop that runs a planner on a task (jitted, vmappable over episodes)."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..forward import step
from ..types import Data, Model
from .tasks import Task


def plan_cost(task: Task, model: Model, data: Data, plan: Float[Array, "H nu"]) -> Array:
    """Total cost of applying `plan` from `data`: sum of running costs plus the terminal cost.

    A diverged world (non-finite state) costs +inf, so no planner ever prefers it."""

    def body(d, u):
        d = step(model, d.replace(ctrl=u))
        return d, task.running_cost(d, u)

    final, running = jax.lax.scan(body, data, plan)
    total = jnp.sum(running) + task.terminal_cost(final)
    return jnp.where(final.diverged | ~jnp.isfinite(total), jnp.inf, total)


def ctrl_bounds(model: Model) -> tuple[Array, Array]:
    """Per-actuator (low, high): ctrlrange where ctrllimited, else (-inf, inf)."""
    limited = np.asarray(model.topology.actuator_ctrllimited, bool)
    low = jnp.where(limited, model.actuator_ctrlrange[:, 0], -jnp.inf)
    high = jnp.where(limited, model.actuator_ctrlrange[:, 1], jnp.inf)
    return low, high


def clip_plan(model: Model, plan: Array) -> Array:
    low, high = ctrl_bounds(model)
    return jnp.clip(plan, low, high)


def shift(plan: Float[Array, "H nu"], k: int = 1) -> Array:
    """Warm start: drop the first k controls, repeat the last one k times."""
    return jnp.concatenate([plan[k:], jnp.repeat(plan[-1:], k, axis=0)])


class Planner(Protocol):
    horizon: int

    def init(self, key: Array) -> Any: ...

    def plan(self, state: Any, data: Data) -> tuple[Any, Array]: ...

    def advance(self, state: Any, k: int) -> Any: ...


class Episode(NamedTuple):
    """A closed-loop run: states (T+1, nq), controls (T, nu), running costs (T,), the
    planner's predicted plan cost at each replanning (T // replan_every,), success at the end."""

    qpos: Array
    qvel: Array
    ctrl: Array
    cost: Array
    plan_cost: Array
    success: Array
    final_distance: Array


def run_episode(planner: Planner, task: Task, data: Data, steps: int, key: Array, replan_every: int = 1) -> Episode:
    """Receding horizon: plan, apply the first `replan_every` controls to the task's model,
    shift the plan, repeat, for `steps` steps. Pure: jit it, vmap it over starts and keys."""
    if steps % replan_every:
        raise ValueError(f"steps ({steps}) must be a multiple of replan_every ({replan_every})")
    model = task.model

    def control_step(carry, _):
        state, d = carry
        state, predicted = planner.plan(state, d)
        us = state.plan[:replan_every]

        def sim(d, u):
            d = step(model, d.replace(ctrl=u))
            return d, (d.qpos, d.qvel, task.running_cost(d, u))

        d, (qpos, qvel, cost) = jax.lax.scan(sim, d, us)
        return (planner.advance(state, replan_every), d), (qpos, qvel, us, cost, predicted)

    state = planner.init(key)
    (_, final), (qpos, qvel, us, cost, predicted) = jax.lax.scan(
        control_step, (state, data), None, length=steps // replan_every
    )
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    return Episode(
        qpos=jnp.concatenate([data.qpos[None], flat(qpos)]),
        qvel=jnp.concatenate([data.qvel[None], flat(qvel)]),
        ctrl=flat(us),
        cost=flat(cost),
        plan_cost=predicted,
        success=task.success(final),
        final_distance=task.goal_distance(final),
    )
