"""Parity with MuJoCo (float64) on contact-free models: forward quantities and trajectories."""

import functools

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp import sensor
from models import ALL
from test_gradients import check_directional

INTEGRATORS = {"euler": mujoco.mjtIntegrator.mjINT_EULER,
               "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
               "rk4": mujoco.mjtIntegrator.mjINT_RK4}


def random_state(m: mujoco.MjModel, rng: np.random.Generator, speed: float = 2.0) -> mujoco.MjData:
    """MjData at a random configuration (unit quaternions), velocity, control and activation."""
    d = mujoco.MjData(m)
    d.qpos[:] = m.qpos0
    for j in range(m.njnt):
        adr, jtype = m.jnt_qposadr[j], m.jnt_type[j]
        if jtype == mujoco.mjtJoint.mjJNT_FREE:
            d.qpos[adr:adr + 3] += rng.normal(size=3)
            q = rng.normal(size=4)
            d.qpos[adr + 3:adr + 7] = q / np.linalg.norm(q)
        elif jtype == mujoco.mjtJoint.mjJNT_BALL:
            q = rng.normal(size=4)
            d.qpos[adr:adr + 4] = q / np.linalg.norm(q)
        else:
            d.qpos[adr] = rng.normal()
    d.qvel[:] = speed * rng.normal(size=m.nv)
    d.ctrl[:] = rng.normal(size=m.nu)
    d.act[:] = 0.3 * rng.normal(size=m.na)
    return d


def mujoco_rollout(m: mujoco.MjModel, d: mujoco.MjData, ctrl: np.ndarray, record) -> np.ndarray:
    """Step MuJoCo with ctrl[t] from d (modified in place); returns record(d) after each step, stacked."""
    out = []
    for u in ctrl:
        d.ctrl[:] = u
        mujoco.mj_step(m, d)
        out.append(np.array(record(d), dtype=np.float64))
    return np.stack(out)


def qpos_qvel(d: mujoco.MjData) -> np.ndarray:
    return np.concatenate([d.qpos, d.qvel])


def to_data(model: jsn.Model, d: mujoco.MjData) -> jsn.Data:
    return jsn.make_data(model).replace(
        qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel), ctrl=jnp.asarray(d.ctrl), act=jnp.asarray(d.act)
    )


def rel_err(ours, ref) -> float:
    ref = np.asarray(ref)
    return float(np.max(np.abs(np.asarray(ours) - ref)) / max(1.0, np.max(np.abs(ref))))


@functools.cache
def compiled(name: str, integrator: str):
    m = mujoco.MjModel.from_xml_string(ALL[name])
    m.opt.integrator = INTEGRATORS[integrator]
    model = jsn.from_mujoco(m)
    return m, model, jax.jit(jsn.forward), jax.jit(jsn.rollout)


@pytest.mark.parametrize("name", sorted(ALL))
def test_forward_matches_mujoco(name):
    m, model, forward, _ = compiled(name, "euler")
    rng = np.random.default_rng(0)
    for _ in range(3):
        d = random_state(m, rng)
        mujoco.mj_forward(m, d)
        out = forward(model, to_data(model, d))
        full_m = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, full_m)
        assert rel_err(out.qacc, d.qacc) < 1e-8
        assert rel_err(out.qM, full_m) < 1e-10
        assert rel_err(out.qfrc_bias, d.qfrc_bias) < 1e-10
        assert rel_err(out.qfrc_passive, d.qfrc_passive) < 1e-10
        assert rel_err(out.qfrc_actuator, d.qfrc_actuator) < 1e-10
        assert rel_err(out.qfrc_smooth, d.qfrc_smooth) < 1e-10
        assert rel_err(out.xpos, d.xpos) < 1e-12
        assert rel_err(out.xmat.reshape(-1, 9), d.xmat) < 1e-12
        assert rel_err(out.ximat.reshape(-1, 9), d.ximat) < 1e-12
        assert rel_err(out.geom_xmat.reshape(-1, 9), d.geom_xmat) < 1e-12
        assert rel_err(out.xanchor, d.xanchor) < 1e-12
        assert rel_err(out.xaxis, d.xaxis) < 1e-12
        assert rel_err(out.xquat, d.xquat) < 1e-12
        assert rel_err(out.xipos, d.xipos) < 1e-12
        assert rel_err(out.geom_xpos, d.geom_xpos) < 1e-12
        assert rel_err(out.subtree_com, d.subtree_com) < 1e-12
        assert rel_err(out.cdof, d.cdof) < 1e-12
        assert rel_err(out.cvel, d.cvel) < 1e-12
        assert rel_err(out.cdof_dot, d.cdof_dot) < 1e-12
        if m.na:
            assert rel_err(out.act_dot, d.act_dot) < 1e-12
        if m.nu:
            assert rel_err(out.actuator_force, d.actuator_force) < 1e-12
            assert rel_err(out.actuator_length, d.actuator_length) < 1e-12
            assert rel_err(out.actuator_velocity, d.actuator_velocity) < 1e-12


@pytest.mark.parametrize("integrator", sorted(INTEGRATORS))
@pytest.mark.parametrize("name", sorted(ALL))
def test_trajectory_matches_mujoco(name, integrator):
    m, model, _, rollout = compiled(name, integrator)
    rng = np.random.default_rng(1)
    d = random_state(m, rng)
    data = to_data(model, d)
    ctrl = rng.normal(size=(200, m.nu))
    ref = mujoco_rollout(m, d, ctrl, lambda d: np.concatenate([d.qpos, d.qvel, d.act, [d.time]]))
    final, traj = rollout(model, data, jnp.asarray(ctrl))
    ours = np.concatenate([traj.qpos, traj.qvel, traj.act, traj.time[:, None]], axis=1)
    assert np.max(np.abs(ours - ref)) < 1e-6
    assert not bool(final.diverged)


@pytest.mark.parametrize("flag", ["gravity", "spring", "damper", "actuation", "clampctrl", "eulerdamp"])
def test_disable_flags_match_mujoco(flag):
    m = mujoco.MjModel.from_xml_string(ALL["arm"])
    m.opt.integrator = INTEGRATORS["euler"]
    m.opt.disableflags |= int(getattr(mujoco.mjtDisableBit, f"mjDSBL_{flag.upper()}"))
    model = jsn.from_mujoco(m)
    assert model.opt.disabled(flag)
    rng = np.random.default_rng(2)
    d = random_state(m, rng)
    data = to_data(model, d)
    ctrl = 3.0 * rng.normal(size=(30, m.nu))  # beyond ctrlrange: clamping matters
    ref = []
    for u in ctrl:
        d.ctrl[:] = u
        mujoco.mj_step(m, d)
        ref.append(np.concatenate([d.qpos, d.qvel, d.act]))
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    ours = np.concatenate([traj.qpos, traj.qvel, traj.act], axis=1)
    assert np.max(np.abs(ours - np.asarray(ref))) < 1e-8


def test_model_without_dofs():
    m = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom type='plane' size='1 1 .1'/>"
                                       "<body pos='0 0 1'><geom size='.1'/></body></worldbody></mujoco>")
    model = jsn.from_mujoco(m)
    final, traj = jsn.rollout(model, jsn.make_data(model), jnp.zeros((3, 0)))
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    np.testing.assert_allclose(traj.xpos[-1], d.xpos, atol=1e-12)
    assert final.qpos.shape == (0,) and float(final.time) == pytest.approx(3 * m.opt.timestep)


POLYNOMIAL = """<mujoco><option timestep="0.004"><flag energy="enable" contact="disable"/></option><worldbody>
  <body pos="0 0 1"><joint name="hinge" axis="0 1 0" stiffness="2 3 4" springref="0.2" damping="0.3 0.5 0.7"/>
    <geom type="capsule" size="0.05" fromto="0 0 0 0.3 0 0"/>
    <body pos="0.3 0 0"><joint name="slide" type="slide" axis="1 0 0" stiffness="5 -1 6" damping="0.2 0.1 0.4"/>
      <geom type="box" size="0.05 0.04 0.03"/></body></body>
  <body pos="1 0 1"><joint type="ball" stiffness="1 2 3" damping="0.1 0.4 0.2"/>
    <geom type="ellipsoid" size="0.1 0.07 0.05" pos="0 0 -0.1"/></body>
  <body pos="2 0 1"><joint type="free" stiffness="4 1 2" damping="0.1 0.2 0.3"/>
    <geom type="box" size="0.1 0.08 0.05"/></body></worldbody>
  <tendon><fixed name="t" stiffness="3 1 2" damping="0.2 0.3 0.1" springlength="-0.1 0.1">
    <joint joint="hinge" coef="1"/><joint joint="slide" coef="-2"/></fixed></tendon>
  <actuator><general joint="hinge" gear="2" damping="0.1 0.2 0.3"/><motor joint="slide"/>
    <general tendon="t" damping="0.05 0.1 0.2"/></actuator></mujoco>"""


@pytest.mark.parametrize("integrator", ["euler", "implicitfast"])
def test_polynomial_stiffness_and_damping_match_mujoco(integrator):
    """MuJoCo's polynomial spring and damper profiles on hinge, slide, ball and free joints, a
    tendon and actuators: forces, energy and trajectories (the implicit integrators use the
    damping's derivative d + 2 b |v| + 3 c v^2)."""
    m = mujoco.MjModel.from_xml_string(POLYNOMIAL)
    m.opt.integrator = INTEGRATORS[integrator]
    assert np.any(m.jnt_stiffnesspoly != 0) and np.any(m.dof_dampingpoly != 0) and np.any(m.actuator_dampingpoly != 0)
    model = jsn.from_mujoco(m)
    rng = np.random.default_rng(4)
    d = random_state(m, rng, speed=3.0)
    ctrl = rng.normal(size=(150, m.nu))
    d.ctrl[:] = ctrl[0]
    mujoco.mj_forward(m, d)
    data = to_data(model, d)
    final, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    # the first step's Data holds forward() at the start state (and the state it stepped to): one
    # compiled program for both checks
    out = jax.tree.map(lambda x: x[0], traj).replace(qpos=data.qpos, qvel=data.qvel)
    assert rel_err(out.qfrc_passive, d.qfrc_passive) < 1e-10
    assert rel_err(out.qacc, d.qacc) < 1e-9
    assert rel_err(jnp.stack(sensor.energy(model, out)), d.energy) < 1e-10
    ref = mujoco_rollout(m, d, ctrl, lambda d: np.concatenate([d.qpos, d.qvel]))
    assert np.max(np.abs(np.concatenate([traj.qpos, traj.qvel], axis=1) - ref)) < 1e-8
    assert not bool(final.diverged)


def _limb(depth: int, joint: str) -> str:
    """A chain of `depth` bodies hanging from the current body, each with the joints `joint`
    (types separated by spaces, applied in order, anchors apart) and a capsule."""
    joints = "".join(f'<joint type="{j}" pos="0 0.0{i} -0.0{i}" axis="0.3 1 0.{i + 2}"/>' for i, j in enumerate(joint.split()))
    bodies = "".join(
        f'<body pos="0.05 0.1 -0.2" quat="0.9 0.1 0.3 -0.2">{joints}'
        '<geom type="capsule" size="0.03" fromto="0 0 0 0 0 -0.2"/>'
        for _ in range(depth)
    )
    return bodies + "</body>" * depth


def test_tree_frames_match_mujoco_and_their_program_does_not_grow_with_depth():
    """Body frames of a branching tree whose depth levels differ in width (limbs of depth 1 to 5 on a
    free torso, hinge, ball and slide joints, bodies with up to four joints) against mj_kinematics;
    the kinematics' traced program is the same size for a 4- and a 12-link chain (the levels run in
    one loop)."""
    limbs = (_limb(1, "hinge") + _limb(3, "ball") + _limb(5, "hinge") + _limb(2, "slide")
             + _limb(2, "slide hinge hinge ball") + _limb(1, "hinge hinge"))
    xml = f'<mujoco><worldbody><body pos="0 0 2"><freejoint/><geom size="0.1"/>{limbs}</body></worldbody></mujoco>'
    m = mujoco.MjModel.from_xml_string(xml)
    model = jsn.from_mujoco(m)
    kinematics = jax.jit(lambda data: jsn.smooth.kinematics(model, data))
    rng = np.random.default_rng(3)
    for _ in range(2):
        d = random_state(m, rng)
        mujoco.mj_kinematics(m, d)
        out = kinematics(to_data(model, d))
        assert rel_err(out.xpos, d.xpos) < 1e-12
        assert rel_err(out.xquat, d.xquat) < 1e-12
        assert rel_err(out.xanchor, d.xanchor) < 1e-12
        assert rel_err(out.xaxis, d.xaxis) < 1e-12
        assert rel_err(out.geom_xmat, d.geom_xmat.reshape(-1, 3, 3)) < 1e-12

    def size(depth: int) -> int:
        chain = jsn.from_mujoco(mujoco.MjModel.from_xml_string(f"<mujoco><worldbody>{_limb(depth, 'ball')}</worldbody></mujoco>"))
        return len(jax.make_jaxpr(lambda data: jsn.smooth.kinematics(chain, data))(jsn.make_data(chain)).eqns)

    assert size(4) == size(12)


IMPLICIT_SCENE = """<mujoco><option integrator="implicit" timestep="0.01" density="1000" viscosity="1e-3"><flag contact="disable"/></option>
  <worldbody>
    <body pos="0 0 1.5"><joint name="h1" type="hinge" axis="0 1 0" damping="0.05"/><geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04"/>
      <body pos="0.4 0 0"><joint name="h2" type="hinge" axis="1 0 0"/><geom type="box" size="0.2 0.05 0.03" pos="0.1 0 0"/>
        <body pos="0.2 0 0"><joint type="ball" damping="0.02"/><geom type="ellipsoid" size="0.1 0.05 0.03" pos="0.1 0 0" fluidshape="ellipsoid"/></body>
      </body>
      <body pos="0 0.2 0"><joint name="s4" type="slide" axis="0 0 1" damping="0.3"/><geom type="sphere" size="0.05"/></body>
    </body>
    <body pos="1 0 0.5"><freejoint/><geom type="box" size="0.15 0.08 0.03" fluidshape="ellipsoid"/></body>
    <body pos="-1 0 0.3"><freejoint/><geom type="cylinder" size="0.1 0.05" pos="0.02 0 0"/><body pos="0.1 0 0"><geom size="0.04"/></body></body>
  </worldbody>
  <tendon><fixed damping="0.4"><joint joint="h1" coef="1"/><joint joint="h2" coef="-0.5"/></fixed></tendon>
  <actuator><position joint="h1" kp="5" kv="0.7"/><velocity joint="h2" kv="0.3"/><motor joint="s4" gear="2"/></actuator>
</mujoco>"""


def test_implicit_integrator_matches_mujoco_and_finite_differences():
    """mjINT_IMPLICIT solves (M - h D) a = f with D = d(qfrc_smooth)/d qvel whole: implicitfast's
    terms (actuator kv, dof and tendon damping) plus -d qfrc_bias/d qvel (Coriolis, centrifugal,
    gyroscopic; a chain with a ball joint, two spinning free bodies) and the fluid derivative
    unsymmetrized (the ellipsoid model in water). 100 steps against MuJoCo; finite differences of a step.
    Without the bias term the trajectories differ by 1.6 (relative qvel; this scene without its fluid),
    with the fluid term symmetrized by 2e-2; here they agree to 1e-10."""
    m = mujoco.MjModel.from_xml_string(IMPLICIT_SCENE)
    d = mujoco.MjData(m)
    d.qvel[:] = 3 * np.random.default_rng(0).normal(size=m.nv)
    d.qvel[m.jnt_dofadr[4] + 3 : m.jnt_dofadr[4] + 6] = [8, 3, -5]
    d.ctrl[:] = [0.3, 1.0, 0.5]
    model = jsn.from_mujoco(m)
    assert model.opt.integrator == "implicit"
    data = to_data(model, d)
    ctrl = np.tile(d.ctrl, (100, 1))
    ref = mujoco_rollout(m, d, ctrl, qpos_qvel)
    _, traj = jax.jit(jsn.rollout)(model, data, jnp.asarray(ctrl))
    assert rel_err(np.concatenate([traj.qpos, traj.qvel], axis=1), ref) < 1e-8

    weights = jnp.asarray(np.random.default_rng(1).normal(size=m.nq + m.nv))

    def loss(x):
        qvel, u = x
        new = jsn.step(model, data.replace(qvel=qvel, ctrl=u))
        return jnp.dot(weights, jnp.concatenate([new.qpos, new.qvel]))

    check_directional(loss, (data.qvel, data.ctrl), np.random.default_rng(2))
