"""Rangefinders and ray casting (ray.py) against MuJoCo's mj_ray: distances and surface normals
for every geom type (planes bounded and unbounded, sphere, capsule, ellipsoid, cylinder, box, a
non-convex mesh, a height field with its side walls and base), rays from outside and from inside,
invisible geoms skipped; the rangefinder sensor's outputs (distance, direction, origin, point,
normal, depth, cutoff) and its gradient against finite differences; camera projections of sites
for cameras in every mode (fixed, track, trackcom, targetbody, targetbodycom; fovy or lens)."""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

import jaxsim_ncp as jsn
from jaxsim_ncp import ray
from test_parity import random_state, to_data

SCENE = """
<mujoco>
  <asset>
    <hfield name="terrain" nrow="5" ncol="6" size="0.6 0.5 0.2 0.1"
            elevation="0 1 2 1 0 1  1 3 2 2 1 0  0 2 4 3 2 1  1 1 2 2 3 2  0 0 1 2 1 1"/>
    <mesh name="notch" vertex="0 0 0  1 0 0  1 1 0  0.5 0.4 0  0 1 0  0 0 0.5  1 0 0.5  1 1 0.5  0.5 0.4 0.5  0 1 0.5"
          face="0 3 1  1 3 2  0 4 3  5 6 8  6 7 8  5 8 9  0 1 6  0 6 5  1 2 7  1 7 6  2 3 8  2 8 7  3 4 9  3 9 8  4 0 5  4 5 9"/>
    <material name="ghost" rgba="1 1 1 0"/>
  </asset>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <geom type="plane" size="3 3 0.1" pos="0 0 -0.5"/>
    <geom type="plane" size="0 0 1" pos="0 0 -3"/>
    <geom type="hfield" hfield="terrain" pos="2 0 -0.4" euler="0 0 20"/>
    <geom name="invisible" type="box" size="0.5 0.5 0.5" pos="0 0 3" rgba="1 0 0 0"/>
    <geom name="transparent_material" type="sphere" size="0.4" pos="0 2 2" material="ghost"/>
    <camera name="world_cam" pos="3 -2 2" xyaxes="0.6 0.8 0 -0.3 0.2 1" fovy="60" resolution="640 480"/>
    <body name="shapes" pos="0 0 0.5">
      <joint type="ball"/>
      <camera name="tracking" mode="track" pos="0 -3 1" euler="70 0 0" resolution="320 240"/>
      <camera name="tracking_com" mode="trackcom" pos="0 -3 1" euler="70 0 0"/>
      <camera name="aiming" mode="targetbody" target="scanner" pos="1 -2 0.5" resolution="100 200"/>
      <camera name="aiming_com" mode="targetbodycom" target="scanner" pos="-1 -2 0.5"/>
      <camera name="lens" pos="0.2 -1.5 0.3" euler="80 0 10" sensorsize="0.006 0.004" focal="0.004 0.005"
              resolution="1200 800"/>
      <site name="marker" pos="0.4 0.3 0.2"/>
      <geom type="sphere" size="0.2" pos="0.6 0 0"/>
      <geom type="capsule" size="0.1 0.25" pos="-0.6 0 0" euler="30 10 0"/>
      <geom type="ellipsoid" size="0.3 0.15 0.1" pos="0 0.6 0" euler="0 20 40"/>
      <geom type="cylinder" size="0.15 0.2" pos="0 -0.6 0" euler="50 0 10"/>
      <geom type="box" size="0.1 0.2 0.15" pos="0.5 0.5 0.3" euler="10 20 30"/>
      <geom type="mesh" mesh="notch" pos="-0.8 0.6 -0.2" euler="0 0 15"/>
    </body>
    <body name="scanner" pos="0.2 0.1 1.5">
      <freejoint/>
      <geom type="sphere" size="0.05"/>
      <site name="down" euler="180 0 0"/>
      <site name="tilted" euler="150 30 0"/>
      <site name="sideways" euler="0 90 0"/>
      <site name="up"/>
    </body>
  </worldbody>
  <sensor>
    <rangefinder site="down"/>
    <rangefinder site="tilted" data="dist point normal"/>
    <rangefinder site="sideways" data="dist dir origin normal depth" cutoff="1.5"/>
    <rangefinder site="up"/>
    <camprojection site="tilted" camera="world_cam"/>
    <camprojection site="marker" camera="tracking"/>
    <camprojection site="down" camera="tracking_com"/>
    <camprojection site="marker" camera="aiming"/>
    <camprojection site="marker" camera="aiming_com"/>
    <camprojection site="up" camera="lens"/>
  </sensor>
</mujoco>
"""


def test_rays_match_mujoco():
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    rng = np.random.default_rng(0)
    d = random_state(m, rng)
    d.qpos[4:7] = [0.3, -0.2, 1.2]
    data = jax.jit(jsn.forward)(model, to_data(model, d))
    mujoco.mj_forward(m, d)
    # rays aimed near every geom's center, from 0 to 2 m away (0: starting inside it)
    target = np.repeat(d.geom_xpos, 60, axis=0) + 0.15 * rng.normal(size=(60 * m.ngeom, 3))
    direction = rng.normal(size=target.shape)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    origin = target - rng.uniform(0, 2, size=(len(target), 1)) * direction
    cast = jax.jit(jax.vmap(lambda p, v: ray.ray(model, data, p, v, exclude_body=-1)))
    dist, normal = cast(jnp.asarray(origin), jnp.asarray(direction))
    hit_geoms = set()
    for k in range(len(origin)):
        geom, ref_normal = np.zeros(1, np.int32), np.zeros(3)
        ref = mujoco.mj_ray(m, d, origin[k], direction[k], None, 1, -1, geom, ref_normal)
        np.testing.assert_allclose(dist[k], ref, atol=1e-10)
        np.testing.assert_allclose(normal[k], ref_normal, atol=1e-9, err_msg=f"geom {geom[0]}")
        hit_geoms.add(int(geom[0]))
    assert hit_geoms >= set(range(m.ngeom)) - {3, 4}  # all but the invisible box and sphere


def test_rangefinders_and_camera_projections_match_mujoco_with_finite_difference_gradients():
    m = mujoco.MjModel.from_xml_string(SCENE)
    model = jsn.from_mujoco(m)
    data = jsn.make_data(model)

    def readings(qpos):
        sensordata = jsn.forward(model, data.replace(qpos=qpos)).sensordata
        return sensordata, sensordata

    jacobian_and_readings = jax.jit(jax.jacfwd(readings, has_aux=True))  # one compiled program for all checks
    rng = np.random.default_rng(1)
    for _ in range(6):
        d = random_state(m, rng)
        d.qpos[4:7] = rng.uniform(-1, 1, 3) + [0, 0, 1]
        mujoco.mj_forward(m, d)
        np.testing.assert_allclose(jacobian_and_readings(jnp.asarray(d.qpos))[1], d.sensordata, atol=1e-10)

    qpos = jnp.asarray(d.qpos).at[4:7].set(jnp.array([0.1, 0.05, 1.4]))  # "down" sees the shapes, "tilted" the terrain's side
    jac = jacobian_and_readings(qpos)[0]
    assert np.all(np.isfinite(jac)) and np.abs(jac[0]).max() > 0.1
    for i in range(m.nq):
        e = jnp.zeros(m.nq).at[i].set(1e-7)
        fd = (jacobian_and_readings(qpos + e)[1] - jacobian_and_readings(qpos - e)[1]) / 2e-7
        np.testing.assert_allclose(jac[:, i], fd, rtol=1e-6, atol=1e-5)
