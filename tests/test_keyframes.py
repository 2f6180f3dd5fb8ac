"""Keyframes: `make_data(model, key)` against MuJoCo's mj_resetDataKeyframe and its trajectory.

A free box over a plane, a hinge with a plastic spring, a mocap body, a filter actuator (activation)
with a delayed control; keyframes given in full, in part (the compiler fills qpos0, body poses,
zeros) and by `<size nkey>` alone.
"""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn

XML = """<mujoco><option timestep="0.005"/><size nkey="3"/><worldbody><geom type="plane" size="2 2 .1"/>
<body name="box" pos="0 0 .3"><freejoint/><geom type="box" size=".05 .05 .05"/></body>
<body pos="1 0 1"><joint name="h" type="hinge" axis="0 1 0" stiffness="3" springyield="0.2" damping=".02"/>
  <geom type="capsule" fromto="0 0 0 .3 0 0" size=".02" contype="0" conaffinity="0"/></body>
<body name="target" mocap="true" pos="0 1 1"><geom size=".05" contype="0" conaffinity="0"/></body></worldbody>
<actuator><general joint="h" dyntype="filter" dynprm=".05" gainprm="2" delay=".01" nsample="3"/></actuator>
<keyframe><key name="launch" time="0.5" qpos="0.1 0 .2 .92388 0 .38268 0 0.7" qvel="1 0 2 0 -3 0 4" act="0.6" ctrl="-0.4"
  mpos="0 1.5 1" mquat="0 0 0 1" plastic="0.5"/>
<key qpos="0 0 1 1 0 0 0 -0.3"/></keyframe></mujoco>"""


def test_keyframes_match_mujoco_reset_and_trajectory():
    m = mujoco.MjModel.from_xml_string(XML)
    model = jsn.from_mujoco(m)
    step = jax.jit(jsn.step)
    d = mujoco.MjData(m)
    for key in (0, "launch", 1, 2, -1):
        index = m.nkey - 1 if key == -1 else (0 if key == "launch" else key)
        mujoco.mj_resetDataKeyframe(m, d, index)
        data = jsn.make_data(model, key)
        for field in ("time", "qpos", "qvel", "act", "ctrl", "mocap_pos", "mocap_quat", "plastic"):
            np.testing.assert_array_equal(np.asarray(getattr(data, field)), getattr(d, field), err_msg=f"{key}: {field}")
        if key in (0, 1):  # from the full and the partial keyframe: MuJoCo's steps (free flight, yield, delay)
            for t in range(60):
                mujoco.mj_step(m, d)
                data = step(model, data)
                for field in ("qpos", "qvel", "act", "plastic"):
                    np.testing.assert_allclose(np.asarray(getattr(data, field)), getattr(d, field), rtol=0, atol=1e-10,
                                               err_msg=f"key {key}, step {t}: {field}")
                np.testing.assert_allclose(float(data.time), d.time, rtol=1e-15)
            assert abs(d.plastic[0] - m.key_plastic[key, 0]) > 0.05  # the spring yielded from the keyframe's reference


def test_keyframe_errors_name_the_cause():
    model = jsn.load_mjcf(XML)
    with pytest.raises(ValueError, match="no keyframe named 'jump'.*launch"):
        jsn.make_data(model, "jump")
    with pytest.raises(ValueError, match="no keyframe named ''"):  # not the first unnamed one
        jsn.make_data(model, "")
    with pytest.raises(ValueError, match="out of range.*3 keyframe"):
        jsn.make_data(model, 3)
    with pytest.raises(TypeError, match="index.*or name"):
        jsn.make_data(model, 1.0)
    plain = jsn.load_mjcf("<mujoco><worldbody><body><freejoint/><geom size='.1'/></body></worldbody></mujoco>")
    assert plain.keyframes is None
    with pytest.raises(ValueError, match="0 keyframe"):
        jsn.make_data(plain, 0)
    data = jax.vmap(lambda q: jsn.make_data(model, "launch").replace(qpos=q))(jnp.zeros((2, model.nq)))
    assert data.qvel.shape == (2, model.nv)  # usable under vmap and jit
