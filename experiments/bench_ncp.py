"""Hard-contact benchmark: the interior-point NCP (``solver="ncp"``) side by side with Newton.

Everything runs in this one process, both solvers from identical inputs, one after the
other. Two parts, selectable with ``--parts``:

``step`` / ``grad`` (part 1): NCP vs Newton at equal batch B (``--batch``, default 1 64;
``--full``: 1 64 1024) on two models, both solvers with ``integrator="implicitfast"``
(the humanoid's MJCF disables eulerdamp, which makes explicit Euler unstable at large
steps) and the model's timestep (``--dt`` overrides it):

  * ``pile``: ``--pile NX NY NZ`` (default 2 2 2 = 8) free cubes, half-size 0.05 m,
    ``--drop`` (2 mm) above the plane and above each other, 2 mm apart sideways, dt=0.005:
    they fall and land within the horizon; all box-box and box-plane pairs collide;
  * ``humanoid``: the mjx package's test humanoid (``mujoco/mjx/test_data/humanoid/
    humanoid.xml``; nq=28, nv=27, nu=21, dt=0.005) from its "squat" keyframe (feet on
    the floor).

  Every world starts from the model's start state plus a random qvel perturbation
  (sigma 0.05 pile, 0.1 humanoid) and gets random controls uniform in the control range
  (the pile has none); inputs are identical for both solvers. Solver settings: NCP at
  the library defaults (``iterations=30``, kappa=1e-8, kappa_grad=1e-4, ncp_passes=4;
  ``--ncp-iterations``, ``--kappa``, ``--kappa-grad``, ``--ncp-passes``; ``--max-geom-pairs N``: a
  contact capacity for both solvers, with which the NCP solves only that many pairs' units), Newton at
  ``--newton-iterations`` (10) / ``--newton-ls-iterations`` (20), where both models reach
  the float32 floor of the Newton residual (see bench_grad.py); the humanoid's own
  iterations=1 would not be converged. Both solvers stop once every world of the batch
  has converged (a converged world is frozen; the NCP's ``ncp_early_exit``, Newton's
  implicit mode), so a batch costs what its slowest world needs.

  * step: ``jax.jit(jax.vmap(rollout))`` over T = ``--steps`` (10) steps, returning the
    final state and the per-step solver status only;
  * grad: ``jax.jit(jax.vmap(jax.value_and_grad(L)))`` with L = sum(qpos_T^2) +
    sum(qvel_T^2) of the final state, w.r.t. the initial qvel, through the rollout.

  Reported per (model, B, part, solver): ``compile s`` (wall time of
  ``jit(f).lower(...).compile()``), ``ms/step`` (median call time / T: the wall time of
  one batched step of all B worlds; for grad, of one step forward + backward), ``us/world-step``
  (median call time / (B T)). Then the ratios NCP/Newton of ms/step and of compile time
  (>1: NCP slower), grad/step per solver, and the solver status over all B*T steps:
  mean/max ``solver_niter``, the fraction of steps with ``solver_converged``, the max
  ``solver_residual`` and the count of non-finite outputs / diverged worlds. The timed
  calls are ``--repeats`` (3) after one warm-up call, fewer when they would not fit
  in ``--budget`` seconds (compile excluded); when none fits the warm-up call is the
  measurement (marked ``*``). A batch whose estimated call time (linear in B from the
  previous batch) exceeds the budget is skipped.

``table5`` (part 2): Dojo's Table V task (Howell et al., "Dojo: A Differentiable
Physics Engine for Robotics", the "MuJoCo C FD" baseline): the humanoid, N =
``--table5-steps`` (100; ``--full``: 1000) steps at dt = ``--table5-dt`` (0.01) with
random actions uniform in the control range, from the "squat" keyframe:

  * ours: ``jax.jit(jax.value_and_grad(L))`` w.r.t. the whole control sequence (N, nu),
    reverse mode through ``rollout`` with ``solver="ncp"`` (``--table5-solvers ncp
    newton`` adds ours with Newton), one world, L as above. ``fwd+grad s`` is the
    median call time (one call = the forward rollout and its whole gradient),
    compile reported separately;
  * MuJoCo C FD: the same model in MuJoCo's C engine (float64, integrator implicitfast,
    dt as above, solver settings ``--mj-iterations`` (100) / ``--mj-ls-iterations`` (50),
    MuJoCo's defaults: MuJoCo stops early at its tolerance), same controls; per step
    ``mujoco.mjd_transitionFD(m, d, eps, centered, A, B, None, None)`` (forward
    differences by default, ``--fd-centered``; eps ``--fd-eps`` 1e-6) then ``mj_step``.
    ``fwd+grad s`` = that loop (best of ``--repeats``) plus the backward chain that turns
    the per-step Jacobians into dL/dctrl (lambda_t = A_t^T lambda_t+1, g_t = B_t^T
    lambda_t+1; its own time is printed, it is small). ``mj_step only`` is the plain
    simulation for reference.

  Printed: both wall times and their ratio ours / MuJoCo-C-FD (>1: ours slower), plus
  the NCP status over the N steps. The two gradients are not compared: MuJoCo's soft
  contacts and the hard NCP contacts simulate different trajectories.

Every measurement is appended as a row to ``--csv`` (default
``experiments/results/bench_ncp.csv``, created with a header if missing; columns
described by ``CSV_FIELDS``), tagged with a timestamp, the device and the dtype.

Run from the repository root:

    .venv/bin/python experiments/bench_ncp.py                                # all parts, B=1 64, T=10, N=100
    .venv/bin/python experiments/bench_ncp.py --parts step --models pile --batch 1 --steps 5
    .venv/bin/python experiments/bench_ncp.py --parts table5 --table5-steps 20
    .venv/bin/python experiments/bench_ncp.py --full                         # GPU: B=1 64 1024, N=1000
    .venv/bin/python experiments/bench_ncp.py --full --pile 4 4 4 --x64      # 64 boxes, float64

On a 2-core CPU compilation dominates: an NCP forward rollout compiles in ~1 min, its
gradient in ~2-4 min (Newton about half of each), once per (model, part, B), so the
default invocation takes ~30-40 min there (most of it compiling); the second command
above takes ~2 min.
Timings are wall times on whatever else the machine runs: noisy.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import pathlib
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contact import package_version, _fmt, _peak_rss_gb, humanoid_path, pile_xml  # noqa: E402

MODELS = ("pile", "humanoid")
PARTS = ("step", "grad", "table5")
SOLVERS = ("newton", "ncp")
CSV_FIELDS = (
    "timestamp", "device", "dtype", "part", "model", "solver", "batch", "steps", "dt", "iterations",
    "compile_s", "call_s", "n_timed", "ms_per_step", "us_per_world_step",
    "niter_mean", "niter_max", "converged_frac", "residual_max", "nonfinite", "diverged", "rss_gb", "status",
)  # fmt: skip
DEFAULT_CSV = pathlib.Path(__file__).resolve().parent / "results" / "bench_ncp.csv"


# ---------------------------------------------------------------------------------- models


def mj_model(args, name: str):
    """(MjModel, start qpos, qvel perturbation sigma) of a benchmark model."""
    import mujoco

    if name == "humanoid":
        m = mujoco.MjModel.from_xml_path(str(humanoid_path()))
        key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "squat")
        return m, np.array(m.key_qpos[key]), 0.1
    if name == "pile":
        # bench_contact's pile with layers `drop` apart (negative overlap); its MJCF solver options are
        # overridden here (solver_overrides), the NCP always uses its exact cones
        m = mujoco.MjModel.from_xml_string(pile_xml(*args.pile, sink=-args.drop))
        return m, np.array(m.qpos0), 0.05
    raise ValueError(f"unknown model {name!r}")


def solver_overrides(args, solver: str) -> dict[str, Any]:
    if solver == "ncp":
        kw: dict[str, Any] = dict(kappa=args.kappa, kappa_grad=args.kappa_grad, ncp_passes=args.ncp_passes)
        if args.ncp_iterations is not None:
            kw["iterations"] = args.ncp_iterations
        return kw
    return dict(iterations=args.newton_iterations, ls_iterations=args.newton_ls_iterations)


def our_model(m, solver: str, args, timestep: float | None):
    import jaxsim_ncp as jsn

    return jsn.from_mujoco(m, solver=solver, integrator="implicitfast", timestep=timestep,
                           max_geom_pairs=getattr(args, "max_geom_pairs", None), **solver_overrides(args, solver))


def random_inputs(m, qpos0: np.ndarray, sigma: float, batch: int, steps: int, seed: int):
    """qpos (B, nq), qvel (B, nv), ctrl (B, T, nu), float64, uniform in the control range."""
    rng = np.random.default_rng(seed)
    qvel = sigma * rng.standard_normal((batch, m.nv))
    lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
    ctrl = lo + (hi - lo) * rng.uniform(0.0, 1.0, (batch, steps, m.nu))
    return np.broadcast_to(qpos0, (batch, m.nq)).copy(), qvel, ctrl


# ---------------------------------------------------------------------------------- timing


@dataclass
class Result:
    status: str = "not run"
    compile_s: float = float("nan")
    call_s: float = float("nan")
    n_timed: int = 0
    out: Any = None
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status.startswith("ok")


def time_compiled(fn: Callable, fargs: tuple, repeats: int, budget: float) -> Result:
    """Compile fn(*fargs), one warm-up call, then up to `repeats` timed calls within `budget` seconds."""
    import jax

    res = Result()
    try:
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*fargs).compile()
        res.compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*fargs))
        first = time.perf_counter() - t0
        n = int(min(repeats, max(0, (budget - first) // max(first, 1e-9))))
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(*fargs))
            times.append(time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - e.g. XLA RESOURCE_EXHAUSTED at a large batch
        res.status = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        return res
    res.status, res.n_timed = "ok", len(times)
    res.call_s = statistics.median(times) if times else first
    res.out = jax.tree.map(np.asarray, out)
    return res


def solver_stats(niter, converged, residual) -> dict[str, float]:
    niter, converged, residual = (np.asarray(x) for x in (niter, converged, residual))
    return dict(niter_mean=float(np.mean(niter)), niter_max=float(np.max(niter)),
                converged_frac=float(np.mean(converged)), residual_max=float(np.nanmax(residual)))  # fmt: skip


def _nonfinite(*arrays) -> int:
    return int(sum(np.sum(~np.isfinite(np.asarray(a, np.float64))) for a in arrays))


# ---------------------------------------------------------------------------------- output


class Recorder:
    """Appends CSV rows (header when the file is new)."""

    def __init__(self, path: str, device: str, dtype: str):
        self.path, self.device, self.dtype = pathlib.Path(path), device, dtype
        self.stamp = datetime.datetime.now().isoformat(timespec="seconds")

    def row(self, **values) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        values = dict(timestamp=self.stamp, device=self.device, dtype=self.dtype, rss_gb=round(_peak_rss_gb(), 3), **values)
        with open(self.path, "a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in values.items()})


def _ms(r: Result, steps: int) -> str:
    if not r.ok:
        return r.status.split(":")[0][:10]
    return f"{1e3 * r.call_s / steps:.3f}" + ("*" if r.n_timed == 0 else "")


def _ratio(a: Result, b: Result, attr: str) -> float:
    if not (a.ok and b.ok):
        return float("nan")
    return getattr(a, attr) / getattr(b, attr)


# ---------------------------------------------------------------------------------- part 1


def build_part1(args, name: str, solver: str, part: str, batch: int):
    """(function, arguments) of one part-1 configuration, vmapped over `batch` worlds."""
    import jax
    import jax.numpy as jnp

    import jaxsim_ncp as jsn

    m, qpos0, sigma = mj_model(args, name)
    model = our_model(m, solver, args, args.dt)
    qpos, qvel, ctrl = random_inputs(m, qpos0, sigma, batch, args.steps, args.seed)
    data0 = jsn.make_data(model)
    dt = data0.qpos.dtype
    data = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), data0)
    data = data.replace(qpos=jnp.asarray(qpos, dt))
    qvel, ctrl = jnp.asarray(qvel, dt), jnp.asarray(ctrl, dt)

    def run(data, qvel0, ctrl):
        final, traj = jsn.rollout(model, data.replace(qvel=qvel0), ctrl)
        loss = jnp.sum(final.qpos**2) + jnp.sum(final.qvel**2)
        status = (traj.solver_niter, traj.solver_converged, traj.solver_residual, final.diverged | jnp.any(traj.contact.overflow))
        return loss, (final.qpos, final.qvel, status)

    if part == "step":
        f = lambda data, qvel0, ctrl: run(data, qvel0, ctrl)[1]  # noqa: E731
    else:
        f = jax.value_and_grad(run, argnums=1, has_aux=True)
    return jax.vmap(f), (data, qvel, ctrl), model


def part1(args, name: str, rec: Recorder) -> list[str]:
    import jax

    m, *_ = mj_model(args, name)
    dt = args.dt if args.dt is not None else float(m.opt.timestep)
    lines = []
    print(f"\n== part 1, {name}: nq={m.nq} nv={m.nv} nu={m.nu} ngeom={m.ngeom} dt={dt:g} T={args.steps} "
          f"implicitfast", flush=True)
    iters = {}
    for solver in SOLVERS:
        model = our_model(m, solver, args, args.dt)
        layout, iters[solver] = model.constraints, model.opt.iterations
        s = solver_overrides(args, solver)
        print(f"   {solver:>6}: ncon slots={layout.ncon} nefc={layout.nefc} "
              + " ".join(f"{k}={v}" for k, v in s.items()), flush=True)
    for part in ("step", "grad"):
        if part not in args.parts:
            continue
        prev: dict[str, tuple[int, Result]] = {}
        for batch in args.batch:
            res: dict[str, Result] = {}
            for solver in SOLVERS:
                last = prev.get(solver)
                if last is not None and not last[1].ok:
                    r = Result(status=f"skipped (B={last[0]} {last[1].status.split(':')[0]})")
                elif last is not None and last[1].call_s * batch / last[0] > args.budget:
                    r = Result(status=f"skipped: est. {last[1].call_s * batch / last[0]:.0f}s/call > budget")
                else:
                    f, fargs, _ = build_part1(args, name, solver, part, batch)
                    r = time_compiled(f, fargs, args.repeats, args.budget)
                    prev[solver] = (batch, r)
                if r.ok:
                    if part == "step":
                        qpos, qvel, (niter, conv, resid, div) = r.out
                        grads = ()
                    else:
                        (loss, (qpos, qvel, (niter, conv, resid, div))), g = r.out
                        grads = (loss, g)
                    r.stats = solver_stats(niter, conv, resid)
                    r.stats.update(nonfinite=_nonfinite(qpos, qvel, *grads), diverged=int(np.sum(div)))
                    if args.max_geom_pairs is not None:  # `diverged` then also counts worlds whose contacts overflowed
                        r.status += f" (max_geom_pairs={args.max_geom_pairs}; diverged counts contact overflow too)"
                res[solver] = r
                rec.row(part=part, model=name, solver=solver, batch=batch, steps=args.steps, dt=dt, iterations=iters[solver],
                        compile_s=r.compile_s, call_s=r.call_s, n_timed=r.n_timed,
                        ms_per_step=1e3 * r.call_s / args.steps, us_per_world_step=1e6 * r.call_s / (batch * args.steps),
                        status=r.status, **r.stats)  # fmt: skip
                st = r.stats
                print(f"   {part:<4} B={batch:<5} {solver:>6} {r.status:<10} compile {_fmt(r.compile_s, '6.1f')}s  "
                      f"{_ms(r, args.steps):>9} ms/step  {_fmt(1e6 * r.call_s / (batch * args.steps), '9.1f')} us/world-step "
                      f"x{r.n_timed}  niter {_fmt(st.get('niter_mean', float('nan')), '.1f')}/"
                      f"{_fmt(st.get('niter_max', float('nan')), '.0f')}  conv {_fmt(st.get('converged_frac', float('nan')), '.3f')}  "
                      f"resid {_fmt(st.get('residual_max', float('nan')), '.1e')}  nonfinite {st.get('nonfinite', '-')}  "
                      f"diverged {st.get('diverged', '-')}  RSS {_peak_rss_gb():.2f} GB", flush=True)
                jax.clear_caches()
            a, b = res["ncp"], res["newton"]
            sa, sb = a.stats, b.stats
            lines.append(
                f"{name:<8} | {part:<4} | {batch:>5} | {_fmt(b.compile_s, '.1f'):>8} | {_fmt(a.compile_s, '.1f'):>8} | "
                f"{_ms(b, args.steps):>10} | {_ms(a, args.steps):>10} | {_fmt(_ratio(a, b, 'call_s'), '.2f'):>7} | "
                f"{_fmt(_ratio(a, b, 'compile_s'), '.2f'):>7} | "
                f"{_fmt(sa.get('niter_mean', float('nan')), '.1f'):>5}/{_fmt(sa.get('niter_max', float('nan')), '.0f'):<3} | "
                f"{_fmt(sa.get('converged_frac', float('nan')), '.3f'):>6} | "
                f"{_fmt(sb.get('niter_mean', float('nan')), '.1f'):>5}/{_fmt(sb.get('niter_max', float('nan')), '.0f'):<3} | "
                f"{_fmt(sb.get('converged_frac', float('nan')), '.3f'):>6} | "
                f"{sa.get('nonfinite', '-')}/{sb.get('nonfinite', '-')}"
            )
            if not a.ok or not b.ok:
                lines.append(f"   note: NCP {a.status}; Newton {b.status}")
    return lines


PART1_HEADER = (
    f"{'model':<8} | {'part':<4} | {'B':>5} | {'Nwt comp':>8} | {'NCP comp':>8} | {'Nwt ms/st':>10} | {'NCP ms/st':>10} | "
    f"{'time x':>7} | {'comp x':>7} | {'NCP niter':>9} | {'NCP cv':>6} | {'Nwt niter':>9} | {'Nwt cv':>6} | nonfin"
)


# ---------------------------------------------------------------------------------- part 2


def table5_inputs(args):
    """MuJoCo model at dt=--table5-dt (implicitfast), start qpos, controls (N, nu)."""
    import mujoco

    m, qpos0, _ = mj_model(args, "humanoid")
    m.opt.timestep = args.table5_dt
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    _, _, ctrl = random_inputs(m, qpos0, 0.0, 1, args.table5_steps, args.seed + 1)
    return m, qpos0, ctrl[0]


def table5_ours(args, solver: str) -> Result:
    import jax
    import jax.numpy as jnp

    import jaxsim_ncp as jsn

    m, qpos0, ctrl = table5_inputs(args)
    model = our_model(m, solver, args, args.table5_dt)
    r_iters = model.opt.iterations
    data0 = jsn.make_data(model)
    dt = data0.qpos.dtype
    data0 = data0.replace(qpos=jnp.asarray(qpos0, dt))

    def loss(ctrl, data):
        final, traj = jsn.rollout(model, data, ctrl)
        value = jnp.sum(final.qpos**2) + jnp.sum(final.qvel**2)
        return value, (traj.solver_niter, traj.solver_converged, traj.solver_residual, final.diverged)

    r = time_compiled(jax.value_and_grad(loss, has_aux=True), (jnp.asarray(ctrl, dt), data0), args.repeats, args.budget)
    if r.ok:
        (value, (niter, conv, resid, div)), g = r.out
        r.stats = solver_stats(niter, conv, resid)
        r.stats.update(nonfinite=_nonfinite(value, g), diverged=int(div), loss=float(value),
                       grad_norm=float(np.linalg.norm(g)))  # fmt: skip
    r.stats["iterations"] = r_iters
    jax.clear_caches()
    return r


def table5_mujoco(args) -> dict[str, float]:
    """MuJoCo C: per-step mjd_transitionFD + mj_step, then the backward chain to dL/dctrl."""
    import mujoco

    m, qpos0, ctrl = table5_inputs(args)
    m.opt.iterations, m.opt.ls_iterations = args.mj_iterations, args.mj_ls_iterations
    n, nx = args.table5_steps, 2 * m.nv + m.na
    A = np.zeros((n, nx, nx))
    B = np.zeros((n, nx, m.nu))
    d = mujoco.MjData(m)

    def reset():
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos0

    fd_times, step_times, chain_times = [], [], []
    for _ in range(max(1, args.repeats)):
        reset()
        t0 = time.perf_counter()
        for t in range(n):
            d.ctrl[:] = ctrl[t]
            mujoco.mjd_transitionFD(m, d, args.fd_eps, args.fd_centered, A[t], B[t], None, None)
            mujoco.mj_step(m, d)
        fd_times.append(time.perf_counter() - t0)
        qpos, qvel = d.qpos.copy(), d.qvel.copy()
        diverged = not (np.all(np.isfinite(qpos)) and np.all(np.isfinite(qvel)))

        # backward chain: lambda = dL/dx_T in MuJoCo's tangent coordinates (dqpos via mj_integratePos, qvel, act)
        t0 = time.perf_counter()
        lam = np.zeros(nx)
        eps, base = 1e-7, float(np.sum(qpos**2))
        for i in range(m.nv):  # dL/d(tangent qpos): one-sided differences of sum(qpos^2) along each dof
            q = qpos.copy()
            dv = np.zeros(m.nv)
            dv[i] = eps
            mujoco.mj_integratePos(m, q, dv, 1.0)
            lam[i] = (np.sum(q**2) - base) / eps
        lam[m.nv : 2 * m.nv] = 2 * qvel
        grad = np.zeros((n, m.nu))
        for t in range(n - 1, -1, -1):
            grad[t] = B[t].T @ lam
            lam = A[t].T @ lam
        chain_times.append(time.perf_counter() - t0)

        reset()
        t0 = time.perf_counter()
        for t in range(n):
            d.ctrl[:] = ctrl[t]
            mujoco.mj_step(m, d)
        step_times.append(time.perf_counter() - t0)
    fd, chain = min(fd_times), min(chain_times)
    return dict(fd_s=fd, chain_s=chain, total_s=fd + chain, step_s=min(step_times), loss=float(np.sum(qpos**2) + np.sum(qvel**2)),
                grad_norm=float(np.linalg.norm(grad)), nonfinite=_nonfinite(grad), diverged=int(diverged),
                ncon_end=int(d.ncon))  # fmt: skip


def part2(args, rec: Recorder) -> list[str]:
    m, *_ = table5_inputs(args)
    n = args.table5_steps
    print(f"\n== part 2 (Dojo Table V): humanoid, N={n} steps at dt={args.table5_dt:g}, random actions, implicitfast; "
          f"ours fwd+grad w.r.t. ctrl (N, nu={m.nu}) vs MuJoCo C mjd_transitionFD "
          f"({'centered' if args.fd_centered else 'forward'}, eps={args.fd_eps:g}, "
          f"iterations={args.mj_iterations}, ls_iterations={args.mj_ls_iterations}) + mj_step per step", flush=True)
    mj = table5_mujoco(args)
    print(f"   MuJoCo C FD: transitionFD+step {mj['fd_s']:.3f}s + chain {mj['chain_s']:.4f}s = {mj['total_s']:.3f}s  "
          f"(mj_step only {mj['step_s']:.4f}s)  loss {mj['loss']:.4g}  |grad| {mj['grad_norm']:.3g}  "
          f"nonfinite {mj['nonfinite']}  ncon at end {mj['ncon_end']}", flush=True)
    rec.row(part="table5", model="humanoid", solver="mujoco_c_fd", batch=1, steps=n, dt=args.table5_dt,
            iterations=args.mj_iterations, call_s=mj["total_s"], n_timed=max(1, args.repeats),
            ms_per_step=1e3 * mj["total_s"] / n, us_per_world_step=1e6 * mj["total_s"] / n,
            nonfinite=mj["nonfinite"], diverged=mj["diverged"], status="ok")  # fmt: skip
    rec.row(part="table5", model="humanoid", solver="mujoco_c_step", batch=1, steps=n, dt=args.table5_dt,
            iterations=args.mj_iterations, call_s=mj["step_s"], n_timed=max(1, args.repeats),
            ms_per_step=1e3 * mj["step_s"] / n, us_per_world_step=1e6 * mj["step_s"] / n, status="ok")  # fmt: skip
    lines = [f"{'MuJoCo C FD':<20} | {'-':>9} | {mj['total_s']:>11.3f} | {1e3 * mj['total_s'] / n:>8.3f} | {'1.00':>7} | "
             f"{'-':>9} | {'-':>6} | {mj['nonfinite']}"]  # fmt: skip
    for solver in args.table5_solvers:
        r = table5_ours(args, solver)
        st = r.stats
        iters = st.pop("iterations")
        rec.row(part="table5", model="humanoid", solver=solver, batch=1, steps=n, dt=args.table5_dt, iterations=iters,
                compile_s=r.compile_s, call_s=r.call_s, n_timed=r.n_timed, ms_per_step=1e3 * r.call_s / n,
                us_per_world_step=1e6 * r.call_s / n, status=r.status, **{k: v for k, v in st.items() if k in CSV_FIELDS})
        print(f"   ours {solver:>6}: {r.status:<10} compile {_fmt(r.compile_s, '.1f')}s  fwd+grad {_fmt(r.call_s, '.3f')}s "
              f"x{r.n_timed}  niter {_fmt(st.get('niter_mean', float('nan')), '.1f')}/{_fmt(st.get('niter_max', float('nan')), '.0f')}  "
              f"conv {_fmt(st.get('converged_frac', float('nan')), '.3f')}  resid {_fmt(st.get('residual_max', float('nan')), '.1e')}  "
              f"loss {_fmt(st.get('loss', float('nan')), '.4g')}  |grad| {_fmt(st.get('grad_norm', float('nan')), '.3g')}  "
              f"nonfinite {st.get('nonfinite', '-')}  diverged {st.get('diverged', '-')}", flush=True)
        niter = f"{_fmt(st.get('niter_mean', float('nan')), '.1f')}/{_fmt(st.get('niter_max', float('nan')), '.0f')}"
        lines.append(f"{'ours ' + solver:<20} | {_fmt(r.compile_s, '.1f'):>9} | {_fmt(r.call_s, '.3f'):>11} | "
                     f"{_fmt(1e3 * r.call_s / n, '.3f'):>8} | {_fmt(r.call_s / mj['total_s'], '.2f'):>7} | {niter:>9} | "
                     f"{_fmt(st.get('converged_frac', float('nan')), '.3f'):>6} | {st.get('nonfinite', '-')}")
    return lines


PART2_HEADER = (f"{'simulator':<20} | {'compile s':>9} | {'fwd+grad s':>11} | {'ms/step':>8} | {'x MuJoCo':>7} | "
                f"{'niter':>9} | {'conv':>6} | nonfin")  # fmt: skip


# ---------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="default: all")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS, help="part 1 models (default: both)")
    parser.add_argument("--full", action="store_true", help="full sizes (GPU): --batch 1 64 1024, --table5-steps 1000")
    parser.add_argument("--batch", type=int, nargs="+", default=None, help="part 1 batch sizes (default 1 64; --full 1 64 1024)")
    parser.add_argument("--steps", type=int, default=10, help="part 1 horizon T (default 10)")
    parser.add_argument("--dt", type=float, default=None, help="part 1 timestep (default: the model's, 0.005)")
    parser.add_argument("--pile", type=int, nargs=3, default=[2, 2, 2], metavar=("NX", "NY", "NZ"),
                        help="boxes in the pile per axis (default 2 2 2 = 8 boxes)")
    parser.add_argument("--drop", type=float, default=0.002, help="pile: gap below each layer in m (default 0.002)")
    parser.add_argument("--ncp-iterations", type=int, default=None, help="NCP iterations (default: the library's, 30)")
    parser.add_argument("--kappa", type=float, default=1e-8, help="NCP central-path parameter (default 1e-8)")
    parser.add_argument("--kappa-grad", type=float, default=1e-4, help="NCP gradient relaxation (default 1e-4)")
    parser.add_argument("--ncp-passes", type=int, default=4, help="NCP re-linearized passes (default 4)")
    parser.add_argument("--max-geom-pairs", type=int, default=None,
                        help="part 1: contact capacity for both solvers (the NCP then solves only that many pairs' units)")
    parser.add_argument("--newton-iterations", type=int, default=10, help="Newton iterations (default 10)")
    parser.add_argument("--newton-ls-iterations", type=int, default=20, help="Newton line-search iterations (default 20)")
    parser.add_argument("--table5-steps", type=int, default=None, help="part 2 N (default 100; --full 1000)")
    parser.add_argument("--table5-dt", type=float, default=0.01, help="part 2 timestep (default 0.01)")
    parser.add_argument("--table5-solvers", nargs="+", default=["ncp"], choices=SOLVERS,
                        help="our solvers in part 2 (default: ncp)")
    parser.add_argument("--fd-eps", type=float, default=1e-6, help="mjd_transitionFD eps (default 1e-6)")
    parser.add_argument("--fd-centered", action="store_true", help="centered differences in mjd_transitionFD")
    parser.add_argument("--mj-iterations", type=int, default=100, help="MuJoCo C solver iterations (default 100)")
    parser.add_argument("--mj-ls-iterations", type=int, default=50, help="MuJoCo C line-search iterations (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up (default 3)")
    parser.add_argument("--budget", type=float, default=120.0, help="run seconds per measurement, compile excluded (default 120)")
    parser.add_argument("--x64", action="store_true", help="float64 (default float32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help=f"CSV file rows are appended to (default {DEFAULT_CSV})")
    args = parser.parse_args()
    if args.batch is None:
        args.batch = [1, 64, 1024] if args.full else [1, 64]
    args.batch = sorted(set(args.batch))
    if args.table5_steps is None:
        args.table5_steps = 1000 if args.full else 100

    import jax
    import mujoco

    if args.x64:
        jax.config.update("jax_enable_x64", True)
    dtype = "float64" if args.x64 else "float32"
    dev = jax.devices()[0]
    device = f"{dev.platform}:{getattr(dev, 'device_kind', '')}"
    version = package_version
    t_start = time.perf_counter()
    print(f"devices: {jax.devices()} ({os.cpu_count()} CPUs), load average {os.getloadavg()[0]:.1f}")
    print(f"jax {jax.__version__}, jaxlib {version('jaxlib')}, mujoco {mujoco.__version__}, jaxsim_ncp {version('jaxsim_ncp')}, "
          f"{dtype}, parts {' '.join(args.parts)}, repeats {args.repeats}, budget {args.budget:.0f}s")
    print("ms/step: median call time / T (one batched step of all B worlds); 'x' ratios: NCP / Newton (>1: NCP slower); "
          "niter mean/max, cv: fraction of steps converged; '*': warm-up call only")
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jax.numpy.zeros(3)))  # keep XLA start-up out of compile times
    rec = Recorder(args.csv, device, dtype)

    table1: list[str] = []
    if {"step", "grad"} & set(args.parts):
        for name in args.models:
            table1 += part1(args, name, rec)
    table2 = part2(args, rec) if "table5" in args.parts else []

    if table1:
        print(f"\npart 1: NCP vs Newton, T={args.steps}, {dtype} (step: forward rollout; grad: value_and_grad w.r.t. qvel0)")
        print(PART1_HEADER)
        print("-" * len(PART1_HEADER))
        print("\n".join(table1))
    if table2:
        print(f"\npart 2: Dojo Table V, humanoid N={args.table5_steps} dt={args.table5_dt:g}, {dtype} "
              f"(x MuJoCo: fwd+grad time / MuJoCo C FD time, >1: slower than MuJoCo)")
        print(PART2_HEADER)
        print("-" * len(PART2_HEADER))
        print("\n".join(table2))
    print(f"\nrows appended to {args.csv}; total wall time {time.perf_counter() - t_start:.0f}s, "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
