"""Predictive sampling (Howell et al., "Predictive Sampling: Real-time Behaviour Synthesis with
MuJoCo", 2022): the derivative-free baseline with the same interface as `GradientMPC`.

Each planning step rolls out the nominal plan and `num_samples - 1` perturbed copies
(clipped to the control bounds) in parallel and keeps the cheapest. Noise: "gaussian"
(white, per step), "smooth" (Gaussian values at `knots` points, linearly interpolated:
low-frequency plans) or "brown" (a random walk, sigma / sqrt(H) per step)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..types import Data
from .base import clip_plan, plan_cost, shift
from .tasks import Task

NOISE_KINDS = ("gaussian", "smooth", "brown")


class SamplingState(NamedTuple):
    plan: Array  # (H, nu)
    key: Array


@dataclasses.dataclass(frozen=True, eq=False)
class PredictiveSampling:
    task: Task
    horizon: int = 30
    num_samples: int = 64
    noise_scale: float = 0.3
    noise: str = "smooth"
    knots: int = 4

    def __post_init__(self):
        if self.noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {self.noise!r}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")

    def init(self, key: Array) -> SamplingState:
        return SamplingState(plan=jnp.zeros((self.horizon, self.task.model.nu), self.task.model.dtype), key=key)

    def advance(self, state: SamplingState, k: int = 1) -> SamplingState:
        return state._replace(plan=shift(state.plan, k))

    def sample_noise(self, key: Array, n: int) -> Array:
        """n perturbations of shape (H, nu) of the chosen kind, standard deviation noise_scale."""
        h, nu = self.horizon, self.task.model.nu
        if self.noise == "gaussian":
            eps = jax.random.normal(key, (n, h, nu))
        elif self.noise == "brown":
            eps = jnp.cumsum(jax.random.normal(key, (n, h, nu)), axis=1) / jnp.sqrt(h)
        else:
            values = jax.random.normal(key, (n, self.knots, nu))
            where = jnp.linspace(0.0, self.knots - 1, h)
            eps = jax.vmap(jax.vmap(lambda v: jnp.interp(where, jnp.arange(self.knots), v), 1, 1))(values)
        return self.noise_scale * eps.astype(self.task.model.dtype)

    def plan(self, state: SamplingState, data: Data) -> tuple[SamplingState, Array]:
        model = self.task.model
        key, sub = jax.random.split(state.key)
        nominal = clip_plan(model, state.plan)
        candidates = clip_plan(model, nominal[None] + self.sample_noise(sub, self.num_samples - 1))
        candidates = jnp.concatenate([nominal[None], candidates])
        costs = jax.vmap(lambda p: plan_cost(self.task, model, data, p))(candidates)
        best = jnp.argmin(costs)
        return SamplingState(plan=candidates[best], key=key), costs[best]
