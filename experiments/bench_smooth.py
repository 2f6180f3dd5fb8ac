"""Contact-free batched rollout benchmark: jaxsim_ncp side by side with MJX.

For each model (the bundled 5-dof arm and a contact-free humanoid-sized chain built
below) and each batch size B, both simulators run the same jitted, vmapped rollout of
T Euler steps in float32 on the same MuJoCo model, from the same random initial qvel
perturbation and with the same random controls:

  * jaxsim_ncp: ``jsn.rollout`` (a ``lax.scan`` over ``jsn.step``);
  * MJX:        a ``lax.scan`` over ``mjx.step`` with ``ctrl`` set each step.

Both rollouts take the model as a (non-batched) argument and return the final
(qpos, qvel) of every world. Measured per model and batch size:

  * compile time: wall time of ``jax.jit(...).lower(...).compile()`` (trace + lower + XLA
    compile) for that batch shape;
  * throughput: B*T / median wall time of ``--repeats`` steady-state calls (after one
    warm-up call), each ended with ``jax.block_until_ready``;
  * sanity check: max |qpos_ours - qpos_mjx| (and qvel) over all worlds at the end of
    the rollout; float32, so differences around 1e-3 are expected.

Run from the repository root:

    .venv/bin/python experiments/bench_smooth.py                 # batch 1 64 1024, T=100
    .venv/bin/python experiments/bench_smooth.py --quick         # batch 1 64, T=50
    .venv/bin/python experiments/bench_smooth.py --batch 1 64 1024 4096 --steps 200

(MJX prints harmless "Failed to import warp" messages on import.)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from mujoco import mjx

import jaxsim_ncp as jsn

# A contact-free humanoid-sized tree: 16 bodies, free root, ball joints at neck, shoulders
# and hips, hinges elsewhere (two on the abdomen body), motors on all hinges.
# nq = 38, nv = 32, nu = 11.
HUMANOID_CHAIN_XML = """
<mujoco model="humanoid_chain">
  <option timestep="0.002" integrator="Euler"/>
  <default>
    <geom contype="0" conaffinity="0" type="capsule" size="0.05"/>
    <joint damping="0.5" armature="0.02"/>
    <motor gear="20" ctrlrange="-1 1"/>
  </default>
  <worldbody>
    <body name="torso" pos="0 0 1.4">
      <freejoint name="root"/>
      <geom fromto="0 -0.07 0 0 0.07 0" size="0.07"/>
      <body name="head" pos="0 0 0.19">
        <joint name="neck" type="ball"/>
        <geom type="sphere" pos="0 0 0.09" size="0.09"/>
      </body>
      <body name="abdomen" pos="0 0 -0.26">
        <joint name="abdomen_y" type="hinge" axis="0 1 0"/>
        <joint name="abdomen_z" type="hinge" axis="0 0 1"/>
        <geom fromto="0 -0.06 0 0 0.06 0" size="0.06"/>
        <body name="pelvis" pos="0 0 -0.16">
          <joint name="abdomen_x" type="hinge" axis="1 0 0"/>
          <geom fromto="0 -0.07 0 0 0.07 0" size="0.09"/>
          <body name="thigh_r" pos="0 -0.1 -0.04">
            <joint name="hip_r" type="ball"/>
            <geom fromto="0 0 0 0 0.01 -0.34"/>
            <body name="shin_r" pos="0 0.01 -0.4">
              <joint name="knee_r" type="hinge" axis="0 -1 0"/>
              <geom fromto="0 0 0 0 0 -0.3" size="0.049"/>
              <body name="foot_r" pos="0 0 -0.35">
                <joint name="ankle_r" type="hinge" axis="0 1 0"/>
                <geom fromto="-0.07 0 0 0.14 -0.02 0" size="0.027"/>
              </body>
            </body>
          </body>
          <body name="thigh_l" pos="0 0.1 -0.04">
            <joint name="hip_l" type="ball"/>
            <geom fromto="0 0 0 0 -0.01 -0.34"/>
            <body name="shin_l" pos="0 -0.01 -0.4">
              <joint name="knee_l" type="hinge" axis="0 -1 0"/>
              <geom fromto="0 0 0 0 0 -0.3" size="0.049"/>
              <body name="foot_l" pos="0 0 -0.35">
                <joint name="ankle_l" type="hinge" axis="0 1 0"/>
                <geom fromto="-0.07 0 0 0.14 0.02 0" size="0.027"/>
              </body>
            </body>
          </body>
        </body>
      </body>
      <body name="upper_arm_r" pos="0 -0.17 0.06">
        <joint name="shoulder_r" type="ball"/>
        <geom fromto="0 0 0 0.16 -0.16 -0.16" size="0.04"/>
        <body name="lower_arm_r" pos="0.18 -0.18 -0.18">
          <joint name="elbow_r" type="hinge" axis="0 -1 1"/>
          <geom fromto="0.01 0.01 0.01 0.17 0.17 0.17" size="0.031"/>
          <body name="hand_r" pos="0.18 0.18 0.18">
            <joint name="wrist_r" type="hinge" axis="1 1 1"/>
            <geom type="sphere" size="0.04"/>
          </body>
        </body>
      </body>
      <body name="upper_arm_l" pos="0 0.17 0.06">
        <joint name="shoulder_l" type="ball"/>
        <geom fromto="0 0 0 0.16 0.16 -0.16" size="0.04"/>
        <body name="lower_arm_l" pos="0.18 0.18 -0.18">
          <joint name="elbow_l" type="hinge" axis="0 -1 -1"/>
          <geom fromto="0.01 -0.01 0.01 0.17 -0.17 0.17" size="0.031"/>
          <body name="hand_l" pos="0.18 -0.18 0.18">
            <joint name="wrist_l" type="hinge" axis="1 -1 1"/>
            <geom type="sphere" size="0.04"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="abdomen_y"/>
    <motor joint="abdomen_z"/>
    <motor joint="abdomen_x"/>
    <motor joint="knee_r"/>
    <motor joint="ankle_r" gear="10"/>
    <motor joint="knee_l"/>
    <motor joint="ankle_l" gear="10"/>
    <motor joint="elbow_r" gear="10"/>
    <motor joint="wrist_r" gear="5"/>
    <motor joint="elbow_l" gear="10"/>
    <motor joint="wrist_l" gear="5"/>
  </actuator>
</mujoco>
"""

State = tuple[jax.Array, jax.Array]  # (qpos, qvel), batched


@dataclass(frozen=True)
class Simulator:
    """One simulator's view of a model: a single-world initial Data and a rollout."""

    name: str
    model: Any  # pytree passed (un-batched) to `rollout`
    data0: Any  # single-world Data pytree with .replace(qvel=...)
    rollout: Callable[[Any, Any, jax.Array], tuple[jax.Array, jax.Array]]  # (model, data, ctrl (T, nu)) -> (qpos, qvel)


def jaxsim_simulator(mj_model: mujoco.MjModel) -> Simulator:
    model = jsn.from_mujoco(mj_model, integrator="euler")

    def rollout(model: jsn.Model, data: jsn.Data, ctrl: jax.Array) -> tuple[jax.Array, jax.Array]:
        final, _ = jsn.rollout(model, data, ctrl)
        return final.qpos, final.qvel

    return Simulator("jaxsim_ncp", model, jsn.make_data(model), rollout)


def mjx_simulator(mj_model: mujoco.MjModel) -> Simulator:
    mx = mjx.put_model(mj_model)

    def rollout(mx: mjx.Model, data: mjx.Data, ctrl: jax.Array) -> tuple[jax.Array, jax.Array]:
        def body(d: mjx.Data, u: jax.Array) -> tuple[mjx.Data, None]:
            return mjx.step(mx, d.replace(ctrl=u)), None

        final, _ = jax.lax.scan(body, data, ctrl)
        return final.qpos, final.qvel

    return Simulator("MJX", mx, mjx.make_data(mx), rollout)


@dataclass
class Result:
    compile_s: float
    steps_per_s: float
    qpos: np.ndarray
    qvel: np.ndarray


def run(sim: Simulator, qvel0: np.ndarray, ctrl: np.ndarray, repeats: int) -> Result:
    """Compile and time sim's vmapped rollout on B worlds (qvel0: (B, nv), ctrl: (B, T, nu))."""
    batch, steps = ctrl.shape[:2]
    data = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), sim.data0)
    data = data.replace(qvel=jnp.asarray(qvel0, sim.data0.qvel.dtype))
    ctrl = jnp.asarray(ctrl, sim.data0.ctrl.dtype)
    fn = jax.jit(jax.vmap(sim.rollout, in_axes=(None, 0, 0)))

    t0 = time.perf_counter()
    compiled = fn.lower(sim.model, data, ctrl).compile()
    compile_s = time.perf_counter() - t0

    out = jax.block_until_ready(compiled(sim.model, data, ctrl))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(sim.model, data, ctrl))
        times.append(time.perf_counter() - t0)
    qpos, qvel = (np.asarray(x) for x in out)
    return Result(compile_s, batch * steps / statistics.median(times), qpos, qvel)


def load_models() -> dict[str, mujoco.MjModel]:
    arm_path = importlib.resources.files("jaxsim_ncp") / "models" / "arm.xml"
    arm = mujoco.MjModel.from_xml_path(str(arm_path))
    arm.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER  # the bundled arm uses implicitfast
    humanoid = mujoco.MjModel.from_xml_string(HUMANOID_CHAIN_XML)
    return {"arm": arm, "humanoid_chain": humanoid}


def bench_model(name: str, mj_model: mujoco.MjModel, batches: list[int], steps: int, repeats: int, seed: int) -> None:
    print(f"\n== {name}: nq={mj_model.nq} nv={mj_model.nv} nu={mj_model.nu} nbody={mj_model.nbody} "
          f"dt={mj_model.opt.timestep} integrator=Euler T={steps} ==")
    ours, theirs = jaxsim_simulator(mj_model), mjx_simulator(mj_model)
    header = (f"{'batch':>6} | {'ours steps/s':>12} | {'MJX steps/s':>12} | {'ratio':>6} | "
              f"{'ours comp s':>11} | {'MJX comp s':>10} | {'comp ratio':>10} | {'max|dqpos|':>10} | {'max|dqvel|':>10}")
    print(header)
    print("-" * len(header))
    for batch in batches:
        rng = np.random.default_rng(seed)
        qvel0 = 0.1 * rng.standard_normal((batch, mj_model.nv)).astype(np.float32)
        ctrl = rng.uniform(-1.0, 1.0, (batch, steps, mj_model.nu)).astype(np.float32)
        a = run(ours, qvel0, ctrl, repeats)
        b = run(theirs, qvel0, ctrl, repeats)
        dqpos = float(np.max(np.abs(a.qpos - b.qpos)))
        dqvel = float(np.max(np.abs(a.qvel - b.qvel)))
        print(f"{batch:>6} | {a.steps_per_s:>12.4g} | {b.steps_per_s:>12.4g} | {a.steps_per_s / b.steps_per_s:>6.2f} | "
              f"{a.compile_s:>11.2f} | {b.compile_s:>10.2f} | {a.compile_s / b.compile_s:>10.2f} | "
              f"{dqpos:>10.2e} | {dqvel:>10.2e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64, 1024], help="batch sizes (default 1 64 1024)")
    parser.add_argument("--steps", type=int, default=100, help="rollout horizon T (default 100)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steady-state calls per measurement (default 5)")
    parser.add_argument("--models", nargs="+", default=["arm", "humanoid_chain"], help="subset of: arm humanoid_chain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="batch 1 and 64 with T=50 only")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.steps = [1, 64], 50

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    print(f"devices: {jax.devices()}")
    print(f"jax {jax.__version__}, jaxlib {version('jaxlib')}, mujoco {mujoco.__version__}, "
          f"mujoco-mjx {version('mujoco-mjx')}, jaxsim_ncp {version('jaxsim_ncp')}, "
          f"x64={jax.config.jax_enable_x64}")
    print("ratio = ours/MJX throughput (>1: ours faster); comp ratio = ours/MJX compile time (<1: ours faster);")
    print("max|dqpos|, max|dqvel|: final-state difference ours vs MJX over all worlds")

    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(3)))  # keep one-time XLA start-up out of compile times
    models = load_models()
    for name in args.models:
        bench_model(name, models[name], args.batch, args.steps, args.repeats, args.seed)


if __name__ == "__main__":
    main()
