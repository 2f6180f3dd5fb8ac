"""Height fields (collision/hfield.py) against MuJoCo: a sphere and a capsule rolling over random
terrain follow MuJoCo's trajectory; ellipsoid and box contacts equal MuJoCo's at its own states
(its EPA stops at ccd_tolerance 1e-6, 2e-5 m from the exact contact, and for the box it once
reports a prism 6 cm away: collision/ccd.py repeats its iterates);
gradients through terrain contact match finite differences; with a margin, contacts within it
appear as MuJoCo's."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from conftest import OPTIMIZED
from test_parity import mujoco_rollout, qpos_qvel, to_data

NROW, NCOL = 7, 9
ELLIPSOID = int(mujoco.mjtGeom.mjGEOM_ELLIPSOID)
ELEVATION = " ".join(f"{v:.3f}" for v in np.random.default_rng(0).uniform(0, 1, NROW * NCOL))
TERRAIN = f"""<asset><hfield name="terrain" nrow="{NROW}" ncol="{NCOL}" size="0.8 0.6 0.3 0.1" elevation="{ELEVATION}"/></asset>"""
GROUND = '<geom type="hfield" hfield="terrain" pos="0.05 -0.02 0" euler="0 0 10"/>'
ROLLING = f"""<mujoco><option timestep="0.002"/>{TERRAIN}<worldbody>{GROUND}
  <body pos="0.1 0.05 0.4"><freejoint/><geom type="sphere" size="0.12"/></body>
  <body pos="-0.4 0.2 0.4" euler="20 70 0"><freejoint/><geom type="capsule" size="0.06 0.15"/></body>
</worldbody></mujoco>"""
CORNERED = f"""<mujoco><option timestep="0.002"/>{TERRAIN}<worldbody>{GROUND}
  <body pos="0.3 -0.2 0.25" euler="10 20 30"><freejoint/><geom type="ellipsoid" size="0.12 0.08 0.1"/></body>
  <body pos="0.35 0.3 0.4" euler="15 25 35"><freejoint/><geom type="box" size="0.1 0.07 0.05"/></body>
</worldbody></mujoco>"""


def _start(m: mujoco.MjModel, model: jsn.Model, seed: int):
    d = mujoco.MjData(m)
    d.qvel[:] = 0.5 * np.random.default_rng(seed).normal(size=m.nv)
    return d, to_data(model, d)


def test_sphere_and_capsule_on_a_height_field_follow_mujoco_and_finite_differences():
    m = mujoco.MjModel.from_xml_string(ROLLING)
    model = jsn.from_mujoco(m)
    d, data = _start(m, model, 1)
    ref = mujoco_rollout(m, d, np.zeros((300, 0)), lambda d: np.concatenate([qpos_qvel(d), [d.ncon]]))
    rollout = jax.jit(jsn.rollout, compiler_options=OPTIMIZED)  # 300 steps: 17 s compile + 9 s run, not 13 + 34
    _, traj = rollout(model, data, jnp.zeros((300, 0)))
    assert np.sum(ref[:, -1] > 0) > 150 and ref[:, -1].max() >= 3  # both bodies on the terrain, several prisms
    np.testing.assert_allclose(jnp.concatenate([traj.qpos, traj.qvel], axis=-1), ref[:, :-1], atol=1e-9)

    start = jax.tree.map(lambda x: x[150], traj)  # resting and rolling on the terrain: one step's gradient
    loss = jax.jit(jax.value_and_grad(lambda v: jnp.sum(jsn.step(model, start.replace(qvel=v)).qvel ** 2)))
    grad = loss(start.qvel)[1]
    for i in (0, 2, 4, 7):
        e = jnp.zeros(m.nv).at[i].set(1e-6)
        fd = (loss(start.qvel + e)[0] - loss(start.qvel - e)[0]) / 2e-6
        np.testing.assert_allclose(grad[i], fd, rtol=1e-5, atol=1e-8)


def test_ellipsoid_and_box_contacts_match_mujoco_at_its_states():
    m = mujoco.MjModel.from_xml_string(CORNERED)
    model = jsn.from_mujoco(m)
    d, _ = _start(m, model, 0)
    forward = jax.jit(jsn.forward)
    compared = ellipsoid_compared = 0
    for _ in range(120):  # (at step 89 MuJoCo's EPA reports the box touching a prism 6 cm away)
        mujoco.mj_forward(m, d)
        if d.ncon:
            out = forward(model, to_data(model, d))
            mask = np.asarray(out.contact.mask)
            assert mask.sum() == d.ncon
            ours = sorted(zip(np.asarray(out.contact.dist)[mask], np.asarray(out.contact.pos)[mask].tolist()))
            theirs = sorted((c.dist, list(c.pos), int(m.geom_type[c.geom[1]])) for c in d.contact[: d.ncon])
            for (d1, p1), (d2, p2, kind) in zip(ours, theirs):
                assert abs(d1 - d2) < 1e-12 and np.allclose(p1, p2, atol=1e-11)
                ellipsoid_compared += kind == ELLIPSOID
            compared += 1
        mujoco.mj_step(m, d)
    assert compared > 20 and ellipsoid_compared > 10


def test_a_margin_on_a_height_field_pair_follows_mujoco():
    """With a margin MuJoCo 4.0.1 grows the sub-grid of cells by it and raises the prism tops by it
    for its height test: contacts within the margin (positive distance) appear as MuJoCo's, and at
    MuJoCo's states every contact's distance, position and normal equal MuJoCo's to its EPA's
    accuracy (on the margin-inflated shapes, ~1e-6 at ccd_tolerance 1e-13)."""
    xml = ROLLING.replace('size="0.12"/>', 'size="0.12" margin="0.03"/>').replace('size="0.06 0.15"/>', 'size="0.06 0.15" margin="0.02"/>')
    m = mujoco.MjModel.from_xml_string(xml.replace('<option timestep="0.002"/>', '<option timestep="0.002" ccd_tolerance="1e-13" ccd_iterations="500"/>'))
    model = jsn.from_mujoco(m)
    d, _ = _start(m, model, 1)
    forward = jax.jit(jsn.forward)
    within = compared = 0
    for step in range(200):
        mujoco.mj_step(m, d)
        if step % 10 or not d.ncon:
            continue
        mujoco.mj_forward(m, d)
        contact = forward(model, to_data(model, d)).contact
        mask = np.asarray(contact.mask)
        assert mask.sum() == d.ncon, step
        dist, pos, normal = (np.asarray(a)[mask] for a in (contact.dist, contact.pos, contact.frame[:, 0]))
        for c in d.contact[: d.ncon]:
            k = np.argmin(np.linalg.norm(pos - c.pos, axis=1))
            np.testing.assert_allclose([dist[k], *pos[k], *normal[k]], [c.dist, *c.pos, *c.frame[:3]], atol=1e-5)
            within += c.dist > 0
        compared += 1
    assert compared > 10 and within > 5
