"""Gradient benchmark: ``jax.grad`` of a T-step rollout loss, jaxsim_ncp side by side with MJX.

Models (built by ``bench_contact.py``, imported from there):

  * ``humanoid``: the mjx package's test humanoid (nq=28, nv=27, nu=21; own settings:
    Newton, pyramidal, iterations=1, ls_iterations=4, tolerance=1e-8), from the "squat"
    keyframe, T=100 by default;
  * ``pile``: 100 free cubes stacked 5x5x4 (nv=600, nu=0, 40000 candidate contacts;
    own settings iterations=4, ls_iterations=8), T=1 by default (``--pile-steps``);
  * ``pile_capped``: the same with ``max_geom_pairs=400`` for both simulators (3600 contacts
    can have rows in ours, 2000 in MJX).

Loss (the same for every configuration), for one world from the model's start state:

    L = sum(qpos_T ** 2) + mean_t,i(qvel_t,i ** 2)          t = 1..T

differentiated with respect to the control sequence ``ctrl`` (T, nu), the initial
``qvel`` (nv,) (the pile has no actuators), ``body_mass`` and the contact friction
(``pair_friction`` for the humanoid, whose foot contacts are explicit <pair>s;
``geom_friction`` for the pile), for ours and for MJX alike (MJX: ``mjx.Model.replace``).

Configurations, each in its own child process (isolation, hard time limit, per-process
peak RSS; see ``bench_contact.py``), all in one invocation:

  (d) fwd       ours, forward rollout only (no gradient), solver at full convergence:
                ``iterations=--iterations`` (50; pile: ``--pile-iterations``, 10),
                ``ls_iterations=--ls-iterations`` (20), ``tolerance=--tolerance`` (1e-8,
                the MuJoCo default and both models' own). Both models reach the float32
                floor of the solver residual within 10 iterations (the "resid" column is
                the same at 10 and 50), so 10 is already full convergence for the pile;
  (a) implicit  ours, ``jax.grad`` with ``grad_mode="implicit"`` at those settings;
  (b) unroll    ours, ``jax.grad`` with ``grad_mode="unroll"`` at those settings;
  (f) fwd@1     ours, forward rollout at MJX's settings (iterations=1, the model's
                ls_iterations and tolerance): the forward reference of (e);
  (e) impl@1    ours, ``grad_mode="implicit"`` at MJX's settings. For the humanoid these
                are the model's own settings; the pile's own iterations=4 is lowered to 1;
  (c) mjx       MJX reverse mode at iterations=1. MJX's solver runs
                ``jax.lax.while_loop`` whenever iterations > 1 (``mjx/_src/solver.py``,
                ``solve``), which JAX cannot reverse-differentiate, so iterations=1 is
                the only setting at which MJX has a reverse-mode gradient at all;
  (g) unroll@1  ours, ``grad_mode="unroll"`` at MJX's settings: the same derivative MJX
                computes (of the one-iteration map), to check ours against MJX.

Each configuration gets a run-time budget (``--budget``; pile: ``--pile-budget``) and
is killed after 2 * budget + ``--compile-allowance`` seconds; a gradient configuration of
ours is skipped when its forward reference, (d) or (f), failed or when 3x that forward
call time exceeds the budget.

Our Newton solver scans a fixed ``iterations`` (converged iterations become no-ops but
are still computed), so our forward cost grows linearly with ``iterations``.

Reported per configuration:

  * compile s: wall time of ``jax.jit(f).lower(...).compile()``;
  * call s:    median wall time of the timed calls after one warm-up call. Their number
    is ``--repeats``, reduced so that warm-up + timed calls fit in the budget; when not
    one timed call fits, the warm-up call is the measurement (marked ``*``);
  * XLA GB:    the compiled program's buffer estimate (arguments + outputs + temps,
    ``compiled.memory_analysis()``); a program above ``--max-mem-gb`` is not run;
  * RSS GB:    peak resident memory of the configuration's process (includes ~0.5-1 GB
    of Python/JAX/MuJoCo baseline and the XLA compiler's own use);
  * resid:     ours only: max over the T steps of MuJoCo's scaled solver gradient
    |M qacc - qfrc_smooth - qfrc_constraint| / (meaninertia * nv), i.e. how far from
    converged the solver ended (MuJoCo stops below ``tolerance``; in float32 it
    bottoms out around 1e-5 for the humanoid and 1e-7 for the pile);
  * loss:      the loss value (as a cross-check that configurations simulate alike).

Then ratios (ours grad / ours forward, ours / MJX, implicit / unrolled) and gradient
sanity lines: implicit vs unrolled at full convergence (should agree to float32
round-off), ours unrolled at iterations=1 vs MJX (the same derivative: should agree up
to the simulators' float32 differences), ours implicit at iterations=1 vs both (the
implicit derivative assumes a converged solver, which one iteration is not), and for the
models in ``--fd-models`` (default: humanoid) ours implicit vs a central finite
difference along one random (ctrl, qvel0) direction in float64 at full convergence.

Run from the repository root:

    .venv/bin/python experiments/bench_grad.py                       # humanoid T=100 + pile T=1 (~15 min)
    .venv/bin/python experiments/bench_grad.py --models humanoid --steps 200 --budget 120
    .venv/bin/python experiments/bench_grad.py --models pile --pile-steps 3 --pile-budget 300
    .venv/bin/python experiments/bench_grad.py --models humanoid --iterations 10 --checkpoint 10
    .venv/bin/python experiments/bench_grad.py --models humanoid --configs fwd implicit --batch 16

Timings are wall times on whatever else the machine is running; treat them as noisy.
(MJX prints harmless "Failed to import warp" messages on import.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contact import package_version, Outcome, _emit, _fmt, _peak_rss_gb, describe, inputs, load_model, run_child_process  # noqa: E402

MODELS = ("humanoid", "pile", "pile_capped")
# key: (label, simulator, gradient?, grad_mode, full convergence?)
CONFIGS: dict[str, tuple[str, str, bool, str, bool]] = {
    "fwd": ("(d) ours fwd, full conv.", "ours", False, "implicit", True),
    "implicit": ("(a) ours grad implicit, full conv.", "ours", True, "implicit", True),
    "unroll": ("(b) ours grad unroll, full conv.", "ours", True, "unroll", True),
    "fwd1": ("(f) ours fwd, iterations=1", "ours", False, "implicit", False),
    "implicit1": ("(e) ours grad implicit, iterations=1", "ours", True, "implicit", False),
    "unroll1": ("(g) ours grad unroll, iterations=1", "ours", True, "unroll", False),
    "mjx": ("(c) MJX grad (reverse), iterations=1", "mjx", True, "", False),
}
GRAD_KEYS = ("ctrl", "qvel0", "body_mass", "friction")


# ---------------------------------------------------------------------------------- problem


def solver_settings(args, model_name: str, full: bool) -> dict[str, Any]:
    """iterations, ls_iterations, tolerance of a configuration (full convergence or MJX's iterations=1)."""
    m, *_ = load_model(model_name)
    if full:
        iterations = args.pile_iterations if model_name.startswith("pile") else args.iterations
        return dict(iterations=iterations, ls_iterations=args.ls_iterations, tolerance=args.tolerance)
    return dict(iterations=1, ls_iterations=int(m.opt.ls_iterations), tolerance=float(m.opt.tolerance))


def build(model_name: str, config: str, settings: dict[str, Any], steps: int, batch: int, seed: int,
          checkpoint: int, dtype=None):
    """(function, arguments) of one configuration: f(params, data) vmapped over the batch."""
    import jax
    import jax.numpy as jnp

    _, sim, grad, grad_mode, _ = CONFIGS[config]
    m, qpos0, sigma, amp = load_model(model_name)
    m.opt.iterations, m.opt.ls_iterations = settings["iterations"], settings["ls_iterations"]
    m.opt.tolerance = settings["tolerance"]
    qpos, qvel, ctrl = inputs(m, qpos0, sigma, amp, batch, steps, seed)
    fric = "pair_friction" if m.npair else "geom_friction"

    if sim == "ours":
        import equinox as eqx

        import jaxsim_ncp as jsn

        model = jsn.from_mujoco(m, grad_mode=grad_mode, dtype=dtype)
        data0 = jsn.make_data(model)

        def loss(params, data):
            mm = eqx.tree_at(lambda x: (x.body_mass, getattr(x, fric)), model, (params["body_mass"], params["friction"]))
            final, traj = jsn.rollout(mm, data.replace(qvel=params["qvel0"]), params["ctrl"], checkpoint=checkpoint)
            value = jnp.sum(final.qpos**2) + jnp.mean(traj.qvel**2)
            r = jnp.einsum("tij,tj->ti", traj.qM, traj.qacc) - traj.qfrc_smooth - traj.qfrc_constraint
            resid = jnp.max(jnp.linalg.norm(r, axis=-1)) / (mm.opt.meaninertia * max(1, mm.nv))
            return value, resid
    else:
        from mujoco import mjx

        model = mjx.put_model(m)
        data0 = mjx.make_data(model)

        def loss(params, data):
            mx = model.replace(body_mass=params["body_mass"], **{fric: params["friction"]})

            def body(d, u):
                d = mjx.step(mx, d.replace(ctrl=u))
                return d, d.qvel

            final, qvels = jax.lax.scan(body, data.replace(qvel=params["qvel0"]), params["ctrl"])
            return jnp.sum(final.qpos**2) + jnp.mean(qvels**2), jnp.full((), jnp.nan, final.qpos.dtype)

    dt = data0.qpos.dtype
    data = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), data0)
    data = data.replace(qpos=jnp.asarray(qpos, dt))
    params = dict(ctrl=jnp.asarray(ctrl, dt), qvel0=jnp.asarray(qvel, dt),
                  body_mass=jnp.asarray(model.body_mass, dt), friction=jnp.asarray(getattr(model, fric), dt))
    f = jax.value_and_grad(loss, has_aux=True) if grad else loss
    axes = dict(ctrl=0, qvel0=0, body_mass=None, friction=None)  # model parameters shared by the batch
    return jax.vmap(f, in_axes=(axes, 0)), (params, data)


# ---------------------------------------------------------------------------------- worker


def measure(args, out_npz: str) -> dict[str, Any]:
    """Compile and time one configuration; writes loss (B,), resid (B,) and the gradients to out_npz."""
    import jax

    config, model_name = args._worker, args.models[0]
    settings = solver_settings(args, model_name, CONFIGS[config][4])
    f, fargs = build(model_name, config, settings, args.steps, args.batch, args.seed, args.checkpoint)
    fn = jax.jit(f)

    t0 = time.perf_counter()
    compiled = fn.lower(*fargs).compile()
    compile_s = time.perf_counter() - t0
    xla_gb = float("nan")
    try:
        ma = compiled.memory_analysis()
        xla_gb = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes) / 1e9
    except Exception:  # noqa: BLE001 - not every backend reports it
        pass
    res: dict[str, Any] = dict(status="compiled", compile_s=compile_s, xla_gb=xla_gb, rss_gb=_peak_rss_gb())
    _emit(**res)
    if xla_gb == xla_gb and xla_gb > args.max_mem_gb:
        res["status"] = f"XLA needs {xla_gb:.1f} GB"
        return res

    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*fargs))  # warm-up
    first = time.perf_counter() - t0
    _emit(status="warm", first_call_s=first)
    n = int(min(args.repeats, max(0, (args.budget - first) // max(first, 1e-9))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*fargs))
        times.append(time.perf_counter() - t0)
    (value, resid), grads = out if CONFIGS[config][2] else (out, {})
    arrays = {"loss": value, "resid": resid, **{f"g_{k}": v for k, v in grads.items()}}
    arrays = {k: np.asarray(v, np.float64) for k, v in arrays.items()}
    np.savez(out_npz, **arrays)
    nonfinite = int(sum(np.sum(~np.isfinite(v)) for k, v in arrays.items() if k != "resid"))
    res.update(status="ok" if not nonfinite else f"ok ({nonfinite} non-finite)", call_s=statistics.median(times) if times else first,
               n_timed=len(times), rss_gb=_peak_rss_gb())
    return res


def fd_check(args, out_json: str) -> None:
    """float64: ours implicit gradient vs central differences along one random (ctrl, qvel0) direction."""
    import jax
    import jax.numpy as jnp

    model_name = args.models[0]
    settings = solver_settings(args, model_name, True)
    settings["tolerance"] = min(settings["tolerance"], 1e-12)  # converge as far as float64 goes
    f, (params, data) = build(model_name, "implicit", settings, args.steps, 1, args.seed, 0, dtype=jnp.float64)
    (value, resid), grads = jax.jit(f)(params, data)
    rng = np.random.default_rng(args.seed + 1)
    direction = {k: jnp.asarray(rng.standard_normal(params[k].shape)) for k in ("ctrl", "qvel0")}
    direction = {k: v / np.sqrt(sum(float(jnp.sum(w**2)) for w in direction.values())) for k, v in direction.items()}
    analytic = float(sum(jnp.sum(grads[k] * direction[k]) for k in direction))

    fwd_model = build(model_name, "fwd", settings, args.steps, 1, args.seed, 0, dtype=jnp.float64)[0]
    fwd = jax.jit(lambda p: fwd_model(p, data)[0][0])
    out = dict(analytic=analytic, resid=float(resid[0]), fd={})
    for eps in (1e-4, 1e-5, 1e-6):
        shifted = lambda s: {**params, **{k: params[k] + s * eps * v for k, v in direction.items()}}  # noqa: E731
        out["fd"][f"{eps:g}"] = float((fwd(shifted(1.0)) - fwd(shifted(-1.0))) / (2 * eps))
    with open(out_json, "w") as fh:
        json.dump(out, fh)


def worker_main(args) -> None:
    import jax

    if args.x64 or args._worker == "fd":
        jax.config.update("jax_enable_x64", True)
    if args._worker == "fd":
        return fd_check(args, args._out)
    _emit(**measure(args, args._out))


# ---------------------------------------------------------------------------------- driver


def run_child(args, worker: str, model_name: str, steps: int, budget: float, out: str) -> Outcome:
    """Run this script as `--_worker worker` with a hard time limit."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", worker, "--_out", out, "--models", model_name,
           "--steps", str(steps), "--batch", str(args.batch), "--repeats", str(args.repeats), "--budget", str(budget),
           "--max-mem-gb", str(args.max_mem_gb), "--iterations", str(args.iterations),
           "--pile-iterations", str(args.pile_iterations),
           "--ls-iterations", str(args.ls_iterations), "--tolerance", repr(args.tolerance), "--seed", str(args.seed),
           "--checkpoint", str(args.checkpoint)] + (["--x64"] if args.x64 else [])
    hard = 2 * budget + args.compile_allowance  # start-up + compile (not budgeted) + run time (budgeted)
    res = Outcome()
    run_child_process(cmd, hard, out, res, label=worker)
    if res.ok and worker in CONFIGS:
        with np.load(out) as fh:
            res.arrays = {k: fh[k] for k in fh.files}
    return res


def _ratio(a: Outcome, b: Outcome, attr: str) -> str:
    x, y = getattr(a, attr), getattr(b, attr)
    return f"{x / y:.2f}" if a.ok and b.ok and x == x and y == y and y > 0 else "-"


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def grad_comparison(a: Outcome, b: Outcome) -> str:
    """Per-group relative difference |ga - gb| / |gb| (and the cosine for ctrl/qvel0 together)."""
    if not (a.ok and b.ok):
        return "-"
    parts = []
    for k in GRAD_KEYS:
        ga, gb = a.arrays.get(f"g_{k}"), b.arrays.get(f"g_{k}")
        if ga is None or gb is None or ga.size == 0:
            continue
        parts.append(f"{k} {_rel(ga, gb):.2e}")
    va = np.concatenate([a.arrays[f"g_{k}"].ravel() for k in ("ctrl", "qvel0")])
    vb = np.concatenate([b.arrays[f"g_{k}"].ravel() for k in ("ctrl", "qvel0")])
    cos = float(va @ vb / max(np.linalg.norm(va) * np.linalg.norm(vb), 1e-30))
    return ", ".join(parts) + f" | cos(ctrl,qvel0) {cos:.4f}"


def bench_model(args, name: str, tmp: str) -> None:
    steps = args.pile_steps if name.startswith("pile") else args.steps
    budget = args.pile_budget if name.startswith("pile") else args.budget
    full = solver_settings(args, name, True)
    low = solver_settings(args, name, False)
    print(f"\n== {name}: T={steps}, batch {args.batch}, {'float64' if args.x64 else 'float32'}, budget {budget:.0f}s"
          f"\n   {describe(name)}"
          f"\n   full convergence (a,b,d): iterations={full['iterations']} ls_iterations={full['ls_iterations']} "
          f"tolerance={full['tolerance']:g}; iterations=1 (c,e,f): ls_iterations={low['ls_iterations']} "
          f"tolerance={low['tolerance']:g}" + (f"; ours checkpoint={args.checkpoint}" if args.checkpoint else ""),
          flush=True)
    res: dict[str, Outcome] = {}
    for cfg in args.configs:
        label, sim, grad, _, is_full = CONFIGS[cfg]
        fwd = res.get("fwd" if is_full else "fwd1")
        reason = None
        if sim == "ours" and grad and fwd is not None:
            if not fwd.ok:
                reason = f"skipped (forward: {fwd.status})"
            elif 3 * fwd.call_s > budget:  # not even the warm-up call of a gradient (~3 forward rollouts) fits
                reason = f"skipped: est. {3 * fwd.call_s:.0f}s/call > budget"
        if reason:
            out = Outcome(status=reason)
        else:
            out = run_child(args, cfg, name, steps, budget, os.path.join(tmp, f"{name}_{cfg}.npz"))
        res[cfg] = out
        print(f"   {label:<38} {out.status:<22} compile {_fmt(out.compile_s, '.1f')}s  call {_fmt(out.call_s, '.3f')}s "
              f"x{out.n_timed}  XLA {_fmt(out.xla_gb, '.3f')} GB  RSS {_fmt(out.rss_gb, '.2f')} GB  "
              f"(wall {_fmt(out.wall_s, '.0f')}s)", flush=True)

    # ------------------------------------------------------------------ table
    print(f"\n{name} (T={steps}, batch {args.batch}, {'float64' if args.x64 else 'float32'}):")
    header = (f"{'configuration':<38} | {'iters/ls':>8} | {'compile s':>9} | {'call s':>9} | {'XLA GB':>8} | "
              f"{'RSS GB':>6} | {'resid':>8} | {'loss':>10}")
    print(header)
    print("-" * len(header))
    for cfg, o in res.items():
        label, sim, _, _, is_full = CONFIGS[cfg]
        s = full if is_full else low
        call = (_fmt(o.call_s, ".4f") + ("*" if o.n_timed == 0 else "")) if o.ok else o.status.split(":")[0][:9]
        resid = float(np.max(o.arrays["resid"])) if o.ok else float("nan")
        loss = float(np.mean(o.arrays["loss"])) if o.ok else float("nan")
        print(f"{label:<38} | {str(s['iterations']) + '/' + str(s['ls_iterations']):>8} | {_fmt(o.compile_s, '.1f'):>9} | "
              f"{call:>9} | {_fmt(o.xla_gb, '.4f'):>8} | {_fmt(o.rss_gb, '.2f'):>6} | {_fmt(resid, '.1e'):>8} | "
              f"{_fmt(loss, '.5g'):>10}")
    for cfg, o in res.items():
        if not o.ok:
            print(f"   note: {CONFIGS[cfg][0]}: {o.status}")
    print("   '*': only the warm-up call fitted the budget and is the measurement; resid: max scaled solver gradient "
          "(ours only)")
    print("   NOTE: MJX runs iterations=1 because its solver uses lax.while_loop for iterations > 1, which has no "
          "reverse-mode derivative:\n   MJX cannot give this gradient at full convergence (compare (c) with (e), (g), "
          "not with (a)).")

    # ------------------------------------------------------------------ ratios
    g = lambda k: res.get(k, Outcome())  # noqa: E731
    print("\n   ratios (time = call s; >1 means the numerator is slower/bigger):")
    print(f"   ours grad / ours fwd:   implicit/fwd {_ratio(g('implicit'), g('fwd'), 'call_s')} (target <= 3)   "
          f"unroll/fwd {_ratio(g('unroll'), g('fwd'), 'call_s')}   "
          f"impl@1/fwd@1 {_ratio(g('implicit1'), g('fwd1'), 'call_s')}   "
          f"unroll@1/fwd@1 {_ratio(g('unroll1'), g('fwd1'), 'call_s')}")
    print(f"   implicit / unroll:      time {_ratio(g('implicit'), g('unroll'), 'call_s')}   "
          f"XLA mem {_ratio(g('implicit'), g('unroll'), 'xla_gb')}   RSS {_ratio(g('implicit'), g('unroll'), 'rss_gb')}   "
          f"compile {_ratio(g('implicit'), g('unroll'), 'compile_s')}")
    for cfg in ("implicit", "implicit1", "unroll1"):
        print(f"   {CONFIGS[cfg][0][:3]} ours {cfg:<9} / MJX: time {_ratio(g(cfg), g('mjx'), 'call_s')}   "
              f"XLA mem {_ratio(g(cfg), g('mjx'), 'xla_gb')}   RSS {_ratio(g(cfg), g('mjx'), 'rss_gb')}   "
              f"compile {_ratio(g(cfg), g('mjx'), 'compile_s')}")

    # ------------------------------------------------------------------ gradient sanity
    print("\n   gradients, relative difference |g1 - g2| / |g2| per input:")
    print(f"   implicit vs unroll (full conv.):  {grad_comparison(g('implicit'), g('unroll'))}")
    print(f"   impl@1 vs MJX (iterations=1):     {grad_comparison(g('implicit1'), g('mjx'))}")
    print(f"   unroll@1 vs MJX (iterations=1):   {grad_comparison(g('unroll1'), g('mjx'))}")
    print(f"   impl@1 vs unroll@1:               {grad_comparison(g('implicit1'), g('unroll1'))}")
    print(f"   impl@1 vs implicit (full conv.):  {grad_comparison(g('implicit1'), g('implicit'))}")
    if name in args.fd_models:
        path = os.path.join(tmp, f"{name}_fd.json")
        out = run_child(args, "fd", name, steps, budget, path)
        if out.status.startswith("crashed") or out.status.startswith("timeout") or out.status.startswith("killed"):
            print(f"   finite differences (float64): {out.status}")
        else:
            with open(path) as fh:
                fd = json.load(fh)
            parts = [f"eps {e}: {v:.6e} (rel {abs(fd['analytic'] - v) / max(abs(v), 1e-30):.1e})" for e, v in fd["fd"].items()]
            print(f"   implicit vs central FD along a random unit (ctrl, qvel0) direction, float64, full conv. "
                  f"(resid {fd['resid']:.1e}, {out.wall_s:.0f}s):\n     analytic {fd['analytic']:.6e} | " + " | ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"subset of: {' '.join(MODELS)}")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                        help="configurations to run, in this order (default: all)")
    parser.add_argument("--steps", type=int, default=100, help="humanoid horizon T (default 100)")
    parser.add_argument("--pile-steps", type=int, default=1, help="pile horizon T (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="worlds per call, vmapped (default 1)")
    parser.add_argument("--iterations", type=int, default=50, help="full-convergence Newton iterations (default 50)")
    parser.add_argument("--pile-iterations", type=int, default=10,
                        help="full-convergence Newton iterations for the pile (default 10: converged, see resid)")
    parser.add_argument("--ls-iterations", type=int, default=20, help="full-convergence line-search iterations (default 20)")
    parser.add_argument("--tolerance", type=float, default=1e-8, help="full-convergence solver tolerance (default 1e-8)")
    parser.add_argument("--checkpoint", type=int, default=0, help="ours: rollout(..., checkpoint=k) (default 0: off)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the warm-up (default 5)")
    parser.add_argument("--budget", type=float, default=60.0, help="humanoid run seconds per configuration, compile excluded (default 60)")
    parser.add_argument("--pile-budget", type=float, default=100.0, help="same for the pile (default 100)")
    parser.add_argument("--compile-allowance", type=float, default=240.0,
                        help="a configuration is killed after 2 * budget + this many seconds (default 240)")
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    parser.add_argument("--max-mem-gb", type=float, default=round(0.5 * avail, 1),
                        help="do not run programs whose XLA buffers exceed this (default: half the free memory)")
    parser.add_argument("--fd-models", nargs="*", default=["humanoid"],
                        help="models to check against finite differences in float64 (default: humanoid)")
    parser.add_argument("--x64", action="store_true", help="float64 instead of float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--_worker", choices=[*CONFIGS, "fd"], help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        return worker_main(args)

    import jax
    import mujoco

    version = package_version
    t0 = time.perf_counter()
    print(f"devices: {jax.devices()} ({os.cpu_count()} CPUs), load average {os.getloadavg()[0]:.1f} "
          "(timings are wall times on a shared machine: noisy)")
    print(f"jax {jax.__version__}, jaxlib {version('jaxlib')}, mujoco {mujoco.__version__}, "
          f"mujoco-mjx {version('mujoco-mjx')}, jaxsim_ncp {version('jaxsim_ncp')}, "
          f"{'float64' if args.x64 else 'float32'}, batch {args.batch}, repeats {args.repeats}, "
          f"max XLA memory {args.max_mem_gb} GB, one child process per configuration")
    print("loss = sum(qpos_T^2) + mean(qvel_1..T^2); gradient w.r.t. ctrl (T, nu), initial qvel, body_mass, friction")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            bench_model(args, name, tmp)
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f}s, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
