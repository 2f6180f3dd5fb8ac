"""Smoothed gradients of the hard-contact NCP solver across a contact switch (Dojo, Fig. 4).

Scene: a sphere (radius 0.1 m, 1 kg, free joint, default friction) above a plane,
released at rest from height z0 (of its center) and simulated for T steps of dt = 0.01
(semi-implicit Euler). Loss: the final height z_T. Input: z0, swept over an interval
that crosses the switch from "touches the plane during the horizon" (low z0: the sphere
lands and rests, z_T = 0.1, dL/dz0 = 0) to "never touches" (high z0: free fall,
z_T = z0 - const, dL/dz0 = 1). The loss is continuous with a kink at the switch.

The forward pass is the hard solve (solver="ncp", kappa = 1e-8) for every model; only the
reverse pass changes with kappa_grad, the central-path point the implicit function
theorem is applied at. For each kappa_grad (default 1e-8 (= kappa: the exact derivative
of the forward pass), 1e-6, 1e-4, 1e-2) the script builds its own model (kappa_grad is a
static option, so each one is its own compile) and evaluates one jitted
`jax.vmap(jax.value_and_grad(loss))` over the whole sweep. Central finite differences
of the forward loss, (L(z0 + eps) - L(z0 - eps)) / (2 eps), are the reference; the
shifted inputs ride in the same vmapped batch (no extra compile), and the losses of all
models are compared (the forward result must not depend on kappa_grad).

What to expect: with kappa_grad = kappa the gradient is the piecewise-constant 1 / 0 and
matches FD everywhere except at the switch itself; with larger kappa_grad the gradient
blends from 1 to 0 over a band of inputs on both sides of the switch: before contact the
relaxed problem already feels the plane (an impulse kappa_grad / gap), after contact it
is softer. The band is cut off by the contact lookahead: a contact outside the
detection range of a step (about 2 h |v| + h^2 |g| + 0.01 L) is inactive and adds
nothing to the gradient, whatever kappa_grad, so on the free side the relaxed gradient
jumps to exactly 1 where the last step's gap leaves that range (at kappa_grad = 1e-2 a
jump of about 1e-3, at z0 ~ 0.586 with the defaults). On the touching side the relaxed
gradient is a smooth negative bump (down to about -0.14 at kappa_grad = 1e-2) for
landings two or three steps before the end: in the relaxed problem a faster impact
leaves the sphere slightly lower, and it has not settled back by step T.

Observed with the defaults (float64, 2-core CPU): the forward losses of all models are
bitwise equal; at kappa_grad = kappa the gradient matches FD to about 1e-7 (free side
about 7e-9) away from the switch, with no NaN; it blends over 0.5551 < z0 < 0.5584 only
for the larger kappa_grad (1e-2: 0.26 on the last touching input, 0.87 on the first free
one, still 0.9988 at a closest approach of 2.8 cm).

Outputs (in experiments/results/): ncp_smoothing.csv (columns z0, loss, min_gap (the
closest approach of the sphere to the plane over the horizon), grad_kg<value> per
kappa_grad, grad_fd) and ncp_smoothing.png (loss and gradients versus z0; needs
matplotlib, otherwise only the CSV is written).

Run from the repository root (about 1.5 minutes per kappa_grad on a busy 2-core CPU,
mostly compile; about 5-6 minutes for the default four):

    .venv/bin/python experiments/ncp_smoothing.py
    .venv/bin/python experiments/ncp_smoothing.py --n 25 --kappa-grad 1e-8 1e-2   # quicker

Compile time: unless XLA_FLAGS is already set, the script sets
`--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true`, which
cuts the XLA compile of each model about 3x (the sweep itself runs in about a second
either way). `--passes` defaults to 1 (one NCP solve per step instead of the default 2):
the sphere translates without rotating, so the gap is exactly linear in the step and
the re-linearized second pass is never taken; this halves the traced program.
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import time

if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxsim_ncp as jsn  # noqa: E402

RADIUS = 0.1
XML = f"""
<mujoco model="ncp_smoothing">
  <option timestep="0.01" integrator="Euler"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="ball" pos="0 0 1">
      <freejoint/>
      <geom type="sphere" size="{RADIUS}" mass="1"/>
    </body>
  </worldbody>
</mujoco>
"""
KAPPA = 1e-8
RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def make_sweep_fn(kappa_grad: float, steps: int, passes: int):
    """jit(vmap(value_and_grad)) of z0 -> (z_T, min_t z_t - r) for one kappa_grad."""
    model = jsn.load_mjcf(XML, solver="ncp", kappa=KAPPA, kappa_grad=kappa_grad, ncp_passes=passes)
    data0 = jsn.make_data(model)
    ctrl = jnp.zeros((steps, model.nu))

    def loss(z0):
        data = data0.replace(qpos=data0.qpos.at[2].set(z0))
        final, traj = jsn.rollout(model, data, ctrl)
        min_gap = jnp.minimum(z0, jnp.min(traj.qpos[:, 2])) - RADIUS
        return final.qpos[2], jax.lax.stop_gradient(min_gap)

    return jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50, help="number of z0 values")
    parser.add_argument("--lo", type=float, default=0.48, help="lowest z0 (m)")
    parser.add_argument("--hi", type=float, default=0.64, help="highest z0 (m)")
    parser.add_argument("--steps", type=int, default=30, help="horizon T (steps of 0.01 s)")
    parser.add_argument("--kappa-grad", type=float, nargs="+", default=[1e-8, 1e-6, 1e-4, 1e-2])
    parser.add_argument("--eps", type=float, default=1e-6, help="finite-difference half step (m)")
    parser.add_argument("--passes", type=int, default=1, help="ncp_passes of the models")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    kgs = sorted(args.kappa_grad)
    if kgs[0] < KAPPA:
        parser.error(f"kappa_grad must be >= kappa = {KAPPA}")

    z0 = np.linspace(args.lo, args.hi, args.n)
    batch = jnp.asarray(np.concatenate([z0, z0 + args.eps, z0 - args.eps]))
    n = args.n
    grads, losses = {}, {}
    min_gap = None
    for kg in kgs:
        t = time.perf_counter()
        fn = make_sweep_fn(kg, args.steps, args.passes)
        (val, gap), grad = jax.block_until_ready(fn(batch))
        print(f"kappa_grad={kg:.0e}: compile + call {time.perf_counter() - t:.1f} s ({3 * n} rollouts of {args.steps} steps)")
        val, grad = np.asarray(val), np.asarray(grad)
        losses[kg], grads[kg] = val, grad[:n]
        if min_gap is None:
            min_gap = np.asarray(gap[:n])
    ref = losses[kgs[0]]
    loss = ref[:n]
    fd = (ref[n : 2 * n] - ref[2 * n :]) / (2 * args.eps)

    # --- summary ---------------------------------------------------------------------------
    touched = min_gap < 1e-6
    free = ~touched
    print(f"\nsweep z0 in [{args.lo}, {args.hi}] ({n} values), T = {args.steps}, forward kappa = {KAPPA:g}, FD eps = {args.eps:g}")
    if touched.any() and free.any():
        i_sw = int(np.argmax(free))  # first non-touching input (touching below)
        print(f"switch between z0 = {z0[i_sw - 1]:.4f} (touches) and {z0[i_sw]:.4f} (closest approach {min_gap[i_sw]:.2e} m)")
    else:
        i_sw = None
        print("WARNING: the sweep does not cross the contact switch")
    spread = max(float(np.max(np.abs(losses[kg] - ref))) for kg in kgs)
    print(f"forward loss, max |difference| across kappa_grad models: {spread:.1e}")
    rng = lambda x, fmt: f"[{x.min():{fmt}}, {x.max():{fmt}}]" if x.size else "(no inputs)"  # noqa: E731
    print(f"FD gradient: touching side in {rng(fd[touched], '.2e')}, free side in {rng(fd[free], '.6f')}")
    away = np.ones(n, bool)  # exclude the points whose FD stencil could straddle the switch
    if i_sw is not None:
        away[max(i_sw - 1, 0) : i_sw + 1] = False
    header = f"{'kappa_grad':>10} {'NaN':>4} {'max|g-FD| away':>15} {'@touch':>9} {'@free':>9} " \
             f"{'free: g<0.999 up to z0':>24} {'(gap)':>9} {'touch: |g|>1e-3 down to z0':>27}"
    print(header)
    for kg in kgs:
        g = grads[kg]
        nan = int(np.sum(~np.isfinite(g)))
        err = np.abs(g - fd)
        e_away = np.nanmax(err[away]) if away.any() else np.nan
        e_t = np.nanmax(err[touched & away]) if (touched & away).any() else np.nan
        e_f = np.nanmax(err[free & away]) if (free & away).any() else np.nan
        soft_free = free & (np.abs(g - 1.0) > 1e-3)
        reach_free = f"{z0[soft_free].max():.4f}" if soft_free.any() else "none"
        gap_free = f"{min_gap[soft_free].max():.2e}" if soft_free.any() else "-"
        soft_touch = touched & (np.abs(g) > 1e-3)
        reach_touch = f"{z0[soft_touch].min():.4f}" if soft_touch.any() else "none"
        print(f"{kg:>10.0e} {nan:>4d} {e_away:>15.2e} {e_t:>9.2e} {e_f:>9.2e} {reach_free:>24} {gap_free:>9} {reach_touch:>27}")
    if i_sw is not None:
        print("\ngradients at the inputs around the switch:")
        lo, hi = max(i_sw - 3, 0), min(i_sw + 4, n)
        print(f"{'z0':>8} {'gap':>9} {'loss':>9} " + " ".join(f"{kg:>9.0e}" for kg in kgs) + f" {'FD':>9}")
        for i in range(lo, hi):
            print(f"{z0[i]:>8.4f} {min_gap[i]:>9.2e} {loss[i]:>9.6f} " + " ".join(f"{grads[kg][i]:>9.5f}" for kg in kgs) + f" {fd[i]:>9.5f}")

    # --- outputs ---------------------------------------------------------------------------
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "ncp_smoothing.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["z0", "loss", "min_gap"] + [f"grad_kg{kg:.0e}" for kg in kgs] + ["grad_fd"])
        for i in range(n):
            w.writerow([f"{z0[i]:.6f}", f"{loss[i]:.10e}", f"{min_gap[i]:.6e}"] + [f"{grads[kg][i]:.10e}" for kg in kgs] + [f"{fd[i]:.10e}"])
    print(f"\nwrote {csv_path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written")
        return
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    ax0.plot(z0, loss, "k.-")
    ax0.set_ylabel("loss: final height $z_T$ (m)")
    ax0.set_title(f"sphere dropped from rest, T = {args.steps} steps of 0.01 s, forward kappa = {KAPPA:g}")
    cmap = plt.get_cmap("viridis")
    for j, kg in enumerate(kgs):
        label = f"kappa_grad = {kg:.0e}" + (" (= kappa, exact)" if kg == KAPPA else "")
        ax1.plot(z0, grads[kg], "-", color=cmap(j / max(len(kgs) - 1, 1)), label=label)
    ax1.plot(z0, fd, "rx", ms=5, label=f"central FD (eps = {args.eps:g})")
    if i_sw is not None:
        for ax in (ax0, ax1):
            ax.axvline(0.5 * (z0[i_sw - 1] + z0[i_sw]), color="gray", ls=":", lw=1)
    ax1.set_xlabel("initial height $z_0$ (m)")
    ax1.set_ylabel("$dz_T / dz_0$")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    png_path = args.out / "ncp_smoothing.png"
    fig.savefig(png_path, dpi=120)
    print(f"wrote {png_path}")


if __name__ == "__main__":
    main()
