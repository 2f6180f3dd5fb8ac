"""Box-box narrow phase against MuJoCo's mjc_BoxBox (parity of d.contact) and finite differences."""

import functools

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from jaxsim_ncp import math
from jaxsim_ncp.collision.base import GeomFrame
from jaxsim_ncp.collision.box import FUNCTIONS, box_box

SIZE1 = (0.3, 0.2, 0.1)
SIZE2 = (0.15, 0.25, 0.12)
TOL = 1e-8
EPS = 1e-6


def two_boxes(size1, size2) -> mujoco.MjModel:
    s1, s2 = (" ".join(map(str, s)) for s in (size1, size2))
    return mujoco.MjModel.from_xml_string(
        f"""<mujoco><option gravity="0 0 0"/><worldbody>
        <body><freejoint/><geom type="box" size="{s1}"/></body>
        <body><freejoint/><geom type="box" size="{s2}"/></body>
        </worldbody></mujoco>"""
    )


def quat(axis, angle):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.r_[np.cos(angle / 2), np.sin(angle / 2) * axis]


def qmul(a, b):
    out = np.empty(4)
    mujoco.mju_mulQuat(out, np.asarray(a, float), np.asarray(b, float))
    return out


def yaw_tilt(rng, tilt):
    q = quat([0, 0, 1], rng.uniform(-np.pi, np.pi))
    return qmul(quat(rng.normal(size=3), tilt * rng.normal()), q) if tilt else q


def random_quat(rng):
    q = rng.normal(size=4)
    return q / np.linalg.norm(q)


def sample_configs(rng, n):
    """(qpos, margin1, margin2) pairs concentrated in contact, with every case represented."""
    s1, s2 = np.array(SIZE1), np.array(SIZE2)
    out = []
    for k in range(n):
        kind = k % 5
        if kind == 0:  # box2 stacked face-on on box1 (or below it): random yaw, offset, small tilt
            tilt = 0.0 if rng.uniform() < 0.4 else 0.05
            q1, q2 = yaw_tilt(rng, tilt * rng.uniform()), yaw_tilt(rng, tilt)
            side = rng.choice([-1.0, 1.0])
            p2 = np.r_[rng.uniform(-0.3, 0.3, 2), side * (s1[2] + s2[2] + rng.uniform(-0.02, 0.008))]
            qpos = np.r_[np.zeros(3), q1, p2, q2]
        elif kind == 1:  # face-on against a side face, larger tilt of the incident box
            axis, side = rng.integers(3), rng.choice([-1.0, 1.0])
            p2 = rng.normal(size=3) * 0.05
            p2[axis] = side * (s1[axis] + s2.min() + rng.uniform(-0.03, 0.02))
            qpos = np.r_[np.zeros(3), yaw_tilt(rng, 0.02), p2, yaw_tilt(rng, 0.3)]
        elif kind == 2:  # random orientations, centres at contact range (slight penetration / margin band)
            direction = rng.normal(size=3)
            p2 = direction / np.linalg.norm(direction) * rng.uniform(0.15, 0.5)
            qpos = np.r_[rng.normal(size=3) * 0.01, random_quat(rng), p2, random_quat(rng)]
        elif kind == 3:  # random orientations, anywhere nearby (mixture of deep, grazing, separated)
            qpos = np.r_[np.zeros(3), random_quat(rng), rng.normal(size=3) * 0.3, random_quat(rng)]
        else:  # well separated
            direction = rng.normal(size=3)
            p2 = direction / np.linalg.norm(direction) * rng.uniform(0.8, 1.5)
            qpos = np.r_[np.zeros(3), random_quat(rng), p2, random_quat(rng)]
        margins = (0.01, 0.015) if k % 3 == 0 else (0.0, 0.0)
        out.append((qpos, margins))
    return out


def mujoco_contacts(m, d, qpos, margins):
    m.geom_margin[:] = margins
    d.qpos[:] = qpos
    mujoco.mj_forward(m, d)
    geoms = tuple(
        GeomFrame(np.array(d.geom_xpos[g]), np.array(d.geom_xmat[g]).reshape(3, 3), np.array(m.geom_size[g]))
        for g in range(2)
    )
    contacts = [(c.geom1, c.geom2, c.dist, np.array(c.pos), np.array(c.frame).reshape(3, 3)) for c in d.contact[: d.ncon]]
    assert all(c[:2] == (0, 1) for c in contacts)  # geom1 = box1: normals point box1 -> box2
    # MuJoCo 4.0 adds the two geoms' margins for the pair
    return geoms, sum(margins), [c[2:] for c in contacts]


def assert_match(expected, col, where=""):
    """MuJoCo's contacts == the valid slots as sets (greedy nearest-position matching)."""
    valid = np.asarray(col.valid)
    ours = [(float(col.dist[i]), np.asarray(col.pos[i]), np.asarray(col.frame[i])) for i in np.flatnonzero(valid)]
    assert len(ours) == len(expected), f"{where}: {len(expected)} MuJoCo contacts, {len(ours)} ours"
    free = list(range(len(ours)))
    for dist, pos, frame in expected:
        j = min(free, key=lambda i: np.linalg.norm(ours[i][1] - pos))
        free.remove(j)
        np.testing.assert_allclose(ours[j][0], dist, atol=TOL, rtol=0, err_msg=where)
        np.testing.assert_allclose(ours[j][1], pos, atol=TOL, rtol=0, err_msg=where)
        np.testing.assert_allclose(ours[j][2], frame, atol=TOL, rtol=0, err_msg=where)


def stack(geoms):
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *geoms)


batched = jax.jit(jax.vmap(box_box))


def test_function_table():
    assert FUNCTIONS == {(6, 6): (box_box, 8)}


def test_matches_mujoco_random_poses():
    m = two_boxes(SIZE1, SIZE2)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(7)
    g1s, g2s, margins, expected = [], [], [], []
    for qpos, margin_pair in sample_configs(rng, 600):
        (g1, g2), margin, contacts = mujoco_contacts(m, d, qpos, margin_pair)
        g1s.append(g1)
        g2s.append(g2)
        margins.append(margin)
        expected.append(contacts)
    col = batched(stack(g1s), stack(g2s), jnp.asarray(margins))
    assert np.all(np.isfinite(np.asarray(col.dist))) and np.all(np.isfinite(np.asarray(col.pos)))
    assert np.all(np.isfinite(np.asarray(col.frame)))
    for k, contacts in enumerate(expected):
        assert_match(contacts, jax.tree.map(lambda x: x[k], col), where=f"config {k}")
    counts = np.bincount([len(c) for c in expected], minlength=9)
    # every regime was exercised: separated, single (edge / corner), face manifolds, the 8-point octagon
    assert counts[0] > 50 and counts[1] > 50 and counts[4] > 50 and counts[5:].sum() > 50 and counts[7:].sum() > 0
    assert max(c[0] for cs, mg in zip(expected, margins) if mg > 0 for c in cs) > 0  # margin band hit


def cube_pair_configs():
    h = 0.1
    edge_height = h + h * np.sqrt(2) - 0.01
    return {
        "identical, exactly stacked": np.r_[0, 0, 0, 1, 0, 0, 0, 0, 0, 2 * h, 1, 0, 0, 0],
        "identical, stacked, penetrating": np.r_[0, 0, 0, 1, 0, 0, 0, 0, 0, 2 * h - 0.01, 1, 0, 0, 0],
        "coincident centres": np.r_[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        "stacked, 45 deg yaw (octagon)": np.r_[0, 0, 0, 1, 0, 0, 0, 0, 0, 2 * h - 0.01, quat([0, 0, 1], np.pi / 4)],
        "side by side, touching edges": np.r_[0, 0, 0, 1, 0, 0, 0, 2 * h, 0, 2 * h - 0.01, 1, 0, 0, 0],
        "edge-edge crossed": np.r_[0, 0, 0, quat([1, 0, 0], np.pi / 4), 0, 0, edge_height, quat([0, 1, 0], np.pi / 4)],
    }


@pytest.mark.parametrize("name", list(cube_pair_configs()))
def test_matches_mujoco_degenerate(name):
    m = two_boxes((0.1, 0.1, 0.1), (0.1, 0.1, 0.1))
    d = mujoco.MjData(m)
    (g1, g2), margin, contacts = mujoco_contacts(m, d, cube_pair_configs()[name], (0.0, 0.0))
    col = batched(stack([g1]), stack([g2]), jnp.asarray([margin]))
    assert_match(contacts, jax.tree.map(lambda x: x[0], col), where=name)
    assert np.all(np.isfinite(np.asarray(col.pos))) and np.all(np.isfinite(np.asarray(col.frame)))


# ------------------------------------------------------------------ gradients


def loss(x, size1, size2, margin, w):
    """A scalar of every valid output: weighted dist, pos and frame, from free-body poses x."""
    g1 = GeomFrame(x[:3], math.quat_to_mat(math.normalize(x[3:7])), size1)
    g2 = GeomFrame(x[7:10], math.quat_to_mat(math.normalize(x[10:14])), size2)
    col = box_box(g1, g2, margin)
    per = col.dist * w[0] + col.pos @ w[1:4] + col.frame.reshape(-1, 9) @ w[4:13]
    return jnp.sum(jnp.where(col.valid, per, 0.0))


@functools.cache
def compiled():
    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))  # pose, sizes, margin
    return value_and_grad, jax.jit(jax.vmap(loss, in_axes=(0, None, None, None, None)))


CUBE = (0.1, 0.1, 0.1)
BOX1_AT_ORIGIN = np.r_[0.0, 0, 0, 1, 0, 0, 0]
YAW_TILT = np.r_[0.98, 0.01, 0.02, 0.2]  # unnormalized; the loss normalizes quaternions
EDGE_EDGE = np.r_[0, 0, 0, quat([1, 0, 0], np.pi / 4), 0, 0, 0.1 + 0.1 * np.sqrt(2) - 0.01, quat([0, 1, 0], np.pi / 4)]
SMOOTH = {  # (x, size1, size2, margin, contact count): the contact set is locally constant
    "stacked, yawed and tilted": (np.r_[BOX1_AT_ORIGIN, 0.05, 0.02, 0.215, YAW_TILT], SIZE1, SIZE2, 0.0, 4),
    "stacked below, in margin band": (np.r_[BOX1_AT_ORIGIN, 0.05, 0.02, -0.225, YAW_TILT], SIZE1, SIZE2, 0.03, 6),
    "tilted corner into face": (np.r_[BOX1_AT_ORIGIN, 0.02, -0.03, 0.26, 0.9, 0.3, 0.2, 0.1], SIZE1, SIZE2, 0.0, 3),
    "edge-edge": (EDGE_EDGE, CUBE, CUBE, 0.0, 1),
}
DEGENERATE = {  # non-smooth points (ties between reference faces, vertices on clip planes): finite only
    "parallel faces": (np.r_[0, 0, 0, 1, 0, 0, 0, 0.05, 0.02, 0.21, 1, 0, 0, 0], SIZE1, SIZE2, 0.0),
    "identical, exactly stacked": (np.r_[0, 0, 0, 1, 0, 0, 0, 0, 0, 0.2, 1, 0, 0, 0], CUBE, CUBE, 0.0),
    "coincident centres": (np.r_[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], CUBE, CUBE, 0.0),
    "aligned, edges touching": (np.r_[0, 0, 0, 1, 0, 0, 0, 0.2, 0.2, 0.2, 1, 0, 0, 0], CUBE, CUBE, 0.0),
    "separated": (np.r_[0, 0, 0, 1, 0, 0, 0, 1, 2, 3, 1, 0, 0, 0], CUBE, CUBE, 0.0),
}
WEIGHTS = np.random.default_rng(0).normal(size=13)


def args(size1, size2, margin):
    return jnp.asarray(size1, float), jnp.asarray(size2, float), jnp.asarray(margin, float), jnp.asarray(WEIGHTS)


@pytest.mark.parametrize("name", list(SMOOTH))
def test_gradient_matches_finite_differences(name):
    x, size1, size2, margin, ncon = SMOOTH[name]
    x = jnp.asarray(x, float)
    rest = args(size1, size2, margin)
    value_and_grad, batched_loss = compiled()
    g1 = GeomFrame(x[:3], math.quat_to_mat(math.normalize(x[3:7])), rest[0])
    g2 = GeomFrame(x[7:10], math.quat_to_mat(math.normalize(x[10:14])), rest[1])
    assert int(jnp.sum(jax.jit(box_box)(g1, g2, rest[2]).valid)) == ncon
    _, (grad, *_) = value_and_grad(x, *rest)
    shifts = jnp.concatenate([jnp.eye(14), -jnp.eye(14)]) * EPS
    values = batched_loss(x + shifts, *rest)
    fd = (values[:14] - values[14:]) / (2 * EPS)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(fd), rtol=1e-5, atol=1e-5 * max(1.0, float(jnp.max(jnp.abs(fd)))))


@pytest.mark.parametrize("name", list(DEGENERATE))
def test_gradient_finite_at_degenerate_poses(name):
    x, size1, size2, margin = DEGENERATE[name]
    value_and_grad, _ = compiled()
    value, grads = value_and_grad(jnp.asarray(x, float), *args(size1, size2, margin))  # pose, sizes, margin
    assert np.isfinite(float(value)) and all(np.all(np.isfinite(np.asarray(g))) for g in grads)
