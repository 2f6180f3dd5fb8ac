"""Control tasks on the bundled models: a model, costs, a success test and random starts.

A task's costs read positions from `qpos` (after `step`, `qpos` is the new state while
`xpos` still describes the state the step started from). Costs are quadratic:

    running(d, u) = w_goal |p_obj - goal|^2 + w_reach |p_tool - p_obj|^2 + w_ctrl |u|^2
    terminal(d)   = w_terminal |p_obj - goal|^2

`reach_weight=0, ctrl_weight=0` leave only the object's cost: a plan that never touches the
object then has a zero gradient unless contacts from distance (`jsn.CFD`) give it one.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from typing import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..io import load_mjcf
from ..types import Data, Model, make_data


def model_path(name: str) -> str:
    """Path of a bundled MJCF model: "pusher", "billiards", "cube", "humanoid" or "arm"."""
    path = importlib.resources.files("jaxsim_ncp") / "models" / f"{name}.xml"
    if not path.is_file():
        raise FileNotFoundError(f"no bundled model {name!r} (have: {', '.join(bundled_models())})")
    return str(path)


def bundled_models() -> list[str]:
    folder = importlib.resources.files("jaxsim_ncp") / "models"
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".xml"))


@dataclasses.dataclass(frozen=True)
class Task:
    """A planar manipulation task: move the object's (x, y) to `goal` with the tool.

    tool_qpos, object_qpos: qpos addresses of the tool's and the object's (x, y);
    object_offset: the object's body position added to its qpos (slide joints);
    start_low/start_high: box from which `sample_start` draws (tool x, tool y, object x, object y).
    """

    name: str
    model: Model
    goal: tuple[float, float]
    tool_qpos: tuple[int, int]
    object_qpos: tuple[int, int]
    object_offset: tuple[float, float]
    tool_offset: tuple[float, float]
    start_low: tuple[float, float, float, float]
    start_high: tuple[float, float, float, float]
    success_radius: float = 0.05
    goal_weight: float = 1.0
    reach_weight: float = 0.1
    ctrl_weight: float = 1e-3
    terminal_weight: float = 10.0

    def object_xy(self, d: Data) -> Array:
        return d.qpos[jnp.array(self.object_qpos)] + jnp.asarray(self.object_offset, d.qpos.dtype)

    def tool_xy(self, d: Data) -> Array:
        return d.qpos[jnp.array(self.tool_qpos)] + jnp.asarray(self.tool_offset, d.qpos.dtype)

    def goal_distance(self, d: Data) -> Array:
        return jnp.linalg.norm(self.object_xy(d) - jnp.asarray(self.goal, d.qpos.dtype))

    def running_cost(self, d: Data, u: Array) -> Array:
        goal = jnp.asarray(self.goal, d.qpos.dtype)
        obj = self.object_xy(d)
        return (self.goal_weight * jnp.sum((obj - goal) ** 2)
                + self.reach_weight * jnp.sum((self.tool_xy(d) - obj) ** 2)
                + self.ctrl_weight * jnp.sum(u**2))  # fmt: skip

    def terminal_cost(self, d: Data) -> Array:
        return self.terminal_weight * jnp.sum((self.object_xy(d) - jnp.asarray(self.goal, d.qpos.dtype)) ** 2)

    def success(self, d: Data) -> Array:
        return self.goal_distance(d) < self.success_radius

    def sample_start(self, key: Array) -> Data:
        """A random start: tool and object placed uniformly in their boxes, at rest."""
        low, high = jnp.asarray(self.start_low), jnp.asarray(self.start_high)
        x = jax.random.uniform(key, (4,), minval=low, maxval=high).astype(self.model.dtype)
        data = make_data(self.model)
        offsets = jnp.asarray(self.tool_offset + self.object_offset, self.model.dtype)
        qpos = data.qpos.at[jnp.array(self.tool_qpos + self.object_qpos)].set(x - offsets)
        return data.replace(qpos=qpos)

    def with_model(self, model: Model) -> "Task":
        return dataclasses.replace(self, model=model)


def pusher(reach_weight: float = 0.1, ctrl_weight: float = 1e-3, **overrides) -> Task:
    """The pusher (models/pusher.xml): push the box to (0.4, 0) with the sphere finger."""
    model = load_mjcf(model_path("pusher"), **overrides)
    return Task(
        name="pusher", model=model, goal=(0.4, 0.0),
        tool_qpos=(0, 1), object_qpos=(2, 3), tool_offset=(0.0, 0.0), object_offset=(0.0, 0.0),
        start_low=(-0.25, -0.2, 0.05, -0.12), start_high=(-0.1, 0.2, 0.15, 0.12),
        success_radius=0.05, reach_weight=reach_weight, ctrl_weight=ctrl_weight,
    )  # fmt: skip


def billiards(reach_weight: float = 0.1, ctrl_weight: float = 1e-3, **overrides) -> Task:
    """Billiards (models/billiards.xml): drive the cue ball so the object ball stops in the target."""
    model = load_mjcf(model_path("billiards"), **overrides)
    return Task(
        name="billiards", model=model, goal=(0.35, 0.15),
        tool_qpos=(0, 1), object_qpos=(2, 3), tool_offset=(-0.3, 0.0), object_offset=(0.0, 0.0),
        start_low=(-0.4, -0.2, -0.1, -0.15), start_high=(-0.25, 0.2, 0.1, 0.15),
        success_radius=0.06, reach_weight=reach_weight, ctrl_weight=ctrl_weight,
    )  # fmt: skip


TASKS: dict[str, Callable[..., Task]] = {"pusher": pusher, "billiards": billiards}


def make_task(name: str, **kwargs) -> Task:
    """A task by name ("pusher", "billiards"); kwargs go to its constructor (reach_weight,
    ctrl_weight, load_mjcf overrides such as solver="ncp" or timestep)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (have: {', '.join(TASKS)})")
    return TASKS[name](**kwargs)
