"""Convergence of the hard-contact NCP (``solver="ncp"``) over randomized batches of worlds.

The criterion under study: over >= 1000 worlds (drops, slides, stacks, the humanoid),
>= 99.9% of the steps converge within the static iteration budget (``iterations``,
30 by default), and the rest are flagged in Data (``solver_converged`` False, a SOLVER
warning), never NaN.

Scenes (each compiled once and vmapped over its worlds, in chunks of ``--chunk``):

  * ``drops``: a plane and 3 free bodies (box 0.1x0.07x0.05 half-sizes, sphere r 0.08,
    capsule r 0.04 half-length 0.12), x spread 0.5 m apart with +-0.2 m jitter (they can
    meet). Each body independently: high (0.05-1 m above the floor, random orientation,
    lin. vel. N(0, 1) m/s, ang. vel. N(0, 3) rad/s), overlapping the floor by 0-1 cm
    (random orientation, half those velocities), sliding (lying flat with a random yaw,
    0-2 mm into the floor, horizontal speed 0.5-3 m/s, ang. vel. N(0, 1)) or resting
    (exactly touching, velocities N(0, 0.05)). Per world: each body geom's sliding friction
    uniform in [0.05, 1.5] (the plane's is 0.05, MuJoCo takes the max of a pair, so a
    body-floor contact has the body's), timestep drawn from ``--dts`` (0.001 0.01 0.05).
  * ``stack``: 4 boxes (half-sizes 0.12/0.10/0.08/0.06 wide, 0.06 high) stacked on a
    plane, each with an xy offset N(0, 1 cm), yaw U(-0.2, 0.2) rad, tilt N(0, 0.01) rad,
    a vertical gap/overlap U(-1, 2) mm, velocities N(0, 0.05) m/s and N(0, 0.2) rad/s;
    per world one friction U(0.05, 1.5) for every geom and a timestep from ``--dts``.
  * ``humanoid``: the mjx test humanoid (``mujoco/mjx/test_data/humanoid/humanoid.xml``),
    ``integrator="implicitfast"``, dt = 0.01, from its "squat" keyframe (feet on the
    floor) with qvel N(0, 0.1) and controls uniform in [-1, 1] at every step.

Both ``drops`` and ``stack`` use ``integrator="euler"`` (``--integrator``). Friction and
timestep are per-world model leaves: the jitted function puts them into the model
with ``eqx.tree_at`` under ``vmap``, the same program as vmapping a stacked model.
Solver settings are the library's NCP defaults (``--iterations``, ``--kappa``,
``--ncp-passes`` override them).

Run from the repository root. On a 2-core CPU (float32) each scene compiles in ~50 s
and runs in ~2 min (drops), ~6 min (stack, 1000 worlds), ~1 min (humanoid, 64 worlds);
float64 is slower. Run the scenes one at a time to keep each call short:

    .venv/bin/python experiments/ncp_convergence.py                   # float32, all scenes
    .venv/bin/python experiments/ncp_convergence.py --scenes stack    # one scene
    .venv/bin/python experiments/ncp_convergence.py --scenes stack --x64 --worlds 0 500   # half of its worlds
    .venv/bin/python experiments/ncp_convergence.py --x64             # float64
    .venv/bin/python experiments/ncp_convergence.py --scenes humanoid --humanoid-batch 1000   # the full humanoid study
    .venv/bin/python experiments/ncp_convergence.py --scenes drops --batch 64 --steps 10   # a quick look

Printed table / CSV columns (one row per scene and dtype; a world-step is one world's
one step; the CSV, ``--csv``, default ``experiments/results/ncp_convergence.csv``, is
appended to, with a header when new):

  timestamp, device, dtype, scene, batch, steps, iterations (the static budget), dts
  worlds           the world ids run (``--worlds START STOP`` runs a slice of the batch; world i
                   is the same in every run with the same --seed and --batch)
  world_steps      batch * steps
  contact_steps    world-steps with at least one active unit (contact or limit) in the solve
  conv_pct         % of all world-steps with ``solver_converged`` (steps without contact count,
                   they converge at iteration 0)
  conv_pct_contact % of the contact world-steps with ``solver_converged``
  unconverged      number of world-steps not converged;  unconv_worlds: worlds with any
  niter_mean, niter_p50/p90/p99/p999/max   ``solver_niter`` over the contact world-steps
                   (the iterations of the pass that was kept, see forward._ncp_solve)
  niter_hist       counts of ``solver_niter`` over all world-steps in bins
                   0 | 1-5 | 6-10 | 11-15 | 16-20 | 21-25 | 26-(budget-1) | budget (the last bin also
                   holds steps that converged at the very last iteration)
  res_max_unconv   max ``solver_residual`` (scaled inf-norm) over unconverged world-steps
  res_p50_unconv   its median;  res_max_conv: the max over converged ones (<= tolerance)
  nonfinite_steps  world-steps with a non-finite qpos, qvel or solver_residual;
  nonfinite_worlds worlds with any
  diverged         worlds with ``diverged`` set at the end
  flag_mismatch    worlds whose SOLVER warning count differs from their unconverged steps
                   (0: every unconverged step is flagged in Data)
  unconv_by_dt     per timestep: unconverged world-steps / world-steps at that timestep
  compile_s, run_s wall times (compile of the chunked program; all chunks)

For each scene with an unconverged step, the 10 worst unconverged world-steps are printed
and the worst one (largest residual; a non-finite one first) is saved (``--save-dir``,
default /tmp): ``ncp_convergence_<scene>_<dtype>.npz`` with its world's initial qpos,
qvel, geom_friction, timestep and controls, the failing step index ``step``, the state
(``qpos_step``, ``qvel_step``) and ``ctrl_step`` entering that step (so the step can be
reproduced alone: put geom_friction/timestep into the scene's model with ``eqx.tree_at``,
then ``jsn.step``), the world's per-step niter/residual/converged and ``failing`` (all
unconverged world-steps of the scene, (world, step) rows).

A failing step re-run alone often converges (batched float32 programs round differently:
the failures are chaotic). ``--capture N`` saves instead the solver's own input: the
``ncp.Problem`` of every solve inside the batched run that did not converge or took at
least N iterations (``ncp_problems_<scene>_<dtype>.npz`` in ``--save-dir``, the fields
stacked, plus kappa and tolerance), to re-solve with a modified solver in seconds
(``ncp._iterate(ncp._mehrotra_step, ncp.initial_point(p), p, kappa, tol, 30, True)``
under ``vmap``). This is how the predictor's spurious fixed point was found.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import pathlib
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fuzz import _height_above_lowest_point  # noqa: E402

import jaxsim_ncp as jsn  # noqa: E402
from jaxsim_ncp.types import WarningKind  # noqa: E402

SCENES = ("drops", "stack", "humanoid")
CSV_FIELDS = (
    "timestamp", "device", "dtype", "scene", "batch", "worlds", "steps", "iterations", "dts", "world_steps", "contact_steps",
    "conv_pct", "conv_pct_contact", "unconverged", "unconv_worlds", "niter_mean", "niter_p50", "niter_p90",
    "niter_p99", "niter_p999", "niter_max", "niter_hist", "res_max_unconv", "res_p50_unconv", "res_max_conv",
    "nonfinite_steps", "nonfinite_worlds", "diverged", "flag_mismatch", "unconv_by_dt", "compile_s", "run_s",
)  # fmt: skip

# ---------------------------------------------------------------------- scenes

DROP_BODIES = (("box", (0.1, 0.07, 0.05)), ("sphere", (0.08,)), ("capsule", (0.04, 0.12)))
STACK_HALF = ((0.12, 0.12, 0.06), (0.10, 0.10, 0.06), (0.08, 0.08, 0.06), (0.06, 0.06, 0.06))
_FLAT_CAPSULE = np.array([np.cos(np.pi / 4), np.sin(np.pi / 4), 0.0, 0.0])  # axis along y: lying on its side


def _fmt(v) -> str:
    return " ".join(f"{x:.17g}" for x in v)


def drops_xml() -> str:
    bodies = "".join(
        f'<body name="b{i}" pos="{0.5 * (i - 1)} 0 1"><freejoint/><geom name="g{i}" type="{kind}" size="{_fmt(size)}"/></body>'
        for i, (kind, size) in enumerate(DROP_BODIES)
    )
    return (
        '<mujoco><worldbody><geom name="floor" type="plane" size="5 5 0.1" friction="0.05"/>'
        f"{bodies}</worldbody></mujoco>"
    )


def stack_xml() -> str:
    bodies, z = [], 0.0
    for i, half in enumerate(STACK_HALF):
        z += half[2]
        bodies.append(f'<body name="b{i}" pos="0 0 {z}"><freejoint/><geom name="g{i}" type="box" size="{_fmt(half)}"/></body>')
        z += half[2]
    return f'<mujoco><worldbody><geom name="floor" type="plane" size="5 5 0.1"/>{"".join(bodies)}</worldbody></mujoco>'


def humanoid_path() -> pathlib.Path:
    return pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data" / "humanoid" / "humanoid.xml"


def _quat_mul(a, b):
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([
        w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
        w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
    ])  # fmt: skip


def _axis_angle(axis, angle):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.r_[np.cos(angle / 2), np.sin(angle / 2) * axis]


def _random_quat(rng):
    q = rng.normal(size=4)
    return q / np.linalg.norm(q)


def drops_inputs(rng, m: mujoco.MjModel, batch: int, dts):
    """(qpos, qvel, geom_friction, timestep) per world for the drops/slides scene."""
    qpos, qvel, fric = [], [], []
    for _ in range(batch):
        q, v = [], []
        for i, (kind, size) in enumerate(DROP_BODIES):
            mode = rng.choice(["high", "overlap", "slide", "rest"], p=[0.3, 0.25, 0.3, 0.15])
            if mode in ("slide", "rest") and rng.uniform() < 0.8 or mode == "slide":
                quat = _quat_mul(_axis_angle([0, 0, 1], rng.uniform(0, 2 * np.pi)), _FLAT_CAPSULE if kind == "capsule" else np.eye(4)[0])
            else:
                quat = _random_quat(rng)
            touch = _height_above_lowest_point(kind, size, quat)
            xy = [0.5 * (i - 1) + rng.uniform(-0.2, 0.2), rng.uniform(-0.2, 0.2)]
            if mode == "high":
                z, lin, ang = touch + rng.uniform(0.05, 1.0), rng.normal(scale=1.0, size=3), rng.normal(scale=3.0, size=3)
            elif mode == "overlap":
                z, lin, ang = touch - rng.uniform(0.0, 0.01), rng.normal(scale=0.5, size=3), rng.normal(scale=1.5, size=3)
            elif mode == "slide":
                phi, speed = rng.uniform(0, 2 * np.pi), rng.uniform(0.5, 3.0)
                z, lin, ang = touch - rng.uniform(0.0, 0.002), speed * np.array([np.cos(phi), np.sin(phi), 0.0]), rng.normal(scale=1.0, size=3)
            else:
                z, lin, ang = touch, rng.normal(scale=0.05, size=3), rng.normal(scale=0.05, size=3)
            q.append(np.r_[xy, z, quat])
            v.append(np.r_[lin, ang])
        qpos.append(np.concatenate(q))
        qvel.append(np.concatenate(v))
        f = np.array(m.geom_friction)
        f[1:, 0] = rng.uniform(0.05, 1.5, size=m.ngeom - 1)
        fric.append(f)
    return np.stack(qpos), np.stack(qvel), np.stack(fric), rng.choice(dts, size=batch)


def stack_inputs(rng, m: mujoco.MjModel, batch: int, dts):
    """(qpos, qvel, geom_friction, timestep) per world for the box stack."""
    qpos, qvel, fric = [], [], []
    for _ in range(batch):
        q, v, z = [], [], 0.0
        for half in STACK_HALF:
            quat = _quat_mul(_axis_angle([0, 0, 1], rng.uniform(-0.2, 0.2)), _axis_angle(np.r_[rng.normal(size=2), 0], abs(rng.normal(scale=0.01))))
            z += half[2]
            q.append(np.r_[rng.normal(scale=0.01, size=2), z + rng.uniform(-0.001, 0.002), quat])
            z += half[2]
            v.append(np.r_[rng.normal(scale=0.05, size=3), rng.normal(scale=0.2, size=3)])
        qpos.append(np.concatenate(q))
        qvel.append(np.concatenate(v))
        f = np.array(m.geom_friction)
        f[:, 0] = rng.uniform(0.05, 1.5)
        fric.append(f)
    return np.stack(qpos), np.stack(qvel), np.stack(fric), rng.choice(dts, size=batch)


def build(scene: str, args, rng):
    """(model, qpos, qvel, geom_friction, timestep, ctrl (B, T, nu)) as numpy float64 inputs."""
    overrides = dict(solver="ncp", iterations=args.iterations, kappa=args.kappa, ncp_passes=args.ncp_passes, **json.loads(args.options))
    b = args.batch if scene != "humanoid" else (args.humanoid_batch or args.batch)
    if scene == "humanoid":
        m = mujoco.MjModel.from_xml_path(str(humanoid_path()))
        model = jsn.from_mujoco(m, integrator="implicitfast", timestep=0.01, **overrides)
        key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "squat")
        qpos = np.broadcast_to(m.key_qpos[key], (b, m.nq)).copy()
        qvel = rng.normal(scale=0.1, size=(b, m.nv))
        fric = np.broadcast_to(m.geom_friction, (b, m.ngeom, 3)).copy()
        dt = np.full(b, 0.01)
        ctrl = rng.uniform(-1.0, 1.0, size=(b, args.steps, m.nu))
        return model, qpos, qvel, fric, dt, ctrl
    m = mujoco.MjModel.from_xml_string(drops_xml() if scene == "drops" else stack_xml())
    model = jsn.from_mujoco(m, integrator=args.integrator, **overrides)
    make = drops_inputs if scene == "drops" else stack_inputs
    qpos, qvel, fric, dt = make(rng, m, b, args.dts)
    return model, qpos, qvel, fric, dt, np.zeros((b, args.steps, m.nu))


# ---------------------------------------------------------------------- the rollout


def world(model: jsn.Model, qpos, qvel, friction, timestep, ctrl):
    """One world's rollout; per step: (converged, niter, residual, any active unit, finite), final diverged/warnings."""
    model = eqx.tree_at(lambda m: (m.geom_friction, m.opt.timestep), model, (friction, timestep))
    data = jsn.make_data(model).replace(qpos=qpos, qvel=qvel)
    ne = model.constraints.ne

    def body(d, u):
        d = jsn.step(model, d.replace(ctrl=u))
        active = jnp.any(d.efc_mask[ne:]) if d.efc_mask.shape[0] > ne else jnp.zeros((), bool)
        finite = jnp.all(jnp.isfinite(d.qpos)) & jnp.all(jnp.isfinite(d.qvel)) & jnp.isfinite(d.solver_residual)
        return d, (d.solver_converged, d.solver_niter, d.solver_residual, active, finite, d.qpos, d.qvel)

    final, out = jax.lax.scan(body, data, ctrl)
    return out, final.diverged, final.warning


_batched = jax.vmap(world, in_axes=(None, 0, 0, 0, 0, 0))


def capture_problems(min_iterations: int) -> list:
    """Wrap ncp.solve (before tracing) to keep every solve's Problem that did not converge or took
    at least min_iterations; returns the list it fills (dicts of numpy arrays, kappa, tolerance)."""
    from jaxsim_ncp.solver import ncp

    kept, solve = [], ncp.solve

    def keep(problem, converged, skip, niter, kappa, tolerance):
        if not bool(skip) and (not bool(converged) or int(niter) >= min_iterations):
            kept.append(({k: np.asarray(v) for k, v in problem._asdict().items()}, float(kappa), float(tolerance)))

    def solve_and_keep(p, kappa, kappa_grad, tolerance, iterations, early_exit=True, skip=False):
        sol = solve(p, kappa, kappa_grad, tolerance, iterations, early_exit, skip)
        jax.debug.callback(keep, p, sol.converged, jnp.asarray(skip), sol.iterations, kappa, tolerance)
        return sol

    ncp.solve = solve_and_keep
    return kept


def save_problems(kept: list, path: pathlib.Path) -> None:
    fields = {k: np.stack([p[k] for p, _, _ in kept]) for k in kept[0][0]}
    np.savez_compressed(path, **fields, kappa=kept[0][1], tolerance=kept[0][2])


def run_scene(scene: str, args, rng):
    model, *inputs = build(scene, args, rng)
    start, stop = args.worlds if args.worlds else (0, inputs[0].shape[0])
    index = np.arange(inputs[0].shape[0])[start:stop]  # the worlds' ids in the full batch
    qpos, qvel, fric, dt, ctrl = (x[index] for x in inputs)
    b = qpos.shape[0]
    chunk = min(args.chunk or b, b)
    n_chunks = -(-b // chunk)
    pad = n_chunks * chunk - b
    dtype = model.dtype
    inputs = [np.concatenate([x, np.repeat(x[:1], pad, axis=0)]) if pad else x for x in (qpos, qvel, fric, dt, ctrl)]
    inputs = [jnp.asarray(x, dtype) for x in inputs]
    t0 = time.perf_counter()
    fn = jax.jit(_batched).lower(model, *[x[:chunk] for x in inputs]).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    parts = []
    for c in range(n_chunks):
        sl = slice(c * chunk, (c + 1) * chunk)
        parts.append(jax.tree.map(np.asarray, fn(model, *[x[sl] for x in inputs])))
        print(f"  {scene}: chunk {c + 1}/{n_chunks} done, {time.perf_counter() - t0:.0f} s", flush=True)
    run_s = time.perf_counter() - t0
    (conv, niter, res, active, finite, traj_q, traj_v), diverged, warning = jax.tree.map(
        lambda *xs: np.concatenate(xs)[:b], *parts
    )
    return dict(
        model=model, index=index, qpos=qpos, qvel=qvel, fric=fric, dt=dt, ctrl=ctrl, conv=conv, niter=niter, res=res,
        active=active, finite=finite, traj_q=traj_q, traj_v=traj_v, diverged=diverged, warning=warning,
        compile_s=compile_s, run_s=run_s,
    )  # fmt: skip


# ---------------------------------------------------------------------- statistics


def summarize(scene: str, r: dict, args) -> dict:
    conv, niter, res, active, finite = r["conv"], r["niter"], r["res"], r["active"], r["finite"]
    budget = r["model"].opt.iterations
    b, t = conv.shape
    edges = [0, 1, 6, 11, 16, 21, 26, budget, budget + 1]
    hist = np.histogram(np.minimum(niter, budget), bins=edges)[0]
    labels = ["0", "1-5", "6-10", "11-15", "16-20", "21-25", f"26-{budget - 1}", f"{budget}"]
    n_contact = niter[active]
    pct = lambda q: float(np.percentile(n_contact, q)) if n_contact.size else 0.0  # noqa: E731
    unconv = ~conv
    res_u = res[unconv]
    res_c = res[conv & np.isfinite(res)]
    solver_warn = r["warning"][:, WarningKind.SOLVER]
    mismatch = (solver_warn != unconv.sum(axis=1)) & ~r["diverged"]
    return dict(
        timestamp=datetime.datetime.now().isoformat(timespec="seconds"),
        device=str(jax.devices()[0].device_kind),
        dtype=str(np.dtype(r["model"].dtype)),
        scene=scene,
        batch=b,
        worlds=f"{r['index'][0]}-{r['index'][-1]}",
        steps=t,
        iterations=budget,
        dts=" ".join(f"{x:g}" for x in sorted(set(np.asarray(r["dt"]).tolist()))),
        world_steps=b * t,
        contact_steps=int(active.sum()),
        conv_pct=100.0 * conv.mean(),
        conv_pct_contact=100.0 * conv[active].mean() if active.any() else 100.0,
        unconverged=int(unconv.sum()),
        unconv_worlds=int(unconv.any(axis=1).sum()),
        niter_mean=float(n_contact.mean()) if n_contact.size else 0.0,
        niter_p50=pct(50),
        niter_p90=pct(90),
        niter_p99=pct(99),
        niter_p999=pct(99.9),
        niter_max=int(niter.max()),
        niter_hist=" ".join(f"{lab}:{n}" for lab, n in zip(labels, hist)),
        res_max_unconv=float(np.nanmax(res_u)) if res_u.size else 0.0,
        res_p50_unconv=float(np.nanmedian(res_u)) if res_u.size else 0.0,
        res_max_conv=float(res_c.max()) if res_c.size else 0.0,
        nonfinite_steps=int((~finite).sum()),
        nonfinite_worlds=int((~finite).any(axis=1).sum()),
        diverged=int(r["diverged"].sum()),
        flag_mismatch=int(mismatch.sum()),
        unconv_by_dt=" ".join(
            f"{x:g}:{int(unconv[r['dt'] == x].sum())}/{int((r['dt'] == x).sum()) * t}" for x in sorted(set(np.asarray(r["dt"]).tolist()))
        ),
        compile_s=r["compile_s"],
        run_s=r["run_s"],
    )


def save_failure(scene: str, r: dict, row: dict, save_dir: pathlib.Path) -> str | None:
    """The failing world-step with the largest residual (a non-finite one first): its world's initial state,
    params and controls, the step index and the state entering it; plus the list of all failing world-steps."""
    bad = ~r["conv"] | ~r["finite"]
    if not bad.any():
        return None
    score = np.where(bad, np.where(r["finite"], np.nan_to_num(r["res"], nan=np.inf), np.inf), -1.0)
    w, step = (int(i) for i in np.unravel_index(np.argmax(score), score.shape))
    q_in = r["qpos"][w] if step == 0 else r["traj_q"][w, step - 1]
    v_in = r["qvel"][w] if step == 0 else r["traj_v"][w, step - 1]
    path = save_dir / f"ncp_convergence_{scene}_{row['dtype']}.npz"
    np.savez(
        path, scene=scene, world=r["index"][w], step=step, qpos0=r["qpos"][w], qvel0=r["qvel"][w], geom_friction=r["fric"][w],
        timestep=r["dt"][w], ctrl=r["ctrl"][w], qpos_step=q_in, qvel_step=v_in, ctrl_step=r["ctrl"][w, step],
        niter=r["niter"][w], residual=r["res"][w], converged=r["conv"][w], iterations=row["iterations"],
        integrator=r["model"].opt.integrator, dtype=row["dtype"], failing=np.argwhere(bad),
    )  # fmt: skip
    return f"{path} (world {r['index'][w]}, step {step}, niter {r['niter'][w, step]}, residual {r['res'][w, step]:.3g})"


def print_failures(scene: str, r: dict, worst: int = 10) -> None:
    """The unconverged world-steps with the largest residuals: world, step, timestep, body frictions, niter, residual."""
    bad = ~r["conv"]
    if not bad.any():
        return
    w, t = np.nonzero(bad)
    order = np.argsort(-np.nan_to_num(r["res"][w, t], nan=np.inf))[:worst]
    print(f"  {scene}: unconverged by timestep {summary_by_dt(r)}; worst residuals:")
    for i in order:
        mu = np.unique(np.round(r["fric"][w[i]][:, 0], 3))
        print(f"    world {r['index'][w[i]]:4d} step {t[i]:2d} dt {r['dt'][w[i]]:g} mu {mu} niter {r['niter'][w[i], t[i]]} "
              f"residual {r['res'][w[i], t[i]]:.3g}; that world: {int(bad[w[i]].sum())} unconverged steps")  # fmt: skip


def summary_by_dt(r: dict) -> str:
    dts = sorted(set(np.asarray(r["dt"]).tolist()))
    return ", ".join(f"dt {x:g}: {int((~r['conv'])[r['dt'] == x].sum())}" for x in dts)


def print_table(rows: list[dict]) -> None:
    cols = (
        ("scene", "{}"), ("dtype", "{}"), ("batch", "{}"), ("world_steps", "{}"), ("contact_steps", "{}"),
        ("conv_pct", "{:.3f}"), ("conv_pct_contact", "{:.3f}"), ("unconverged", "{}"), ("unconv_worlds", "{}"),
        ("niter_mean", "{:.1f}"), ("niter_p50", "{:.0f}"), ("niter_p90", "{:.0f}"), ("niter_p99", "{:.0f}"),
        ("niter_p999", "{:.0f}"), ("niter_max", "{}"), ("res_max_unconv", "{:.2e}"), ("res_max_conv", "{:.2e}"),
        ("nonfinite_worlds", "{}"), ("diverged", "{}"), ("flag_mismatch", "{}"), ("compile_s", "{:.0f}"), ("run_s", "{:.0f}"),
    )  # fmt: skip
    cells = [[c for c, _ in cols]] + [[f.format(row[c]) for c, f in cols] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    for i, r in enumerate(cells):
        print("  ".join(x.rjust(wd) for x, wd in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * wd for wd in widths))
    for row in rows:
        print(f"{row['scene']} {row['dtype']} niter histogram (all world-steps): {row['niter_hist']}")


def append_csv(path: pathlib.Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items() if k in CSV_FIELDS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", nargs="+", choices=SCENES, default=list(SCENES))
    parser.add_argument("--batch", type=int, default=1000, help="worlds per scene (drops, stack)")
    parser.add_argument("--humanoid-batch", type=int, default=64, help="worlds for the humanoid (1000 for the full study)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=250, help="worlds per compiled call (0: the whole batch at once)")
    parser.add_argument("--dts", type=float, nargs="+", default=[0.001, 0.01, 0.05], help="timesteps drawn per world (drops, stack)")
    parser.add_argument("--integrator", choices=("euler", "implicitfast"), default="euler", help="drops and stack")
    parser.add_argument("--iterations", type=int, default=None, help="NCP iteration budget (default: the library's, 30)")
    parser.add_argument("--kappa", type=float, default=1e-8)
    parser.add_argument("--ncp-passes", type=int, default=4)
    parser.add_argument("--options", default="{}", help="JSON overrides for from_mujoco, e.g. '{\"ncp_nonlinear_gap\": false}'")
    parser.add_argument("--worlds", type=int, nargs=2, metavar=("START", "STOP"), default=None,
                        help="run only worlds START..STOP-1 of the batch (the same worlds as in the full run: split a slow run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--x64", action="store_true", help="float64 (default float32)")
    parser.add_argument("--csv", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results" / "ncp_convergence.csv")
    parser.add_argument("--save-dir", type=pathlib.Path, default=pathlib.Path("/tmp"))
    parser.add_argument("--capture", type=int, default=None, metavar="N",
                        help="save the NCP Problem of every solve that fails or takes >= N iterations (slower)")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", args.x64)
    kept = capture_problems(args.capture) if args.capture is not None else None
    rows = []
    for k, scene in enumerate(args.scenes):
        rng = np.random.default_rng([args.seed, SCENES.index(scene)])
        print(f"== {scene} ({'float64' if args.x64 else 'float32'})", flush=True)
        r = run_scene(scene, args, rng)
        row = summarize(scene, r, args)
        rows.append(row)
        print_failures(scene, r)
        saved = save_failure(scene, r, row, args.save_dir)
        if kept:
            path = args.save_dir / f"ncp_problems_{scene}_{row['dtype']}.npz"
            save_problems(kept, path)
            print(f"  {scene}: {len(kept)} solves' Problems saved to {path}", flush=True)
            kept.clear()
        print(f"  {scene}: conv {row['conv_pct']:.3f}% ({row['unconverged']} unconverged), compile {row['compile_s']:.0f} s, "
              f"run {row['run_s']:.0f} s" + (f"; worst failing world saved: {saved}" if saved else ""), flush=True)  # fmt: skip
    print()
    print_table(rows)
    append_csv(args.csv, rows)
    print(f"\nappended {len(rows)} rows to {args.csv}")


if __name__ == "__main__":
    main()
