"""jaxsim_ncp: a JAX-native, batched, differentiable rigid-body simulator with MuJoCo-compatible physics."""

from .cfd import CFD
from .forward import forward, rollout, step
from .io import MJCFError, check_model, from_mujoco, load_mjcf
from .types import Data, Model, Option, UnsupportedFeatureError, WarningKind, make_data
from .validate import ModelError

__all__ = [
    "CFD",
    "Data",
    "MJCFError",
    "Model",
    "ModelError",
    "Option",
    "UnsupportedFeatureError",
    "WarningKind",
    "check_model",
    "forward",
    "from_mujoco",
    "load_mjcf",
    "make_data",
    "rollout",
    "step",
]
