"""A point mass bouncing off a wall (DiffMJX Fig. 4): fixed-step vs adaptive gradients, against the analytic ones.

A small sphere on a vertical slide joint, no gravity, starts at height q0 moving down at
v0 = -1 m/s and hits the floor. The contact is MuJoCo's soft contact without damping:
direct solref (-K, 0) and solimp (0, dmax, width, 0.5, 2), so with gap r < 0 the
acceleration is a = (1 - d) a0 + d aref = -(K / dmax^2) d(r)^2 r (Computation chapter),
a conservative force that grows smoothly from zero at first touch (d(0) = mjMINIMP). The
bounce is elastic and lasts a fixed time tau (quadrature below), so after time T

    q_T = radius + T - (q0 - radius) - tau,   loss = |q_T - 1|,
    d loss / d q0 = -sign(q_T - 1)             (the wall reflects a shift in q0).

Semi-implicit Euler at a fixed step differentiates its own discretization: the gradient
oscillates with q0 (time of impact relative to the step grid) and only shrinks its error
with the step; the adaptive integrator (Tsit5 + PID, `integrator="adaptive"`) resolves the
impact and follows the analytic curve.

The force must start from zero for that: with a flat impedance (a linear spring, force
K r: continuous, its slope jumps at r = 0) or MuJoCo's default dmin = 0.9 with damping
(the force itself jumps at first touch) the embedded error estimate does not see the
switch inside a step, and the derivative of the adaptive solution (step sizes held
fixed, as Diffrax does) is off by O(1) like the fixed-step one (`--solimp-dmin 0.9`).

    .venv/bin/python experiments/bounce_toy.py            # writes experiments/results/bounce_toy.{csv,png}
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsim_ncp as jsn

jax.config.update("jax_enable_x64", True)

RADIUS, K, DMAX, WIDTH, DURATION = 0.01, 1e4, 0.95, 0.01, 1.0
MINIMP = 1e-4  # mjMINIMP: MuJoCo's floor of every impedance
RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def xml(dmin: float) -> str:
    contact = f'condim="1" solref="-{K} 0" solimp="{dmin} {DMAX} {WIDTH} 0.5 2"'
    return f"""
<mujoco>
  <option timestep="0.01" gravity="0 0 0"/>
  <worldbody>
    <geom type="plane" size="1 1 .1" {contact}/>
    <body><joint name="z" type="slide" axis="0 0 1"/><geom type="sphere" size="{RADIUS}" mass="1" {contact}/></body>
  </worldbody>
</mujoco>
"""


def contact_time(dmin: float, dt: float = 1e-7) -> float:
    """tau: the time the bounce takes (RK4 on r'' = -(K / dmax^2) d(r)^2 r from r = 0, v = -1, to v = 0, doubled)."""

    def impedance(r):  # MuJoCo's spline (midpoint 0.5, power 2), from max(dmin, MINIMP) at r = 0 to DMAX at |r| = WIDTH
        x = min(abs(r) / WIDTH, 1.0)
        y = 2 * x * x if x <= 0.5 else 1 - 2 * (1 - x) ** 2
        lo = max(dmin, MINIMP)
        return lo + y * (DMAX - lo)

    acc = lambda r: -(K / DMAX**2) * impedance(r) ** 2 * r if r < 0 else 0.0  # noqa: E731
    r, v, t = 0.0, -1.0, 0.0
    while v < 0:
        k1r, k1v = v, acc(r)
        k2r, k2v = v + 0.5 * dt * k1v, acc(r + 0.5 * dt * k1r)
        k3r, k3v = v + 0.5 * dt * k2v, acc(r + 0.5 * dt * k2r)
        k4r, k4v = v + dt * k3v, acc(r + dt * k3r)
        r, v, t = r + dt * (k1r + 2 * k2r + 2 * k3r + k4r) / 6, v + dt * (k1v + 2 * k2v + 2 * k3v + k4v) / 6, t + dt
    return 2 * t


def analytic(q0: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Loss and d loss / d q0 of the elastic bounce (valid while the bounce ends before DURATION)."""
    q_final = RADIUS + DURATION - (q0 - RADIUS) - tau
    return np.abs(q_final - 1.0), -np.sign(q_final - 1.0)


def simulated(model_xml: str, integrator: str, dt: float, q0: np.ndarray, **overrides) -> tuple[np.ndarray, np.ndarray, float]:
    """Loss and gradient over a batch of start heights (vmapped), and the wall time."""
    model = jsn.load_mjcf(model_xml, integrator=integrator, timestep=dt, **overrides)
    steps = int(round(DURATION / dt))

    def loss(start):
        data = jsn.make_data(model)
        data = data.replace(qpos=jnp.reshape(start, (1,)), qvel=jnp.full((1,), -1.0))
        final, _ = jsn.rollout(model, data, jnp.zeros((steps, 0)))
        return jnp.abs(final.qpos[0] - 1.0)

    run = jax.jit(jax.vmap(jax.value_and_grad(loss)))
    t = time.perf_counter()
    value, grad = run(jnp.asarray(q0))
    value.block_until_ready()
    return np.asarray(value), np.asarray(grad), time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=200, help="start heights between 0.1 and 0.6 m")
    parser.add_argument("--dts", type=float, nargs="+", default=[0.01, 0.003, 0.001], help="fixed (Euler) steps")
    parser.add_argument("--rtols", type=float, nargs="+", default=[1e-6, 1e-8], help="adaptive tolerances (rtol = atol)")
    parser.add_argument("--solimp-dmin", type=float, default=0.0, help="impedance at first touch (MuJoCo's default: 0.9)")
    args = parser.parse_args()

    q0 = np.linspace(0.1, 0.6, args.points)
    tau = contact_time(args.solimp_dmin)
    loss_ref, grad_ref = analytic(q0, tau)
    model_xml = xml(args.solimp_dmin)
    print(f"solimp dmin {args.solimp_dmin}: the bounce lasts {tau * 1e3:.2f} ms")
    columns = {"q0": q0, "loss_analytic": loss_ref, "grad_analytic": grad_ref}
    runs = [(f"euler_dt{dt:g}", "euler", dt, {}) for dt in args.dts]
    runs += [(f"adaptive_rtol{tol:g}", "adaptive", 0.01, dict(rtol=tol, atol=tol)) for tol in args.rtols]
    print(f"{'method':>22} {'max |loss err|':>15} {'max |grad err|':>15} {'mean |grad err|':>16} {'sign flips':>11} {'time s':>8}")
    for name, integrator, dt, overrides in runs:
        loss, grad, seconds = simulated(model_xml, integrator, dt, q0, **overrides)
        columns[f"loss_{name}"], columns[f"grad_{name}"] = loss, grad
        err = np.abs(grad - grad_ref)
        flips = int(np.sum(np.sign(grad) != np.sign(grad_ref)))
        print(f"{name:>22} {np.max(np.abs(loss - loss_ref)):15.3e} {np.max(err):15.3e} {np.mean(err):16.3e} {flips:11d} {seconds:8.1f}")

    RESULTS.mkdir(exist_ok=True)
    stem = "bounce_toy" if args.solimp_dmin == 0 else f"bounce_toy_dmin{args.solimp_dmin:g}"
    with open(RESULTS / f"{stem}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values()))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_grad) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for key in columns:
        if key == "q0":
            continue
        kind, name = key.split("_", 1)
        ax = ax_loss if kind == "loss" else ax_grad
        style = dict(color="k", lw=2.5, ls="--") if name == "analytic" else dict(lw=1)
        ax.plot(q0, columns[key], label=name, **style)
    ax_loss.set_ylabel("loss |q_T - 1|")
    ax_grad.set_ylabel("d loss / d q0 (symlog)")
    ax_grad.set_yscale("symlog", linthresh=1.0)  # the coarse fixed steps reach +-100
    ax_grad.set_xlabel("start height q0 (m)")
    ax_loss.legend(fontsize=8)
    ax_loss.set_title(f"point mass bouncing off a wall (solimp dmin {args.solimp_dmin:g}): fixed-step vs adaptive")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)
    print(f"wrote {RESULTS / stem}.csv and .png")


if __name__ == "__main__":
    main()
