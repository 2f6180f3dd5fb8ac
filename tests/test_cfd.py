"""Contacts from distance (cfd.py): the forward pass is bit-identical, gradients appear before contact.

Scene: two free spheres in zero gravity, A rolling towards B, 5 cm apart, never touching
within the rollout. The loss is B's final position: without CFD nothing reaches B and
the gradient w.r.t. A's speed is exactly zero; with CFD it is positive (a faster A pushes
B further). One compiled value-and-gradient program per (solver, integrator, cfd).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp import cfd, constraint, smooth
from jaxsim_ncp.collision.driver import collide

BILLIARDS = """
<mujoco>
  <option timestep="0.01" gravity="0 0 0"/>
  <worldbody>
    <body name="a"><freejoint/><geom type="sphere" size="0.1" mass="1"/></body>
    <body name="b" pos="0.25 0 0"><freejoint/><geom type="sphere" size="0.1" mass="1"/></body>
  </worldbody>
</mujoco>
"""
STEPS = 3
CASES = [dict(solver="newton", integrator="euler"), dict(solver="newton", integrator="adaptive"), dict(solver="ncp", integrator="euler")]


def _rollout(model, speed):
    data = jsn.make_data(model)
    return jsn.rollout(model, data.replace(qvel=data.qvel.at[0].set(speed)), jnp.zeros((STEPS, 0)))


def _loss_and_grad(model):
    def loss(speed):
        final, traj = _rollout(model, speed)
        return final.qpos[7], traj

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(0.5)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['solver']}-{c['integrator']}")
def test_forward_is_bit_identical_and_gradient_appears_before_contact(case):
    (value, traj), grad = _loss_and_grad(jsn.load_mjcf(BILLIARDS, cfd=jsn.CFD(width=0.1), **case))
    plain = jsn.load_mjcf(BILLIARDS, **case)
    if case["integrator"] == "euler" and case["solver"] == "newton":  # the zero gradient: one case is enough
        (_, traj_plain), grad_plain = _loss_and_grad(plain)
        assert grad_plain == 0.0  # exactly: without CFD nothing couples A and B
    else:  # the plain forward pass only (compiling its gradient too would double the test's time)
        traj_plain = jax.jit(lambda v: _rollout(plain, v)[1])(0.5)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), traj, traj_plain)), "CFD changed the forward pass"
    assert value == 0.25  # B never moves
    assert not np.any(np.asarray(traj.contact.mask))  # A never reaches it (not even the NCP's lookahead)
    assert np.isfinite(grad) and grad > 0.0, grad  # with CFD a faster A pushes B further


def test_cfd_impedance_continues_mujoco_and_tapers_to_dmin():
    cfd = jsn.CFD(width=0.1, dmin=0.2)
    solimp = jnp.tile(jnp.array([[0.9, 0.95, 0.001, 0.5, 2.0]]), (7, 1))
    r = jnp.array([-0.01, -1e-9, 0.0, 1e-9, 0.05, 0.1, 0.3])
    d = np.asarray(constraint.cfd_impedance(cfd, solimp, r))
    mujoco_d = np.asarray(constraint.impedance(solimp, r))
    np.testing.assert_array_equal(d[:3], mujoco_d[:3])  # unchanged in penetration
    np.testing.assert_allclose(d[3], 0.9, atol=1e-12)  # continuous at the surface
    np.testing.assert_allclose(d[4], 0.5 * (0.9 + 0.2))  # the spline's midpoint
    np.testing.assert_allclose(d[5:], 0.2)  # dmin from width on
    slope = jax.grad(lambda x: constraint.cfd_impedance(cfd, solimp[:1], x[None])[0])
    assert abs(slope(1e-9)) < 1e-6 and slope(0.03) < 0  # flat at the surface, then decreasing


WALLED = """
<mujoco>
  <worldbody>
    <geom name="wall" type="box" pos="0 0.16 0" size="1 0.01 0.1"/>
    <body name="a"><freejoint/><geom name="a" type="sphere" size="0.1" mass="1"/></body>
    <body name="b" pos="0.25 0 0"><freejoint/><geom name="b" type="sphere" size="0.1" mass="1"/></body>
  </worldbody>
</mujoco>
"""


def _cfd_contact_rows(cfd_settings, dtype=None):
    """The gradient model's contact rows of WALLED at rest: (geom-name pair, mask, aref) per row."""
    model = jsn.load_mjcf(WALLED, cfd=cfd_settings, dtype=dtype)
    data = smooth.kinematics(model, jsn.make_data(model))
    contact = collide(model, data, pair_reach=cfd.pair_reach(model.opt.cfd, model.topology.geom_names))
    efc = constraint.make_efc(model, data.replace(contact=contact), model.opt.cfd)
    layout, names = model.constraints, model.topology.geom_names
    first = layout.ne + layout.nf + layout.nl
    pairs = [tuple(sorted(names[g] for g in pair)) for pair in np.asarray(layout.contact_geom)[layout.row_contact]]
    return pairs, np.asarray(efc.mask)[first:], np.asarray(efc.aref)[first:]


def test_cfd_pairs_reach_only_the_named_pairs():
    """Every pair is 5 cm apart (inside width 0.1): by default all reach out; with pairs=(a, b)
    the wall's contacts stay MuJoCo's (out of the gradient model: 5 cm is beyond their margin)."""
    for pairs, reaching in ((None, {("a", "b"), ("a", "wall"), ("b", "wall")}), ((("b", "a"),), {("a", "b")})):
        rows, mask, _ = _cfd_contact_rows(jsn.CFD(width=0.1, pairs=pairs))
        assert {pair for pair, on in zip(rows, mask) if on} == reaching


def test_cfd_pushes_out_to_its_width_in_float32():
    """At rest only the position term's push apart makes a far contact act (and pass on velocity
    gradients). Gaps of 0.95 width are 95 softness lengths, where float32's e^(-r/s) underflows:
    the push must still be positive there."""
    _, mask, aref = _cfd_contact_rows(jsn.CFD(width=0.05 / 0.95), dtype=jnp.float32)
    assert mask.sum() == 12 and np.all(aref[mask] > 0), aref[mask]  # 3 contacts, 4 pyramid rows each


def test_cfd_settings_are_checked():
    with pytest.raises(ValueError, match="width"):
        jsn.CFD(width=0.0)
    with pytest.raises(ValueError, match="dmin"):
        jsn.CFD(width=0.1, dmin=1.0)
    with pytest.raises(TypeError, match="CFD"):
        jsn.load_mjcf(BILLIARDS, cfd=0.1)
    with pytest.raises(ValueError, match="pairs"):
        jsn.CFD(width=0.1, pairs=("a", "b"))  # one pair, not a sequence of pairs
    with pytest.raises(ValueError, match="no geom named 'c'"):
        jsn.load_mjcf(WALLED, cfd=jsn.CFD(width=0.1, pairs=(("a", "c"),)))
