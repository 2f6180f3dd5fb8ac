"""Gradients through collision, constraint rows and the Newton solver (float64, central FD).

Reverse mode here differentiates through the (converged, static-count) solver
iterations; states are chosen where the dynamics are smooth (no contact at an
activation boundary), so the derivative exists and FD is meaningful.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsim_ncp as jsn
from test_gradients import check_directional

TILTED_BOX = """<mujoco><option timestep="0.005" iterations="30" ls_iterations="12" tolerance="1e-12"/><worldbody>
  <geom type="plane" size="5 5 .1"/>
  <body pos="0 0 .07" quat=".995 .07 .05 0"><freejoint/><geom type="box" size=".1 .08 .06" friction=".8"/></body>
</worldbody></mujoco>"""

SPHERE_CAPSULE = """<mujoco><option timestep="0.005" iterations="30" ls_iterations="12" tolerance="1e-12"/><worldbody>
  <geom type="plane" size="5 5 .1"/>
  <body pos="0 0 .048"><freejoint/><geom type="sphere" size=".05" condim="4"/></body>
  <body pos=".03 0 .145" quat=".96 0 .28 0"><freejoint/><geom type="capsule" size=".04 .08" condim="6"/></body>
</worldbody></mujoco>"""

CHAIN = """<mujoco><option timestep="0.005" iterations="30" ls_iterations="12" tolerance="1e-12"/><worldbody>
  <body pos="0 0 1"><joint type="hinge" axis="0 1 0" range="-30 30" frictionloss=".2"/>
    <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" contype="0" conaffinity="0"/>
    <body pos=".3 0 0"><joint type="hinge" axis="0 1 0" range="-10 10"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" contype="0" conaffinity="0"/></body></body>
</worldbody></mujoco>"""

CASES = [
    ("tilted_box", TILTED_BOX, "pyramidal", None),
    ("sphere_capsule", SPHERE_CAPSULE, "elliptic", None),
    ("chain", CHAIN, "pyramidal", [0.55, -0.19]),
]


@pytest.mark.parametrize("name,xml,cone,qpos", CASES)
def test_step_gradients_match_finite_differences(name, xml, cone, qpos):
    model = jsn.load_mjcf(xml, cone=cone)
    rng = np.random.default_rng(7)
    data = jsn.make_data(model)
    if qpos is not None:
        data = data.replace(qpos=jnp.asarray(qpos))
    data = data.replace(qvel=jnp.asarray(0.2 * rng.normal(size=model.nv)))
    assert int(jnp.sum(jsn.forward(model, data).efc_mask)) > 0, "state must have active constraints"
    w = jnp.asarray(rng.normal(size=model.nv))

    def loss_state(state):
        qpos, qvel = state
        out = jsn.step(model, data.replace(qpos=qpos, qvel=qvel))
        return jnp.dot(w, out.qvel) + jnp.sum(out.qacc * w) * 1e-3

    check_directional(jax.jit(loss_state), (data.qpos, data.qvel), rng, rtol=1e-4)

    params = lambda m: (m.geom_friction, m.geom_solref, m.geom_solimp, m.geom_size, m.body_mass, m.jnt_range, m.dof_frictionloss)  # noqa: E731

    def loss_params(p):
        m = eqx.tree_at(params, model, p)
        out = jsn.step(m, data)
        return jnp.dot(w, out.qvel) + jnp.sum(out.qacc * w) * 1e-3

    check_directional(jax.jit(loss_params), params(model), rng, rtol=1e-4)


def test_gradients_finite_at_activation_boundary():
    """Sphere exactly touching the plane (dist == 0) and a limit exactly at its bound: finite gradients."""
    model = jsn.load_mjcf(SPHERE_CAPSULE)
    data = jsn.make_data(model)
    qpos = data.qpos.at[2].set(0.05)  # sphere radius: touching

    def loss(qpos, friction):
        m = eqx.tree_at(lambda m: m.geom_friction, model, friction)
        out = jsn.step(m, data.replace(qpos=qpos))
        return jnp.sum(out.qpos**2) + jnp.sum(out.qvel**2)

    g = jax.grad(loss, argnums=(0, 1))(qpos, model.geom_friction)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in g)
    chain = jsn.load_mjcf(CHAIN)
    cdata = jsn.make_data(chain).replace(qpos=jnp.asarray([np.deg2rad(30.0), 0.0]))
    g = jax.grad(lambda q: jnp.sum(jsn.step(chain, cdata.replace(qpos=q)).qvel ** 2))(cdata.qpos)
    assert np.all(np.isfinite(np.asarray(g)))
