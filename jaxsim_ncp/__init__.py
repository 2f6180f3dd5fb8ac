"""jaxsim_ncp: a JAX-native, batched, differentiable rigid-body simulator with MuJoCo-compatible physics."""

import ctypes.util as _ctypes_util
import os as _os
import sys as _sys

# headless rendering (render.py): MuJoCo picks its OpenGL backend when it is first imported. Only
# where libEGL exists: with MUJOCO_GL=egl and no libEGL, `import mujoco` itself fails (seen on a
# GPU machine without it).
if ("MUJOCO_GL" not in _os.environ and _sys.platform.startswith("linux") and not _os.environ.get("DISPLAY")
        and _ctypes_util.find_library("EGL")):  # fmt: skip
    _os.environ["MUJOCO_GL"] = "egl"

from .cfd import CFD
from .forward import forward, rollout, step
from .io import MJCFError, check_model, from_mujoco, load_mjcf
from .parallel import batched, tile_for, use_cpu_cores, world_mesh
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
    "batched",
    "check_model",
    "forward",
    "from_mujoco",
    "load_mjcf",
    "make_data",
    "rollout",
    "step",
    "tile_for",
    "use_cpu_cores",
    "world_mesh",
]
