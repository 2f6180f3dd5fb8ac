"""Contact capacity (`max_geom_pairs`): the broad phase that picks which pairs the narrow
phase sees, its overflow flag, and that within capacity nothing changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp import constraint, math, smooth
from jaxsim_ncp.collision import collide, driver

# spheres and capsules crowded over a plane: several pairs per narrow-phase function
rng = np.random.default_rng(3)
BODIES = "".join(
    f'<body pos="{x:.3f} {y:.3f} {z:.3f}" euler="{a:.0f} {b:.0f} 0"><freejoint/>'
    + (f'<geom type="sphere" size="{r:.3f}"/>' if i % 2 else f'<geom type="capsule" size="{r:.3f} 0.06"/>')
    + "</body>"
    for i, (x, y, z, a, b, r) in enumerate(
        zip(*rng.uniform([-0.2, -0.2, 0.0, 0, 0, 0.03], [0.2, 0.2, 0.25, 180, 180, 0.08], size=(8, 6)).T)
    )
)
CROWD = f'<mujoco><worldbody><geom type="plane" size="2 2 0.1"/>{BODIES}</worldbody></mujoco>'


def _contacts(model):
    data = jsn.make_data(model)
    run = jax.jit(lambda q: collide(model, smooth.kinematics(model, data.replace(qpos=q))))
    depth = jax.jit(jax.grad(lambda q: jnp.sum(jnp.where((c := run(q)).mask, jnp.sin(c.dist), 0.0))))
    return run(model.qpos0), depth(model.qpos0)


def _present(contact):
    """The contact array with the slots that hold no contact zeroed (their geometry is arbitrary)."""
    keep = lambda x: np.where(np.asarray(contact.mask).reshape((-1,) + (1,) * (x.ndim - 1)), x, 0)  # noqa: E731
    return contact.replace(pos=keep(contact.pos), frame=keep(contact.frame))


def _candidates_per_group(model):
    data = smooth.kinematics(model, jsn.make_data(model))
    counts, distances = [], []
    for group in model.constraints.groups:
        g1, g2 = np.asarray(group.geom1), np.asarray(group.geom2)
        *_, margin, gap = driver._group_params(model, group)
        reach = margin + gap
        d = np.asarray(driver.broad_phase_distance(model, data, group.types, g1, g2) - reach)
        counts.append(int(np.sum(d <= 0)))
        distances.append(d)
    return counts, distances


def test_capacity_changes_nothing_when_it_suffices_and_flags_overflow_when_it_does_not():
    full = jsn.load_mjcf(CROWD)
    counts, distances = _candidates_per_group(full)
    assert max(counts) >= 3 and max(len(g.geom1) for g in full.constraints.groups) > max(counts)
    reference, reference_grad = _contacts(full)
    assert int(reference.mask.sum()) >= 4 and not bool(reference.overflow)

    # capacity = the most candidates of any group: every pair that can touch is collided
    enough, enough_grad = _contacts(jsn.load_mjcf(CROWD, max_geom_pairs=max(counts)))
    assert not bool(enough.overflow)
    np.testing.assert_array_equal(enough.mask, reference.mask)
    for a, b in zip(jax.tree.leaves(_present(reference)), jax.tree.leaves(_present(enough))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)  # the same function, batched differently
    np.testing.assert_allclose(enough_grad, reference_grad, rtol=1e-12, atol=1e-14)

    # one pair less: the world is flagged; what is kept is the closest pairs, unchanged
    short, _ = _contacts(jsn.load_mjcf(CROWD, max_geom_pairs=max(counts) - 1))
    assert bool(short.overflow)
    kept, mask = np.asarray(short.mask), np.asarray(reference.mask)
    assert np.all(mask[kept])  # a subset of the contacts (dropped candidates need not have touched)
    np.testing.assert_allclose(np.asarray(short.dist)[kept], np.asarray(reference.dist)[kept], rtol=1e-12, atol=1e-14)
    start = 0
    for group, d in zip(full.constraints.groups, distances):
        n_slots = driver.FUNCTIONS[group.types][1]
        pair_kept = kept[start : start + len(d) * n_slots].reshape(len(d), n_slots).any(axis=1)
        if len(d) > max(counts) - 1 and pair_kept.any():  # a culled group keeps only its closest pairs
            assert d[pair_kept].max() <= np.sort(d)[max(counts) - 2]
        start += len(d) * n_slots


def test_occupied_slots_come_first_in_order_as_a_stable_sort_puts_them():
    """`math.true_first` (the efc contacts' compaction, without a sort) against numpy's stable
    argsort: all, none or some flags set, fewer, as many or more places than flags, batched."""
    rng = np.random.default_rng(3)
    first = jax.jit(jax.vmap(math.true_first, in_axes=(0, None)), static_argnums=1)
    for n in (1, 5, 300):
        flags = rng.random((4, n)) < np.array([0.0, 0.05, 0.5, 1.0])[:, None]
        for count in (1, n // 3 + 1, n, n + 2):
            expected = np.argsort(~flags, axis=1, kind="stable")[:, :count]
            np.testing.assert_array_equal(first(jnp.asarray(flags), count), expected)
        np.testing.assert_array_equal(jax.vmap(math.prefix_count)(jnp.asarray(flags)), np.cumsum(flags, axis=1))


def test_load_rejects_a_bad_capacity_and_reads_mjx_custom_numeric():
    with pytest.raises(ValueError, match="max_geom_pairs"):
        jsn.load_mjcf(CROWD, max_geom_pairs=0)
    custom = CROWD.replace("<worldbody>", '<custom><numeric name="max_geom_pairs" data="5"/></custom><worldbody>')
    assert jsn.load_mjcf(custom).opt.max_geom_pairs == 5
    assert jsn.load_mjcf(custom, max_geom_pairs=7).opt.max_geom_pairs == 7
    assert jsn.load_mjcf(custom.replace('data="5"', 'data="-1"')).opt.max_geom_pairs is None
    assert jsn.load_mjcf(custom, max_geom_pairs=-1).opt.max_geom_pairs is None  # MJX's "no limit"
    with pytest.raises(ValueError, match="max_contact_points"):
        jsn.load_mjcf(CROWD, max_contact_points=2.5)


TILTED_BOXES = """<mujoco><custom><numeric name="max_contact_points" data="6"/></custom>
  <option timestep="0.005"/><worldbody><geom type="plane" size="5 5 .1"/>
  <body pos="0 0 .095" euler=".3 .5 0"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  <body pos=".5 0 .096" euler="-.4 .2 0"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  <body pos="1 0 .5"><freejoint/><geom type="sphere" size=".1"/></body></worldbody></mujoco>"""


def test_max_contact_points_keeps_the_deepest_contacts_and_flags_the_rest():
    """MJX's `max_contact_points`: two sunk, tilted boxes touch the floor at 8 corners, each at its
    own depth. A limit of 6 gives rows to the 6 deepest (as MJX's top_k keeps them) and flags
    CONTACTFULL; a limit of 8 drops nothing and steps as without a limit. The file's MJX numeric
    alone changes nothing (MuJoCo C ignores it: a plain load follows MuJoCo)."""
    def run(limit):
        model = jsn.load_mjcf(TILTED_BOXES, max_contact_points=limit)
        data = jax.jit(lambda d: jsn.step(model, d))(jsn.make_data(model))
        return model, data

    capped, after = run(6)
    assert capped.constraints.capacity_by_dim == {3: 6} and capped.constraints.nefc_contact == 6
    contact = after.contact  # the contacts the step solved with (its forward pass's)
    mask, dist = np.asarray(contact.mask), np.asarray(contact.dist)
    slots = np.asarray(constraint.efc_slots(capped, contact))
    assert mask.sum() == 8 and int(after.warning[jsn.WarningKind.CONTACTFULL]) == 1
    np.testing.assert_array_equal(np.sort(dist[slots]), np.sort(dist[mask])[:6])
    _, enough = run(8)
    unlimited_model, unlimited = run(None)
    assert unlimited_model.constraints.capacity_by_dim is None
    assert int(enough.warning[jsn.WarningKind.CONTACTFULL]) == 0
    np.testing.assert_allclose(enough.qvel, unlimited.qvel, rtol=0, atol=1e-12)
    np.testing.assert_allclose(enough.qpos, unlimited.qpos, rtol=0, atol=1e-14)


def _surface_points(kind: int, size: np.ndarray, n: int = 4000) -> np.ndarray:
    """Points on (or, for the box, at the corners and on the faces of) a geom, in its frame."""
    u = rng.normal(size=(n, 3))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    if kind == driver.SPHERE:
        return size[0] * u
    if kind == driver.CAPSULE:
        return size[0] * u + np.c_[np.zeros((n, 2)), np.sign(u[:, 2]) * size[1]]
    if kind == driver.ELLIPSOID:
        return size * u
    if kind == driver.CYLINDER:
        rim = size[0] * u[:, :2] / np.linalg.norm(u[:, :2], axis=1, keepdims=True)
        return np.c_[rim, rng.choice([-1, 1], size=n) * size[1]]
    corners = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T
    return np.r_[corners, np.clip(1.5 * u, -1, 1)] * size


@pytest.mark.parametrize("kind", [driver.SPHERE, driver.CAPSULE, driver.ELLIPSOID, driver.CYLINDER, driver.BOX])
def test_bounding_boxes_hold_the_geom_and_are_tight(kind):
    for _ in range(5):
        q = rng.normal(size=4)
        mat = np.asarray(math.quat_to_mat(jnp.asarray(q / np.linalg.norm(q))))
        size = rng.uniform(0.01, 0.3, size=3)
        points = _surface_points(kind, size) @ mat.T
        extent = np.asarray(driver._half_extents(kind, jnp.asarray(mat)[None], jnp.asarray(size)[None]))[0]
        reach = np.abs(points).max(axis=0)
        assert np.all(reach <= extent * (1 + 1e-12))
        assert np.all(reach >= 0.97 * extent)  # tight: the farthest sampled point nearly reaches it


# sphere 0 rests on the plane, sphere 1 on sphere 0 (both sliding and spinning), sphere 2 far above:
# one candidate pair per group, so max_geom_pairs=1 suffices and compacts the 6 contact slots' rows to 2 contacts'
TOWER = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="2 2 0.1" friction="0.6"/>
  <body pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
  <body pos="0.01 0 0.3"><freejoint/><geom type="sphere" size="0.1"/></body>
  <body pos="1 0 2"><freejoint/><geom type="sphere" size="0.1"/></body></worldbody></mujoco>"""


@pytest.mark.parametrize("solver", ["ncp", "newton"])
def test_a_capacity_solves_only_the_slots_that_can_hold_contacts(solver):
    qvel0 = jnp.asarray(np.r_[0.5, 0.2, -0.1, 1.0, -2.0, 0.5, -0.3, 0.1, 0.0, 0.0, 0.0, 3.0, np.zeros(6)])

    def run(model):
        data = jsn.make_data(model)

        def loss(qvel):
            final, traj = jsn.rollout(model, data.replace(qvel=qvel), jnp.zeros((4, 0)))
            per_slot = jax.vmap(lambda d: constraint.contact_force(model, d))(traj)  # through the efc contacts' slots
            generalized = jnp.einsum("tri,tr->ti", traj.efc_J, traj.efc_force)
            return jnp.sum(final.qpos[:14] ** 2) + jnp.sum(final.qvel**2), (final, traj, per_slot, generalized)

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(qvel0)

    # the NCP with one pass (a smaller program, the same rows); Newton with elliptic cones (their row blocks move too)
    scene = TOWER if solver == "ncp" else TOWER.replace('timestep="0.01"', 'timestep="0.01" cone="elliptic"')
    options = dict(solver="ncp", ncp_passes=1) if solver == "ncp" else {}
    full = jsn.load_mjcf(scene, **options)
    capped = jsn.load_mjcf(scene, max_geom_pairs=1, **options)
    assert full.constraints.nefc_contact == 6 and capped.constraints.nefc_contact == 2
    assert capped.constraints.nefc < full.constraints.nefc
    (value, (final, traj, force, generalized)), grad = run(full)
    (value_c, (final_c, traj_c, force_c, generalized_c)), grad_c = run(capped)
    assert np.all(np.asarray(traj.solver_converged)) and np.all(np.asarray(traj_c.solver_converged))
    assert not np.any(np.asarray(traj_c.contact.overflow))
    assert int(np.asarray(traj.contact.mask[-1]).sum()) == 2  # both contacts active at the end
    assert np.all(np.abs(np.asarray(force[-1, :, 0])[np.asarray(traj.contact.mask[-1])]) > 1.0)
    for a, b in ((final.qpos, final_c.qpos), (final.qvel, final_c.qvel), (force, force_c), (generalized, generalized_c),
                 (traj.contact.mask, traj_c.contact.mask), (grad, grad_c)):  # fmt: skip
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(value_c, value, rtol=1e-12)


def _pile(capacity):
    """Eight cubes stacked 2x2x2 on a plane (layers sunk 0.5 mm into each other, columns 2 mm
    apart), elliptic cones: 28 box-box pairs, 4 of which touch."""
    cubes = "".join(
        f'<body pos="{0.102 * i - 0.051:.3f} {0.102 * j - 0.051:.3f} {0.0495 + 0.0995 * k:.4f}"><freejoint/>'
        f'<geom type="box" size="0.05 0.05 0.05"/></body>'
        for i in range(2) for j in range(2) for k in range(2)
    )  # fmt: skip
    custom = f'<custom><numeric name="max_geom_pairs" data="{capacity}"/></custom>'
    return (f'<mujoco>{custom}<option timestep="0.005" cone="elliptic" jacobian="sparse"/><worldbody>'
            f'<geom type="plane" size="5 5 0.1"/>{cubes}</worldbody></mujoco>')  # fmt: skip


def test_capped_pile_with_sparse_rows_follows_mujoco_and_finite_differences():
    """Both bounds on the Newton solve at once: capacity 8 compacts the rows to the slots of 8
    box-box and 8 box-plane pairs, and every contact moves at most 12 of the 48 dofs, which
    jacobian="sparse" keeps (`constraint.contact_dofs`). MuJoCo (no capacity) is the oracle."""
    import mujoco
    from test_gradients import check_directional

    xml = _pile(8)
    model = jsn.load_mjcf(xml)
    layout = model.constraints
    assert layout.nefc_contact < layout.ncon and constraint.contact_dofs(model).shape[1] == 12
    rng = np.random.default_rng(0)
    qvel0 = 0.2 * rng.normal(size=model.nv)
    steps = 30

    def loss(qvel):
        final, traj = jsn.rollout(model, jsn.make_data(model).replace(qvel=qvel), jnp.zeros((steps, 0)))
        return jnp.sum(final.qpos**2) + jnp.sum(final.qvel**2), traj

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    _, traj = value_and_grad(jnp.asarray(qvel0))[0]
    assert not np.any(np.asarray(traj.contact.overflow)) and np.all(np.asarray(traj.solver_converged))

    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    d.qvel[:] = qvel0
    expected = []
    for _ in range(steps):
        mujoco.mj_step(m, d)
        expected.append(d.qpos.copy())
    assert d.ncon >= 16  # every cube touches the plane or the cube below
    np.testing.assert_allclose(np.asarray(traj.qpos), np.array(expected), atol=1e-9)

    def value_grad(qvel):
        (value, _), grad = value_and_grad(qvel)
        return value, grad

    check_directional(None, jnp.asarray(qvel0), rng, value_and_grad=value_grad)
