"""Contact-rich batched rollout benchmark: jaxsim_ncp side by side with MJX.

Models (all options are read by both simulators from the same ``mujoco.MjModel``, so
timestep, cone, iterations, ls_iterations, tolerance and ls_tolerance are identical):

  * ``humanoid``: the humanoid shipped with the mjx package
    (``mujoco/mjx/test_data/humanoid/humanoid.xml``; nq=28, nv=27, nu=21), four explicit
    foot-floor <pair>s and 21 limited joints, at the model's OWN solver settings:
    Newton, pyramidal cone, iterations=1, ls_iterations=4, dt=0.005, Euler with
    eulerdamp disabled. Starts from the "squat" keyframe (feet on the floor).
  * ``humanoid_it10``: the same with iterations=10 (ls_iterations stays 4).
  * ``pile``: 100 free cubes (half-size 0.05) stacked 5x5x4 on a plane, each layer
    sunk 0.5 mm into the one below (so the stack is in contact from step 0), 2 mm
    gaps between columns; all box-box and box-plane pairs collide. Newton, pyramidal,
    iterations=4, ls_iterations=8, dt=0.005 (nq=700, nv=600, nu=0).

For each model and batch size B both simulators run the same jitted, vmapped rollout of
T steps from the same per-world initial state (the model's start state plus a small
random qvel perturbation) with the same random controls:

  * jaxsim_ncp: ``jax.jit(jax.vmap(jsn.rollout))``;
  * MJX:        ``jax.jit(jax.vmap(scan(mjx.step)))`` with ``ctrl`` set each step.

Both return the final (qpos, qvel) only. Reported per configuration:

  * compile s: wall time of ``jit(...).lower(...).compile()`` for that batch shape;
  * steps/s: B*T / median wall time of the timed calls after one warm-up call. The
    number of timed calls is ``--repeats``, reduced so that the run time (warm-up +
    timed calls, compile excluded) stays within ``--budget``; when not even one timed
    call fits, the warm-up call itself is the measurement (marked ``*``);
  * XLA GB: the compiled program's own buffer estimate (arguments + outputs + temps,
    ``compiled.memory_analysis()``);
  * RSS GB: peak resident memory of the process that ran the configuration (includes
    ~0.5 GB of Python/JAX/MuJoCo baseline and what XLA's compiler used);
  * sanity: final-state differences ours vs MJX over all worlds, and at batch 1 both
    against MuJoCo's C engine (float64, same options) from the same initial state and
    controls.

Isolation (default): every (model, simulator, batch) configuration runs in a child
process (this script with ``--_worker``), so that a configuration that does not finish
within 2 * ``--budget`` + 180 seconds (start-up and compile included) is killed and reported as
"timeout", one that runs out of memory is reported as "crashed"/"OOM" instead of taking
the benchmark down, and peak RSS is measured per configuration. Both simulators still
run in the same script invocation, from identical inputs, one after the other.
``--in-process`` runs everything in this process instead (no hard timeouts; RSS is the
running peak of the whole process). Before launching a configuration, its run time
(warm-up + one timed call) and memory are extrapolated linearly in B from the largest
smaller batch that finished;
it is skipped when the estimate exceeds ``--budget`` (on the CPU only) or ``--max-mem-gb``, and every
larger batch of a simulator is skipped once one batch did not finish or fit. In a child,
a compiled program whose XLA buffer estimate exceeds ``--max-mem-gb`` is not run.

Run from the repository root:

    .venv/bin/python experiments/bench_contact.py                        # all models, batch 1 16 256 4096, T=100
    .venv/bin/python experiments/bench_contact.py --models humanoid --batch 1 16 --budget 60
    .venv/bin/python experiments/bench_contact.py --models pile --batch 1 16 --pile-steps 5 --budget 150

(MJX prints harmless "Failed to import warp" messages on import.)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

# every configuration runs in its own child process: on a GPU each would otherwise preallocate
# most of the device's memory and the next one fails (cuSolver handle / CUBIN load: out of memory)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def package_version(name: str) -> str:
    """The installed version of a package, or "not installed" (e.g. run from a source tree)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"

import numpy as np

MODELS = ("humanoid", "humanoid_it10", "humanoids4", "pile", "pile_capped")
SIMS = ("ours", "mjx")
_MSG = "@@bench_contact@@ "  # prefix of the JSON lines a worker sends to the driver


# ---------------------------------------------------------------------------------- models


def humanoid_path() -> pathlib.Path:
    import mujoco

    return pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data" / "humanoid" / "humanoid.xml"


def pile_xml(*args, **kwargs) -> str:
    """`jaxsim_ncp.workflows.pile_xml`, imported when called (the driver process imports no JAX)."""
    from jaxsim_ncp.workflows import pile_xml as make

    return make(*args, **kwargs)


def load_model(name: str):
    """(MjModel, initial qpos, qvel perturbation scale, ctrl amplitude) of a benchmark model."""
    import mujoco

    if name in ("humanoid", "humanoid_it10"):
        m = mujoco.MjModel.from_xml_path(str(humanoid_path()))
        if name == "humanoid_it10":
            m.opt.iterations = 10
        key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "squat")
        return m, np.array(m.key_qpos[key]), 0.1, 1.0
    if name == "humanoids4":  # four humanoids colliding with each other and the floor, from 1.5 m up
        m = mujoco.MjModel.from_xml_path(str(humanoid_path().parent / "04_humanoids.xml"))
        return m, np.array(m.qpos0), 0.1, 1.0
    if name in ("pile", "pile_capped"):  # capped: 400 box-box pairs (of 4950) reach the narrow phase
        m = mujoco.MjModel.from_xml_string(pile_xml(max_geom_pairs=400 if name == "pile_capped" else None))
        return m, np.array(m.qpos0), 0.05, 0.0
    raise ValueError(f"unknown model {name!r} (choose from {MODELS})")


def inputs(m, qpos0: np.ndarray, sigma: float, amp: float, batch: int, steps: int, seed: int):
    """Per-world qpos (B, nq), qvel (B, nv) and ctrl (B, T, nu), float64; identical for both simulators."""
    rng = np.random.default_rng(seed)
    qvel = sigma * rng.standard_normal((batch, m.nv))
    lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
    u = rng.uniform(-1.0, 1.0, (batch, steps, m.nu))
    ctrl = np.clip(amp * u, lo, hi) if m.nu else u
    return np.broadcast_to(qpos0, (batch, m.nq)).copy(), qvel, ctrl


# ---------------------------------------------------------------------------------- worker


def _emit(**msg) -> None:
    print(_MSG + json.dumps(msg), flush=True)


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # ru_maxrss is in KiB on Linux


def batched_rollout(model_name: str, sim: str, batch: int, steps: int, seed: int, options: dict | None = None):
    """(jit(vmap(rollout)), (model, data, ctrl)) of one configuration: a rollout of `steps` steps
    returning the final (qpos, qvel) per world, and its inputs (`inputs`) in the simulator's dtype.
    `options`: overrides for ours (`jsn.from_mujoco` keywords, e.g. grad_mode)."""
    import jax
    import jax.numpy as jnp

    m, qpos0, sigma, amp = load_model(model_name)
    qpos, qvel, ctrl = inputs(m, qpos0, sigma, amp, batch, steps, seed)

    if sim == "ours":
        import jaxsim_ncp as jsn
        from jaxsim_ncp.workflows import mjx_limits

        model = jsn.from_mujoco(m, **{**mjx_limits(m), **(options or {})})  # MJX's contact cap, as MJX runs it
        data0 = jsn.make_data(model)

        def rollout(model, data, ctrl):
            final, _ = jsn.rollout(model, data, ctrl)
            return final.qpos, final.qvel
    else:
        from mujoco import mjx

        model = mjx.put_model(m)
        data0 = mjx.make_data(model)

        def rollout(mx, data, ctrl):
            def body(d, u):
                return mjx.step(mx, d.replace(ctrl=u)), None

            final, _ = jax.lax.scan(body, data, ctrl)
            return final.qpos, final.qvel

    dt = data0.qpos.dtype
    data = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), data0)
    data = data.replace(qpos=jnp.asarray(qpos, dt), qvel=jnp.asarray(qvel, dt))
    fn = jax.jit(jax.vmap(rollout, in_axes=(None, 0, 0)))
    return fn, (model, data, jnp.asarray(ctrl, dt))


def measure(model_name: str, sim: str, batch: int, steps: int, repeats: int, seed: int, budget: float,
            max_mem_gb: float, out_npz: str, options: dict | None = None) -> dict[str, Any]:
    """Compile and time one configuration; writes the final (qpos, qvel) to out_npz."""
    import jax

    fn, (model, data, ctrl) = batched_rollout(model_name, sim, batch, steps, seed, options)
    t0 = time.perf_counter()
    compiled = fn.lower(model, data, ctrl).compile()
    compile_s = time.perf_counter() - t0
    xla_gb = float("nan")
    try:
        ma = compiled.memory_analysis()
        xla_gb = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes) / 1e9
    except Exception:  # noqa: BLE001 - not every backend reports it
        pass
    res: dict[str, Any] = dict(status="compiled", compile_s=compile_s, xla_gb=xla_gb, rss_gb=_peak_rss_gb())
    _emit(**res)
    if xla_gb == xla_gb and xla_gb > max_mem_gb:
        res["status"] = f"XLA needs {xla_gb:.1f} GB"
        return res

    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(model, data, ctrl))  # warm-up
    first = time.perf_counter() - t0
    _emit(status="warm", first_call_s=first)
    # the budget bounds run time (warm-up + timed calls); compile time is reported, not budgeted
    n = int(min(repeats, max(0, (budget - first) // max(first, 1e-9))))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(model, data, ctrl))
        times.append(time.perf_counter() - t0)
    call_s = statistics.median(times) if times else first
    fq, fv = (np.asarray(x, np.float64) for x in out)
    np.savez(out_npz, qpos=fq, qvel=fv)
    res.update(status="ok", call_s=call_s, n_timed=len(times), steps_per_s=batch * steps / call_s,
               rss_gb=_peak_rss_gb(), nonfinite=int(np.sum(~np.isfinite(fq))))
    return res


def worker_main(args) -> None:
    import jax

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    res = measure(args.models[0], args._worker, args.batch[0], args.steps, args.repeats, args.seed,
                  args.budget, args.max_mem_gb, args._out, json.loads(args.options))
    _emit(**res)


# ---------------------------------------------------------------------------------- driver


@dataclass
class Outcome:
    status: str = "not run"  # ok | skipped: ... | timeout | crashed | XLA needs ...
    compile_s: float = float("nan")
    call_s: float = float("nan")
    steps_per_s: float = float("nan")
    n_timed: int = 0
    xla_gb: float = float("nan")
    rss_gb: float = float("nan")
    wall_s: float = float("nan")
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # the worker's npz (final state, gradients)

    @property
    def ok(self) -> bool:
        return self.status.startswith("ok")


def run_child_process(cmd: list[str], hard_s: float, log_base: str, outcome, label: str) -> None:
    """Run `cmd` (a ``--_worker`` invocation) killing it after `hard_s` seconds; fill `outcome`.

    Sets the outcome's fields from the worker's ``_MSG`` lines (not its array dicts),
    its wall_s, its peak RSS (os.wait4 returns the child's own) and, when the child
    timed out or crashed, its status. stdout/stderr go to ``log_base + ".out"/".err"``.
    """
    t0 = time.perf_counter()
    with open(log_base + ".out", "w+") as fout, open(log_base + ".err", "w+") as ferr:
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, text=True)
        timed_out = False
        while True:  # os.wait4 rather than Popen.wait: it also returns the child's own peak RSS
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.perf_counter() - t0 > hard_s:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.2)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        fout.seek(0), ferr.seek(0)
        stdout, stderr = fout.read(), ferr.read()
    outcome.wall_s = time.perf_counter() - t0
    for line in stdout.splitlines():
        if line.startswith(_MSG):
            for k, v in json.loads(line[len(_MSG):]).items():
                if hasattr(outcome, k) and not isinstance(getattr(outcome, k), dict):
                    setattr(outcome, k, v)
    outcome.rss_gb = usage.ru_maxrss / 1e6  # KiB on Linux
    if timed_out:
        outcome.status = f"timeout >{hard_s:.0f}s"
    elif rc != 0:
        outcome.status = "killed (OOM?)" if rc == -9 else f"crashed rc={rc}"
        tail = [ln for ln in stderr.splitlines() if ln.strip() and "warp" not in ln][-3:]
        print(f"   [{label}] {outcome.status}: " + " | ".join(tail), flush=True)


def run_isolated(args, model_name: str, sim: str, batch: int, steps: int, out_npz: str) -> Outcome:
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", sim, "--_out", out_npz,
           "--models", model_name, "--batch", str(batch), "--steps", str(steps), "--repeats", str(args.repeats),
           "--seed", str(args.seed), "--budget", str(args.budget), "--max-mem-gb", str(args.max_mem_gb),
           "--dtype", args.dtype, "--options", args.options]
    hard = 2 * args.budget + 180  # start-up + compile (not budgeted) + run time (budgeted, may overshoot once)
    out = Outcome()
    run_child_process(cmd, hard, out_npz, out, label=f"{sim} B={batch}")
    if out.ok:
        with np.load(out_npz) as f:
            out.arrays = {k: f[k] for k in f.files}
    return out


def run_in_process(args, model_name: str, sim: str, batch: int, steps: int, out_npz: str) -> Outcome:
    t0 = time.perf_counter()
    try:
        res = measure(model_name, sim, batch, steps, args.repeats, args.seed, args.budget, args.max_mem_gb, out_npz,
                      json.loads(args.options))
    except Exception as e:  # noqa: BLE001 - e.g. XLA RESOURCE_EXHAUSTED
        print(f"   [{sim} B={batch}] failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return Outcome(status="crashed", wall_s=time.perf_counter() - t0)
    out = Outcome(wall_s=time.perf_counter() - t0)
    for k, v in res.items():
        if hasattr(out, k):
            setattr(out, k, v)
    if out.ok:
        with np.load(out_npz) as f:
            out.arrays = {k: f[k] for k in f.files}
    return out


def estimate_skip(args, prev: Outcome | None, prev_batch: int | None, batch: int) -> str | None:
    """Reason to skip (batch) from the last attempted smaller batch of the same simulator, or None."""
    if prev is None:
        return None
    if not prev.ok:
        return f"skipped (B={prev_batch}: {prev.status})"
    scale = batch / prev_batch
    est = 2 * prev.call_s * scale  # run time: warm-up + one timed call, linear in B
    if args.time_estimate and est > args.budget:
        return f"skipped: est. {est:.0f}s run > budget"
    if prev.xla_gb == prev.xla_gb and prev.xla_gb * scale > args.max_mem_gb:
        return f"skipped: est. {prev.xla_gb * scale:.1f} GB"
    return None


def mujoco_reference(model_name: str, steps: int, seed: int) -> np.ndarray:
    """Final qpos of world 0 of batch 1 with MuJoCo's C engine (float64)."""
    import mujoco

    m, qpos0, sigma, amp = load_model(model_name)
    qpos, qvel, ctrl = inputs(m, qpos0, sigma, amp, 1, steps, seed)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos[0], qvel[0]
    for t in range(steps):
        d.ctrl[:] = ctrl[0, t]
        mujoco.mj_step(m, d)
    return np.array(d.qpos)


def describe(model_name: str) -> str:
    import jaxsim_ncp as jsn
    from mujoco import mjx

    m, *_ = load_model(model_name)
    layout = jsn.from_mujoco(m).constraints
    dx = mjx.make_data(mjx.put_model(m))
    impl = getattr(dx, "_impl", dx)
    cone = ("pyramidal", "elliptic")[int(m.opt.cone)]
    return (f"nq={m.nq} nv={m.nv} nu={m.nu} ngeom={m.ngeom} dt={m.opt.timestep:g} cone={cone} "
            f"iterations={m.opt.iterations} ls_iterations={m.opt.ls_iterations} tolerance={m.opt.tolerance:g}\n"
            f"   static sizes: ours ncon={layout.ncon} nefc={layout.nefc} | "
            f"MJX ncon={impl.contact.dist.shape[0]} nefc={impl.efc_J.shape[0]}")


def _fmt(x: float, spec: str) -> str:
    return format(x, spec) if x == x else "-"


def bench_model(args, name: str, tmp: str) -> None:
    steps = args.pile_steps if (name.startswith("pile") and args.pile_steps) else args.steps
    print(f"\n== {name}: T={steps} {args.dtype}\n   {describe(name)}", flush=True)
    runner = run_in_process if args.in_process else run_isolated
    results: dict[tuple[str, int], Outcome] = {}
    last: dict[str, tuple[int, Outcome]] = {}
    for batch in args.batch:
        for sim in args.sims:
            prev_batch, prev = last.get(sim, (None, None))
            reason = estimate_skip(args, prev, prev_batch, batch)
            if reason:
                out = Outcome(status=reason)
            else:
                out = runner(args, name, sim, batch, steps, os.path.join(tmp, f"{name}_{sim}_{batch}.npz"))
                last[sim] = (batch, out)
            results[sim, batch] = out
            print(f"   {sim:>4} B={batch:<5} {out.status:<24} compile {_fmt(out.compile_s, '.1f')}s  "
                  f"call {_fmt(out.call_s, '.3f')}s x{out.n_timed}  {_fmt(out.steps_per_s, '.4g')} steps/s  "
                  f"XLA {_fmt(out.xla_gb, '.2f')} GB  RSS {_fmt(out.rss_gb, '.2f')} GB  "
                  f"(wall {_fmt(out.wall_s, '.0f')}s)", flush=True)

    def sps(o: Outcome) -> str:
        if o.ok:
            return f"{o.steps_per_s:.4g}" + ("*" if o.n_timed == 0 else "")
        return o.status.split(":")[0].split(" (")[0][:12]

    header = (f"{'batch':>6} | {'ours steps/s':>12} | {'MJX steps/s':>12} | {'ratio':>6} | {'ours comp s':>11} | "
              f"{'MJX comp s':>10} | {'comp ratio':>10} | {'ours RSS GB':>11} | {'MJX RSS GB':>10} | "
              f"{'max|dqpos|':>10} | {'max|dqvel|':>10}")
    print(f"\n{name} (T={steps}, {args.dtype}):")
    print(header)
    print("-" * len(header))
    notes = []
    for batch in args.batch:
        a, b = results.get(("ours", batch), Outcome()), results.get(("mjx", batch), Outcome())
        ratio = a.steps_per_s / b.steps_per_s if a.ok and b.ok else float("nan")
        cratio = a.compile_s / b.compile_s
        dq = dv = float("nan")
        if a.ok and b.ok:
            dq = float(np.max(np.abs(a.arrays["qpos"] - b.arrays["qpos"])))
            dv = float(np.max(np.abs(a.arrays["qvel"] - b.arrays["qvel"])))
        print(f"{batch:>6} | {sps(a):>12} | {sps(b):>12} | {_fmt(ratio, '6.2f'):>6} | {_fmt(a.compile_s, '.2f'):>11} | "
              f"{_fmt(b.compile_s, '.2f'):>10} | {_fmt(cratio, '.2f'):>10} | {_fmt(a.rss_gb, '.2f'):>11} | "
              f"{_fmt(b.rss_gb, '.2f'):>10} | {_fmt(dq, '.2e'):>10} | {_fmt(dv, '.2e'):>10}")
        for sim, o in (("ours", a), ("MJX", b)):
            if not o.ok:
                notes.append(f"B={batch} {sim}: {o.status}")
    for n in notes:
        print(f"   note: {n}")

    a, b = results.get(("ours", 1)), results.get(("mjx", 1))
    if a is not None and b is not None and (a.ok or b.ok):
        ref = mujoco_reference(name, steps, args.seed)
        parts = [f"sanity at B=1 after {steps} steps: max|qpos - qpos_MuJoCo-C(float64)|:"]
        for sim, o in (("ours", a), ("MJX", b)):
            parts.append(f"{sim} {_fmt(float(np.max(np.abs(o.arrays['qpos'][0] - ref))), '.2e')}" if o.ok else f"{sim} -")
        if a.ok and b.ok:
            parts.append(f"| ours vs MJX {float(np.max(np.abs(a.arrays['qpos'][0] - b.arrays['qpos'][0]))):.2e}")
        parts.append(f"| max|qpos_C - qpos_start| {float(np.max(np.abs(ref - load_model(name)[1]))):.2e}")
        print("   " + " ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"subset of: {' '.join(MODELS)}")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 256, 4096], help="batch sizes (default 1 16 256 4096)")
    parser.add_argument("--steps", type=int, default=100, help="rollout horizon T (default 100)")
    parser.add_argument("--pile-steps", type=int, default=None, help="T for the cube pile (default: --steps)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steady-state calls per measurement (default 3)")
    parser.add_argument("--budget", type=float, default=120.0, help="run-time seconds per configuration, compile excluded (default 120)")
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    parser.add_argument("--max-mem-gb", type=float, default=round(0.5 * avail, 1),
                        help="skip configurations whose XLA buffers exceed this (default: half the free memory)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sims", nargs="+", choices=SIMS, default=list(SIMS), help="simulators to run (default both)")
    parser.add_argument("--options", default="{}", help='ours: jsn.from_mujoco overrides as JSON, e.g. \'{"grad_mode": "unroll"}\'')
    parser.add_argument("--in-process", action="store_true", help="no child processes (no hard timeouts)")
    parser.add_argument("--_worker", choices=SIMS, help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        return worker_main(args)
    args.batch = sorted(set(args.batch))

    import jax
    import mujoco

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    # a GPU call's time is far from linear in B until the device is full (H100, capped pile: 15 s
    # estimated at B=256 from B=1): there only memory and the child's hard time limit skip a batch
    args.time_estimate = jax.default_backend() == "cpu"
    version = package_version
    print(f"devices: {jax.devices()} ({os.cpu_count()} CPUs)")
    print(f"jax {jax.__version__}, jaxlib {version('jaxlib')}, mujoco {mujoco.__version__}, "
          f"mujoco-mjx {version('mujoco-mjx')}, jaxsim_ncp {version('jaxsim_ncp')}, dtype={args.dtype}")
    print(f"budget {args.budget:.0f}s per configuration, max XLA memory {args.max_mem_gb} GB, repeats {args.repeats}, "
          f"{'in-process' if args.in_process else 'one child process per configuration'}")
    print("ratio = ours/MJX throughput (>1: ours faster); comp ratio = ours/MJX compile time (<1: ours faster);")
    print("'*' = only the warm-up call fitted the budget and is the measurement; RSS = peak of the process;")
    print("max|dqpos|, max|dqvel|: final-state difference ours vs MJX over all worlds")
    if args.in_process:
        jax.block_until_ready(jax.jit(lambda x: x + 1)(jax.numpy.zeros(3)))  # keep XLA start-up out of compile times
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            bench_model(args, name, tmp)


if __name__ == "__main__":
    main()
