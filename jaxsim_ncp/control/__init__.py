"""Control on top of the simulator: gradient MPC, predictive sampling, the bundled tasks."""

from .base import Episode, plan_cost, run_episode, shift
from .mpc import GradientMPC
from .sampling import PredictiveSampling
from .tasks import Task, billiards, bundled_models, make_task, model_path, pusher

__all__ = [
    "Episode",
    "GradientMPC",
    "PredictiveSampling",
    "Task",
    "billiards",
    "bundled_models",
    "make_task",
    "model_path",
    "plan_cost",
    "pusher",
    "run_episode",
    "shift",
]
