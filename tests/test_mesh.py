"""Mesh geoms (their convex hulls) against MuJoCo: plane-mesh contact sets and trajectories,
sphere/box/mesh-mesh single contacts, multiccd manifolds against meshes, finite-difference
gradients, load-time refusals."""

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp import smooth
from jaxsim_ncp.collision import driver, mesh
from test_gradients import check_directional

CUBE = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
TETRA = np.array([[0, 0, 1], [0.94, 0, -0.33], [-0.47, 0.82, -0.33], [-0.47, -0.82, -0.33]])


def _hull(rng, n, scale):
    return rng.normal(size=(n, 3)) * scale


def _mesh_assets(meshes):
    return "".join(f'<mesh name="{k}" vertex="{" ".join(f"{x:.6f}" for x in v.ravel())}"/>' for k, v in meshes.items())


def _resting_scene():
    """Meshes dropped on a plane: flat and tilted cubes (one with a margin), a tetrahedron and
    random hulls; meshes collide only with the plane."""
    rng = np.random.default_rng(3)
    meshes = {"cube": 0.05 * CUBE, "tetra": 0.06 * TETRA, "blob": _hull(rng, 30, [0.05, 0.04, 0.03]),
              "flat": _hull(rng, 12, [0.06, 0.05, 0.015])}  # fmt: skip
    bodies = [("cube", "0 0 0.049", "0 0 30", 0), ("cube", "0.3 0 0.06", "4 3 10", 0.01),
              ("tetra", "0 0.3 0.04", "10 -5 0", 0), ("blob", "0.3 0.3 0.06", "20 40 60", 0),
              ("flat", "-0.3 0 0.03", "2 1 0", 0.005)]  # fmt: skip
    body_xml = "".join(
        f'<body pos="{p}" euler="{e}"><freejoint/><geom type="mesh" mesh="{k}" contype="2" conaffinity="1" margin="{mg}"/></body>'
        for k, p, e, mg in bodies
    )
    return f"""<mujoco><option timestep="0.004"/><asset>{_mesh_assets(meshes)}</asset><worldbody>
        <geom type="plane" size="5 5 .1"/>{body_xml}</worldbody></mujoco>"""


def _convex_scene():
    """Sphere, box and mesh bodies pressed into a static mesh from three sides (no gravity,
    multiccd off: MuJoCo's single contact), MuJoCo's EPA run to a tight tolerance; a tilted
    mesh on a plane below (placed by _press)."""
    rng = np.random.default_rng(5)
    meshes = {"rock": _hull(rng, 40, [0.1, 0.08, 0.07]), "pebble": _hull(rng, 14, [0.04, 0.03, 0.03])}
    return f"""<mujoco><option gravity="0 0 0" ccd_tolerance="1e-13" ccd_iterations="500"><flag multiccd="disable"/></option>
        <asset>{_mesh_assets(meshes)}</asset><worldbody>
        <geom type="mesh" mesh="rock" euler="10 20 30"/>
        <body pos="0.3 0 0"><freejoint/><geom type="sphere" size="0.04"/></body>
        <body pos="0 0.3 0" euler="15 25 35"><freejoint/><geom type="box" size="0.04 0.03 0.02"/></body>
        <body pos="0 0 0.3" euler="-20 10 40"><freejoint/><geom type="mesh" mesh="pebble"/></body>
        <geom type="plane" pos="0 0 -1" size="5 5 .1" margin="0.05"/>
        <body pos="0 0 -0.9" euler="3 -4 50"><freejoint/><geom type="mesh" mesh="rock"/></body>
        </worldbody></mujoco>"""


def _press(m, d, depth=0.003):
    """Move the first three free bodies towards the origin along their start offsets until they
    penetrate the static geom 0 by depth; lower the fourth (geom 5) into the plane by depth."""
    mujoco.mj_forward(m, d)
    lowest = d.geom_xpos[5, 2] + np.min((m.mesh_vert[: m.mesh_vertnum[0]] @ d.geom_xmat[5].reshape(3, 3).T)[:, 2])
    d.qpos[23] += -1.0 - lowest - depth
    for j in range(3):
        adr = m.jnt_qposadr[j]
        start = d.qpos[adr : adr + 3].copy()
        for s in np.linspace(1.0, 0.0, 2001):
            d.qpos[adr : adr + 3] = s * start
            mujoco.mj_forward(m, d)
            touching = lambda c: 0 in c.geom and m.jnt_bodyid[j] in m.geom_bodyid[c.geom]  # noqa: E731
            dists = [c.dist for c in d.contact[: d.ncon] if touching(c)]
            if dists and min(dists) < -depth:
                break


def _assert_contacts_match(model, out, d, tol):
    """Every MuJoCo contact, in order per geom pair: distance, position and normal."""
    mask = np.asarray(out.contact.mask)
    assert int(mask.sum()) == d.ncon
    geoms = model.constraints.contact_geom[mask]
    dist, pos, frame = (np.asarray(a)[mask] for a in (out.contact.dist, out.contact.pos, out.contact.frame))
    for pair in {tuple(g) for g in geoms}:
        ours = np.nonzero((geoms[:, 0] == pair[0]) & (geoms[:, 1] == pair[1]))[0]
        theirs = [c for c in d.contact[: d.ncon] if tuple(c.geom) == pair]
        assert len(ours) == len(theirs), pair
        for i, c in zip(ours, theirs):
            np.testing.assert_allclose(dist[i], c.dist, atol=tol)
            np.testing.assert_allclose(pos[i], c.pos, atol=tol)
            np.testing.assert_allclose(frame[i], c.frame.reshape(3, 3), atol=tol)


def _assert_contact_sets_match(model, contact, d, tol):
    """As many contacts as MuJoCo, and each of MuJoCo's is one of ours (the nearest of its pair's;
    the order within a pair aside): distance, position and normal."""
    mask = np.asarray(contact.mask)
    assert int(mask.sum()) == d.ncon
    geoms = model.constraints.contact_geom[mask]
    dist, pos, normal = (np.asarray(a)[mask] for a in (contact.dist, contact.pos, contact.frame[:, 0]))
    for c in d.contact[: d.ncon]:
        ours = np.nonzero((geoms[:, 0] == c.geom[0]) & (geoms[:, 1] == c.geom[1]))[0]
        k = ours[np.argmin(np.linalg.norm(pos[ours] - c.pos, axis=1))]
        np.testing.assert_allclose(pos[k], c.pos, atol=tol)
        np.testing.assert_allclose(dist[k], c.dist, atol=tol)
        np.testing.assert_allclose(normal[k], c.frame[:3], atol=tol)


STEPS = 100
_ROLLOUT = jax.jit(lambda model, data: jsn.rollout(model, data, jnp.zeros((STEPS, model.nu))))


def test_plane_mesh_contacts_and_trajectory_match_mujoco():
    m = mujoco.MjModel.from_xml_string(_resting_scene())
    m.opt.iterations, m.opt.ls_iterations, m.opt.tolerance = 100, 50, 1e-13
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    assert d.ncon >= 10  # the flat cube rests on 4 corners, the tilted one reaches 4 with its margin
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel))
    final, traj = _ROLLOUT(model, data)
    _assert_contacts_match(model, jax.tree.map(lambda x: x[0], traj), d, 1e-12)
    qpos = []
    for _ in range(STEPS):
        mujoco.mj_step(m, d)
        qpos.append(d.qpos.copy())
    np.testing.assert_allclose(np.asarray(traj.qpos), np.stack(qpos), atol=1e-8, rtol=0)
    assert not bool(final.diverged)


def test_plane_mesh_large_face_rests_on_four_of_its_vertices():
    """A hexagonal prism on its face: MuJoCo's 4-of-6 choice is not reproduced (mesh.py), but the
    contacts are 4 distinct vertices of the bottom face, at their depth, along the plane normal."""
    a = np.arange(6) * np.pi / 3
    prism = np.concatenate([np.stack([0.1 * np.cos(a), 0.1 * np.sin(a), np.full(6, z)], 1) for z in (-0.02, 0.02)])
    xml = f"""<mujoco><asset>{_mesh_assets({"prism": prism})}</asset><worldbody><geom type="plane" size="5 5 .1"/>
        <body pos="0 0 0.019" euler="0.5 0.3 0"><freejoint/><geom type="mesh" mesh="prism" margin="0.01"/></body>
        </worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    model = jsn.from_mujoco(m)
    contact = driver.collide(model, smooth.kinematics(model, jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos))))
    mask = np.asarray(contact.mask)
    assert mask.sum() == d.ncon == 4
    xmat, xpos = d.geom_xmat[1].reshape(3, 3), d.geom_xpos[1]
    world = xpos + m.mesh_vert @ xmat.T  # the mesh in its (recentred) geom frame
    bottom = world[world[:, 2] < world[:, 2].min() + 0.01]
    assert len(bottom) == 6
    pos, dist = np.asarray(contact.pos)[mask], np.asarray(contact.dist)[mask]
    vertex = pos + 0.5 * dist[:, None] * np.array([0, 0, 1.0])
    match = np.argmin(np.linalg.norm(vertex[:, None] - bottom[None], axis=-1), axis=1)
    np.testing.assert_allclose(vertex, bottom[match], atol=1e-12)
    np.testing.assert_allclose(dist, bottom[match, 2], atol=1e-12)
    assert len(set(match)) == 4
    np.testing.assert_allclose(np.asarray(contact.frame)[mask][:, 0], np.tile([0, 0, 1.0], (4, 1)), atol=1e-15)


@pytest.fixture(scope="module")
def convex():
    m = mujoco.MjModel.from_xml_string(_convex_scene())
    d = mujoco.MjData(m)
    _press(m, d)
    model = jsn.from_mujoco(m)

    def contact_loss(qpos):
        data = smooth.kinematics(model, jsn.make_data(model).replace(qpos=qpos))
        c = driver.collide(model, data)
        w = jnp.where(c.mask, 1.0, 0.0)
        return jnp.sum(w * c.dist) + jnp.sum(w[:, None] * c.pos**2) + jnp.sum(w[:, None] * c.frame[:, 0] * c.pos), c

    return m, d, model, jax.jit(jax.value_and_grad(contact_loss, has_aux=True))


def test_sphere_box_mesh_against_mesh_match_mujoco(convex):
    m, d, model, value_and_grad = convex
    assert d.ncon == 3 + 3  # a contact with each of three bodies, three vertices within the plane's margin
    (_, contact), _ = value_and_grad(jnp.asarray(d.qpos))
    out = jsn.make_data(model).replace(contact=contact)
    _assert_contacts_match(model, out, d, 1e-8)


def test_mesh_contact_gradients_match_finite_differences(convex):
    m, d, model, value_and_grad = convex
    check_directional(None, jnp.asarray(d.qpos), np.random.default_rng(0), n_dirs=3, rtol=1e-5,
                      value_and_grad=lambda q: (lambda out: (out[0][0], out[1]))(value_and_grad(q)))  # fmt: skip


def test_mesh_validation():
    """A manifold pair with a margin loads (with multiccd on or off); a non-finite hull names its mesh."""
    xml = f"""<mujoco><asset>{_mesh_assets({"cube": 0.05 * CUBE})}</asset><worldbody>
        <body><freejoint/><geom name="rod" type="capsule" size="0.02 0.1" margin="0.01"/></body>
        <body pos="0 0 0.3"><freejoint/><geom name="block" type="mesh" mesh="cube"/></body></worldbody></mujoco>"""
    assert (3, 7) in {g.types for g in jsn.from_mujoco(mujoco.MjModel.from_xml_string(xml)).constraints.groups}
    model = jsn.from_mujoco(mujoco.MjModel.from_xml_string(xml.replace("<worldbody>", '<option><flag multiccd="disable"/></option><worldbody>')))
    assert (3, 7) in {g.types for g in model.constraints.groups}
    bad = eqx.tree_at(lambda mdl: mdl.mesh_vert, model, model.mesh_vert.at[0, 3, 1].set(jnp.nan))
    with pytest.raises(jsn.ModelError, match='mesh_vert of mesh "cube": non-finite'):
        jsn.check_model(bad)


def _intermediate_sizes(jaxpr):
    """Element counts of every value a jaxpr (and its sub-jaxprs) computes."""
    for eqn in jaxpr.eqns:
        yield from (int(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _intermediate_sizes(sub)


def test_mesh_features_hold_only_the_polygons_at_the_support_vertex():
    """A fine hull (387 polygons) against itself: the manifold's face and edge searches range
    over the polygons at each support vertex (`MeshShape.vert_poly`), so no value of the narrow
    phase grows with the square of the polygon count (it was (P, P): 23 GB for MuJoCo's 125
    bunnies). Tracing only."""
    points = np.random.default_rng(0).normal(size=(200, 3))
    points = 0.05 * points / np.linalg.norm(points, axis=1, keepdims=True)
    xml = f"""<mujoco><asset>{_mesh_assets({"ball": points})}</asset><worldbody>
        <body><freejoint/><geom type="mesh" mesh="ball"/></body>
        <body pos="0 0 0.09"><freejoint/><geom type="mesh" mesh="ball"/></body></worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    model = jsn.from_mujoco(m)
    table = mesh.vertex_polygons(model.topology.mesh_polyvert, model.mesh_vert.shape[1])
    polys = [set(p) - {-1} for p in model.topology.mesh_polyvert[0]]
    for v, around in enumerate(table[0]):  # each vertex's polygons, ascending, and no other
        assert list(around[around >= 0]) == [p for p, poly in enumerate(polys) if v in poly]
    data = jsn.make_data(model)
    jaxpr = jax.make_jaxpr(lambda q: driver.collide(model, smooth.kinematics(model, data.replace(qpos=q))))(data.qpos)
    n_poly = int(m.mesh_polynum[0])
    assert n_poly > 300 and max(_intermediate_sizes(jaxpr.jaxpr)) < 0.1 * n_poly**2


def _manifold_scene():
    """Bodies resting 1 mm deep on a static mesh slab with a 1 cm margin (multiccd on): a box tilted
    by 3 deg (face-face, its 4 corners within the margin), a mesh cube on an edge (edge-face, the
    edge from MuJoCo's EPA points on the inflated shapes), a capsule tilted by 2 deg (edge-face: its
    line through the inflated witness, deflated along the face normal) and a yawed mesh cube flat on
    its face (4 points)."""
    slab = 0.3 * CUBE * np.array([2.0, 2.0, 1.0 / 3.0])  # top face at z = 0.1
    low = lambda offset: 0.1 + offset - 0.001  # noqa: E731
    tilt = np.radians(3.0)
    return f"""<mujoco><option ccd_tolerance="1e-13" ccd_iterations="500"/>
        <asset>{_mesh_assets({"slab": slab, "cube": 0.05 * CUBE})}</asset><worldbody>
        <geom name="slab" type="mesh" mesh="slab" margin="0.01"/>
        <body pos="-0.35 0 {low(0.05 * (np.cos(tilt) + np.sin(tilt)))}" euler="3 0 10"><freejoint/><geom type="box" size="0.05 0.05 0.05"/></body>
        <body pos="0 0 {low(0.05 * np.sqrt(2))}" euler="45 0 0"><freejoint/><geom type="mesh" mesh="cube"/></body>
        <body pos="0.35 0.01 {low(0.02)}" euler="0 92 0"><freejoint/><geom type="capsule" size="0.02 0.08"/></body>
        <body pos="0 0.35 {low(0.05)}" euler="0 0 20"><freejoint/><geom type="mesh" mesh="cube"/></body>
        </worldbody></mujoco>"""


def test_multiccd_manifolds_against_a_mesh_match_mujoco_and_finite_differences():
    """Contacts and qacc at the start and a 40-step trajectory (the bodies settling under gravity)
    against MuJoCo; finite differences of the contacts' geometry w.r.t. qpos."""
    m = mujoco.MjModel.from_xml_string(_manifold_scene())
    d = mujoco.MjData(m)
    d.qvel[:] = 0.05 * np.random.default_rng(0).normal(size=m.nv)
    mujoco.mj_forward(m, d)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel))
    _, traj = jax.jit(lambda data: jsn.rollout(model, data, jnp.zeros((40, 0))))(data)
    contact = jax.tree.map(lambda x: x[0], traj.contact)  # at the initial state
    per_body = [sum(1 for c in d.contact[: d.ncon] if g in c.geom) for g in range(1, 5)]
    assert per_body == [4, 2, 2, 4]  # MuJoCo's manifolds: tilted face (2 of 4 within the margin), edge, capsule line, face
    _assert_contact_sets_match(model, contact, d, 1e-9)
    np.testing.assert_allclose(traj.qacc[0], d.qacc, rtol=0, atol=1e-8 * np.abs(d.qacc).max())
    for t in range(40):
        mujoco.mj_step(m, d)
        np.testing.assert_allclose(traj.qpos[t], d.qpos, atol=1e-9)
        np.testing.assert_allclose(traj.qvel[t], d.qvel, atol=1e-8)

    def contact_loss(qpos):
        c = driver.collide(model, smooth.kinematics(model, data.replace(qpos=qpos)))
        w = jnp.where(c.mask, 1.0, 0.0)
        return jnp.sum(w * c.dist) + jnp.sum(w[:, None] * c.pos**2) + jnp.sum(w[:, None] * c.frame[:, 0] * c.pos)

    check_directional(contact_loss, data.qpos, np.random.default_rng(1), n_dirs=2, rtol=1e-5)


def test_cylinders_lying_across_a_mesh_block_match_mujoco_and_finite_differences():
    """Cylinders and a capsule lying on a free mesh block's top face, tilted 1-2 deg, the cylinders
    overhanging its edges (the block's edge cuts into a side, so the contact normal is not the face's):
    each cylinder's side line is its support line towards the face (MuJoCo 4.0.1), clipped to the
    face. Contacts equal MuJoCo's to 1e-9 (the side line along the contact normal was 9e-6 off);
    their geometry's gradient w.r.t. qpos equals central differences, the block's rotation included
    (the capsule's line once kept its offset from the axis fixed as the face turned: both points'
    position derivatives were off by the same vector)."""
    block = 0.15 * CUBE * np.array([1.0, 1.0, 0.5])  # top face at z = 0.075
    poses = [(0.12, 0, 1, 0, 30), (0.1, 0.05, 1.5, 20, 60), (-0.12, 0.02, -1, 0, -30), (0.13, -0.1, 2, 10, 10)]
    bodies = "".join(f'<body pos="{x} {y} {0.075 + 0.04 - 0.002}" euler="{roll} {90 + tilt} {yaw}"><freejoint/>'
                     f'<geom type="cylinder" size="0.04 0.12" contype="1" conaffinity="2"/></body>' for x, y, tilt, roll, yaw in poses)  # fmt: skip
    capsule = '<body pos="-0.05 -0.1 0.103" euler="0 91 0"><freejoint/><geom type="capsule" size="0.03 0.08" contype="1" conaffinity="2"/></body>'
    m = mujoco.MjModel.from_xml_string(f"""<mujoco><option ccd_tolerance="1e-13" ccd_iterations="500" gravity="0 0 0"/>
        <asset>{_mesh_assets({"block": block})}</asset><worldbody>
        <body><freejoint/><geom type="mesh" mesh="block" contype="2"/></body>{bodies}{capsule}</worldbody></mujoco>""")
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    model = jsn.from_mujoco(m)

    def contact_loss(qpos):
        c = driver.collide(model, smooth.kinematics(model, jsn.make_data(model).replace(qpos=qpos)))
        w = jnp.where(c.mask, 1.0, 0.0)
        return jnp.sum(w * c.dist) + jnp.sum(w[:, None] * c.pos**2) + jnp.sum(w[:, None] * c.frame[:, 0] * c.pos), c

    value_and_grad = jax.jit(jax.value_and_grad(contact_loss, has_aux=True))
    (_, contact), _ = value_and_grad(jnp.asarray(d.qpos))
    assert d.ncon == 2 * len(poses) + 2
    _assert_contact_sets_match(model, contact, d, 1e-9)
    check_directional(None, jnp.asarray(d.qpos), np.random.default_rng(0), n_dirs=2, rtol=1e-5,
                      value_and_grad=lambda q: (lambda out: (out[0][0], out[1]))(value_and_grad(q)))  # fmt: skip


def test_cylinder_side_line_along_its_axis_has_no_round_off_azimuth():
    """multiccd's cylinder side line where the contact direction is its axis up to round-off
    (float32 EPA lands there exactly: the mesh fuzz's NaN gradient, a rollout whose adjoint grew
    1e5-1e6 in single steps). The line's azimuth is then noise whose derivative is ~1/sqrt(n2):
    it is put at a fixed azimuth on the side instead. With a real tilt it follows the direction."""
    from jaxsim_ncp.collision.base import GeomFrame
    from jaxsim_ncp.collision.multiccd import CYLINDER, _edge

    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, np.array([0.9, 0.2, -0.3, 0.25]) / np.linalg.norm([0.9, 0.2, -0.3, 0.25]))
    rot = jnp.asarray(mat.reshape(3, 3))
    size = jnp.array([0.13, 0.08, 0.0])

    def line(mat, tilt, dtype):
        g = GeomFrame(jnp.zeros(3, dtype), mat.astype(dtype), size.astype(dtype))
        towards = rot[:, 2] + tilt * rot[:, 0]
        towards = (towards / jnp.linalg.norm(towards)).astype(dtype)
        return _edge(CYLINDER, g, None, towards, jnp.asarray(1.0, dtype))[0]

    for dtype, tilt in ((jnp.float32, 1e-8), (jnp.float32, 0.03), (jnp.float64, 1e-8)):
        ends = np.asarray(line(rot, tilt, dtype), np.float64)
        local = ends @ np.asarray(rot)  # rows: the endpoints in the cylinder's frame
        np.testing.assert_allclose(np.hypot(local[:, 0], local[:, 1]), 0.13, rtol=1e-5)  # on the side
        np.testing.assert_allclose(np.abs(local[:, 2]), 0.08, rtol=1e-5)
        if tilt > 1e-6 or dtype == jnp.float64:  # a real direction off the axis: the support line along it
            np.testing.assert_allclose(local[:, 0], 0.13, rtol=1e-4)
        jac = jax.jacrev(line)(rot, tilt, dtype)
        bound = 10.0 if dtype == jnp.float32 and tilt < 1e-6 else 1e9  # float64: the exact geometry's 1/sqrt(n2)
        assert np.all(np.isfinite(np.asarray(jac))) and np.abs(np.asarray(jac)).max() < bound


def test_fine_hull_features_come_from_mujocos_epa_face():
    """Box-mesh and mesh-mesh manifolds with a 150-vertex hull (faces a few degrees apart) along
    MuJoCo's own trajectory (3 rocks and a box tumbling onto a tilted slab): every contact, at 40
    states, as MuJoCo's. Which faces and edges take part is read off MuJoCo's final EPA face; the
    support set within a tolerance (the float32 rule) names other ones at 2 of these states."""
    rng = np.random.default_rng(1)
    rock = rng.normal(size=(150, 3))
    rock = rock / np.linalg.norm(rock, axis=1, keepdims=True) * [0.06, 0.045, 0.035]
    shapes = ['<geom type="mesh" mesh="rock"/>', '<geom type="box" size="0.04 0.03 0.025"/>'] + ['<geom type="mesh" mesh="rock"/>'] * 2
    bodies = "".join(
        f'<body pos="{-0.06 + 0.12 * (k % 2) + 0.01 * (k // 2)} {0.02 * (k // 2)} {0.05 + 0.09 * (k // 2)}" '
        f'euler="{rng.uniform(0, 90):.1f} {rng.uniform(0, 90):.1f} 0"><freejoint/>{shape}</body>'
        for k, shape in enumerate(shapes)
    )
    m = mujoco.MjModel.from_xml_string(f"""<mujoco><option timestep="0.005"/><asset>{_mesh_assets({"rock": rock})}</asset>
        <worldbody><geom type="box" size="0.2 0.2 0.01" pos="0 0 -0.005" euler="0 3 0"/>{bodies}</worldbody></mujoco>""")
    d = mujoco.MjData(m)
    qpos, theirs = [], []
    for t in range(400):
        mujoco.mj_step(m, d)
        if t % 10 == 9:
            mujoco.mj_forward(m, d)
            qpos.append(d.qpos.copy())
            theirs.append([(tuple(c.geom), c.dist, c.pos.copy(), c.frame[:3].copy()) for c in d.contact[: d.ncon]])
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    out = jax.jit(jax.vmap(lambda q: driver.collide(model, smooth.kinematics(model, data.replace(qpos=q)))))(jnp.asarray(np.array(qpos)))
    geoms = model.constraints.contact_geom
    manifolds = 0
    for s, contacts in enumerate(theirs):
        mask = np.asarray(out.mask[s])
        assert int(mask.sum()) == len(contacts), s
        dist, pos, normal = (np.asarray(a[s])[mask] for a in (out.dist, out.pos, out.frame[:, :, 0]))
        for pair in {c[0] for c in contacts}:
            ours = np.nonzero(np.all(geoms[mask] == pair, axis=1))[0]
            same = [c for c in contacts if c[0] == pair]
            assert len(ours) == len(same), (s, pair)
            manifolds += len(same) > 1
            for _, c_dist, c_pos, c_normal in same:  # each of MuJoCo's contacts is one of ours
                k = ours[np.argmin(np.linalg.norm(pos[ours] - c_pos, axis=1))]
                np.testing.assert_allclose(pos[k], c_pos, atol=1e-12)
                np.testing.assert_allclose(dist[k], c_dist, atol=1e-12)
                np.testing.assert_allclose(normal[k], c_normal, atol=1e-12)
    assert manifolds >= 40  # the multi-point manifolds this checks are there
