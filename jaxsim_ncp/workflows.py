"""The runs behind the CLI (`jaxsim-ncp simulate | sysid | mpc | bench`), callable from Python
and notebooks: each takes a config (a dict, as read from a TOML file in `configs/`) and a run
folder, writes its CSVs, plots and GIFs there and returns a summary dict.

Configs are checked up front: an unknown key, a missing model file or a bad value raises
`ConfigError` with one line naming the problem.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import time
import tomllib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .io import from_mujoco, load_mjcf
from .parallel import batched, tile_for
from .types import Model


class ConfigError(ValueError):
    """A config file or value the runs cannot use (the message names the key or file)."""


# ------------------------------------------------------------------------------ configs
def load_config(path) -> dict:
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err


def _section(config: dict, name: str, defaults: dict, required: tuple[str, ...] = ()) -> dict:
    """config[name] merged over defaults; unknown or missing keys raise ConfigError."""
    given = config.get(name, {})
    if not isinstance(given, dict):
        raise ConfigError(f"[{name}] must be a table")
    unknown = sorted(set(given) - set(defaults) - set(required))
    if unknown:
        raise ConfigError(f"[{name}]: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(set(defaults) | set(required)))})")
    missing = [k for k in required if k not in given]
    if missing:
        raise ConfigError(f"[{name}]: missing key(s) {', '.join(missing)}")
    return {**defaults, **given}


def _check_sections(config: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(unknown)} (known: {', '.join(known)})")


def resolve_model(name_or_path: str) -> str:
    """A bundled model name ("cube", "pusher", ...) or an MJCF file path -> a path."""
    from .control.tasks import bundled_models, model_path

    if name_or_path in bundled_models():
        return model_path(name_or_path)
    if not os.path.isfile(name_or_path):
        raise ConfigError(f"model file not found: {name_or_path} (bundled models: {', '.join(bundled_models())})")
    return name_or_path


def load_model(path: str, overrides: dict | None = None) -> Model:
    """load_mjcf with config overrides; a bad file or override is a ConfigError naming the file."""
    from .io import MJCFError

    try:
        return load_mjcf(path, **(overrides or {}))
    except (TypeError, MJCFError) as err:
        raise ConfigError(f"{path}: {err}") from err


def run_folder(root, kind: str) -> pathlib.Path:
    """A fresh folder root/<kind>-<date>-<time>[-n] for a run's outputs."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = pathlib.Path(root) / f"{kind}-{stamp}"
    path, n = base, 1
    while path.exists():
        path, n = pathlib.Path(f"{base}-{n}"), n + 1
    path.mkdir(parents=True)
    return path


def _write_csv(path: pathlib.Path, header: list[str], rows) -> pathlib.Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------------------ simulate
SIMULATE_DEFAULTS = {"batch": 4, "steps": 200, "ctrl": "random", "ctrl_scale": 0.5, "seed": 0, "video_worlds": 4,
                     "fps": 30.0, "width": 240, "height": 180, "key": ""}  # fmt: skip


def simulate(model_path: str, out: pathlib.Path, overrides: dict | None = None, **options) -> dict:
    """A batched rollout of an MJCF model: `batch` worlds from qpos0 (or from the keyframe `key`, a
    name or index) with small random velocities added, under zero or smooth random controls. Writes
    states.csv (world, step, time, qpos, qvel), rollout.gif (the first `video_worlds` worlds tiled)
    and returns a summary."""
    from . import render
    from .forward import rollout
    from .types import make_data

    opts = _section({"simulate": options}, "simulate", SIMULATE_DEFAULTS)
    if opts["ctrl"] not in ("zero", "random"):
        raise ConfigError(f"ctrl must be 'zero' or 'random', got {opts['ctrl']!r}")
    path = resolve_model(model_path)
    model = load_model(path, overrides)
    b, t = int(opts["batch"]), int(opts["steps"])
    rng = np.random.default_rng(opts["seed"])
    key = opts["key"]  # "" (none), a name, or an index (from the command line, as text)
    if isinstance(key, str) and key.lstrip("-").isdigit():
        key = int(key)
    data = make_data(model, None if key == "" else key)
    qvel0 = data.qvel + jnp.asarray(0.1 * rng.normal(size=(b, model.nv)), model.dtype)
    knots = rng.normal(size=(b, 5, model.nu)) * opts["ctrl_scale"]
    ctrl = np.stack([[np.interp(np.linspace(0, 4, t), np.arange(5), knots[w, :, a]) for a in range(model.nu)]
                     for w in range(b)], axis=-1) if model.nu and opts["ctrl"] == "random" else np.zeros((b, t, model.nu))  # fmt: skip
    run = batched(lambda v, u: rollout(model, data.replace(qvel=v), u), tile=tile_for(model))  # split over every device
    start = time.perf_counter()
    final, traj = jax.block_until_ready(run(qvel0, jnp.asarray(ctrl, model.dtype)))
    wall = time.perf_counter() - start
    qpos, qvel, times = np.asarray(traj.qpos), np.asarray(traj.qvel), np.asarray(traj.time)
    header = ["world", "step", "time"] + [f"qpos{i}" for i in range(model.nq)] + [f"qvel{i}" for i in range(model.nv)]
    rows = ([w, k, times[w, k], *qpos[w, k], *qvel[w, k]] for w in range(b) for k in range(t))
    csv_path = _write_csv(out / "states.csv", header, rows)
    worlds = min(b, int(opts["video_worlds"]))
    frames = render.render_batch(path, np.swapaxes(qpos[:worlds], 0, 1), fps=opts["fps"], width=opts["width"],
                                 height=opts["height"])  # fmt: skip
    gif = render.write_gif(frames, out / "rollout.gif", fps=opts["fps"])
    diverged = int(np.sum(np.asarray(final.diverged)))
    print(f"{b} worlds x {t} steps in {wall:.2f} s (compile included); diverged worlds: {diverged}")
    return {"csv": csv_path, "video": gif, "diverged": diverged, "seconds": wall}


# ------------------------------------------------------------------------------ sysid
SYSID_SECTIONS = ("model", "recording", "param", "fit")
RECORDING_DEFAULTS = {"source": "mujoco", "episodes": 3, "steps": 300, "substeps": 4, "height": [0.2, 0.3],
                      "linear_speed": 1.5, "angular_speed": 5.0, "noise_qpos": 1e-3, "noise_qvel": 1e-2, "seed": 0}  # fmt: skip
FIT_DEFAULTS = {"horizon": 25, "stride": 0, "iterations": 60, "learning_rate": 0.1, "qvel_weight": 0.01}
PARAM_KEYS = ("field", "element", "init", "lower", "upper", "component")
_NAMES_OF = {"geom": "geom_names", "body": "body_names", "jnt": "jnt_names", "actuator": "actuator_names"}


def _element_index(model: Model, field: str, element: str | int) -> int:
    """Row of `field` (geom_*, body_*, jnt_*, dof_*, actuator_*) for an element name or index."""
    if not hasattr(model, field) or not isinstance(getattr(model, field), jax.Array):
        raise ConfigError(f"param field {field!r} is not an array field of the model")
    prefix = field.split("_")[0]
    if isinstance(element, int):
        return element
    if prefix == "dof":  # dofs are named by their joint: the joint's first dof
        names = model.topology.jnt_names
        if element not in names:
            raise ConfigError(f"param {field}: no joint named {element!r}")
        return model.topology.jnt_dofadr[names.index(element)]
    if prefix not in _NAMES_OF:
        raise ConfigError(f"param {field}: give element as an index (no names for {prefix} fields)")
    names = getattr(model.topology, _NAMES_OF[prefix])
    if element not in names:
        raise ConfigError(f"param {field}: no {prefix} named {element!r} (have: {', '.join(n for n in names if n)})")
    return names.index(element)


def _param_specs(model: Model, params: list) -> list[dict]:
    if not params:
        raise ConfigError("[[param]]: at least one parameter to fit is required")
    specs = []
    for p in params:
        unknown = sorted(set(p) - set(PARAM_KEYS))
        if unknown or "field" not in p or "element" not in p or "init" not in p:
            raise ConfigError(f"[[param]] needs field, element, init (optional lower, upper, component); got {sorted(p)}")
        row = _element_index(model, p["field"], p["element"])
        leaf = getattr(model, p["field"])
        if not 0 <= row < leaf.shape[0]:
            raise ConfigError(f"param {p['field']}: element index {row} out of range")
        specs.append({**p, "row": row, "name": f"{p['field']}[{p['element']}]" + (f"[{p['component']}]" if "component" in p else "")})
    return specs


def _apply_specs(specs: list[dict]):
    """apply(model, values): writes each scalar into its field's row (every component of the
    row, or `component` only)."""

    def apply(model: Model, values: list) -> Model:
        for spec, value in zip(specs, values):
            leaf = getattr(model, spec["field"])
            idx = (spec["row"], spec["component"]) if "component" in spec else spec["row"]
            model = eqx.tree_at(lambda m, f=spec["field"]: getattr(m, f), model, leaf.at[idx].set(value))
        return model

    return apply


def record_mujoco(path: str, rec: dict, timestep: float) -> tuple[np.ndarray, np.ndarray]:
    """Tosses recorded with MuJoCo C: each episode starts from qpos0 with free bodies raised to a
    random height in `height`, random orientation, random linear (up to linear_speed) and angular
    (angular_speed) velocities, integrated at timestep / substeps and sampled every timestep;
    Gaussian measurement noise is added. Returns qpos (E, T+1, nq), qvel (E, T+1, nv)."""
    import mujoco

    mj = mujoco.MjModel.from_xml_path(path)
    mj.opt.timestep = timestep / rec["substeps"]
    rng = np.random.default_rng(rec["seed"])
    qpos_all, qvel_all = [], []
    free = [j for j in range(mj.njnt) if mj.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
    for _ in range(rec["episodes"]):
        d = mujoco.MjData(mj)
        for j in free:
            qa, da = mj.jnt_qposadr[j], mj.jnt_dofadr[j]
            d.qpos[qa + 2] = rng.uniform(*rec["height"])
            q = rng.normal(size=4)
            d.qpos[qa + 3 : qa + 7] = q / np.linalg.norm(q)
            d.qvel[da : da + 3] = rec["linear_speed"] * np.array([0.5 + 0.5 * rng.random(), 0.3 * rng.normal(), 0.5])
            d.qvel[da + 3 : da + 6] = rec["angular_speed"] * rng.normal(size=3)
        qp, qv = [d.qpos.copy()], [d.qvel.copy()]
        for _ in range(rec["steps"]):
            for _ in range(rec["substeps"]):
                mujoco.mj_step(mj, d)
            qp.append(d.qpos.copy())
            qv.append(d.qvel.copy())
        qpos_all.append(qp)
        qvel_all.append(qv)
    qpos, qvel = np.asarray(qpos_all), np.asarray(qvel_all)
    qpos = qpos + rec["noise_qpos"] * rng.normal(size=qpos.shape)
    qvel = qvel + rec["noise_qvel"] * rng.normal(size=qvel.shape)
    return qpos, qvel


def sysid(config: dict, out: pathlib.Path) -> dict:
    """Fit [[param]]s of [model] to a [recording] (MuJoCo C tosses of the true model, or an .npz
    with qpos, qvel[, ctrl]); writes recording.npz, fit.csv (loss and parameters per iteration),
    sysid.png and the fitted values; returns a summary."""
    from . import sysid as fitting

    _check_sections(config, SYSID_SECTIONS)
    model_cfg = _section(config, "model", {"overrides": {}}, required=("path",))
    rec = _section(config, "recording", RECORDING_DEFAULTS)
    fit_cfg = _section(config, "fit", FIT_DEFAULTS)
    path = resolve_model(model_cfg["path"])
    model = load_model(path, model_cfg["overrides"])
    specs = _param_specs(model, config.get("param", []))
    if rec["source"] == "mujoco":
        qpos, qvel = record_mujoco(path, rec, float(model.opt.timestep))
        ctrl = None
    else:
        if not os.path.isfile(rec["source"]):
            raise ConfigError(f"[recording] source: file not found: {rec['source']} (or 'mujoco' to record tosses)")
        arrays = np.load(rec["source"])
        qpos, qvel, ctrl = arrays["qpos"], arrays["qvel"], arrays.get("ctrl")
    np.savez(out / "recording.npz", qpos=qpos, qvel=qvel)
    truth = [float(np.asarray(getattr(model, s["field"])[(s["row"], s["component"]) if "component" in s else s["row"]]).ravel()[0])
             for s in specs]  # fmt: skip
    init = [jnp.asarray(s["init"], model.dtype) for s in specs]
    bars = []  # the progress bar opens at the first iteration (a bad config fails before it, in one line)

    def progress(it, loss):
        if not bars:
            bars.append(tqdm(total=fit_cfg["iterations"], desc="sysid", unit="it"))
        bars[0].update(1)
        bars[0].set_postfix(loss=f"{loss:.3g}")

    try:
        result = fitting.fit_params(
            model, init, _apply_specs(specs), qpos, qvel, ctrl,
            lower=[s.get("lower") for s in specs], upper=[s.get("upper") for s in specs],
            horizon=fit_cfg["horizon"], stride=fit_cfg["stride"] or None, qvel_weight=fit_cfg["qvel_weight"],
            learning_rate=fit_cfg["learning_rate"], iterations=fit_cfg["iterations"],
            names=[s["name"] for s in specs], progress=progress,
        )  # fmt: skip
    except ValueError as err:  # bounds, shapes, horizon: name the problem in one line
        raise ConfigError(str(err)) from err
    finally:
        for bar in bars:
            bar.close()
    history = [np.asarray(h) for h in result.param_history]
    _write_csv(out / "fit.csv", ["iteration", "loss"] + [s["name"] for s in specs],
               ([i, result.loss_history[i], *(h[i] for h in history)] for i in range(len(result.loss_history))))  # fmt: skip
    plt = _pyplot()
    fig, axes = plt.subplots(1, 1 + len(specs), figsize=(4 * (1 + len(specs)), 3.2))
    axes[0].semilogy(result.loss_history)
    axes[0].set(xlabel="iteration", ylabel="loss", title="multi-step-ahead loss")
    for ax, spec, h, true in zip(axes[1:], specs, history, truth):
        ax.plot(h, label="estimate")
        if rec["source"] == "mujoco":
            ax.axhline(true, color="k", ls="--", label="truth (model file)")
        ax.set(xlabel="iteration", title=spec["name"])
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sysid.png", dpi=100)
    plt.close(fig)
    fitted = [float(np.asarray(v)) for v in result.params]
    print(result.summary())
    return {"fitted": dict(zip([s["name"] for s in specs], fitted)), "truth": dict(zip([s["name"] for s in specs], truth)),
            "loss": result.loss_history, "plot": out / "sysid.png"}  # fmt: skip


# ------------------------------------------------------------------------------ mpc
MPC_SECTIONS = ("task", "episodes", "gradient", "sampling")
TASK_DEFAULTS = {"name": "pusher", "reach_weight": 0.1, "ctrl_weight": 1e-3, "overrides": {}}
EPISODE_DEFAULTS = {"count": 20, "steps": 100, "replan_every": 2, "seed": 0, "video": True}
GRADIENT_DEFAULTS = {"horizon": 20, "iterations": 8, "learning_rate": 0.2, "clip_norm": 1.0, "cfd_width": [0.0],
                     "cfd_pairs": [], "optimizer": "adam", "line_search": [], "knots": 0}  # fmt: skip
SAMPLING_DEFAULTS = {"horizon": 20, "num_samples": "equal_time", "noise_scale": 0.3, "noise": "smooth"}


def _gradient_planners(task, grad_cfg: dict) -> dict:
    """Gradient MPC with and without CFD: one planner per cfd_width (0 = off). optimizer: "adam",
    or "normalized" (steps of RMS size learning_rate along the plan gradient's direction: Adam
    scales each control separately, so where every gradient is tiny, as CFD's are far from
    contact, it takes full steps along directions that are only round-off)."""
    import optax

    from .cfd import CFD, pair_mask
    from .control import GradientMPC

    widths = grad_cfg["cfd_width"] if isinstance(grad_cfg["cfd_width"], list) else [grad_cfg["cfd_width"]]
    pairs = tuple(tuple(p) for p in grad_cfg["cfd_pairs"]) or None  # [] (default): every geom pair
    try:
        cfds = {w: CFD(width=w, pairs=pairs) if w else None for w in widths}
        pair_mask(pairs, task.model.topology.geom_names)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"[gradient] cfd_width / cfd_pairs: {err}") from err
    try:  # GradientMPC checks knots (0: every step free) and line_search before they are used below
        planners = {("gradient" if w == 0 else f"gradient+cfd{w:g}"): GradientMPC(
            task, horizon=grad_cfg["horizon"], iterations=grad_cfg["iterations"],
            clip_norm=grad_cfg["clip_norm"] or None, cfd=cfds[w], line_search=grad_cfg["line_search"] or None,
            knots=grad_cfg["knots"] or None)
            for w in widths}  # fmt: skip
    except (TypeError, ValueError) as err:
        raise ConfigError(f"[gradient] {err}") from err

    lr, size = grad_cfg["learning_rate"], (grad_cfg["knots"] or grad_cfg["horizon"]) * task.model.nu  # free controls
    optimizers = {"adam": optax.adam(lr), "normalized": optax.normalize_by_update_norm(scale_factor=-lr * size**0.5)}
    if grad_cfg["optimizer"] not in optimizers:
        raise ConfigError(f"[gradient] optimizer must be one of {', '.join(optimizers)}, got {grad_cfg['optimizer']!r}")
    return {name: dataclasses.replace(p, optimizer=optimizers[grad_cfg["optimizer"]]) for name, p in planners.items()}


def _sampling(task, samp_cfg: dict, n: int):
    """Predictive sampling as configured, with n samples."""
    from .control import PredictiveSampling

    return PredictiveSampling(task, horizon=samp_cfg["horizon"], num_samples=n, noise_scale=samp_cfg["noise_scale"],
                              noise=samp_cfg["noise"])  # fmt: skip


def _sampling_planner(task, samp_cfg: dict, reference, states, keys):
    """Predictive sampling; with num_samples = "equal_time" as many samples as make one of its
    planning steps take as long as one of `reference`'s, both timed on `states` (mid-episode
    states of the reference's own run: a planning step's cost depends on the contacts)."""

    def seconds(planner) -> float:
        plan = jax.jit(jax.vmap(lambda d, k: planner.plan(planner.init(k), d)))
        jax.block_until_ready(plan(states, keys))
        begin = time.perf_counter()
        jax.block_until_ready(plan(states, keys))
        return time.perf_counter() - begin

    samples = samp_cfg["num_samples"]
    if samples == "equal_time":
        budget, trial = seconds(reference), 16
        samples = max(2, int(trial * budget / seconds(_sampling(task, samp_cfg, trial))))
        # once more at the estimate: the time is not linear in n
        samples = max(2, int(samples * budget / seconds(_sampling(task, samp_cfg, samples))))
        print(f"equal wall-clock: a gradient planning step takes {budget * 1e3:.1f} ms -> {samples} samples")
    elif not isinstance(samples, int) or samples < 1:
        raise ConfigError(f"[sampling] num_samples must be a positive integer or \"equal_time\", got {samples!r}")
    return _sampling(task, samp_cfg, samples)


def mpc(config: dict, out: pathlib.Path) -> dict:
    """Closed-loop comparison on a task over randomized episodes (same starts for every
    planner): the gradient planners, then predictive sampling (sample count matched to the
    slowest gradient planner's time, and run once more with the count rescaled when their
    episodes' times differ by more than 20%); success rates, cost curves (mpc.png), results.csv and a
    GIF per planner."""
    from . import render
    from .control import make_task, model_path, run_episode

    _check_sections(config, MPC_SECTIONS)
    task_cfg = _section(config, "task", TASK_DEFAULTS)
    ep = _section(config, "episodes", EPISODE_DEFAULTS)
    grad_cfg = _section(config, "gradient", GRADIENT_DEFAULTS)
    samp_cfg = _section(config, "sampling", SAMPLING_DEFAULTS)
    try:
        task = make_task(task_cfg["name"], reach_weight=task_cfg["reach_weight"], ctrl_weight=task_cfg["ctrl_weight"],
                         **task_cfg["overrides"])  # fmt: skip
    except (TypeError, ValueError) as err:
        raise ConfigError(f"[task]: {err}") from err
    keys = jax.random.split(jax.random.PRNGKey(ep["seed"]), ep["count"])
    starts = jax.vmap(task.sample_start)(keys)
    planners = _gradient_planners(task, grad_cfg)
    results, rows, seconds_of = {}, [], {}

    def run(name, planner):
        episodes = batched(lambda d, k: run_episode(planner, task, d, ep["steps"], k, ep["replan_every"]))
        jax.block_until_ready(episodes(starts, keys))  # compile
        begin = time.perf_counter()
        result = jax.block_until_ready(episodes(starts, keys))
        seconds = time.perf_counter() - begin
        results[name], seconds_of[name] = result, seconds
        success = np.asarray(result.success)
        print(f"{name}: {int(success.sum())}/{ep['count']} episodes reach the goal; "
              f"mean final distance {float(np.mean(result.final_distance)):.3f} m; {seconds:.1f} s")  # fmt: skip
        rows.extend([name, e, bool(success[e]), float(result.final_distance[e]), float(np.sum(result.cost[e])), seconds]
                    for e in range(ep["count"]))  # fmt: skip
        if ep["video"]:
            qpos = np.asarray(result.qpos[: min(4, ep["count"])])
            render.write_gif(render.render_batch(model_path(task.name), np.swapaxes(qpos, 0, 1), width=240, height=180),
                             out / f"{name}.gif")  # fmt: skip

    for name, planner in tqdm(planners.items(), desc="gradient planners"):
        run(name, planner)
    slowest = max(planners, key=seconds_of.get)  # sampling gets the most time any gradient planner took
    middle = ep["steps"] // 2
    states = starts.replace(qpos=results[slowest].qpos[:, middle], qvel=results[slowest].qvel[:, middle])
    sampling = _sampling_planner(task, samp_cfg, planners[slowest], states, keys)
    run("sampling", sampling)
    ratio = seconds_of[slowest] / seconds_of["sampling"]
    if samp_cfg["num_samples"] == "equal_time" and abs(ratio - 1.0) > 0.2:
        # the planning steps were timed on the gradient planner's states; where sampling's own episodes
        # meet other contacts (fewer pushes) their time differs: rescale the count once by the episode times
        n = max(2, round(sampling.num_samples * ratio))
        print(f"equal wall-clock: sampling's episodes took {seconds_of['sampling']:.1f} s against "
              f"{seconds_of[slowest]:.1f} s -> {n} samples, run again")  # fmt: skip
        rows[:] = [row for row in rows if row[0] != "sampling"]
        run("sampling", _sampling(task, samp_cfg, n))
    _write_csv(out / "results.csv", ["planner", "episode", "success", "final_distance", "total_cost", "seconds"], rows)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, r in results.items():
        dist = np.linalg.norm(np.asarray(r.qpos)[:, :, list(task.object_qpos)] + np.asarray(task.object_offset)
                              - np.asarray(task.goal), axis=-1)  # fmt: skip
        t = np.arange(dist.shape[1]) * float(task.model.opt.timestep)
        axes[0].plot(t, np.median(dist, 0), label=name)
        axes[0].fill_between(t, np.percentile(dist, 25, 0), np.percentile(dist, 75, 0), alpha=0.2)
        axes[1].plot(np.mean(np.cumsum(np.asarray(r.cost), 1), 0), label=name)
    axes[0].axhline(task.success_radius, color="k", ls="--", lw=0.8)
    axes[0].set(xlabel="time [s]", ylabel="object to goal [m]", title=f"{task.name}: median, 25-75%")
    axes[1].set(xlabel="step", ylabel="cumulative cost (mean)", title="cost")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "mpc.png", dpi=100)
    plt.close(fig)
    return {name: {"success": int(np.sum(r.success)), "episodes": ep["count"]} for name, r in results.items()}


# ------------------------------------------------------------------------------ bench
def pile_xml(nx: int = 5, ny: int = 5, nz: int = 4, half: float = 0.05, sink: float = 0.0005, gap: float = 0.002,
             max_geom_pairs: int | None = None) -> str:
    """nx*ny*nz free cubes stacked on a plane; layers overlap by `sink`, columns `gap` apart;
    `max_geom_pairs`: the contact capacity per narrow-phase function (MJX's custom numeric,
    read by both simulators)."""
    bodies = []
    pitch = 2 * half + gap
    for k in range(nz):
        for i in range(nx):
            for j in range(ny):
                x, y = (i - (nx - 1) / 2) * pitch, (j - (ny - 1) / 2) * pitch
                z = half - sink + k * (2 * half - sink)
                bodies.append(
                    f'    <body name="cube_{k}_{i}_{j}" pos="{x:.6f} {y:.6f} {z:.6f}">'
                    f'<freejoint/><geom type="box" size="{half} {half} {half}"/></body>'
                )
    body_xml = "\n".join(bodies)
    custom = f'<custom><numeric name="max_geom_pairs" data="{max_geom_pairs}"/></custom>' if max_geom_pairs else ""
    return f"""<mujoco model="cube_pile">
  {custom}
  <option timestep="0.005" iterations="4" ls_iterations="8" cone="pyramidal"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
{body_xml}
  </worldbody>
</mujoco>
"""


BENCH_SCENES = {
    "pile": "100 free cubes stacked 5 x 5 x 4 on a plane (`pile_xml`), the contact-rich scene",
    "humanoids4": "four humanoids that collide with each other and the floor (mujoco-mjx's test_data/humanoid/04_humanoids.xml)",
}


def mjx_limits(mj) -> dict:
    """The `max_contact_points` of an MJCF's MJX custom numeric as a `from_mujoco` keyword: the
    benchmarks run ours with MJX's contact cap (the same contacts get rows in both), which a plain
    load leaves out (MuJoCo C has no such cap)."""
    from .io import custom_numeric

    return {"max_contact_points": custom_numeric(mj, "max_contact_points")}


def bench_model_path(name: str, folder: pathlib.Path) -> str:
    """A benchmark model's MJCF path: a generated scene of `BENCH_SCENES` (the pile is written into
    `folder`), a bundled model name or a file path (`resolve_model`)."""
    if name == "pile":
        path = pathlib.Path(folder) / "pile.xml"
        path.write_text(pile_xml())
        return str(path)
    if name == "humanoids4":
        import mujoco

        path = pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data" / "humanoid" / "04_humanoids.xml"
        if not path.is_file():
            raise ConfigError(f"model humanoids4 is mujoco-mjx's {path.name}, not found at {path} (pip install mujoco-mjx)")
        return str(path)
    return resolve_model(name)


def bench(models: list[str], batches: list[int], steps: int, out: pathlib.Path, mjx: bool = True,
          compile_repeats: int = 2) -> list[dict]:  # fmt: skip
    """Forward throughput (steps/s) vs batch and compile time of a jitted rollout, side by side
    with MJX (mujoco-mjx, when installed) on the same models, and the compile time of one step
    (`jax.jit(step)` of one world against `jax.jit(mjx.step)`, fastest of `compile_repeats`; 0
    skips it); writes bench.csv. Both run as `jax.jit(jax.vmap(rollout))` on one device; ours also
    through `batched` (`batched_*` columns: over every device, a CPU's worlds in tiles; the CLI gives
    a CPU a device per core, `use_cpu_cores`). MJX is not run that way: jaxlib's batched Cholesky,
    which it calls, deadlocks when several CPU devices run it at once (issue #11)."""
    import mujoco

    from .forward import rollout, step
    from .types import make_data

    rows = []
    for name in models:
        mj = mujoco.MjModel.from_xml_path(bench_model_path(name, out))
        model = from_mujoco(mj, **mjx_limits(mj))
        data = make_data(model)
        mjx_run = _mjx_rollout(mj) if mjx else None
        per_model = {"step_compile_s": _compile_seconds(step, model, data, repeats=compile_repeats)} if compile_repeats else {}
        if mjx_run is not None:
            run, d0, mx = mjx_run
            mjx_step = jax.jit(jax.vmap(lambda u: run(d0, u)[0].qpos))
            if compile_repeats:
                from mujoco import mjx as mjx_module

                per_model["mjx_step_compile_s"] = _compile_seconds(mjx_module.step, mx, d0, repeats=compile_repeats)
                per_model["step_compile_ratio"] = per_model["step_compile_s"] / per_model["mjx_step_compile_s"]
        final_qpos = lambda u: rollout(model, data, u)[0].qpos  # noqa: E731
        for batch in batches:
            ctrl = jnp.zeros((batch, steps, model.nu), model.dtype)
            ours = jax.jit(jax.vmap(final_qpos))
            row = {"model": name, "batch": batch, "steps": steps, **per_model}
            row["compile_s"], row["steps_per_s"] = _time(ours, ctrl, batch * steps)
            if mjx_run is not None:
                row["mjx_compile_s"], row["mjx_steps_per_s"] = _time(mjx_step, ctrl, batch * steps)
                row["speed_ratio"] = row["steps_per_s"] / row["mjx_steps_per_s"]
            if batch > 1:  # ours again through `batched`: the worlds split over the devices, in tiles on a CPU
                spread = batched(final_qpos, tile=tile_for(model))
                row["batched_devices"] = len(jax.devices())
                row["batched_compile_s"], row["batched_steps_per_s"] = _time(spread, ctrl, batch * steps)
                if mjx_run is not None:
                    row["batched_speed_ratio"] = row["batched_steps_per_s"] / row["mjx_steps_per_s"]
            _print_row(row)
            rows.append(row)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k) if k in rows[-1] else 99)
    _write_csv(out / "bench.csv", keys, ([r.get(k, "") for k in keys] for r in rows))
    return rows


CHECKPOINTS = (False, True, "sqrt")  # rollout(checkpoint=...) settings the gradient benchmark compares


def bench_gradient(models: list[str], horizons: list[int], out: pathlib.Path, mjx: bool = True,
                   checkpoints=CHECKPOINTS) -> list[dict]:  # fmt: skip
    """Reverse-mode gradient of a T-step rollout vs the horizon T, side by side with MJX: compile
    time, seconds per gradient and peak memory, as XLA's estimate for the compiled program
    (arguments + outputs + temporaries, `memory_analysis()`: deterministic, unlike RSS). Ours runs
    with each `rollout(checkpoint=...)` of `checkpoints`, MJX with plain reverse mode through its scan.

    Loss (both): sum(qpos_T^2) + mean_t(qvel_t^2), differentiated w.r.t. the initial qvel and the
    controls (T, nu), from the model's initial state with fixed random controls. Both simulators
    run at opt.iterations = 1, the only setting at which MJX's solver is reverse-differentiable
    (it runs a while_loop above 1). Writes bench_gradient.csv and bench_gradient.png.
    """
    import mujoco

    from .forward import rollout
    from .types import make_data

    rows = []
    for name in models:
        mj = mujoco.MjModel.from_xml_path(bench_model_path(name, out))
        mj.opt.iterations = 1
        model = from_mujoco(mj, **mjx_limits(mj))
        data = make_data(model)
        rng = np.random.default_rng(0)
        configs = [(f"ours checkpoint={c}", _rollout_loss(lambda d, u, c=c: rollout(model, d, u, checkpoint=c), data))
                   for c in checkpoints]  # fmt: skip
        mjx_run = _mjx_rollout(mj) if mjx else None
        if mjx_run is not None:
            configs.append(("mjx", _rollout_loss(*mjx_run[:2])))
        for horizon in horizons:
            ctrl = jnp.asarray(rng.uniform(-0.3, 0.3, (horizon, model.nu)), model.dtype)
            for label, loss in configs:
                grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
                begin = time.perf_counter()
                compiled = grad.lower(data.qvel, ctrl).compile()
                row = {"model": name, "horizon": horizon, "config": label, "compile_s": time.perf_counter() - begin}
                jax.block_until_ready(compiled(data.qvel, ctrl))
                begin = time.perf_counter()
                jax.block_until_ready(compiled(data.qvel, ctrl))
                row["grad_s"] = time.perf_counter() - begin
                memory = compiled.memory_analysis()
                row["peak_mb"] = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                                  + memory.temp_size_in_bytes - memory.alias_size_in_bytes) / 1e6  # fmt: skip
                _print_row(row)
                rows.append(row)
    _write_csv(out / "bench_gradient.csv", list(rows[0]), ([*r.values()] for r in rows))
    plt = _pyplot()
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 3.5 * len(models)), squeeze=False)
    for (mem_ax, time_ax), name in zip(axes, models):
        for label in dict.fromkeys(r["config"] for r in rows):
            mine = [r for r in rows if r["model"] == name and r["config"] == label]
            x = [r["horizon"] for r in mine]
            mem_ax.loglog(x, [r["peak_mb"] for r in mine], "o-", label=label)
            time_ax.loglog(x, [r["grad_s"] for r in mine], "o-", label=label)
        mem_ax.set(xlabel="horizon T [steps]", ylabel="peak memory (XLA) [MB]", title=f"{name}: gradient memory")
        time_ax.set(xlabel="horizon T [steps]", ylabel="seconds per gradient", title=f"{name}: gradient time")
        mem_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench_gradient.png", dpi=100)
    plt.close(fig)
    return rows


def _print_row(row: dict) -> None:
    print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def _rollout_loss(run, data):
    def loss(qvel, ctrl):
        final, traj = run(data.replace(qvel=qvel), ctrl)
        return jnp.sum(final.qpos**2) + jnp.mean(traj.qvel**2)

    return loss


def _time(fn, arg, work: int) -> tuple[float, float]:
    begin = time.perf_counter()
    jax.block_until_ready(fn(arg))
    compile_s = time.perf_counter() - begin
    begin = time.perf_counter()
    jax.block_until_ready(fn(arg))
    return compile_s, work / (time.perf_counter() - begin)


def _compile_seconds(fn, *args, repeats: int) -> float:
    """Seconds to trace, lower and compile `jax.jit(fn)` for args: the fastest of `repeats`, the
    later ones from cleared jit caches (the first in a process also pays one-time library setup,
    e.g. jaxlib loading LAPACK from scipy on its first factorization, 0.4 s on a 2-core machine)."""
    best = float("inf")
    for attempt in range(repeats):
        if attempt:
            jax.clear_caches()
        begin = time.perf_counter()
        jax.jit(fn).lower(*args).compile()
        best = min(best, time.perf_counter() - begin)
    return best


def _mjx_rollout(mj):
    """(rollout, initial data, model) of MJX: rollout(d, ctrl) -> (final, traj) through `mjx.step`;
    None without mujoco-mjx."""
    try:
        from mujoco import mjx
    except ImportError:
        print("mujoco-mjx is not installed: no MJX comparison")
        return None
    mx = mjx.put_model(mj)

    def run(d, ctrl):
        def body(d, u):
            d = mjx.step(mx, d.replace(ctrl=u.astype(d.ctrl.dtype)))
            return d, d

        return jax.lax.scan(body, d, ctrl)

    return run, mjx.make_data(mx), mx
