"""Re-run chosen scenes of a `fuzz.py` run in float64: is a float32 NaN gradient a defect or the
overflow of a derivative that really is that large? (`--dtype float32` replays them as run.)

    .venv/bin/python experiments/fuzz_recheck.py --seed 1084 --scenes 1000 --only 19 100 102

rebuilds the group `fuzz.py --seed 1084 --scenes 1000 --group 1000` drew (its first structure;
same scenes, same order; with `--make-group-seed S`, the group of that seed, as a FAIL line of a
`--one-structure` run prints it) and checks the listed scenes in float64 over `--steps` steps: finite or
not, and the gradient's norm. A float64 norm beyond float32's range (3.4e38), or near it, means
the float32 NaN came from an exploding derivative (an unstable linearization: |eig| > 1 per
step compounds over the horizon), not from a wrong formula.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fuzz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, required=True, help="the run's group size (--scenes with --group equal)")
    parser.add_argument("--only", type=int, nargs="+", required=True, help="scene indices to re-check")
    parser.add_argument("--make-group-seed", type=int, default=None,
                        help="a group's seed as a FAIL line prints it (`--one-structure` runs): that group of the run's structure")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="float32: replay as the run had it (a NaN there, +-inf since rollout rescales its adjoint)")
    fuzz.add_structure_arguments(parser)  # as the run had them
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)
    rng = np.random.default_rng(args.seed)
    if args.make_group_seed is None:
        group = fuzz.next_group(rng, args.scenes, args, dtype=dtype)  # the run's first
    else:
        group = fuzz.make_group(fuzz.run_structure(rng, args), args.scenes, args.make_group_seed, dtype=dtype)
    structure = group.structure
    idx = np.asarray(args.only)
    group = fuzz.Group(structure, jax.tree.map(lambda x: x[idx], group.model), group.qpos[idx], group.qvel[idx], group.apart[idx], group.seed)
    print(structure, f"{args.dtype}, {args.steps} steps", flush=True)
    states_ok, grad_ok, _, diverged, gnorm, unconverged = fuzz.check_group(group, args.steps)
    for k, i in enumerate(idx):
        print(f"scene {i}: states finite {states_ok[k]}, gradient finite {grad_ok[k]}, |gradient| {gnorm[k]:.3g} "
              f"(NaN: {bool(np.isnan(gnorm[k]))}), "
              f"diverged {diverged[k]}, unconverged steps {unconverged[k]}")
    print(f"{args.dtype} |gradient| over these scenes: min {gnorm.min():.3g}, median {np.median(gnorm):.3g}, "
          f"beyond float32 (> 3.4e38): {int((gnorm > 3.4e38).sum())} of {len(idx)}")


if __name__ == "__main__":
    main()
