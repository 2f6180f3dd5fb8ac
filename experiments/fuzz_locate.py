"""Where in the backward pass does a fuzz scene's gradient turn NaN? (issue #11)

Seed 3010's scenes 49 and 108 have NaN gradients only on the GPU and only inside the batched
gradient program (`fuzz_h100.md`); single steps' VJPs at nearby states were finite. This replays
the adjoint of that program's own trajectory step by step:

1. the group's batched gradient program (`fuzz.rollout_gradient` vmapped over the whole group, as
   `fuzz.py` runs it) returns its gradients and, for the `--only` scenes, every step's Data;
2. from the loss's cotangent on the final state, each step's VJP (one vmapped program over the
   chosen scenes, at the states of 1) is taken in turn, backwards, the cotangent renormalized after
   each step (its log scale kept), the friction's share summed;
3. per scene: the first step (counting from the end) whose VJP turned a finite cotangent into a
   non-finite one, the replayed forward's largest deviation from the program's states, and the
   chained gradient against the program's. The input Data and cotangent of each first non-finite
   step are saved (`--save`), so the step can be reproduced anywhere:

    .venv/bin/python experiments/fuzz_locate.py --seed 3010 --scenes 400 --make-group-seed 1384001605 \\
        --only 49 --steps 500 --save /tmp/locate

If the chain stays finite while the program's gradient is NaN, the NaN is the fused program's
(XLA's code for it), not the derivative of any step at those states.
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import fuzz
import fuzz_recheck
import jaxsim_ncp as jsn


def _with_friction(model: jsn.Model, friction) -> jsn.Model:
    return eqx.tree_at(lambda m: m.geom_friction, model, friction)


def _program(group: fuzz.Group, steps: int, only: np.ndarray):
    """The group's batched gradient program: (gradient norm per scene, (d/dqvel, d/dfriction) and
    the initial and per-step Data of the `only` scenes)."""

    @jax.jit
    def run(model, qpos, qvel):
        final, traj, grads = jax.vmap(fuzz.rollout_gradient, in_axes=(0, 0, 0, None))(model, qpos, qvel, steps)
        gnorm = jnp.sqrt(jnp.sum(grads[0] ** 2, axis=1) + jnp.sum(grads[1] ** 2, axis=(1, 2)))
        pick = lambda x: x[only]  # noqa: E731
        start = jax.vmap(lambda m, q, v: jsn.make_data(m).replace(qpos=q, qvel=v))(model, qpos, qvel)
        return gnorm, jax.tree.map(pick, grads), jax.tree.map(pick, start), jax.tree.map(pick, traj)

    dt = group.model.dtype
    return run(group.model, jnp.asarray(group.qpos, dt), jnp.asarray(group.qvel, dt))


@jax.jit
@jax.vmap
def _step_vjp(model: jsn.Model, data: jsn.Data, cotangent: jsn.Data):
    """One step's forward (its floating fields) and the VJP of `cotangent` w.r.t. the input Data's
    floating fields and geom_friction."""
    diff, static = eqx.partition(data, eqx.is_inexact_array)

    def step(diff, friction):
        out = jsn.step(_with_friction(model, friction), eqx.combine(diff, static))
        return eqx.filter(out, eqx.is_inexact_array)

    out, pull = jax.vjp(step, diff, model.geom_friction)
    return out, pull(cotangent)


def _finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _max_abs(tree) -> np.ndarray:
    """Per scene: the largest |entry| over the tree's leaves (leading axis = scenes)."""
    return np.max(np.stack([np.max(np.abs(np.asarray(x, np.float64)).reshape(len(x), -1), axis=1, initial=0.0)
                            for x in jax.tree.leaves(tree)]), axis=0)


def replay(group: fuzz.Group, steps: int, only: np.ndarray, keep_step: int = -1):
    """Steps 1-3 of the module docstring; returns one dict per chosen scene. Its `saved` is the
    (input Data, output cotangent) of the first non-finite step, else of `keep_step` (if >= 0)."""
    gnorm, (g_qvel, g_fric), start, traj = _program(group, steps, only)
    model = jax.tree.map(lambda x: x[only], group.model)
    at = lambda t: start if t < 0 else jax.tree.map(lambda x: x[:, t], traj)  # noqa: E731  (Data after step t)

    final = eqx.filter(at(steps - 1), eqx.is_inexact_array)
    cotangent = jax.tree.map(jnp.zeros_like, final)
    cotangent = eqx.tree_at(lambda d: (d.qpos, d.qvel), cotangent,
                            (cotangent.qpos.at[:, :3].set(2 * final.qpos[:, :3]), 2 * final.qvel))  # d loss_of_final
    n = len(only)
    log_scale = np.zeros(n)
    fric = np.zeros(np.shape(g_fric))
    first_bad = np.full(n, -1)
    deviation = np.zeros(n)
    saved = [None] * n
    for t in range(steps - 1, -1, -1):
        data_in = at(t - 1)
        out, (ct_in, ct_fric) = _step_vjp(model, data_in, cotangent)
        deviation = np.maximum(deviation, _max_abs(jax.tree.map(lambda a, b: a - b, (out.qpos, out.qvel),
                                                                (at(t).qpos, at(t).qvel))))
        ok = np.asarray(jax.vmap(_finite)((ct_in, ct_fric)))
        for k in np.nonzero((~ok | (t == keep_step)) & (first_bad < 0))[0]:  # a non-finite step replaces keep_step's
            first_bad[k] = -1 if ok[k] else t
            saved[k] = jax.tree.map(lambda x: np.asarray(x[k]), (data_in, cotangent))
        fric += np.exp(log_scale)[:, None, None] * np.asarray(ct_fric, np.float64)
        size = _max_abs(ct_in)
        size = np.where(np.isfinite(size) & (size > 0), size, 1.0)
        cotangent = jax.tree.map(lambda x: x / jnp.asarray(size, x.dtype).reshape((-1,) + (1,) * (x.ndim - 1)), ct_in)
        log_scale += np.log(size)
    chained_qvel = np.exp(log_scale)[:, None] * np.asarray(cotangent.qvel, np.float64)
    results = []
    for k, i in enumerate(only):
        chained = np.r_[chained_qvel[k], fric[k].ravel()]
        program = np.r_[np.asarray(g_qvel[k], np.float64), np.asarray(g_fric[k], np.float64).ravel()]
        results.append(dict(scene=int(i), program_norm=float(gnorm[i]), chained_norm=float(np.linalg.norm(chained)),
                            program_vs_chained=float(np.linalg.norm(program - chained)), first_nonfinite_step=int(first_bad[k]),
                            forward_deviation=float(deviation[k]), saved=saved[k]))
    return results


def reproduce(path: str, structure: fuzz.Structure, dtype) -> None:
    """Load a saved step (its scene's MJCF, input Data, output cotangent) and take its VJP alone."""
    saved = np.load(path, allow_pickle=True)
    xml = str(saved["xml"])
    model = fuzz.structure_model(structure, mujoco.MjModel.from_xml_string(xml), dtype)
    template = jsn.make_data(model)
    data = jax.tree.unflatten(jax.tree.structure(template), [jnp.asarray(x) for x in saved["data"]])
    cotangent_template = eqx.filter(template, eqx.is_inexact_array)
    cotangent = jax.tree.unflatten(jax.tree.structure(cotangent_template), [jnp.asarray(x) for x in saved["cotangent"]])
    batch = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731
    _, (ct_in, ct_fric) = _step_vjp(batch(model), batch(data), batch(cotangent))
    print(f"{path}: step VJP finite {bool(_finite((ct_in, ct_fric)))}, |d/dqpos| {float(jnp.max(jnp.abs(ct_in.qpos))):.4g}, "
          f"|d/dqvel| {float(jnp.max(jnp.abs(ct_in.qvel))):.4g}, |d/dfriction| {float(jnp.max(jnp.abs(ct_fric))):.4g} "
          f"(device {jax.devices()[0]})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fuzz_recheck.add_group_arguments(parser)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float32")
    parser.add_argument("--save", default=None, help="directory for each first non-finite step's (Data, cotangent), .npz")
    parser.add_argument("--save-step", type=int, default=-1, help="also save this step's, finite or not (to check --reproduce)")
    parser.add_argument("--reproduce", default=None, help="a saved .npz: that step's VJP alone, on this device")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    if args.reproduce:
        structure = fuzz.run_structure(np.random.default_rng(args.seed), args)  # a run's first draw (`chosen_group`)
        reproduce(args.reproduce, structure, jnp.dtype(args.dtype))
        return
    group = fuzz_recheck.chosen_group(args, jnp.dtype(args.dtype), keep_all=True)  # the whole batch: the same program
    only = np.asarray(args.only)
    print(group.structure, f"{args.dtype}, {args.steps} steps, batch {len(group.qpos)}, device {jax.devices()[0]}", flush=True)
    for r in replay(group, args.steps, only, keep_step=args.save_step):
        t, data_and_cotangent = r["first_nonfinite_step"], r["saved"]
        print(f"scene {r['scene']}: program |gradient| {r['program_norm']:.4g}, chained {r['chained_norm']:.4g} "
              f"(|difference| {r['program_vs_chained']:.3g}); replayed forward within {r['forward_deviation']:.3g} of the "
              f"program's states; first non-finite step VJP: {'none' if t < 0 else t}", flush=True)
        if data_and_cotangent is not None and args.save:
            path = f"{args.save}/scene{r['scene']}_step{t if t >= 0 else args.save_step}.npz"
            data, cotangent = data_and_cotangent
            np.savez(path, xml=group.xml[r["scene"]], data=np.array(jax.tree.leaves(data), dtype=object),
                     cotangent=np.array(jax.tree.leaves(cotangent), dtype=object))
            print(f"  saved {path} (--reproduce {path} with the same group options)", flush=True)


if __name__ == "__main__":
    main()
