"""Optional smoothing of the narrow phase's case switches (collision.smoothing).

For each smoothed switch: away from it (by 40 tau) the smoothed contact and its gradient
equal MuJoCo's; across it the unsmoothed gradient jumps and the smoothed one does not;
the smoothed gradient is the exact derivative (central finite differences, float64) of
the smoothed forward pass; the option is off by default and reaches the narrow phase.
"""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp.collision import collide, primitives
from jaxsim_ncp.collision.base import GeomFrame

TAU = 1e-3
TILT = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.8, -0.6], [0.0, 0.6, 0.8]])  # generic box/cylinder orientation
BOX = GeomFrame(jnp.array([0.1, -0.2, 0.3]), TILT, jnp.array([0.3, 0.2, 0.25]))
CYL = GeomFrame(jnp.array([0.1, -0.2, 0.3]), TILT, jnp.array([0.2, 0.15, 0.0]))


def _frame(pos, size, mat=TILT):
    return GeomFrame(jnp.asarray(pos), mat, jnp.asarray(size))


def _sphere_box(x, tau):
    sphere = _frame(BOX.pos + TILT @ x, [0.05, 0.0, 0.0])
    return primitives.sphere_box(sphere, BOX, 0.0, smoothing=tau)


def _sphere_cylinder(x, tau):
    sphere = _frame(CYL.pos + TILT @ x, [0.05, 0.0, 0.0])
    return primitives.sphere_cylinder(sphere, CYL, 0.0, smoothing=tau)


def _capsule_box(x, tau):
    capsule = _frame(BOX.pos + TILT @ x, [0.04, 0.05, 0.0])  # axis = box z: both end points inside
    return primitives.capsule_box(capsule, BOX, 0.0, smoothing=tau)


def _scalar(fn):
    """A scalar that depends on every output of slot 0 (dist, pos, normal)."""

    def f(x, tau):
        col = fn(x, tau)
        return col.dist[0] + jnp.dot(col.pos[0], jnp.array([0.3, -0.2, 0.5])) + jnp.dot(col.frame[0, 0], jnp.array([0.7, 0.1, -0.4]))

    return f


# (function, local offset of the sphere/capsule centre on a switch, direction crossing it)
# sphere-box: +x face (0.3 - x) ties with +y face (0.2 - y); sphere-cylinder: side
# (0.2 - r) ties with the top cap (0.15 - z); capsule-box: same face tie at its axis points.
CASES = {
    "sphere-box": (_sphere_box, [0.15, 0.05, 0.02], [1.0, 0.0, 0.0]),
    "sphere-cylinder": (_sphere_cylinder, [0.08, 0.06, 0.05], [0.6, 0.8, 0.0]),
    "capsule-box": (_capsule_box, [0.15, 0.05, 0.0], [1.0, 0.0, 0.0]),
}


def _outputs(col):
    return [np.asarray(a) for a in (col.dist, col.pos, col.frame, col.valid)]


@pytest.mark.parametrize("name", CASES)
def test_exact_away_from_switches(name):
    fn, x0, direction = CASES[name]
    rng = np.random.default_rng(0)
    f = _scalar(fn)
    grad = jax.jit(jax.grad(f), static_argnums=1)
    jfn = jax.jit(fn, static_argnums=1)
    points = [jnp.asarray(x0) + s * jnp.asarray(direction) for s in (-40 * TAU, 40 * TAU)]
    points += [jnp.asarray(x) for x in rng.uniform(-0.35, 0.35, (20, 3))]  # mostly outside or far from ties
    for x in points:
        runner_up_gap = _switch_gap(name, x)
        if runner_up_gap < 40 * TAU:
            continue
        for a, b in zip(_outputs(jfn(x, 0.0)), _outputs(jfn(x, TAU))):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        np.testing.assert_allclose(grad(x, TAU), grad(x, 0.0), rtol=0, atol=1e-12)


def _switch_gap(name, x):
    """How much deeper the runner-up candidate is than the chosen one (inf if outside)."""
    x = np.asarray(x)
    if name == "sphere-cylinder":
        r, z = np.hypot(x[0], x[1]), x[2]
        depths = np.array([0.2 - r, 0.15 - z, 0.15 + z])
    else:
        size = np.array([0.3, 0.2, 0.25])
        points = [x] if name == "sphere-box" else [x + [0, 0, 0.05], x - [0, 0, 0.05]]
        gaps = []
        for p in points:
            d = np.sort(np.concatenate([size - p, size + p]))
            gaps.append(np.inf if d[0] <= 0 else d[1] - d[0])
        return min(gaps)
    if depths.min() <= 0:
        return np.inf
    d = np.sort(depths)
    return d[1] - d[0]


@pytest.mark.parametrize("name", CASES)
def test_gradient_jump_is_smoothed(name):
    fn, x0, direction = CASES[name]
    f = _scalar(fn)
    x0, direction = jnp.asarray(x0), jnp.asarray(direction)
    grad = jax.jit(jax.grad(f), static_argnums=1)
    side = lambda s, tau: grad(x0 + s * direction, tau)  # noqa: E731
    jump_hard = float(jnp.abs(side(1e-9, 0.0) - side(-1e-9, 0.0)).max())
    jump_smooth = float(jnp.abs(side(1e-9, TAU) - side(-1e-9, TAU)).max())
    assert jump_hard > 0.3
    assert jump_smooth < 1e-2 * jump_hard
    # the blended depth stays within 0.3 tau of MuJoCo's
    assert abs(float(fn(x0, TAU).dist[0] - fn(x0, 0.0).dist[0])) < 0.3 * TAU


@pytest.mark.parametrize("name", CASES)
def test_smoothed_gradient_matches_finite_differences(name):
    fn, x0, direction = CASES[name]
    f = jax.jit(_scalar(fn), static_argnums=1)
    for s in (0.0, 3e-4, -1e-3):  # on the switch and inside the blended band
        x = jnp.asarray(x0) + s * jnp.asarray(direction)
        h = 1e-7
        fd = [(f(x + h * e, TAU) - f(x - h * e, TAU)) / (2 * h) for e in jnp.eye(3)]
        np.testing.assert_allclose(jax.grad(f)(x, TAU), np.array(fd), rtol=1e-5, atol=1e-6)


SCENE = """
<mujoco>
  <worldbody>
    <geom name="box" type="box" size="0.3 0.2 0.25"/>
    <body pos="0.15 0.05 0.02"><freejoint/><geom type="sphere" size="0.05"/></body>
  </worldbody>
</mujoco>
"""


def test_model_option_reaches_the_narrow_phase():
    mj_model = mujoco.MjModel.from_xml_string(SCENE)
    mj_data = mujoco.MjData(mj_model)
    mujoco.mj_kinematics(mj_model, mj_data)

    def depth_gradient(tau):
        model = jsn.from_mujoco(mj_model, collision_smoothing=tau)
        data = jsn.make_data(model).replace(
            geom_xpos=jnp.asarray(mj_data.geom_xpos), geom_xmat=jnp.asarray(mj_data.geom_xmat).reshape(-1, 3, 3)
        )

        def depth(xpos):
            return collide(model, data.replace(geom_xpos=data.geom_xpos.at[1].set(xpos))).dist[0]

        return jax.jit(jax.grad(depth))(data.geom_xpos[1] + jnp.array([1e-7, 0.0, 0.0]))

    assert jsn.from_mujoco(mj_model).opt.collision_smoothing == 0.0
    assert float(jnp.abs(depth_gradient(0.0) - depth_gradient(TAU)).max()) > 0.3
    with pytest.raises(ValueError, match="collision_smoothing"):
        jsn.from_mujoco(mj_model, collision_smoothing=-1.0)
