"""`jaxsim-ncp` command: demo (the main job of `make demo`), simulate, sysid, mpc, bench.

Each run writes its CSVs, plots and GIFs into a fresh run folder whose path it prints."""

from __future__ import annotations

import argparse
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np


def demo(batch: int, steps: int, opt_iters: int, out: pathlib.Path) -> None:
    """Batched rollouts (throughput), a rollout gradient checked by finite differences, and a
    gradient-based trajectory optimisation of the arm's fingertip; writes a plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optax

    import jaxsim_ncp as jsn
    from jaxsim_ncp.control import model_path

    model = jsn.load_mjcf(model_path("arm"))
    data = jsn.make_data(model)
    print(f"model: arm (nq={model.nq}, nv={model.nv}, nu={model.nu}), integrator={model.opt.integrator}, "
          f"dt={float(model.opt.timestep):g}, dtype={model.dtype.name}, device={jax.devices()[0]}")

    # 1. a vmapped batch of rollouts under random sinusoidal controls
    rng = np.random.default_rng(0)
    t = np.arange(steps) * float(model.opt.timestep)
    amp = rng.uniform(0.2, 1.0, size=(batch, 1, model.nu))
    freq = rng.uniform(0.5, 3.0, size=(batch, 1, model.nu))
    ctrl = jnp.asarray(amp * np.sin(2 * np.pi * freq * t[None, :, None]), dtype=model.dtype)
    run = jsn.batched(lambda u: jsn.rollout(model, data, u), tile=jsn.tile_for(model))  # split over the devices (cores)
    start = time.perf_counter()
    final, traj = jax.block_until_ready(run(ctrl))
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    final, traj = jax.block_until_ready(run(ctrl))
    run_s = time.perf_counter() - start
    print(f"batch rollout: {batch} worlds x {steps} steps on {jax.device_count()} device(s): "
          f"first call (compile + run) {compile_s:.2f} s, then {run_s * 1e3:.1f} ms = {batch * steps / run_s:,.0f} steps/s; "
          f"diverged worlds: {int(np.sum(np.asarray(final.diverged)))}")

    # 2. gradient of a rollout loss: fingertip distance to a target, w.r.t. the control sequence
    tip = model.topology.body_names.index("finger")
    target = jnp.asarray([0.3, 0.3, 0.6], dtype=model.dtype)

    def loss(u):
        end, _ = jsn.rollout(model, data, u)
        end = jsn.forward(model, end)
        return jnp.sum((end.xpos[tip] - target) ** 2) + 1e-4 * jnp.mean(u**2)

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    u0 = jnp.zeros((steps, model.nu), model.dtype)
    value, grad = value_and_grad(u0)
    direction = jnp.asarray(rng.normal(size=u0.shape), dtype=model.dtype)
    eps = 1e-2 if model.dtype == jnp.float32 else 1e-5
    fd = (loss(u0 + eps * direction) - loss(u0 - eps * direction)) / (2 * eps)
    print(f"rollout loss {float(value):.4f}; |grad| = {float(jnp.linalg.norm(grad)):.4e}; "
          f"directional derivative: autodiff {float(jnp.vdot(grad, direction)):.5f} vs central FD {float(fd):.5f}")

    # 3. a few Adam steps on the controls (gradient-based trajectory optimisation)
    optimizer = optax.adam(0.05)
    state = optimizer.init(u0)
    u, losses = u0, []
    for _ in range(opt_iters):
        value, grad = value_and_grad(u)
        updates, state = optimizer.update(grad, state)
        u = optax.apply_updates(u, updates)
        losses.append(float(value))
    print(f"trajectory optimisation: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {opt_iters} Adam steps")

    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for world in range(min(batch, 8)):
        axes[0].plot(t, np.asarray(traj.qpos[world, :, 1]), lw=1)
    axes[0].set(xlabel="time [s]", ylabel="shoulder angle [rad]", title=f"{min(batch, 8)} of {batch} batched worlds")
    axes[1].semilogy(losses)
    axes[1].set(xlabel="Adam iteration", ylabel="fingertip loss", title="gradient-based control")
    fig.tight_layout()
    path = out / "demo.png"
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def _run_folder(args, kind: str) -> pathlib.Path:
    from .workflows import run_folder

    out = run_folder(args.out, kind)
    print(f"run folder: {out}")
    return out


def main(argv: list[str] | None = None, cpu_cores: bool | None = None) -> None:
    """Parse and run a subcommand; a bad config, model file or value exits with one line
    naming the problem (status 2). cpu_cores: first give JAX's CPU a device per core
    (`use_cpu_cores`: the batched commands then run a share of the worlds on each); by default
    only as the `jaxsim-ncp` command (argv None), not inside a Python process that uses JAX itself."""
    from . import workflows
    from .io import MJCFError
    from .types import UnsupportedFeatureError

    parser = argparse.ArgumentParser(prog="jaxsim-ncp", description="jaxsim_ncp: simulate, identify, control.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser("demo", help="batched rollouts, a rollout gradient and a plot")
    demo_parser.add_argument("--batch", type=int, default=256)
    demo_parser.add_argument("--steps", type=int, default=500)
    demo_parser.add_argument("--opt-iters", type=int, default=40)
    demo_parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"))

    sim = sub.add_parser("simulate", help="batched rollout of an MJCF model: states.csv and rollout.gif")
    sim.add_argument("model", help="MJCF file, or a bundled model name (arm, billiards, cube, humanoid, pusher)")
    sim.add_argument("--batch", type=int, default=4)
    sim.add_argument("--steps", type=int, default=200)
    sim.add_argument("--ctrl", choices=("zero", "random"), default="random", help="controls: zero or smooth random")
    sim.add_argument("--video-worlds", type=int, default=4, help="worlds tiled in the video")
    sim.add_argument("--solver", choices=("newton", "cg", "ncp"), default=None, help="default: the MJCF's option/solver")
    sim.add_argument("--key", default="", help="start at this <keyframe> (name or index; default: qpos0)")
    sim.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs"), help="parent of the run folder")

    for name, text in (("sysid", "fit model parameters to recorded trajectories (configs/sysid_cube.toml)"),
                       ("mpc", "gradient MPC vs predictive sampling on a task (configs/mpc_pusher.toml)")):  # fmt: skip
        p = sub.add_parser(name, help=text)
        p.add_argument("config", help="TOML config file")
        p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs"), help="parent of the run folder")

    bench = sub.add_parser("bench", help="steps/s and compile time vs batch, gradient time and memory vs horizon, "
                                         "side by side with MJX")
    bench.add_argument("--models", nargs="+", default=["cube", "humanoid"],
                       help="bundled model names, MJCF paths, or the scenes pile and humanoids4 (workflows.BENCH_SCENES)")
    bench.add_argument("--batch", type=int, nargs="*", default=[1, 64, 1024], help="forward part (none: skip it)")
    bench.add_argument("--steps", type=int, default=100)
    bench.add_argument("--horizons", type=int, nargs="*", default=[10, 100, 1000],
                       help="gradient part: rollout horizons (none: skip the part)")
    bench.add_argument("--compile-repeats", type=int, default=2,
                       help="one step's compile time: fastest of this many compiles from cold jit caches (0: skip)")
    bench.add_argument("--no-mjx", action="store_true", help="skip the MJX comparison")
    bench.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs"), help="parent of the run folder")
    args = parser.parse_args(argv)
    if cpu_cores is None:
        cpu_cores = argv is None
    if cpu_cores:
        from .parallel import use_cpu_cores

        use_cpu_cores()

    try:
        if args.command == "demo":
            demo(args.batch, args.steps, args.opt_iters, args.out)
        elif args.command == "simulate":
            overrides = {"solver": args.solver} if args.solver else {}
            out = _run_folder(args, "simulate")
            workflows.simulate(args.model, out, overrides, batch=args.batch, steps=args.steps, ctrl=args.ctrl,
                               video_worlds=args.video_worlds, key=args.key)  # fmt: skip
        elif args.command in ("sysid", "mpc"):
            config = workflows.load_config(args.config)
            out = _run_folder(args, args.command)
            getattr(workflows, args.command)(config, out)
        elif args.command == "bench":
            out = _run_folder(args, "bench")
            if args.batch:
                workflows.bench(args.models, args.batch, args.steps, out, mjx=not args.no_mjx,
                                compile_repeats=args.compile_repeats)
            if args.horizons:
                workflows.bench_gradient(args.models, args.horizons, out, mjx=not args.no_mjx)
        if args.command != "demo":
            print(f"outputs in {out}")
    except (workflows.ConfigError, MJCFError, UnsupportedFeatureError, FileNotFoundError) as err:
        message = " ".join(str(err).split())  # one line, even for MuJoCo's multi-line parser errors
        parser.exit(2, f"jaxsim-ncp {args.command}: error: {message}\n")


if __name__ == "__main__":
    main()
