"""Contact, limit, friction-loss and equality constraints against MuJoCo (float64).

Fixed states: qacc and every row of efc_force agree with mj_forward (both cones,
solver run to convergence). Trajectories: 100 steps agree with mj_step.
"""

from __future__ import annotations

import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from conftest import OPTIMIZED

import jaxsim_ncp as jsn
from jaxsim_ncp import constraint
from jaxsim_ncp.solver import island
from test_gradients import check_directional

HUMANOID = pathlib.Path(mujoco.__file__).parent / "mjx" / "test_data" / "humanoid" / "humanoid.xml"


def _free(name, pos, quat, geom):
    return f'<body name="{name}" pos="{pos}" quat="{quat}"><freejoint/>{geom}</body>'


def _scene(bodies, option=""):
    return f'<mujoco><option timestep="0.005" {option}/><worldbody><geom name="floor" type="plane" size="5 5 .1"/>{bodies}</worldbody></mujoco>'


SCENES = {
    "box_resting": (_scene(_free("box", "0 0 0.099", "1 0 0 0", '<geom type="box" size=".1 .1 .1"/>')), None),
    "box_sliding": (_scene(_free("box", "0 0 0.099", "1 0 0 0", '<geom type="box" size=".1 .08 .1" friction=".4"/>')), [1.5, 0.5, 0, 0, 0, 0.3]),
    "capsule_rolling": (_scene(_free("cap", "0 0 0.049", ".7071 .7071 0 0", '<geom type="capsule" size=".05 .2" condim="4"/>')), [0.4, 0, 0, 0, -8, 0]),
    "cylinder_rolling": (_scene(_free("cyl", "0 0 0.0495", ".7071 .7071 0 0", '<geom type="cylinder" size=".05 .2" condim="6"/>')), [0.4, 0, 0, 0, -8, 0]),
    "spheres_and_boxes": (
        _scene(
            _free("s1", "0 0 0.049", "1 0 0 0", '<geom type="sphere" size=".05"/>')
            + _free("s2", ".02 0 .145", "1 0 0 0", '<geom type="sphere" size=".05"/>')
            + _free("b1", ".5 0 .099", "1 0 0 0", '<geom type="box" size=".1 .1 .1"/>')
            + _free("b2", ".53 .02 .297", ".995 0 0 .0998", '<geom type="box" size=".1 .1 .1"/>')
            + _free("s3", ".5 .3 .15", "1 0 0 0", '<geom type="sphere" size=".06"/>')
            + _free("c3", ".55 .3 .3", ".9 .3 .2 0", '<geom type="capsule" size=".04 .1"/>')
        ),
        None,
    ),
    "ellipsoids": (  # general convex pairs (GJK/EPA in MuJoCo), MuJoCo run at a tight ccd_tolerance
        _scene(
            '<geom type="box" pos="1 0 .1" size=".2 .2 .1"/><geom type="cylinder" pos="-1 0 .1" size=".15 .1" contype="2" conaffinity="2"/>'
            + _free("e1", "1 0 .2595", "1 0 0 0", '<geom type="ellipsoid" size=".1 .08 .06"/>')
            + _free("e2", "0 0 .0495", ".995 0 0 .0998", '<geom type="ellipsoid" size=".1 .07 .05"/>')
            + _free("e3", "-1 0 .2495", "1 0 0 0", '<geom type="ellipsoid" size=".08 .06 .05" condim="4" contype="3" conaffinity="3"/>')
            + _free("e4", "-1 .01 .339", "1 0 0 0", '<geom type="ellipsoid" size=".05 .05 .04"/>')
            + _free("e5", ".5 0 .0295", "1 0 0 0", '<geom type="ellipsoid" size=".12 .08 .03"/>')
            + _free("c5", ".5 0 .089", ".7071 .7071 0 0", '<geom type="capsule" size=".03 .1"/>'),
            option='ccd_tolerance="1e-13" ccd_iterations="500"',
        ),
        None,
    ),
    "cylinders": (  # MuJoCo 4's multiccd manifolds: cylinder on a box (4), lying on it (2),
        # a capsule across a cylinder cap (2), a box on a cylinder cap (4). A cap fully inside a face
        # clips to a regular 16-gon whose 4 kept vertices MuJoCo picks by round-off: reproduced
        # bit for bit from the same geom frames (test_collision_primitives), not through geom
        # frames that differ in the last bit, so c1 overhangs the box edge.
        # contype/conaffinity keep only the intended pairs (one compiled group per pair type)
        _scene(
            '<geom type="box" pos="1 0 .1" size=".3 .3 .1" contype="0" conaffinity="6"/>'
            + '<geom type="cylinder" pos="-1 0 .1" size=".2 .1" contype="0" conaffinity="8"/>'
            + '<geom type="cylinder" pos="0 1 .1" size=".2 .1" contype="0" conaffinity="16"/>'
            + _free("c1", ".95 -.27 .2795", ".9888 0 0 .1494", '<geom type="cylinder" size=".06 .08" contype="2" conaffinity="0"/>')
            + _free("c2", "1.1 .15 .2495", ".7071 .7071 0 0", '<geom type="cylinder" size=".05 .1" contype="4" conaffinity="0"/>')
            + _free("k3", "-1 0 .2295", ".6533 .6533 .2706 .2706", '<geom type="capsule" size=".03 .12" contype="8" conaffinity="0"/>')
            + _free("b4", ".05 1.02 .2495", ".995 0 0 .0998", '<geom type="box" size=".08 .06 .05" contype="16" conaffinity="0"/>'),
            option='ccd_tolerance="1e-13" ccd_iterations="500"',
        ),
        [0, 0, 0, 0, 0, 0, 0, 0.3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0],  # c2 slides along its axis, b4 spins
    ),
    "chain_limits": (
        """<mujoco><option timestep="0.005"/><worldbody>
        <body pos="0 0 1"><joint type="hinge" axis="0 1 0" range="-30 30" frictionloss=".2"/>
          <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" contype="0" conaffinity="0"/>
          <body pos=".3 0 0"><joint type="hinge" axis="0 1 0" range="-10 10" damping=".1"/>
            <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" contype="0" conaffinity="0"/>
            <body pos=".3 0 0"><joint type="ball" range="0 20"/>
              <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" contype="0" conaffinity="0"/>
        </body></body></body></worldbody>
        <keyframe><key qpos="0.53 -0.18 0.9763 0 0.2164 0"/></keyframe></mujoco>""",
        [2.0, -3.0, 1.0, 4.0, 0.5],
    ),
    "welded_pair": (
        """<mujoco><option timestep="0.005"/><worldbody><geom type="plane" size="5 5 .1"/>
        <body name="a" pos="0 0 .5"><freejoint/><geom type="box" size=".1 .05 .05"/><site name="sa" pos=".05 .1 0" quat=".9 .3 0 .1"/></body>
        <body name="b" pos=".25 0 .5" quat=".9 .1 .2 .3"><freejoint/><geom type="box" size=".1 .05 .05"/>
          <site name="sb" pos=".05 .02 -.01" quat=".8 .2 .4 .4"/></body>
        <body name="e" pos=".3 .1 .8" quat=".7 .1 -.3 .2"><freejoint/><geom type="sphere" size=".05"/>
          <site name="se" pos="0 .03 .02" quat=".6 -.2 .5 .3"/></body>
        <body name="c" pos="0 .3 .6"><joint type="hinge" axis="1 0 0"/>
          <geom type="capsule" fromto="0 0 0 0 .2 0" size=".03" contype="0" conaffinity="0"/>
          <body name="d" pos="0 .2 0"><joint name="j2" type="hinge" axis="0 1 0"/>
            <geom type="capsule" fromto="0 0 0 0 .2 0" size=".03" contype="0" conaffinity="0"/><site name="sd" pos="0 .2 0"/></body></body>
        </worldbody><equality><weld body1="a" body2="b" torquescale="2"/><connect body1="c" body2="a" anchor="0 .1 0"/>
        <joint joint1="j2" polycoef=".1 .5 .2 0 0"/>
        <weld site1="se" site2="sb" torquescale=".5"/><connect site1="sd" site2="sa"/></equality></mujoco>""",  # site semantics too
        "random",
    ),
}


def _mj_model(xml, cone, truncated=False):
    """MuJoCo's model with the solver run to convergence, or (truncated) stopped after one Newton
    iteration with at most 4 line-search evaluations, as the MJX test humanoids ship."""
    m = mujoco.MjModel.from_xml_path(str(HUMANOID)) if xml == "humanoid" else mujoco.MjModel.from_xml_string(xml)
    m.opt.cone = {"pyramidal": mujoco.mjtCone.mjCONE_PYRAMIDAL, "elliptic": mujoco.mjtCone.mjCONE_ELLIPTIC}[cone]
    m.opt.iterations, m.opt.ls_iterations, m.opt.tolerance = (1, 4, 1e-8) if truncated else (100, 50, 1e-13)
    return m


def _initial_state(m, qvel, humanoid=False):
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    if isinstance(qvel, str):
        d.qvel[:] = rng.normal(0, 1, m.nv)
    elif qvel is not None:
        d.qvel[:] = qvel
    if m.nkey:
        d.qpos[:] = m.key_qpos[0]
    if humanoid:  # perturbed first keyframe, feet near the floor
        d.qpos[7:] += rng.normal(0, 0.3, m.nq - 7)
        d.qvel[:] = rng.normal(0, 0.5, m.nv)
    return d


def _contact_rows(model, mj_data, ours):
    """Pairs (our rows, MuJoCo rows) for every MuJoCo contact, matched by geoms and position."""
    layout = model.constraints
    geoms = layout.contact_geom
    mask = np.asarray(ours.contact.mask)
    pos = np.asarray(ours.contact.pos)
    pairs = []
    for con in mj_data.contact[: mj_data.ncon]:
        cand = np.nonzero(mask & (geoms[:, 0] == con.geom[0]) & (geoms[:, 1] == con.geom[1]))[0]
        assert len(cand), f"MuJoCo contact between geoms {con.geom} missing"
        slot = cand[np.argmin(np.linalg.norm(pos[cand] - con.pos, axis=1))]
        n = int(layout.contact_rows[slot])
        start = int(layout.contact_row_start[slot])
        pairs.append((np.arange(start, start + n), np.arange(con.efc_address, con.efc_address + n)))
    return pairs


STEPS = 100
# the trajectories' program; the forward checks of a scene and cone with a trajectory test run it
# too (its first step's Data holds forward() at the start state) instead of compiling forward()
# separately. The scenes of MuJoCo's GJK/EPA (replayed: hundreds of loop iterations per contact
# and step) run STEPS steps 6x faster compiled with optimizations (ellipsoids: 28 s compile + 5 s
# run, not 15 + 29); the others compile in half the time without and run in 0.1 s either way
def _unactuated_rollout(model, data):
    return jsn.rollout(model, data, jnp.zeros((STEPS, model.nu)))


_ROLLOUT = jax.jit(_unactuated_rollout)
_ROLLOUT_OPTIMIZED = jax.jit(_unactuated_rollout, compiler_options=OPTIMIZED)
CONVEX_SCENES = ("ellipsoids", "cylinders")


def _rollout(model, data, name):
    return (_ROLLOUT_OPTIMIZED if name in CONVEX_SCENES else _ROLLOUT)(model, data)


def _check_forward(m, d, rollout_scene=None):
    mujoco.mj_forward(m, d)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel))
    out = jax.tree.map(lambda x: x[0], _rollout(model, data, rollout_scene)[1]) if rollout_scene else jsn.forward(model, data)
    scale = max(1.0, np.max(np.abs(d.qacc)))
    np.testing.assert_allclose(np.asarray(out.qacc), d.qacc, atol=1e-6 * scale, rtol=0)
    assert int(np.sum(np.asarray(out.contact.mask))) == d.ncon
    assert int(np.sum(np.asarray(out.efc_mask))) == d.nefc
    force = np.asarray(out.efc_force)
    fscale = max(1.0, np.max(np.abs(d.efc_force), initial=0))
    # equality, friction-loss and limit rows come first, in the same order
    layout = model.constraints
    n_other = layout.ne + layout.nf + layout.nl
    other = np.nonzero(np.asarray(out.efc_mask)[:n_other])[0]
    np.testing.assert_allclose(force[other], d.efc_force[: len(other)], atol=1e-6 * fscale, rtol=0)
    for ours, theirs in _contact_rows(model, d, out):
        np.testing.assert_allclose(force[ours], d.efc_force[theirs], atol=1e-6 * fscale, rtol=0)
    # constraint islands as mj_island numbers them (by their smallest tree), -1: unconstrained dof
    found = island.find(model, out.efc_J, out.efc_mask)
    dof = np.asarray(found.dof)
    constrained = dof < found.count
    ours = np.full(model.nv, -1)
    ours[constrained] = np.searchsorted(np.unique(dof[constrained]), dof[constrained])
    np.testing.assert_array_equal(ours, d.dof_island)
    return model


CASES = [(name, cone) for name in [*SCENES, "humanoid"] for cone in ("pyramidal", "elliptic")]


@pytest.mark.parametrize("name,cone", CASES)
def test_forward_matches_mujoco(name, cone):
    xml, qvel = SCENES.get(name, ("humanoid", None))
    m = _mj_model(xml, cone)
    d = _initial_state(m, qvel, humanoid=name == "humanoid")
    rollout_scene = name if (name, cone) in TRAJECTORIES and name not in TRUNCATED else None
    _check_forward(m, d, rollout_scene)
    if name != "welded_pair":
        assert d.ncon + d.nl > 0, "scene should start in contact or at a limit"
    for _ in range(3):  # also a state MuJoCo itself produced
        mujoco.mj_step(m, d)
    _check_forward(m, d, rollout_scene)


TRAJECTORIES = [(name, "elliptic" if i % 2 else "pyramidal") for i, name in enumerate([*SCENES, "humanoid"])]
# a truncated solver's trajectory depends on every step of MuJoCo's algorithm: its line search and
# its constraint islands (three in spheres_and_boxes, each with its own step length and scale)
TRUNCATED = ("spheres_and_boxes", "humanoid")


@pytest.mark.parametrize("name,cone", TRAJECTORIES)
def test_trajectory_matches_mujoco(name, cone):
    xml, qvel = SCENES.get(name, ("humanoid", None))
    truncated = name in TRUNCATED
    m = _mj_model(xml, cone, truncated)
    d = _initial_state(m, qvel, humanoid=name == "humanoid")
    # the islands scene runs the solver's loops as full-count scans (a GPU's default), the others as
    # while_loops (the CPU's): the same iterates either way
    model = jsn.from_mujoco(m, newton_early_exit=name != "spheres_and_boxes")
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel))
    final, traj = _rollout(model, data, name)
    qpos = []
    for _ in range(STEPS):
        mujoco.mj_step(m, d)
        qpos.append(d.qpos.copy())
    tol = 1e-6 if truncated else 1e-4
    np.testing.assert_allclose(np.asarray(traj.qpos), np.stack(qpos), atol=tol, rtol=0)
    np.testing.assert_allclose(np.asarray(final.qvel), d.qvel, atol=tol * max(1, np.max(np.abs(d.qvel))), rtol=0)
    assert not bool(final.diverged)


def test_margin_and_gap_follow_mujoco():
    """Pair margins/gaps add up; contacts within margin + gap are reported, only those within margin get rows."""
    for sep in (0.035, 0.041, 0.045, 0.05):
        xml = f"""<mujoco><worldbody><body><freejoint/><geom type="sphere" size=".1" margin=".01" gap=".002"/></body>
          <body pos="0 0 {0.2 + sep}"><freejoint/><geom type="sphere" size=".1" margin=".03" gap=".005"/></body>
          </worldbody><option><flag gravity="disable"/></option></mujoco>"""
        m = mujoco.MjModel.from_xml_string(xml)
        d = mujoco.MjData(m)
        d.qvel[2] = 0.3
        mujoco.mj_forward(m, d)
        model = jsn.from_mujoco(m)
        data = jsn.make_data(model).replace(qvel=jnp.asarray(d.qvel))
        out = jsn.forward(model, data)
        assert int(np.sum(out.contact.mask)) == d.ncon
        assert int(np.sum(out.efc_mask)) == d.nefc
        np.testing.assert_allclose(np.asarray(out.qacc), d.qacc, atol=1e-9)
        if d.ncon:
            np.testing.assert_allclose(float(out.contact.includemargin[0]), d.contact[0].includemargin)


def _follows_mujoco(xml: str, steps: int = 300, on_step=None):
    """A rollout from the model's initial state against MuJoCo's, qpos and qvel to 1e-10 at every step;
    returns MuJoCo's (model, final data) and ours. on_step(d): called with MuJoCo's data after each step."""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos))
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.zeros((steps, 0)))
    for t in range(steps):
        mujoco.mj_step(m, d)
        if on_step is not None:
            on_step(d)
        np.testing.assert_allclose(traj.qpos[t], d.qpos, rtol=0, atol=1e-10)
        np.testing.assert_allclose(traj.qvel[t], d.qvel, rtol=0, atol=1e-10)
    return m, d, model, data, traj


SURFACE_VELOCITY = """<mujoco><option cone="{cone}" timestep="0.002"/>
  <worldbody>
    <geom name="belt" type="box" size="1 0.3 0.05" pos="0 0 -0.05" euler="0 2 0" surfacevel="0.5 0.1 0 0 0 0"/>
    <geom name="turntable" type="box" size="0.4 0.4 0.05" pos="0 1.2 -0.05" surfacevel="0 0 0 0 0 2" condim="4"/>
    <body pos="0.2 0 0.05"><freejoint/><geom type="box" size="0.05 0.04 0.03"/></body>
    <body pos="-0.3 0.1 0.04"><freejoint/><geom size="0.04" condim="6"/></body>
    <body pos="0.25 1.2 0.03"><freejoint/><geom size="0.03" condim="4"/></body>
    <body pos="0 1.2 0.03"><freejoint/><geom type="box" size="0.05 0.05 0.02" condim="4" surfacevel="0.2 0 0 0 0 0"/></body>
  </worldbody></mujoco>"""


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_moving_surfaces_match_mujoco(cone):
    """MuJoCo 4's `surfacevel`: a tilted conveyor belt (linear), a turntable (angular: w x r at each
    contact, and the torsional row of condim 4), a box with its own belt on the turntable (the
    geom-1 and geom-2 sides). 300 steps against MuJoCo; the carried bodies reach the belt's speed
    and the turntable's spin."""
    m, d, *_ = _follows_mujoco(SURFACE_VELOCITY.format(cone=cone))
    assert abs(d.qvel[0] - 0.5) < 1e-3 and d.qvel[17] > 1.0  # on the belt's speed; spun by the turntable
    with pytest.raises(jsn.UnsupportedFeatureError, match="surfacevel.*solver='ncp'"):
        jsn.from_mujoco(m, solver="ncp")


CONTACT_ADHESION = """<mujoco><option cone="{cone}" timestep="0.002"/>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 .1"/>
    <geom name="ceiling" type="box" size="0.5 0.5 0.02" pos="0 0 0.6" adhesion="3" priority="1"/>
    <body pos="0 0 0.55"><freejoint/><geom type="box" size="0.05 0.04 0.03" adhesion="2" mass="0.2" condim="4"/></body>
    <body pos="0.3 0 0.04"><freejoint/><geom size="0.04" adhesion="1.5" condim="1"/></body>
    <body pos="-0.3 0 0.05"><freejoint/><geom name="pill" type="capsule" size="0.03 0.05" euler="0 90 0" adhesion="0.5" gap="0.01"/></body>
    <body pos="0.6 0.2 0.2"><freejoint/><geom name="ball" size="0.05" mass="0.5"/></body>
  </worldbody>
  <contact><pair geom1="floor" geom2="pill" adhesion="4"/><pair geom1="ceiling" geom2="ball" adhesion="4"/></contact>
</mujoco>"""


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_contact_adhesion_matches_mujoco(cone):
    """MuJoCo 4's contact `adhesion`: a passive pull -a n^T (J2 - J1) per contact, the contacts in the
    gap too (they get constraint rows), and aref raised by R a on the normal row or a / (2 (dim - 1))
    per pyramid edge. Mixed as MuJoCo: the geoms' sum, the higher priority's, an explicit pair's own
    (which replaces only its own geom pair: the ball's floor contact stays). 300 steps against MuJoCo."""
    mixed = set()
    m, _, model, data, traj = _follows_mujoco(CONTACT_ADHESION.format(cone=cone), on_step=lambda d: mixed.update(float(c.adhesion) for c in d.contact[: d.ncon]))
    assert mixed == {0.0, 1.5, 2.0, 3.0, 4.0}
    if cone == "pyramidal":
        weights = jnp.asarray(np.random.default_rng(0).normal(size=m.nv))
        at = data.replace(qpos=traj.qpos[150], qvel=traj.qvel[150])
        check_directional(lambda v: weights @ jsn.step(model, at.replace(qvel=v)).qvel, at.qvel, np.random.default_rng(1))
    with pytest.raises(jsn.UnsupportedFeatureError, match="adhesion.*solver='ncp'"):
        jsn.from_mujoco(m, solver="ncp")


def test_contact_parameter_override_matches_mujoco():
    """<flag override="enable"/>: every contact takes option/o_margin, o_solref (also as solreffriction),
    o_solimp and o_friction instead of its geoms' or pair's (mj_assign*); the gap stays the geoms'.
    300 steps against MuJoCo (ignoring the flag: 7.9 off)."""
    xml = """<mujoco><option timestep="0.002" o_margin="0.004" o_solref="0.03 0.8" o_solimp="0.8 0.9 0.002 0.4 3"
        o_friction="0.3 0.3 0.01 0.002 0.002" cone="elliptic"><flag override="enable"/></option>
      <worldbody><geom type="plane" size="2 2 .1" euler="3 0 0" friction="1 0.1 0.1" solref="0.01 1"/>
        <body pos="0 0 0.1"><freejoint/><geom type="box" size="0.05 0.04 0.03" margin="0.01" condim="4"/></body>
        <body pos="0.3 0 0.1"><freejoint/><geom size="0.04" condim="6" solimp="0.5 0.6 0.01"/></body>
        <body pos="-0.3 0 0.1"><freejoint/><geom name="pill" type="capsule" size="0.03 0.05" euler="0 90 0" gap="0.005"/></body>
        <body pos="-0.3 0 0.25"><freejoint/><geom name="pill2" type="capsule" size="0.03 0.05"/></body>
      </worldbody><contact><pair geom1="pill" geom2="pill2" margin="0.02"/></contact></mujoco>"""
    _, d, *_ = _follows_mujoco(xml)
    assert d.ncon >= 6 and all(c.includemargin == 0.004 for c in d.contact[: d.ncon])


def test_exact_diagonal_follows_mujoco_and_finite_differences():
    """<flag diagexact="enable"/>: R from the exact A_ii = J_i M^-1 J_i^T at the current state instead of
    diagApprox (constraint.exact_diagonal). The welded scene with a limited hinge that has dry friction
    (equality, friction-loss, limit and contact rows), elliptic cones, contact rows sparse: 60 steps
    against MuJoCo (the approximation is 2.4x off in qacc at the start); the gradient of the final state
    w.r.t. the initial velocity and the body masses (M enters A_ii) against central differences."""
    xml = SCENES["welded_pair"][0].replace('<joint type="hinge" axis="1 0 0"/>', '<joint type="hinge" axis="1 0 0" range="-15 15" frictionloss=".2"/>')
    m = _mj_model(xml.replace("<option ", '<option jacobian="sparse" '), "elliptic")
    m.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_DIAGEXACT
    d = _initial_state(m, "random")
    model = jsn.from_mujoco(m)
    assert model.opt.diag_exact and constraint.contact_dofs(model) is not None
    data = jsn.make_data(model).replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel))
    weights = jnp.asarray(np.random.default_rng(1).normal(size=m.nq + m.nv))

    def loss(x):
        qvel, mass = x
        final, traj = jsn.rollout(eqx.tree_at(lambda m: m.body_mass, model, mass), data.replace(qvel=qvel), jnp.zeros((60, 0)))
        return jnp.dot(weights, jnp.concatenate([final.qpos, final.qvel])), traj

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    x = (data.qvel, model.body_mass)
    (_, traj), _ = value_and_grad(x)
    kinds = set()
    for t in range(60):
        mujoco.mj_step(m, d)
        kinds |= set(d.efc_type[: d.nefc].tolist())
        np.testing.assert_allclose(traj.qpos[t], d.qpos, rtol=0, atol=1e-10)
        np.testing.assert_allclose(traj.qvel[t], d.qvel, rtol=0, atol=1e-9)
    assert {mujoco.mjtConstraint.mjCNSTR_FRICTION_DOF, mujoco.mjtConstraint.mjCNSTR_CONTACT_ELLIPTIC} <= kinds
    check_directional(None, x, np.random.default_rng(2), n_dirs=2, rtol=1e-5,
                      value_and_grad=lambda y: (lambda out: (out[0][0], out[1]))(value_and_grad(y)))  # fmt: skip


NOSLIP = """<mujoco><option timestep="0.005" cone="{cone}" noslip_iterations="{iterations}"/>
  <worldbody>
    <geom type="plane" size="5 5 .1" euler="12 0 0" friction="0.5 0.01 0.001"/>
    <body pos="0 0 0.3"><freejoint/><geom type="box" size=".1 .08 .05" mass="1"/></body>
    <body pos="0.4 0 0.3"><freejoint/><geom size=".07" mass="0.5" condim="6" friction="0.6 0.02 0.01"/></body>
    <body pos="-0.4 0 0.3"><freejoint/><geom type="capsule" size=".04 .1" euler="0 90 0" mass="0.7" condim="4"/></body>
    <body pos="0 1 0.5"><joint type="hinge" axis="1 0 0" frictionloss="0.05"/><geom type="capsule" fromto="0 0 0 0 0.3 0" size=".03"/></body>
  </worldbody></mujoco>"""


def _largest_array(jaxpr) -> int:
    """The most entries of any array a jaxpr (and the jaxprs inside it) computes."""
    largest = 0
    for eqn in jaxpr.eqns:
        largest = max([largest] + [int(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape")])
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    largest = max(largest, _largest_array(inner))
    return largest


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_noslip_matches_mujoco(cone):
    """MuJoCo's noslip post-processor (noslip_iterations = 5): Gauss-Seidel over a hinge's dry friction,
    pyramid edge pairs or elliptic friction blocks (condim 3, 4, 6) on a 12-degree incline. 150 steps
    against MuJoCo; the resting box creeps downhill 9000x slower than without noslip (MuJoCo both).
    The pyramidal step's gradient against central differences, every sweep run (tolerance 0: where the
    tolerance test changes a sweep count the map jumps). Elliptic noslip has kinks where the gradient is
    one-sided: a sliding contact's Newton force already lies on the friction ellipsoid where the QCQP puts
    it, and MuJoCo's undo of a cost increase (costChange) keeps any outward perturbation of it."""
    m, d, model, data, traj = _follows_mujoco(NOSLIP.format(cone=cone, iterations=5), steps=150)
    # no array of the forward pass grows as rows x rows (J M^-1 J^T over every contact slot's rows was
    # 18 GB of temporaries for dm_control's dog)
    nefc = model.constraints.nefc
    assert _largest_array(jax.make_jaxpr(jsn.forward)(model, data).jaxpr) < nefc * nefc / 2
    m0 = mujoco.MjModel.from_xml_string(NOSLIP.format(cone=cone, iterations=0))
    d0 = mujoco.MjData(m0)
    mujoco.mj_step(m0, d0, 150)
    assert np.linalg.norm(d0.qvel[:3]) > 1000 * np.linalg.norm(d.qvel[:3])  # the resting box creeps 9000x slower
    if cone == "pyramidal":
        weights = jnp.asarray(np.random.default_rng(0).normal(size=m.nv))
        at = data.replace(qpos=traj.qpos[80], qvel=traj.qvel[80])
        m.opt.noslip_tolerance = 0.0
        model = jsn.from_mujoco(m)
        check_directional(lambda v: weights @ jsn.step(model, at.replace(qvel=v)).qvel, at.qvel, np.random.default_rng(1))


def test_cg_solver_matches_mujoco_step_for_step():
    """option/solver="CG": mj_solPrimal's conjugate gradient (direction -M^-1 grad plus Hager-Zhang's beta
    times the last one, MuJoCo's line search, the duality-gap stop before the first step), per island,
    elliptic cones of condim 3, 4 and 6 and a hinge's dry friction. From 12 states of MuJoCo's own CG
    trajectory (falling, impacts, sliding, resting; warm started as MuJoCo) one vmapped forward: qacc to
    1e-9 of its scale and the same iteration counts (2 to 40 here). Long trajectories are not compared: CG
    stops at an inexact answer whose round-off depends on the path (the same 1e-12 per step grows to 5e-4
    within 50 steps of the first impact)."""
    m = mujoco.MjModel.from_xml_string(NOSLIP.format(cone="elliptic", iterations=0).replace("<option ", '<option solver="CG" '))
    model = jsn.from_mujoco(m)
    assert model.opt.solver == "cg"
    d = mujoco.MjData(m)
    states, qacc, niter = [], [], []
    for t in range(200):
        if t in (30, 43, 44, 45, 46, 50, 51, 55, 62, 80, 120, 199):
            states.append((d.qpos.copy(), d.qvel.copy(), d.qacc_warmstart.copy()))
            mujoco.mj_forward(m, d)
            qacc.append(d.qacc.copy())
            niter.append(d.solver_niter[: max(1, d.nisland)].max())
        mujoco.mj_step(m, d)
    qpos, qvel, warm = (jnp.asarray(np.stack(x)) for x in zip(*states))
    data = jsn.make_data(model)
    out = jax.jit(jax.vmap(lambda q, v, w: jsn.forward(model, data.replace(qpos=q, qvel=v, qacc_warmstart=w))))(qpos, qvel, warm)
    scale = np.abs(np.stack(qacc)).max(axis=1, keepdims=True)
    np.testing.assert_allclose(out.qacc / scale, np.stack(qacc) / scale, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(out.solver_niter, niter)
    assert max(niter) > 20  # the conjugate directions, not only steepest descent, were exercised
