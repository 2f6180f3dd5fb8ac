"""jaxsim_ncp: a JAX-native, batched, differentiable rigid-body simulator with MuJoCo-compatible physics."""

from .forward import forward, rollout, step
from .io import MJCFError, check_model, from_mujoco, load_mjcf
from .types import Data, Model, Option, UnsupportedFeatureError, make_data

__all__ = [
    "Data",
    "MJCFError",
    "Model",
    "Option",
    "UnsupportedFeatureError",
    "check_model",
    "forward",
    "from_mujoco",
    "load_mjcf",
    "make_data",
    "rollout",
    "step",
]
