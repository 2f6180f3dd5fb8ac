"""Mocap bodies: poses from Data.mocap_pos / mocap_quat, per world, against MuJoCo (float64),
and differentiable (central finite differences)."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn

SCENE = """
<mujoco model="mocap">
  <option timestep="0.005"/>
  <worldbody>
    <geom type="plane" size="2 2 0.1"/>
    <body name="hand" mocap="true" pos="0 0 0.8" quat="0.9 0 0.3 0.1">
      <geom type="box" size="0.05 0.05 0.05" contype="0" conaffinity="0"/>
    </body>
    <body name="paddle" mocap="true" pos="0.4 0 0.1">
      <geom type="box" size="0.1 0.1 0.02"/>
    </body>
    <body name="link" pos="0 0 0.5">
      <freejoint/>
      <geom type="capsule" fromto="0 0 0 0 0 0.3" size="0.03" contype="0" conaffinity="0"/>
    </body>
    <body name="ball" pos="0.4 0 0.3">
      <freejoint/>
      <geom type="sphere" size="0.05"/>
    </body>
  </worldbody>
  <equality>
    <connect body1="link" body2="hand" anchor="0 0 0.3"/>
  </equality>
</mujoco>
"""


def moves(t: int) -> tuple[np.ndarray, np.ndarray]:
    """A scripted motion: the hand circles and turns, the paddle rises under the ball."""
    hand = np.array([0.2 * np.sin(0.1 * t), 0.2 * np.cos(0.1 * t), 0.8])
    paddle = np.array([0.4, 0.0, 0.1 + 0.002 * t])
    quat = np.array([np.cos(0.02 * t), 0.0, 0.0, np.sin(0.02 * t)])
    return np.stack([hand, paddle]), np.stack([quat, [1.0, 0, 0, 0]])


def test_mocap_bodies_follow_data_and_match_mujoco():
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    d = mujoco.MjData(m)
    data = jsn.make_data(model)
    np.testing.assert_allclose(data.mocap_pos, d.mocap_pos)  # defaults: the bodies' poses in the MJCF
    np.testing.assert_allclose(data.mocap_quat, d.mocap_quat)
    step = jax.jit(jsn.step)
    for t in range(60):
        pos, quat = moves(t)
        d.mocap_pos[:], d.mocap_quat[:] = pos, quat
        mujoco.mj_step(m, d)
        data = step(model, data.replace(mocap_pos=jnp.asarray(pos), mocap_quat=jnp.asarray(quat)))
        np.testing.assert_allclose(data.xpos, d.xpos, atol=1e-8)  # mocap poses, before the step's integration
        np.testing.assert_allclose(np.concatenate([data.qpos, data.qvel]), np.concatenate([d.qpos, d.qvel]), atol=1e-6)
    assert d.ncon > 0  # the ball sits on the paddle


def test_mocap_pose_gradient_matches_finite_differences():
    """d(link acceleration) / d(hand position) through the connect equality, batched over worlds."""
    model = jsn.load_mjcf(SCENE.replace('<option timestep="0.005"/>', '<option timestep="0.005"><flag contact="disable"/></option>'))
    data = jsn.make_data(model)

    def link_acc(hand):
        return jsn.forward(model, data.replace(mocap_pos=data.mocap_pos.at[0].set(hand))).qacc[:3]

    hands = jnp.array([[0.0, 0.0, 0.8], [0.1, -0.05, 0.75]])
    jac = jax.jit(jax.vmap(jax.jacrev(link_acc)))(hands)
    f = jax.jit(jax.vmap(link_acc))
    for i in range(3):
        e = jnp.zeros(3).at[i].set(1e-6)
        np.testing.assert_allclose(jac[:, :, i], (f(hands + e) - f(hands - e)) / 2e-6, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(jac)).max() > 1.0  # the equality pulls the link towards the hand


DOFLESS = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="1 1 0.1"/>
    <body name="a" mocap="true" pos="0 0 0.05"><geom name="a" type="sphere" size="0.1"/></body>
    <body name="b" mocap="true" pos="0.05 0 0.05"><geom type="sphere" size="0.1"/></body>
    {ball}
  </worldbody>
  <contact><pair geom1="floor" geom2="a"/>{self_pair}</contact>
</mujoco>
"""


def test_pairs_of_bodies_without_dofs_follow_mujoco():
    """Automatic pairs of two dof-less bodies (mocap and world, mocap and mocap) are not tested; an
    explicit pair's contact between bodies with the same dof chain (dof-less ones, two geoms of one
    body) is reported but gets no rows (MuJoCo's filterBodyPair and mj_instantiateContact); without
    any dof (nv = 0) the forward pass still runs."""
    ball = ('<body pos="0.5 0 0.09"><freejoint/><geom name="ball" type="sphere" size="0.1"/>'
            '<geom name="bump" type="sphere" size="0.05" pos="0.05 0 0"/></body>')  # fmt: skip
    self_pair = '<pair geom1="ball" geom2="bump"/>'
    for scene in (DOFLESS.format(ball="", self_pair=""), DOFLESS.format(ball=ball, self_pair=self_pair)):
        m = mujoco.MjModel.from_xml_string(scene)
        d = mujoco.MjData(m)
        mujoco.mj_forward(m, d)
        model = jsn.from_mujoco(m)
        out = jsn.forward(model, jsn.make_data(model))
        rowless = 1 + (m.nv > 0)  # the explicit pairs' contacts
        assert int(np.sum(out.contact.mask)) == d.ncon == rowless + (m.nv > 0)  # and the ball on the floor
        assert int(np.sum(out.efc_mask)) == d.nefc == 4 * (d.ncon - rowless)
        np.testing.assert_allclose(np.asarray(out.efc_force)[np.asarray(out.efc_mask)], d.efc_force, rtol=1e-9)
        np.testing.assert_allclose(out.qacc, d.qacc, atol=1e-9)
    # the rowless contacts (the self pair 4 cm deep) take no place among max_contact_points (m, d:
    # the scene with the ball, the loop's last)
    capped = jsn.from_mujoco(m, max_contact_points=1)
    out = jsn.forward(capped, jsn.make_data(capped))
    assert not bool(out.contact.overflow) and int(np.sum(out.efc_mask)) == 4
    np.testing.assert_allclose(out.qacc, d.qacc, atol=1e-9)


def test_the_adaptive_integrator_reads_the_mocap_poses():
    """Each adaptive substep's forward pass sees the world's mocap poses (it once rebuilt its Data
    without them, and the tethered ball stayed put): 40 steps against MuJoCo's RK4."""
    xml = """<mujoco><option timestep="0.002" integrator="RK4"/><worldbody><body name="hand" mocap="true" pos="0 0 1"/>
      <body name="ball" pos="0 0 1"><freejoint/><geom size=".05" contype="0" conaffinity="0"/></body></worldbody>
      <equality><connect body1="hand" body2="ball" anchor="0 0 0"/></equality></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    d.mocap_pos[0] = [0.3, 0.1, 1.0]
    for _ in range(40):
        mujoco.mj_step(m, d)
    model = jsn.from_mujoco(m, integrator="adaptive", rtol=1e-9, atol=1e-9)
    data = jsn.make_data(model).replace(mocap_pos=jnp.asarray(d.mocap_pos))
    final, _ = jax.jit(jsn.rollout)(model, data, jnp.zeros((40, 0)))
    assert d.qpos[0] > 0.1  # the ball followed the hand
    np.testing.assert_allclose(final.qpos, d.qpos, atol=1e-6)


GRASP = """<mujoco><option timestep="0.005" cone="elliptic"/><worldbody><geom type="plane" size="2 2 .1"/>
  <body name="hand" mocap="true" pos="0 0 .3"><geom type="box" size=".02 .02 .02" contype="0" conaffinity="0"/></body>
  <body name="box" pos="0 0 .05"><freejoint/><geom type="box" size=".05 .05 .05"/></body>
  <body name="a" pos=".5 0 .3"><joint name="ja" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 .2 0 0" size=".02" contype="0" conaffinity="0"/></body>
  <body name="b" pos=".5 .3 .3"><joint name="jb" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 .2 0 0" size=".02" contype="0" conaffinity="0"/></body>
  </worldbody><equality><weld name="grab" body1="hand" body2="box" relpose="0 0 -.08 1 0 0 0" active="false" solref=".02 1"/>
  <joint name="couple" joint1="jb" joint2="ja"/><connect name="pin" body1="a" body2="world" anchor=".2 0 0" active="false"/></equality></mujoco>"""


def test_equality_constraints_switch_on_and_off_per_world_as_mujoco():
    """Data.eq_active (mjData.eq_active, from eq_active0): a weld to a mocap hand grabs a box off the
    floor and lets it go, a pin holds a hinge, a joint coupling is cut. Two worlds in one batch, switched
    on different schedules between three 100-step rollouts, each against its own MuJoCo run."""
    m = mujoco.MjModel.from_xml_string(GRASP)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)
    np.testing.assert_array_equal(data.eq_active, [False, True, False])
    rollout = jax.jit(jax.vmap(lambda d: jsn.rollout(model, d, jnp.zeros((100, 0)))))
    grab, cut = [True, True, True], [False, False, True]
    schedules = ([grab, cut, [False, True, False]], [cut, grab, [True, False, False]])
    refs = [mujoco.MjData(m) for _ in schedules]
    worlds = jax.tree.map(lambda x: jnp.stack([x, x]), data)
    for k in range(3):
        worlds, traj = rollout(worlds.replace(eq_active=jnp.asarray([s[k] for s in schedules])))
        for w, d in enumerate(refs):
            d.eq_active[:] = schedules[w][k]
            for t in range(100):
                mujoco.mj_step(m, d)
                np.testing.assert_allclose(traj.qpos[w, t], d.qpos, rtol=0, atol=1e-9)
        if k == 0:
            assert refs[0].qpos[2] > 0.15 and abs(refs[0].qpos[7]) < 0.05  # the box lifted, the pin holding
            assert refs[1].qpos[2] < 0.06 and abs(refs[1].qpos[7]) < 0.05 and abs(refs[1].qpos[8]) > 1  # cut: b swings down
    assert refs[0].qpos[2] < 0.06 and refs[1].qpos[2] > 0.15  # world 0 dropped the box, world 1 holds it
