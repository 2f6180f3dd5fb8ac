"""Our contacts against MuJoCo's along MuJoCo's own trajectory, per geom-type pair.

MuJoCo steps the model; every `--every` steps our narrow phase (`collision.driver.collide`, compiled
once, float64) runs at MuJoCo's state and each geom pair's contacts are compared with MuJoCo's: a pair
differs when the counts differ or one of MuJoCo's points is farther than `--tol` from all of ours.
Prints the differing pairs and a count per geom-type pair. MuJoCo's `model/replicate/bunnies.xml`
(300 steps, every 25): at stop 66 mesh-mesh 79 of 2148 pair samples differed, capsule-mesh 3 of 36
(our mesh features came from the support set); since stop 67 they come from MuJoCo's final EPA face
as MuJoCo's do (`collision/mesh.py`): mesh-mesh 0 of 2147, capsule-mesh 0 of 36, plane-mesh 0 of 620.

    python experiments/contacts_vs_mujoco.py PATH/TO/model.xml [--steps 300] [--every 25]
"""

from __future__ import annotations

import argparse
import collections
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402

import jaxsim_ncp as jsn  # noqa: E402
from jaxsim_ncp import smooth  # noqa: E402
from jaxsim_ncp.collision import driver  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--tol", type=float, default=1e-6, help="distance within which two contact points agree")
    args = parser.parse_args()
    m = mujoco.MjModel.from_xml_path(args.model)
    d = mujoco.MjData(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the contact-capacity warning: every pair is collided on purpose
        model = jsn.from_mujoco(m)
    data = jsn.make_data(model)

    @jax.jit
    def collide(qpos, mocap_pos, mocap_quat):
        return driver.collide(model, smooth.kinematics(model, data.replace(qpos=qpos, mocap_pos=mocap_pos, mocap_quat=mocap_quat)))

    counts = collections.Counter()
    for step in range(args.steps):
        mujoco.mj_step(m, d)
        if (step + 1) % args.every:
            continue
        mujoco.mj_forward(m, d)
        c = collide(jnp.asarray(d.qpos), jnp.asarray(d.mocap_pos), jnp.asarray(d.mocap_quat))
        mask = np.asarray(c.mask)
        theirs, ours = collections.defaultdict(list), collections.defaultdict(list)
        for con in d.contact[: d.ncon]:
            theirs[tuple(sorted(int(g) for g in con.geom))].append(con.pos.copy())
        for geoms, pos in zip(model.constraints.contact_geom[mask], np.asarray(c.pos)[mask]):
            ours[tuple(sorted(int(g) for g in geoms))].append(pos)
        for pair in set(theirs) | set(ours):
            a, b = theirs[pair], ours[pair]
            kind = tuple(sorted(mujoco.mjtGeom(int(m.geom_type[g])).name[7:].lower() for g in pair))
            counts[kind, "pairs"] += 1
            far = max((min(np.linalg.norm(q - p) for q in b) for p in a), default=0.0) if b else np.inf
            if len(a) != len(b) or far > args.tol:
                counts[kind, "differ"] += 1
                print(f"step {step + 1}: geoms {pair} ({'-'.join(kind)}): MuJoCo {len(a)} contacts, ours {len(b)}, "
                      f"farthest of MuJoCo's points from ours {far:.2e}", flush=True)
    for kind in sorted({k for k, _ in counts}):
        print(f"{'-'.join(kind)}: {counts[kind, 'differ']} of {counts[kind, 'pairs']} pair samples differ")


if __name__ == "__main__":
    main()
