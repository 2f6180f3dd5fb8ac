"""Re-run chosen scenes of a `fuzz.py` run in float64: is a float32 NaN gradient a defect or the
overflow of a derivative that really is that large? (`--dtype float32` replays them as run.)

    .venv/bin/python experiments/fuzz_recheck.py --seed 1084 --scenes 1000 --only 19 100 102

rebuilds the group `fuzz.py --seed 1084 --scenes 1000 --group 1000` drew (its first structure;
same scenes, same order; with `--make-group-seed S`, the group of that seed, as a FAIL line of a
`--one-structure` run prints it) and checks the listed scenes in float64 over `--steps` steps: finite or
not, and the gradient's norm. A float64 norm beyond float32's range (3.4e38), or near it, means
the float32 NaN came from an exploding derivative (an unstable linearization: |eig| > 1 per
step compounds over the horizon), not from a wrong formula.

With `--mujoco` each scene's energy rise is also triaged against MuJoCo C (float64): from the
start, and from our own state just before ours rises. Where MuJoCo C gains the same from our
state, the rise is the integrator's (explicit Euler and a fast-spinning thin body), not ours.
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import fuzz
import jaxsim_ncp as jsn


@functools.partial(jax.jit, static_argnums=3)
@functools.partial(jax.vmap, in_axes=(0, 0, 0, None))
def _trajectory(model: jsn.Model, qpos, qvel, steps: int):
    """(qpos, qvel, energy) at each state of a forward rollout, the start included."""
    data = jsn.make_data(model).replace(qpos=qpos, qvel=qvel)
    _, traj = jsn.rollout(model, data, jnp.zeros((steps, model.nu), model.dtype))
    qpos, qvel = jnp.concatenate([qpos[None], traj.qpos]), jnp.concatenate([qvel[None], traj.qvel])
    return qpos, qvel, jax.vmap(lambda q, v: fuzz.energy(model, data.replace(qpos=q, qvel=v)))(qpos, qvel)


def _mujoco_triage(group: fuzz.Group, names, steps: int, window: int = 16) -> None:
    """Each scene's energy in MuJoCo C (float64): from the start, and from our own state `window`
    steps before ours first rises beyond the tolerance (the same steps, side by side). Ours is a
    forward replay of the whole group (its batch, not the gradient program's): in float32 a chaotic
    scene can rise in one program and not in another."""
    dtype = group.model.dtype
    qpos, qvel, energies = jax.tree.map(np.asarray, _trajectory(group.model, jnp.asarray(group.qpos, dtype),
                                                                 jnp.asarray(group.qvel, dtype), steps))
    for k in range(len(group.xml)):
        mj, warned = fuzz.mujoco_energies(group.structure, group.xml[k], group.qpos[k], group.qvel[k], steps)
        print(f"scene {names[k]}, MuJoCo C from the start: energy rise {mj.max() - mj[0]:.3g} J"
              + (f" until its warning and reset at step {warned}" if warned >= 0 else ""))
        _triage_rise(group, k, qpos[k], qvel[k], energies[k].astype(np.float64), window)


def _triage_rise(group: fuzz.Group, k: int, qpos, qvel, ours, window: int) -> None:
    """Where our energy first rises beyond the tolerance, ours and MuJoCo C's from our state."""
    mass = float(np.sum(np.asarray(group.model.body_mass)[k]))
    rise = ours - ours[0]
    beyond = rise > fuzz.ENERGY_REL * (abs(ours[0]) + np.maximum.accumulate(np.abs(ours))) + fuzz.ENERGY_PER_KG * mass
    crossing = int(np.argmax(beyond))  # as `fuzz.energy_gain`, over the steps so far
    if crossing == 0:
        print("    ours (this replay) stays within the tolerance")
        return
    t0 = max(crossing - window, 0)
    mj, warned = fuzz.mujoco_energies(group.structure, group.xml[k], qpos[t0], qvel[t0], 2 * window)
    n = len(mj)
    print(f"    from our state at step {t0} (ours crosses the tolerance at {crossing}), energy every 4 steps:\n"
          f"      ours     {np.array2string(ours[t0:t0 + n:4], precision=4)}\n      MuJoCo C {np.array2string(mj[::4], precision=4)}"
          + (f" (its warning and reset at step {t0 + warned})" if warned >= 0 else ""))


def add_group_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that pick a run's group and scenes (`chosen_group`)."""
    parser.add_argument("--scenes", type=int, required=True, help="the run's group size (--scenes with --group equal)")
    parser.add_argument("--only", type=int, nargs="+", required=True, help="scene indices to re-check")
    parser.add_argument("--make-group-seed", type=int, default=None,
                        help="a group's seed as a FAIL line prints it (`--one-structure` runs): that group of the run's structure")
    fuzz.add_structure_arguments(parser)  # as the run had them


def chosen_group(args: argparse.Namespace, dtype, keep_all: bool = False) -> fuzz.Group:
    """The group of a `fuzz.py` run that `add_group_arguments` name: the run's first group, or the
    one of `--make-group-seed`; only the `--only` scenes unless keep_all."""
    rng = np.random.default_rng(args.seed)
    if args.make_group_seed is None:
        group = fuzz.next_group(rng, args.scenes, args, dtype=dtype)  # the run's first
    else:
        group = fuzz.make_group(fuzz.run_structure(rng, args), args.scenes, args.make_group_seed, dtype=dtype,
                                planar=args.planar_fraction)
    if keep_all:
        return group
    idx = np.asarray(args.only)
    return fuzz.Group(group.structure, jax.tree.map(lambda x: x[idx], group.model), group.qpos[idx], group.qvel[idx],
                      group.apart[idx], group.seed, tuple(group.xml[i] for i in idx))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_group_arguments(parser)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="float32: replay as the run had it (a NaN there, +-inf since rollout rescales its adjoint)")
    parser.add_argument("--mujoco", action="store_true",
                        help="also run each scene in MuJoCo C (float64) and print its energy rise: is a rise the integrator's?")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)
    group = chosen_group(args, dtype)
    structure, idx = group.structure, np.asarray(args.only)
    print(structure, f"{args.dtype}, {args.steps} steps", flush=True)
    states_ok, grad_ok, energies, diverged, gnorm, unconverged = fuzz.check_group(group, args.steps)
    rise, too_much = fuzz.energy_gain(group, energies)
    for k, i in enumerate(idx):
        print(f"scene {i}: states finite {states_ok[k]}, gradient finite {grad_ok[k]}, |gradient| {gnorm[k]:.3g} "
              f"(NaN: {bool(np.isnan(gnorm[k]))}), "
              f"diverged {diverged[k]}, unconverged steps {unconverged[k]}, energy rise {rise[k]:.3g} J"
              f"{' (beyond the tolerance)' if too_much[k] else ''}")
    if args.mujoco:
        _mujoco_triage(group, idx, args.steps)
    print(f"{args.dtype} |gradient| over these scenes: min {gnorm.min():.3g}, median {np.median(gnorm):.3g}, "
          f"beyond float32 (> 3.4e38): {int((gnorm > 3.4e38).sum())} of {len(idx)}")


if __name__ == "__main__":
    main()
