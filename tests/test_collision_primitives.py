"""Narrow phase against MuJoCo's d.contact, and finite-difference gradient checks.

For every pair in `collision.FUNCTIONS` except box-box (test_collision_box.py) and meshes (test_mesh.py): a two-geom model, random poses (most of them in
contact, some separated, a few exactly degenerate), the whole batch through one jit+vmap,
contacts matched as sets by position. Gradients: one value_and_grad per pair, vmapped over
the configurations and their central-difference perturbations (float64).
"""

import functools

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from conftest import OPTIMIZED

from jaxsim_ncp import math as jm
from jaxsim_ncp.collision import FUNCTIONS, convex, multiccd
from jaxsim_ncp.collision.base import GeomFrame

PLANE, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX = 0, 2, 3, 4, 5, 6
NAMES = {PLANE: "plane", SPHERE: "sphere", CAPSULE: "capsule", ELLIPSOID: "ellipsoid", CYLINDER: "cylinder", BOX: "box"}
SIZES = {
    PLANE: (0.0, 0.0, 1.0),
    SPHERE: (0.2, 0.0, 0.0),
    CAPSULE: (0.12, 0.3, 0.0),
    ELLIPSOID: (0.3, 0.2, 0.12),
    CYLINDER: (0.2, 0.25, 0.0),
    BOX: (0.3, 0.2, 0.1),
}
SIZES2 = {SPHERE: (0.15, 0, 0), CAPSULE: (0.1, 0.2, 0.0), ELLIPSOID: (0.25, 0.15, 0.18), CYLINDER: (0.15, 0.2, 0.0)}  # second geom of a same-type pair
MARGIN = 0.04
TOL = 1e-10
# General convex pairs: MuJoCo's EPA (run at ccd_tolerance 1e-13 here) is accurate to about
# 1e-6 in the normal; ours is Newton-polished to round-off. Compared on contacts no deeper
# than DEEPEST, where the minimum-translation direction is well conditioned.
CONVEX_TOL = {"dist": 1e-9, "pos": 5e-6, "frame": 3e-5}
DEEPEST = -0.05
IDQ = np.array([1.0, 0.0, 0.0, 0.0])
PAIRS = sorted(pair for pair in FUNCTIONS if pair != (BOX, BOX) and convex.MESH not in pair)  # meshes: test_mesh.py
GENERAL = {*convex.FUNCTIONS, *multiccd.FUNCTIONS}  # pairs through the GJK/EPA path (MuJoCo's mjc_Convex)


def rbound(t, s):
    return {SPHERE: s[0], CAPSULE: s[0] + s[1], ELLIPSOID: max(s), CYLINDER: np.hypot(s[0], s[1]), BOX: np.linalg.norm(s)}[t]


def unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v)


def quat_z_to(v):
    q = np.zeros(4)
    mujoco.mju_quatZ2Vec(q, unit(v))
    return q


def quat_axis_angle(axis, angle):
    return np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * unit(axis)])


def rotation(q) -> np.ndarray:
    """3x3 rotation matrix of quaternion q (normalized), by MuJoCo's quat2Mat."""
    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, unit(q))
    return mat.reshape(3, 3)


def sizes(pair):
    t1, t2 = pair
    return SIZES[t1], (SIZES2[t2] if t1 == t2 else SIZES[t2])


def padded_sizes(pair):
    """The pair's sizes as two 3-vectors (GeomFrame.size)."""
    return tuple(np.pad(np.asarray(s, float), (0, 3 - len(s))) for s in sizes(pair))


def xml(pair, margin):
    (t1, t2), (s1, s2) = pair, sizes(pair)
    # margin on g2 only: MuJoCo 4 adds the two geoms' margins
    geom = lambda t, s, mg: f'<geom type="{NAMES[t]}" size="{" ".join(map(str, s))}" margin="{mg}"/>'  # noqa: E731
    first = f'<body mocap="true">{geom(t1, s1, 0)}</body>' if t1 == PLANE else f"<body><freejoint/>{geom(t1, s1, 0)}</body>"
    return f"""<mujoco><option gravity="0 0 0" ccd_tolerance="1e-13" ccd_iterations="500"/><worldbody>{first}
      <body><freejoint/>{geom(t2, s2, margin)}</body></worldbody></mujoco>"""


def random_quat(rng):
    return unit(rng.normal(size=4))


def poses(pair, rng, n=20):
    """(pos1, quat1, pos2, quat2) list: random ones (mostly in contact), then exact degenerate ones."""
    (t1, t2), (s1, s2) = pair, sizes(pair)
    out = []
    for _ in range(n):
        q2 = random_quat(rng)
        if t1 == PLANE:
            normal = unit([0, 0, 1] + 0.4 * rng.normal(size=3))
            p1 = 0.3 * rng.normal(size=3)
            h = rbound(t2, s2) * rng.uniform(-0.5, 1.15)
            p2 = p1 + normal * h + 0.5 * rng.normal(size=3) * (1 - np.abs(normal))
            out.append((p1, quat_z_to(normal), p2, q2))
        else:
            p1 = 0.3 * rng.normal(size=3)
            lo, hi = (0.15, 1.1) if pair not in GENERAL else (0.4, 0.7) if pair in multiccd.FUNCTIONS else (0.35, 0.85)
            # general convex pairs: mostly shallow (see DEEPEST)
            d = unit(rng.normal(size=3)) * (rbound(t1, s1) + rbound(t2, s2)) * rng.uniform(lo, hi)
            out.append((p1, random_quat(rng), p1 + d, q2))
    return out + degenerate_poses(pair)


def degenerate_poses(pair):
    """Exactly degenerate configurations MuJoCo users hit (identity orientations, shared centres)."""
    (t1, t2), (s1, s2) = pair, sizes(pair)
    z = np.zeros(3)
    up = lambda h: np.array([0.1, -0.2, h])  # noqa: E731
    lying = quat_axis_angle([1, 0, 0], np.pi / 2)
    if t1 == PLANE:
        if t2 == CAPSULE:  # upright (tangent hint parallel to the normal), lying flat
            return [(z, IDQ, up(s2[0] + s2[1] - 0.01), IDQ), (z, IDQ, up(s2[0] - 0.02), lying)]
        if t2 == CYLINDER:  # disk parallel to the plane
            return [(z, IDQ, up(s2[1] - 0.01), IDQ), (z, IDQ, up(s2[1] + MARGIN / 2), IDQ)]
        if t2 in (BOX, ELLIPSOID):  # face / axes parallel to the plane
            return [(z, IDQ, up(s2[2] - 0.01), IDQ)]
        return [(z, IDQ, up(s2[0] - 0.01), IDQ)]
    if pair == (SPHERE, SPHERE):  # coincident centres
        return [(up(0), IDQ, up(0), IDQ), (up(0), IDQ, up(0), quat_axis_angle([1, 1, 0], 0.3))]
    if pair == (SPHERE, CAPSULE):  # sphere centre on the capsule axis
        return [(up(0.05), IDQ, up(0), lying), (up(0), IDQ, up(0), IDQ)]
    if pair == (CAPSULE, CAPSULE):  # parallel (offset, overlapping), crossing at a common point
        q = quat_axis_angle([1, 2, 3], 0.7)
        return [(up(0), q, up(0.15), q), (up(0), IDQ, up(0) + [0.2, 0, 0.3], IDQ), (up(0), IDQ, up(0), lying)]
    if pair == (SPHERE, CYLINDER):  # centre on the axis: inside, above the cap, at the centre
        return [(up(0.1), IDQ, up(0), IDQ), (up(0.3), IDQ, up(0), IDQ), (up(0), IDQ, up(0), IDQ)]
    if pair == (SPHERE, BOX):  # centre inside the box, at the box centre
        return [(up(0.05), IDQ, up(0), IDQ), (up(0), IDQ, up(0), IDQ)]
    if pair == (CAPSULE, BOX):  # vertical capsule beside a side face, standing on the top face
        return [(up(0) + [0.38, 0.05, 0.1], IDQ, up(0), IDQ), (up(0) + [0.1, 0.05, 0.5], IDQ, up(0), IDQ)]
    # general convex pairs: aligned resting contacts (on a kink of the box / cylinder / capsule
    # support function: face, cap, side), then coincident centres
    rest = lambda h: [(up(h), IDQ, up(0), IDQ)]  # noqa: E731
    coincident = [(up(0), IDQ, up(0), IDQ)]
    if pair == (SPHERE, ELLIPSOID):
        return rest(s1[0] + s2[2] - 0.01) + coincident
    if pair == (CAPSULE, ELLIPSOID):  # capsule lying across the top
        return [(up(s1[0] + s2[2] - 0.01), lying, up(0), IDQ)] + coincident
    if pair == (ELLIPSOID, ELLIPSOID):
        return rest(s1[2] + s2[2] - 0.01) + coincident
    if pair == (ELLIPSOID, CYLINDER):  # on the cap, beside the side
        return rest(s1[2] + s2[1] - 0.01) + [(up(0) + [s1[0] + s2[0] - 0.01, 0, 0], IDQ, up(0), IDQ)] + coincident
    if pair == (ELLIPSOID, BOX):  # on the top face
        return rest(s1[2] + s2[2] - 0.01) + coincident
    # multiccd manifolds: flat features resting on each other, exactly (ties, symmetric
    # clipping) and tilted by 1-2 degrees (every discrete choice fixed: FD-checked)
    def tilted(deg, axis, yaw, q=IDQ):
        out = np.zeros(4)
        mujoco.mju_mulQuat(out, quat_axis_angle(axis, np.radians(deg)), q)
        mujoco.mju_mulQuat(out, quat_axis_angle([0, 0, 1], np.radians(yaw)), out)
        return out

    lie = lambda h: (up(h) + [0.03, 0.02, 0], tilted(1.0, [1, 0, 0], 30, lying), up(0), IDQ)  # noqa: E731
    stand = lambda h: (up(h) + [0.05, 0.03, 0], tilted(2.0, [1, 1, 0], 10), up(0), IDQ)  # noqa: E731
    if pair == (CAPSULE, CYLINDER):  # lying across the cap, ends overhanging
        return [(up(s1[0] + s2[1] - 0.01), lying, up(0), IDQ), lie(s1[0] + s2[1] - 0.004)] + coincident
    if pair == (CYLINDER, CYLINDER):  # equal caps stacked exactly, lying across a cap
        # geom 2 lying tilted under geom 1's cap: its rim digs in (one contact), or, overhanging,
        # geom 1's rim cuts into its side (a manifold)
        under = lambda shift: (up(s1[1] + s2[0] - 0.004) + shift, IDQ, up(0), tilted(1.0, [1, 0, 0], 30, lying))  # noqa: E731
        return (rest(s1[1] + s2[1] - 0.01) + [(up(s1[0] + s2[1] - 0.01), lying, up(0), IDQ)]
                + [stand(s1[1] + s2[1] - 0.002), lie(s1[0] + s2[1] - 0.004), under([0.03, 0.02, 0]), under([0.05, -0.087, 0])] + coincident)
    if pair == (CYLINDER, BOX):  # standing on the top face (overhanging it), lying on it
        return (rest(s1[1] + s2[2] - 0.01) + [(up(s1[0] + s2[2] - 0.01), lying, up(0), IDQ)]
                + [stand(s1[1] + s2[2] - 0.002), lie(s1[0] + s2[2] - 0.004)] + coincident)
    return []


@functools.cache
def mujoco_batch(pair):
    """Poses run through MuJoCo, with and without margin: geom frames, sizes, margins, contacts."""
    rng = np.random.default_rng(sum(pair) * 7 + pair[0])
    frames, margins, contacts = [], [], []
    for margin in (0.0, MARGIN):
        m = mujoco.MjModel.from_xml_string(xml(pair, margin))
        d = mujoco.MjData(m)
        for p1, q1, p2, q2 in poses(pair, rng, n=40 if pair in GENERAL else 20):
            if pair[0] == PLANE:  # the plane sits on a mocap body
                d.mocap_pos[0], d.mocap_quat[0] = p1, q1
                d.qpos[:] = np.concatenate([p2, q2])
            else:
                d.qpos[:] = np.concatenate([p1, q1, p2, q2])
            mujoco.mj_forward(m, d)
            con = d.contact[: d.ncon]
            assert np.all(con.geom == [0, 1]), con.geom
            if pair in GENERAL and np.any(con.dist < DEEPEST):
                continue
            frames.append((d.geom_xpos.copy(), d.geom_xmat.reshape(-1, 3, 3).copy()))
            margins.append(margin)
            contacts.append((con.dist.copy(), con.pos.copy(), con.frame.reshape(-1, 3, 3).copy()))
    xpos = np.stack([f[0] for f in frames])
    xmat = np.stack([f[1] for f in frames])
    size = np.broadcast_to(m.geom_size, xpos.shape)
    g1 = GeomFrame(xpos[:, 0], xmat[:, 0], size[:, 0])
    g2 = GeomFrame(xpos[:, 1], xmat[:, 1], size[:, 1])
    return jax.tree.map(jnp.asarray, (g1, g2)), jnp.asarray(margins), contacts


def batch_size(pair):
    """Every evaluation of a pair is padded to this batch: one compilation per pair."""
    return 800 if pair in multiccd.FUNCTIONS else 512  # more FD-checked configurations there (13 x 61)


@functools.cache
def value_and_grad(pair):
    """jit(vmap(value_and_grad)) of sum(w dist + v.pos + u:frame) over valid slots, collision as aux."""
    fn = FUNCTIONS[pair][0]

    def loss(g1, g2, margin, w):
        col = fn(g1, g2, margin)
        terms = w[0] * col.dist + jnp.sum(w[1] * col.pos, -1) + jnp.sum(w[2] * col.frame, (-1, -2))
        return jnp.sum(jnp.where(col.valid, terms, 0.0)), col

    # hundreds of poses (and test_gradients' finite differences) through GJK/EPA loops are run-bound:
    # optimized code there (conftest); the analytic pairs compile in half the time at the suite's flags
    options = OPTIMIZED if pair in GENERAL else None
    return jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)), compiler_options=options)


def evaluate(pair, g1, g2, margin):
    """((loss, Collision), (grad g1, grad g2)) for a batch of geom pairs, as numpy arrays."""
    n, batch = len(margin), batch_size(pair)
    assert n <= batch
    pad = lambda a: jnp.concatenate([a, jnp.broadcast_to(a[:1], (batch - n, *a.shape[1:]))])  # noqa: E731
    rng = np.random.default_rng(1)
    slots = FUNCTIONS[pair][1]
    w = (rng.normal(size=slots), rng.normal(size=(slots, 3)), rng.normal(size=(slots, 3, 3)))
    w = jax.tree.map(lambda a: jnp.broadcast_to(jnp.asarray(a), (batch, *a.shape)), w)
    out = value_and_grad(pair)(*jax.tree.map(pad, (g1, g2, jnp.asarray(margin))), w)
    return jax.tree.map(lambda a: np.asarray(a)[:n], out)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{NAMES[p[0]]}-{NAMES[p[1]]}")
def test_matches_mujoco(pair):
    (g1, g2), margin, contacts = mujoco_batch(pair)
    (_, col), grads = evaluate(pair, g1, g2, margin)
    assert col.valid.shape[1] == FUNCTIONS[pair][1]
    tol = CONVEX_TOL if pair in GENERAL else {"dist": TOL, "pos": TOL, "frame": TOL}
    for leaf in (col.dist, col.pos, col.frame, *jax.tree.leaves(grads)):
        assert np.all(np.isfinite(leaf))  # invalid slots and separated poses included
    n_contact = 0
    for b, (dist, pos, frame) in enumerate(contacts):
        valid = col.valid[b]
        assert valid.sum() == len(dist), (b, valid, dist)
        n_contact += len(dist) > 0
        mine = list(np.flatnonzero(valid))
        for k in range(len(dist)):  # match as sets: nearest remaining contact by position
            j = min(mine, key=lambda j: np.linalg.norm(col.pos[b, j] - pos[k]))
            mine.remove(j)
            np.testing.assert_allclose(col.pos[b, j], pos[k], rtol=0, atol=tol["pos"], err_msg=f"pose {b}")
            np.testing.assert_allclose(col.dist[b, j], dist[k], rtol=0, atol=tol["dist"], err_msg=f"pose {b}")
            np.testing.assert_allclose(col.frame[b, j], frame[k], rtol=0, atol=tol["frame"], err_msg=f"pose {b}")
    assert n_contact >= len(contacts) // 3  # the sampler mostly produces contacts


# ------------------------------------------------------------------------------ gradients


def gradient_configs(pair):
    """(config, smooth, touching): generic penetrating configurations, degenerate ones, a separated one."""
    rng = np.random.default_rng(11 + pair[1])
    m = mujoco.MjModel.from_xml_string(xml(pair, 0.0))
    d = mujoco.MjData(m)
    generic = []
    for p1, q1, p2, q2 in poses(pair, rng, n=200):  # generic: MuJoCo reports penetration
        if pair[0] == PLANE:
            d.mocap_pos[0], d.mocap_quat[0] = p1, q1
            d.qpos[:] = np.concatenate([p2, q2])
        else:
            d.qpos[:] = np.concatenate([p1, q1, p2, q2])
        mujoco.mj_forward(m, d)
        if d.ncon and np.all(d.contact.dist[: d.ncon] < -1e-3):
            generic.append(((p1, q1, p2, q2), True, True))
        if len(generic) == 3:
            break
    # exact degenerate configurations: grads must be finite; FD too where the function stays smooth
    smooth = {(PLANE, CAPSULE): [1], (PLANE, BOX): [0], (PLANE, ELLIPSOID): [0], (PLANE, SPHERE): [0], (CAPSULE, CAPSULE): [0],
              **{pair: [0] for pair in convex.FUNCTIONS}, (CAPSULE, CYLINDER): [1], (CYLINDER, CYLINDER): [2, 3], (CYLINDER, BOX): [2, 3], (ELLIPSOID, CYLINDER): [0, 1]}
    degenerate = [(cfg, i in smooth.get(pair, []), False) for i, cfg in enumerate(degenerate_poses(pair))]
    far = (np.zeros(3), IDQ, np.array([0.0, 0.0, 3.0]), IDQ)
    return generic + DEEP.get(pair, []) + degenerate + [(far, True, False)]


# Deep overlaps where the polish from EPA's start, with its witness's kinks misread
# (`convex._active_kinks`), used to settle below the start; the fallback kept the start's normal,
# whose frame then had derivative 0 (against differences of up to 36). One of 43 such among 1000
# random poses.
# A capsule along a cylinder's side, their axes 0.5-2 degrees apart (two of 24 such among 768 sampled
# poses, whose rotations were up to 5% off orthonormal): the direction reaches the capsule's side
# kink from one side, with its witness at the segment's end, read as off the kink (the polish
# oscillated across it); and EPA's witness 1e-6 inside the capsule's end, read as on the side,
# whose Newton solution lay beyond the end (no step could be taken). Both left the frame's
# derivative 0 against differences of up to 40.
# Then two where the lines of the capsule's and the cylinder's sides (0.4 and 2.9 degrees apart) meet
# beyond both ends, and the polish read the cylinder's side as off, the wrong one: it dropped the
# kink farthest out in sigma, not in length (`convex._outside_kinks`). 12 of 768 sampled poses (axes
# 0.3-6 degrees apart) had such an error of order 1; none since.
# Two cylinders' sides 1.7 degrees apart: the first pass converged onto both side kinks (m = 0 to
# round-off), one was dropped, and the next pass's witness for it jumped between its side's two ends
# with the round-off's sign: at 1e-7 from this pose the normal was 0.05 rad off, at others right.
# Then two deep capsule-cylinder poses. EPA's witness on the cylinder's rim, the solution on its
# side, 2 degrees away: pass 0 had the capsule's side only and dropped it; its Newton step crossed
# the cylinder's side kink, which is now added instead (`convex._crossed_kinks`). And a pass that
# stalled far out on both sides (sigma at 18 and 21) dropped one and lost the other with it (read
# at its x, beyond its end); the kinks kept are now read inside their features. The frame's
# derivative was 0 against differences of 21 and 40; 3 order-1 errors among 768 sampled poses,
# none since.
# Two nearly coincident cylinders (dist -0.35): the depth varies by 0.0023 over the directions across
# their axes, and EPA, not converged in its iterations, ended on a face whose normal was 113 degrees from
# the minimum; the polish, a local method, kept it (the frame's derivative 0 against differences of 78).
# Where EPA did not converge, it now answers as at its iteration whose face normal had the least depth.
DEEP = {(ELLIPSOID, CYLINDER): [((np.array([0.003147, -0.01607, 0.010848]), np.array([-0.065325, 0.806029, -0.421789, 0.410054]),
                                  np.zeros(3), np.array([0.24479, -0.278299, 0.740132, -0.561099])), True, True)],
        (CAPSULE, CYLINDER): [
            ((np.array([0.00468404335848, 0.00876242196114, 0.00256485627222]),
              np.array([-0.0874150113609, 0.736242354415, 0.539553051566, -0.398984104822]),
              np.zeros(3), np.array([-0.0901295972119, 0.739598669369, 0.545201971639, -0.384220345759])), True, True),
            ((np.array([-0.00364514848586, 0.000376425873625, 0.00728849094315]),
              np.array([0.0734251368789, -0.249893232275, 0.955512438258, 0.138412795914]),
              np.zeros(3), np.array([0.0765031683228, -0.259083596967, 0.953082958587, 0.136586342909])), True, True),
            ((np.array([-0.03118512, 0.05129432, 0.11049969]), np.array([0.25025342, -0.09409904, 0.08525038, 0.9598182]),
              np.zeros(3), np.array([0.233146, -0.08531473, 0.06271227, 0.96665998])), True, True),
            ((np.array([-0.08225445, -0.01823408, 0.00416882]), np.array([0.03917564, 0.77648071, -0.04058095, -0.62761147]),
              np.zeros(3), np.array([0.03660067, 0.77864991, -0.03867517, -0.62519512])), True, True),
            ((np.array([0.003633206792, 0.015305348179, 0.002013621926]), np.array([0.686615168223, 0.572815167007, -0.431783111225, -0.118345849415]),
              np.zeros(3), np.array([0.548093189949, 0.106971740493, -0.714555566079, 0.421380166658])), True, True),
            ((np.array([0.002858531519, 0.005899431036, -0.006651008442]), np.array([-0.42222180531, -0.36123836394, 0.26206665522, 0.78902259775]),
              np.zeros(3), np.array([0.859853783783, 0.060186680279, -0.441849886039, -0.248591456489])), True, True)],
        (CYLINDER, CYLINDER): [
            ((np.array([0.00573742774861, 0.0182201136333, -0.0132043097001]),
              np.array([-0.119033615722, 0.728950174565, 0.607826875285, 0.291563253877]),
              np.zeros(3), np.array([-0.136871046785, 0.740000947355, 0.592804383232, 0.286788907885])), True, True),
            ((np.array([0.004025733659, -0.004001147510, -0.020192658105]),
              np.array([0.707813441746, -0.303716085584, -0.128413377683, -0.624713274610]),
              np.zeros(3), np.array([0.692100374257, -0.271105796680, -0.136717994595, -0.654833497092])), True, True)]}


def frames_of(pair, cfg):
    """GeomFrames of a (p1, q1, p2, q2) configuration (mat from MuJoCo's quat2Mat)."""
    s1, s2 = padded_sizes(pair)
    return (np.asarray(cfg[0], float), rotation(cfg[1]), s1), (np.asarray(cfg[2], float), rotation(cfg[3]), s2)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{NAMES[p[0]]}-{NAMES[p[1]]}")
def test_gradients(pair):
    eps = 1e-6
    configs = gradient_configs(pair)
    rows = []
    for cfg, _, _ in configs:
        flat = np.concatenate([np.ravel(a) for g in frames_of(pair, cfg) for a in g])  # 30 numbers
        rows.append(flat)
        for k in range(flat.size):  # central differences on every pos, mat and size entry
            for s in (eps, -eps):
                pert = flat.copy()
                pert[k] += s
                rows.append(pert)
    x = np.stack(rows)
    unflat = lambda a: GeomFrame(jnp.asarray(a[:, :3]), jnp.asarray(a[:, 3:12].reshape(-1, 3, 3)), jnp.asarray(a[:, 12:15]))  # noqa: E731
    g1, g2 = unflat(x[:, :15]), unflat(x[:, 15:])
    (value, col), grads = evaluate(pair, g1, g2, np.zeros(len(x)))
    grad = np.concatenate([np.concatenate([leaf.reshape(len(x), -1) for leaf in jax.tree.leaves(g)], 1) for g in grads], 1)
    assert np.all(np.isfinite(grad)) and np.all(np.isfinite(value))
    stride = 1 + 2 * 30
    valid = col.valid
    assert sum(touching for *_, touching in configs) == 3 + len(DEEP.get(pair, []))
    for c, (_, is_smooth, touching) in enumerate(configs):
        base = c * stride
        assert valid[base].any() or not touching, f"config {c} not in contact"
        if not is_smooth:
            continue
        assert np.all(col.dist[base][valid[base]] < -1e-4)  # validity fixed within the FD step
        fd = (value[base + 1: base + stride: 2] - value[base + 2: base + stride: 2]) / (2 * eps)
        np.testing.assert_allclose(grad[base], fd, rtol=0, atol=1e-5 * max(1.0, np.abs(fd).max()), err_msg=f"config {c}")


def test_sphere_ellipsoid_matches_exact_closest_point():
    """Sphere centre outside an ellipsoid: the closest surface point x solves the Lagrange
    condition x = S^2 y / (S^2 + t), |x / S| = 1 (a scalar root in t > 0). MuJoCo's EPA only
    agrees with it to about 1e-6 in the normal; ours must agree to round-off."""
    from scipy.optimize import brentq

    pair = (SPHERE, ELLIPSOID)
    (r, *_), size = sizes(pair)
    size = np.asarray(size, float)
    rng = np.random.default_rng(5)
    frames1, frames2, expected = [], [], []
    for _ in range(12):
        rot = rotation(random_quat(rng))
        y = unit(rng.normal(size=3)) * size.max() * rng.uniform(1.05, 2.0)  # local centre, outside
        t = brentq(lambda t: np.sum((size * y / (size**2 + t)) ** 2) - 1, 0, 10, xtol=1e-15)
        x = size**2 * y / (size**2 + t)
        nu = rot @ (x / size**2)
        nu /= np.linalg.norm(nu)  # outward ellipsoid normal; ours points sphere -> ellipsoid = -nu
        p2 = rng.normal(size=3) * 0.1
        centre, surface = p2 + rot @ y, p2 + rot @ x
        frames1.append((centre, np.eye(3), np.array([r, 0.0, 0.0])))
        frames2.append((p2, rot, size))
        expected.append((np.linalg.norm(centre - surface) - r, 0.5 * (centre - r * nu + surface), -nu))
    g1, g2 = (GeomFrame(*(jnp.asarray(np.stack(a)) for a in zip(*f))) for f in (frames1, frames2))
    (_, col), _ = evaluate(pair, g1, g2, np.full(12, 10.0))
    for b, (dist, pos, normal) in enumerate(expected):
        np.testing.assert_allclose(col.dist[b, 0], dist, atol=1e-12)
        np.testing.assert_allclose(col.pos[b, 0], pos, atol=1e-12)
        np.testing.assert_allclose(col.frame[b, 0, 0], normal, atol=1e-11)



def test_far_apart_convex_pairs_are_finite_in_float32():
    """Two boxes 1 m to 1 km apart through the GJK/EPA path, float32: no contact, the float64
    distance, finite values and gradients (of a loss that masks invalid slots, as the pipeline
    does). GJK's sub-simplex projection used to solve a KKT system of the support points
    themselves, whose pivots fall as 1/|w|^2: beyond ~10 m every sub-simplex could be rejected,
    the centroid of four points then read as "contains the origin" and EPA's NaN reached the
    gradient. The first pose is the one a GPU fuzz run met (two box meshes, 10.2 m apart)."""
    fn = convex.convex_contact(BOX, BOX)
    mat1 = [[1.5506636e-10, 6.9700414e-01, -7.1706706e-01], [1.6864114e-08, 7.17067e-01, 6.970042e-01],
            [9.9999994e-01, -4.470683e-08, -1.1920929e-07]]
    mat2 = [[-0.787396, 0.3620962, -0.49889296], [-0.18107913, -0.9094599, -0.3742903], [-0.58925223, -0.20437565, 0.781673]]
    pos1, pos2 = np.array([0.403598, 0.6083666, 0.10963109]), np.array([-7.1188045, -6.8465858, 0.25094917])
    stretch = np.array([1.0, 0.1, 3.0, 10.0, 100.0])  # the pair's offset scaled: 1 m to 1 km
    size1, size2 = [0.10971628, 0.15876153, 0.1938028], [0.051230066, 0.09253443, 0.18317929]

    def loss(p2, dtype):
        n = len(stretch)
        g1 = GeomFrame(*(jnp.broadcast_to(jnp.asarray(a, dtype), (n, *np.shape(a))) for a in (pos1, mat1, size1)))
        g2 = GeomFrame(p2.astype(dtype), *(jnp.broadcast_to(jnp.asarray(a, dtype), (n, *np.shape(a))) for a in (mat2, size2)))
        col = jax.vmap(fn)(g1, g2, jnp.zeros(n, dtype))
        return jnp.sum(jnp.where(col.valid, col.dist, 0.0)) + jnp.sum(jnp.where(col.valid[..., None], col.pos, 0.0)), col

    run = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    p2 = jnp.asarray(pos1 + stretch[:, None] * (pos2 - pos1))
    (_, col32), grad = run(p2, jnp.float32)
    (_, col64), _ = run(p2, jnp.float64)
    assert not np.asarray(col32.valid).any()
    for leaf in (col32.dist, col32.pos, col32.frame, grad):
        assert np.all(np.isfinite(np.asarray(leaf)))
    np.testing.assert_allclose(np.asarray(col32.dist), np.asarray(col64.dist), rtol=1e-5)


def test_float32_gjk_stalled_short_of_a_shallow_contact_goes_to_epa():
    """A thin box resting on a cylinder's side 3.4e-5 m deep (GPU fuzz, float32, step 200 of a
    resting scene): float32 GJK stalled 4e-6 m short of the origin, the pair was taken as apart
    along that arbitrary direction and the polish returned a contact 0.73 m deep (the scene then
    gained 3 kJ in one step). A stalled GJK (support gap along its direction far below its
    distance) now goes to EPA: float32 gives float64's contact."""
    fn = jax.jit(FUNCTIONS[(CYLINDER, BOX)][0])  # multiccd: a manifold around the GJK/EPA contact
    frames = (
        ([0.30626028776168823, 0.06697914004325867, 0.18759329617023468],
         [[0.9997732639312744, 0.02129245735704899, 0.00010637636296451092],
          [-0.021292472258210182, 0.9997732639312744, 0.00012770768080372363],
          [-0.0001036330359056592, -0.00012994375720154494, 1.0]],
         [0.19427303969860077, 0.18763431906700134, 0.0]),
        ([0.33689257502555847, -0.33044761419296265, 0.1821424514055252],
         [[0.2874709963798523, 0.4890170097351074, -0.8235430121421814],
          [0.4174696207046509, 0.7098886966705322, 0.5672541856765747],
          [0.8620207905769348, -0.506873369216919, -7.736682891845703e-05]],
         [0.19516710937023163, 0.02773733250796795, 0.19851922988891602]),
    )
    out = {}
    for dtype in (jnp.float32, jnp.float64):
        g1, g2 = (GeomFrame(*(jnp.asarray(a, dtype) for a in f)) for f in frames)
        col = fn(g1, g2, jnp.zeros((), dtype))
        valid = np.asarray(col.valid)
        out[dtype] = np.asarray(col.dist)[valid], np.asarray(col.frame)[valid][:, 0]
    (dist32, normal32), (dist64, normal64) = out[jnp.float32], out[jnp.float64]
    assert len(dist32) >= 1 and np.all(dist32 > -1e-4) and np.all(dist64 > -1e-4)
    np.testing.assert_allclose(normal32[0], normal64[0], atol=5e-3)


def test_float32_gjk_finds_the_origin_in_a_flat_tetrahedron():
    """GJK's tetrahedron around the origin for a cylinder lying 2.5e-4 m into a box (GPU fuzz,
    replayed on the CPU in float32): 5e-4 m high on 0.4 m edges, too flat for the edge-coordinate
    solve (rejected as singular), so GJK stalled 2e-4 m short of the origin, EPA started from a
    polytope without it and the contact came out 0.16-0.72 m deep (the scene gained 250 J in one
    step). Its coordinates now come from signed volumes: float32 gives float64's."""
    w = np.array([[-1.2500778e-02, -3.8667464e-01, 3.1346083e-04],
                  [-5.4289252e-03, 1.8148638e-02, -8.4565952e-03],
                  [1.0146648e-03, 1.2420874e-02, 4.2177737e-04],
                  [6.7065507e-03, 7.1322732e-03, 9.9093840e-03]])
    closest = jax.jit(convex._closest_on_simplex)
    lam64 = np.asarray(closest(jnp.asarray(w, jnp.float64), jnp.ones(4, bool)))
    lam32 = np.asarray(closest(jnp.asarray(w, jnp.float32), jnp.ones(4, bool)))
    np.testing.assert_allclose(lam64 @ w, 0.0, atol=1e-12)  # contains the origin
    assert np.all(lam64 > 0.02) and np.all(lam32 > 0)
    np.testing.assert_allclose(lam32, lam64, atol=1e-3)


def test_float32_epa_keeps_the_origin_inside_its_polytope():
    """The same fuzz scene a few steps on (cylinder against box, near-parallel faces): float32 EPA
    expanded its polytope across near-coplanar faces into one with the origin outside a face and
    returned a depth of -0.013 (the contact then came out 0.73 m deep and the scene gained 8 kJ in
    one step). An expansion that loses the origin is now undone. Compiled at XLA's default
    optimization level: at the suite's level 0 the rounding that breaks it does not happen."""
    cylinder = ([0.0024257388431578875, -0.06359145790338516, 0.1432938277721405],
                [[0.26452362537384033, 0.7271528840065002, -0.6334635019302368],
                 [-0.21655716001987457, -0.5952974557876587, -0.7737725973129272],
                 [-0.9397501349449158, 0.34186220169067383, -1.1920928955078125e-07]],
                [0.1436336189508438, 0.13947361707687378, 0.0])
    box = ([0.319078266620636, 0.14191287755966187, 0.03966899216175079],
           [[1.1920928955078125e-07, -0.0481635183095932, 0.9988394975662231],
            [-4.65208893629665e-09, -0.9988396167755127, -0.0481635183095932],
            [1.0, 3.1342608508566627e-09, -2.384185791015625e-07]],
           [0.039738282561302185, 0.19967436790466309, 0.12153245508670807])
    simplex = (  # GJK's tetrahedron around the origin: w = a - b, a on the cylinder, b on the box
        [[-0.014780014753341675, 0.02845526486635208, -0.032338276505470276],
         [-0.017388835549354553, -0.38404062390327454, -0.0010379329323768616],
         [0.011544197797775269, 0.006904438138008118, 0.03479847311973572],
         [0.0018452256917953491, 0.014844685792922974, -0.0010378733277320862]],
        [[0.17328982055187225, -0.023221097886562347, 0.04706902801990509],
         [0.18991504609584808, -0.036831654608249664, 0.0783693715929985],
         [0.1996140331029892, -0.04477192461490631, 0.11420577764511108],
         [0.18991506099700928, -0.036831676959991455, 0.07836943119764328]],
        [[0.18806983530521393, -0.05167636275291443, 0.07940730452537537],
         [0.20730388164520264, 0.34720897674560547, 0.07940730452537537],
         [0.18806983530521393, -0.05167636275291443, 0.07940730452537537],
         [0.18806983530521393, -0.05167636275291443, 0.07940730452537537]],
        [0.16770201921463013, 0.039445407688617706, 0.17543701827526093, 0.6174156069755554],
    )

    def epa(g1, g2, simplex, tol):
        support = convex._pair_support(CYLINDER, g1, BOX, g2, core=False)
        return convex._epa(support, convex._Simplex(*simplex), tol, jnp.array(True))[:2]

    epa = jax.jit(epa, compiler_options={"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False})
    out = {}
    for dtype in (jnp.float32, jnp.float64):
        g1, g2 = (GeomFrame(*(jnp.asarray(a, dtype) for a in f)) for f in (cylinder, box))
        out[dtype] = epa(g1, g2, tuple(jnp.asarray(a, dtype) for a in simplex), jnp.asarray(1.5099021766218357e-06, dtype))
    (n32, depth32), (n64, depth64) = out[jnp.float32], out[jnp.float64]
    assert 0 < float(depth64) < 2e-3 and float(depth32) >= 0
    np.testing.assert_allclose(float(depth32), float(depth64), atol=1e-5)
    np.testing.assert_allclose(n32, n64, atol=5e-3)


def test_capsule_box_gradient_is_finite_with_round_off_off_its_rotation_axis():
    """A capsule and a box both turned about the world y axis, their matrices carrying float32
    round-off (1e-26 to 1e-23) off that axis (GPU fuzz, seed 3010 scene 49, step 41 of 500). The
    capsule's axis in the box frame then has a y component of ~1e-24: nonzero, so `capsule_box`
    forms size / component (as C does; never the minimum), and the textbook derivative of that
    quotient, -size / component**2, overflowed float32. The pair is apart, so the pipeline passes
    a zero cotangent, and 0 * inf made the step's gradient NaN. Now finite, and float64's."""
    fn = FUNCTIONS[(CAPSULE, BOX)][0]
    capsule = ([0.14319934, 0.2585144, 0.20184954],
               [[0.99816817, -1.2204523e-25, -0.06050081], [1.2429599e-25, 1.0, 3.3438874e-26],
                [0.06050081, -4.0897628e-26, 0.99816817]], [0.15225595, 0.052182987, 0.0])
    box = ([0.40568632, 0.2585144, 0.1838665],
           [[0.8934493, 2.3085642e-23, -0.44916412], [-2.4772637e-23, 1.0, 2.1207105e-24],
            [0.44916412, 9.2322317e-24, 0.8934493]], [0.02185354, 0.058766577, 0.19535346])

    def loss(poses, dtype, masked):
        col = fn(*(GeomFrame(p, m, jnp.asarray(s, dtype)) for (p, m), (_, _, s) in zip(poses, (capsule, box))),
                 jnp.zeros((), dtype))
        weight = jnp.where(col.valid, 1.0, 0.0) if masked else jnp.ones_like(col.dist)
        return jnp.sum(weight * col.dist) + jnp.sum(weight[:, None] * col.pos)

    grad = jax.jit(jax.grad(loss), static_argnums=(1, 2))
    poses = lambda dtype: tuple((jnp.asarray(p, dtype), jnp.asarray(m, dtype)) for p, m, _ in (capsule, box))  # noqa: E731
    masked = grad(poses(jnp.float32), jnp.float32, True)  # both slots apart: a zero cotangent
    assert all(np.all(np.asarray(leaf) == 0) for leaf in jax.tree.leaves(masked))
    g32, g64 = grad(poses(jnp.float32), jnp.float32, False), grad(poses(jnp.float64), jnp.float64, False)
    for a, b in zip(jax.tree.leaves(g32), jax.tree.leaves(g64)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_norm_and_normalize_derivatives_are_finite_where_the_square_is_subnormal():
    """A GPU keeps float32 subnormals (XLA's CPU flushes them): there a round-off vector of 1e-20,
    such as the cross product of two parallel box edges in planar motion (`box_box` always forms
    edge pair 0's contact, then discards it for a face contact; GPU fuzz seed 9002, planar scenes
    turned about x), has |x|^2 = 1e-40 > 0, and JAX's quotient rule -x / |x|^2 overflowed to inf:
    0 * inf = NaN through the discarded candidate. float16 keeps its subnormals on this CPU, so it
    shows the same regime here (|x| = 1e-3: |x|^2 subnormal in float16). `normalize` and
    `safe_norm` are now differentiated through 1 / |x|: finite, and the analytic derivatives."""
    x = jnp.array([1e-3, 2e-4, -3e-4], jnp.float16)
    assert 0 < float(jnp.sum(x * x)) < float(jnp.finfo(jnp.float16).tiny)  # subnormal, not flushed
    length = np.linalg.norm(np.asarray(x, np.float64))
    unit = np.asarray(x, np.float64) / length
    for jacobian in (jax.jacfwd(jm.normalize), jax.jacrev(jm.normalize)):
        # (I - u u^T) / |x|, up to the few bits a float16 subnormal |x|^2 holds
        jac = np.asarray(jacobian(x), np.float64)
        assert np.all(np.isfinite(jac))
        assert 0.8 < np.linalg.norm(jac, 2) * length < 1.25
        assert np.linalg.norm(jac @ unit) < 0.1 / length
    np.testing.assert_allclose(np.asarray(jax.grad(jm.safe_norm)(x), np.float64), unit, atol=0.05)
    # the discarded-candidate pattern: a zero cotangent stays zero
    masked = jax.grad(lambda v: jnp.where(False, jnp.sum(jm.normalize(v)), 0.0))(x)
    assert np.all(np.asarray(masked) == 0)
    # exactly zero: the identity and a zero gradient, as before
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(jm.normalize)(jnp.zeros(3))), np.eye(3))
    np.testing.assert_array_equal(np.asarray(jax.grad(jm.safe_norm)(jnp.zeros(3))), np.zeros(3))


def test_polish_settles_the_witnesses_where_crossed_sides_pin_the_normal():
    """Two cylinders' sides crossed at 50 degrees, 9 cm deep: the kinks of both sides pin n to their axes'
    cross product, exactly where s(n) of (1) peaks with a kink, and EPA's start had the right n but
    witnesses on a flat face of the Minkowski difference with a tangential gap. Every Newton step's change
    of n was the solve's round-off, along which s drops linearly, and none was taken: the gap stayed and
    the position's derivative was that of witnesses fixed on their bodies (10 of 1792 sampled deep poses,
    `experiments/pair_fd.py`, where a batch's start came out so). The witnesses are the points of the
    axes' common normal, moved out by the radii."""
    size1, size2 = padded_sizes((CYLINDER, CYLINDER))
    r1, r2 = size1[0], size2[0]
    mat1 = rotation([0.9, 0.1, -0.3, 0.2])
    a1 = mat1[:, 2]
    a2 = np.cos(np.radians(50)) * a1 + np.sin(np.radians(50)) * unit(np.cross(a1, [0.3, -1.0, 0.2]))
    mat2 = rotation(quat_z_to(a2))
    n = unit(np.cross(a1, a2))
    depth, t1, t2 = 0.09, 0.1, -0.05
    p2 = t1 * a1 + (r1 + r2 - depth) * n - t2 * a2
    # EPA's start: the right normal, each witness on its side 0.1 and 0.15 from the solution along its axis
    start = n, (t1 + 0.1) * a1 + r1 * n, p2 + (t2 - 0.15) * a2 - r2 * n
    scale = convex._bound(CYLINDER, size1) + convex._bound(CYLINDER, size2)

    def contact(p1):
        g1 = GeomFrame(p1, jnp.asarray(mat1), jnp.asarray(size1))
        g2 = GeomFrame(jnp.asarray(p2), jnp.asarray(mat2), jnp.asarray(size2))
        n, a, b = convex._polish(CYLINDER, g1, CYLINDER, g2, *map(jnp.asarray, start), scale)
        return 0.5 * (a + b), (n, a, b)

    dpos, (n_out, a, b) = jax.jit(jax.jacfwd(contact, has_aux=True))(jnp.zeros(3))
    np.testing.assert_allclose(n_out, n, atol=1e-12)
    np.testing.assert_allclose(a, t1 * a1 + r1 * n, atol=1e-12)
    np.testing.assert_allclose(b, t1 * a1 + (r1 - depth) * n, atol=1e-12)
    # moving geom 1 by delta moves the axes' common normal along both axes: (s a1 - u a2) cancels
    # delta's part across n, and the midpoint moves by (delta + s a1 + u a2) / 2
    across = np.eye(3) - np.outer(n, n)
    s_u = np.linalg.lstsq(np.stack([a1, -a2], 1), -across, rcond=None)[0]
    np.testing.assert_allclose(dpos, 0.5 * (np.eye(3) + np.outer(a1, s_u[0]) + np.outer(a2, s_u[1])), atol=1e-9)
