"""Images and videos of trajectories through `mujoco.Renderer` (headless: EGL, set by
`jaxsim_ncp/__init__.py` when there is no display; `MUJOCO_GL=osmesa` also works).

    frames = render_trajectory(mj_model, traj.qpos)           # (F, H, W, 3) uint8
    write_gif(frames, "rollout.gif", fps=30)
    frames = render_batch(mj_model, traj.qpos[:, :4])         # 4 worlds side by side
"""

from __future__ import annotations

import os
import pathlib

import mujoco
import numpy as np


def as_mujoco_model(model_or_path) -> mujoco.MjModel:
    """A mujoco.MjModel from an MjModel, an MJCF path or an MJCF string."""
    if isinstance(model_or_path, mujoco.MjModel):
        return model_or_path
    text = str(model_or_path)
    if text.lstrip().startswith("<"):
        return mujoco.MjModel.from_xml_string(text)
    return mujoco.MjModel.from_xml_path(os.fspath(model_or_path))


def render_trajectory(model_or_path, qpos, width: int = 320, height: int = 240, fps: float = 30.0,
                      camera: int | str = -1) -> np.ndarray:  # fmt: skip
    """Frames (F, height, width, 3) of a qpos trajectory (T, nq) sampled at the model's
    timestep, subsampled to about `fps` frames per second. camera: a camera name or id;
    -1 is the free camera set by the model's <visual><global> azimuth/elevation."""
    mj = as_mujoco_model(model_or_path)
    qpos = np.asarray(qpos, dtype=np.float64)
    if qpos.ndim != 2 or qpos.shape[1] != mj.nq:
        raise ValueError(f"qpos must have shape (T, nq={mj.nq}), got {qpos.shape}")
    every = max(1, round(1.0 / (fps * mj.opt.timestep)))
    data = mujoco.MjData(mj)
    try:
        renderer = mujoco.Renderer(mj, height, width)
    except Exception as err:  # no GL context: say how to get one
        raise RuntimeError(f"cannot open an OpenGL context for rendering ({err}); headless machines need "
                           "MUJOCO_GL=egl (or osmesa) set before mujoco is imported") from err  # fmt: skip
    frames = []
    with renderer:
        for q in qpos[::every]:
            data.qpos[:] = q
            mujoco.mj_forward(mj, data)
            renderer.update_scene(data, camera=camera)
            frames.append(renderer.render().copy())
    return np.stack(frames)


def render_batch(model_or_path, qpos, columns: int | None = None, **kwargs) -> np.ndarray:
    """Frames of several worlds tiled in a grid: qpos (T, B, nq) -> (F, rows*H, columns*W, 3)."""
    qpos = np.asarray(qpos)
    if qpos.ndim != 3:
        raise ValueError(f"qpos must have shape (T, B, nq), got {qpos.shape}")
    worlds = [render_trajectory(model_or_path, qpos[:, b], **kwargs) for b in range(qpos.shape[1])]
    columns = columns or int(np.ceil(np.sqrt(len(worlds))))
    rows = int(np.ceil(len(worlds) / columns))
    blank = np.zeros_like(worlds[0])
    worlds += [blank] * (rows * columns - len(worlds))
    grid = [np.concatenate(worlds[r * columns : (r + 1) * columns], axis=2) for r in range(rows)]
    return np.concatenate(grid, axis=1)


def write_gif(frames: np.ndarray, path, fps: float = 30.0) -> pathlib.Path:
    """Write frames (F, H, W, 3) uint8 as an animated GIF (Pillow); returns the path."""
    from PIL import Image

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return path
