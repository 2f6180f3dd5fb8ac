"""Public API behaviour: loading errors, overrides, jit/vmap, checkpointed rollouts, per-world divergence flags."""

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from models import ALL, ARM, SLIDER


def test_missing_file_raises():
    with pytest.raises(FileNotFoundError, match="MJCF file not found"):
        jsn.load_mjcf("/nonexistent/robot.xml")


def test_malformed_xml_raises():
    with pytest.raises(jsn.MJCFError, match="could not compile"):
        jsn.load_mjcf("<mujoco><worldbody><body></worldbody></mujoco>")
    with pytest.raises(jsn.MJCFError):
        jsn.load_mjcf("<mujoco><worldbody><geom type='sphere' size='-1'/></worldbody></mujoco>")
    for empty in ("", "  \n"):
        with pytest.raises(jsn.MJCFError, match="the MJCF is empty"):
            jsn.load_mjcf(empty)


@pytest.mark.parametrize(
    "xml,match",
    [
        # convex pairs follow MuJoCo's native GJK/EPA only, not libccd's
        ("<mujoco><option><flag nativeccd='disable'/></option><worldbody><geom name='egg' type='ellipsoid' size='.1 .2 .3'/>"
         "<body><freejoint/><geom name='pill' type='capsule' size='.1 .2'/></body></worldbody></mujoco>", "nativeccd.*'pill'-'egg'"),
        ("<mujoco><default><geom contype='0' conaffinity='0'/></default><worldbody><body><joint name='j'/><geom size='.1'/></body></worldbody>"
         "<actuator><general name='mus' joint='j' dyntype='user'/></actuator></mujoco>", "actuator 'mus'"),
        # MuJoCo 4's sleeping islands are not simulated yet
        ("<mujoco><option><flag sleep='enable'/></option><worldbody><geom type='plane' size='1 1 .1'/>"
         "<body><freejoint/><geom size='.1'/></body></worldbody></mujoco>", r"sleeping islands \(option/flag sleep\)"),
        # nor speculative contacts (MuJoCo 4's conservative advancement against tunnelling)
        ("<mujoco><option><flag speculative='enable'/></option><worldbody><geom type='plane' size='1 1 .1'/>"
         "<body><freejoint/><geom size='.1'/></body></worldbody></mujoco>", r"speculative contacts \(option/flag speculative\)"),
        ("<mujoco><default><geom contype='0' conaffinity='0'/></default><worldbody><body><joint name='j'/><geom size='.1'/></body></worldbody>"
         "<actuator><general name='callback' joint='j' gaintype='user'/></actuator></mujoco>", "actuator 'callback' gaintype mjGAIN_USER"),
    ],
)
def test_unsupported_features_raise(xml, match):
    with pytest.raises(jsn.UnsupportedFeatureError, match=match):
        jsn.load_mjcf(xml)


def test_contact_free_when_disabled_or_filtered():
    # the contact flag off, or parent/child pairs (filtered by MuJoCo), load fine
    off = jsn.load_mjcf("<mujoco><option><flag contact='disable'/></option><worldbody><body><freejoint/><geom size='.1'/></body>"
                        "<body pos='1 0 0'><freejoint/><geom size='.1'/></body></worldbody></mujoco>")
    chain = jsn.load_mjcf("<mujoco><worldbody><body><joint/><geom size='.1'/><body><joint/><geom size='.1'/></body></body></worldbody></mujoco>")
    assert off.constraints.ncon == 0 and chain.constraints.ncon == 0
    # contact extras (surface velocity, adhesion) on geoms that never collide change nothing
    quiet = jsn.load_mjcf("<mujoco><worldbody><geom type='plane' size='1 1 .1'/><body><freejoint/><geom size='.1'/>"
                          "<geom size='.05' contype='0' conaffinity='0' surfacevel='1 0 0 0 0 0' adhesion='2'/></body></worldbody></mujoco>")
    assert quiet.constraints.ncon == 1


def test_a_contact_rich_load_without_capacity_warns():
    """50 free boxes: 1225 box pairs, 9800 slots; with max_geom_pairs the load is quiet."""
    boxes = "".join(f"<body pos='{i % 7} {i // 7} 1'><freejoint/><geom type='box' size='.1 .1 .1'/></body>" for i in range(50))
    xml = f"<mujoco><worldbody>{boxes}</worldbody></mujoco>"
    with pytest.warns(UserWarning, match="1225 candidate geom pairs with 9800 contact slots.*max_geom_pairs"):
        jsn.load_mjcf(xml)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jsn.load_mjcf(xml, max_geom_pairs=64)


def test_overrides_and_errors():
    model = jsn.load_mjcf(ARM, timestep=0.001, integrator="rk4", dtype=jnp.float32)
    assert model.opt.integrator == "rk4" and float(model.opt.timestep) == pytest.approx(0.001)
    assert model.body_mass.dtype == jnp.float32
    assert jsn.step(model, jsn.make_data(model)).qpos.dtype == jnp.float32
    assert jsn.load_mjcf(ARM, integrator="adaptive", rtol=1e-6).opt.adaptive.max_steps == 256
    with pytest.raises(ValueError, match="only apply to integrator='adaptive'"):
        jsn.load_mjcf(ARM, rtol=1e-6)
    with pytest.raises(ValueError, match="not both"):
        jsn.load_mjcf(ARM, integrator="adaptive", atol=1e-6, stepsize_controller=diffrax.ConstantStepSize())
    with pytest.raises(jsn.UnsupportedFeatureError, match="velocity-level"):
        jsn.load_mjcf(ARM, integrator="adaptive", solver="ncp")
    assert jsn.load_mjcf(ARM, solver="ncp").opt.solver == "ncp"
    tiny = '<mujoco><option solver="{}"/><worldbody><body><freejoint/><geom size=".1"/></body></worldbody></mujoco>'
    # option/solver is read (MuJoCo's PGS, a dual method, is solved by Newton: the same optimum); overrides win
    assert [jsn.load_mjcf(tiny.format(s)).opt.solver for s in ("Newton", "CG", "PGS")] == ["newton", "cg", "newton"]
    assert jsn.load_mjcf(tiny.format("CG"), solver="newton").opt.solver == "newton"
    with pytest.raises(jsn.UnsupportedFeatureError, match="unroll.*CG"):
        jsn.load_mjcf(tiny.format("CG"), grad_mode="unroll")
    with pytest.raises(ValueError, match="solver"):
        jsn.load_mjcf(ARM, solver="pgs")
    assert jsn.load_mjcf(ARM, cfd=jsn.CFD(width=0.1)).opt.cfd.width == 0.1
    with pytest.raises(TypeError, match="unknown override"):
        jsn.load_mjcf(ARM, timestpe=0.1)
    with pytest.raises(ValueError, match="integrator"):
        jsn.load_mjcf(ARM, integrator="verlet")
    with pytest.raises(ValueError, match="grad_mode"):
        jsn.load_mjcf(ARM, grad_mode="adjoint")
    assert jsn.load_mjcf(ARM).opt.grad_mode == "implicit"
    assert jsn.load_mjcf(ARM, grad_mode="unroll").opt.grad_mode == "unroll"


def test_rollout_shapes_and_ctrl_validation():
    model = jsn.load_mjcf(ARM)
    data = jsn.make_data(model)
    final, traj = jsn.rollout(model, data, jnp.zeros((7, model.nu)))
    assert traj.qpos.shape == (7, model.nq) and traj.xpos.shape == (7, model.nbody, 3)
    assert float(final.time) == pytest.approx(7 * float(model.opt.timestep))
    with pytest.raises(ValueError, match="ctrl must have shape"):
        jsn.rollout(model, data, jnp.zeros((7, model.nu + 1)))

    # the model sets the precision: a float32 model takes float64 state (and float64 a float32 one)
    model32 = jsn.load_mjcf(ARM, dtype=jnp.float32)
    mixed = jsn.make_data(model32).replace(qvel=np.ones(model.nv), ctrl=jnp.ones(model.nu, jnp.float64))
    for fn in (jsn.forward, jsn.step, lambda m, d: jsn.rollout(m, d, np.zeros((2, m.nu)))[1]):
        out = jax.eval_shape(fn, model32, mixed)
        assert {x.dtype for x in jax.tree.leaves(out) if jnp.issubdtype(x.dtype, jnp.floating)} == {np.dtype("float32")}
    assert jax.eval_shape(jsn.step, model, mixed).qpos.dtype == jnp.float64
    # one world's sizes, named field; a batch without vmap says so
    with pytest.raises(ValueError, match=r"data.qvel has shape \(2,\), expected"):
        jax.eval_shape(jsn.step, model, data.replace(qvel=jnp.zeros(2)))
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), data)
    with pytest.raises(ValueError, match="data.time has shape .*jax.vmap"):
        jax.eval_shape(jsn.step, model, batch)


def test_checkpointed_rollout_matches_plain_values_and_gradients():
    model = jsn.load_mjcf(SLIDER)
    data = jsn.make_data(model).replace(qvel=jnp.array([0.1, 0.5, -0.2]))
    ctrl = jnp.linspace(-1, 1, 23)[:, None]

    def loss(u, checkpoint):
        final, traj = jsn.rollout(model, data, u, checkpoint=checkpoint)
        return jnp.sum(final.qpos**2) + jnp.sum(traj.qvel**2)

    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    ref_val, ref_grad = value_and_grad(ctrl, False)
    for checkpoint in (True, 5, "sqrt"):  # 23 = 4 chunks of 5 + 3 remaining steps ("sqrt": ceil(sqrt(23)) = 5)
        val, grad = value_and_grad(ctrl, checkpoint)
        np.testing.assert_allclose(val, ref_val, rtol=1e-12)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)
    for bad in ("log", -1, 2.5):
        with pytest.raises(ValueError, match="checkpoint must be"):
            jsn.rollout(model, data, ctrl, checkpoint=bad)

    # checkpoint="sqrt": the gradient's memory (XLA's estimate for the compiled program) grows like
    # sqrt(T) + the per-step outputs, not like T (measured: x1.5 from T = 16 to 256; x14 without).
    # T = 23 is the program compiled above (loaded from the compilation cache, not compiled again)
    def peak(horizon):
        memory = value_and_grad.lower(jnp.zeros((horizon, 1)), "sqrt").compile().memory_analysis()
        return memory.temp_size_in_bytes + memory.output_size_in_bytes
    assert peak(256) < 4 * peak(23)


def test_vmap_batch_equals_individual_worlds_and_nan_world_is_isolated():
    model = jsn.load_mjcf(ARM)
    data = jsn.make_data(model)
    batch = 4
    rng = np.random.default_rng(0)
    qvel = jnp.asarray(rng.normal(size=(batch, model.nv)))
    ctrl = jnp.asarray(rng.uniform(-1, 1, size=(batch, 30, model.nu)))
    ctrl = ctrl.at[2, 10, 1].set(jnp.nan)  # world 2 gets a NaN control at t = 10
    run = jax.jit(jax.vmap(lambda v, u: jsn.rollout(model, data.replace(qvel=v), u)))
    final, traj = run(qvel, ctrl)
    assert np.asarray(final.diverged).tolist() == [False, False, True, False]
    assert np.all(np.isfinite(np.asarray(final.qpos)))
    # the bad world froze at its last finite state; its flag stays set
    np.testing.assert_array_equal(traj.qpos[2, 10], traj.qpos[2, 9])
    np.testing.assert_array_equal(final.qpos[2], traj.qpos[2, 9])
    assert bool(traj.diverged[2, 10]) and not bool(traj.diverged[2, 9])
    # the NaN control is dropped before use: gradients w.r.t. shared parameters stay finite
    def loss(gain):
        m = eqx.tree_at(lambda m: m.actuator_gainprm, model, gain)
        fin, _ = jax.vmap(lambda v, u: jsn.rollout(m, data.replace(qvel=v), u))(qvel, ctrl)
        return jnp.sum(fin.qpos[jnp.array([0, 1, 3])] ** 2)

    assert np.all(np.isfinite(np.asarray(jax.jit(jax.grad(loss))(model.actuator_gainprm))))
    for i in (0, 1, 3):  # other worlds are exactly what a single-world rollout gives
        single, _ = jax.jit(jsn.rollout)(model, data.replace(qvel=qvel[i]), ctrl[i])
        np.testing.assert_allclose(final.qpos[i], single.qpos, rtol=1e-12, atol=1e-12)


def test_xfrc_applied_and_qfrc_applied_agree_with_mujoco():
    import mujoco

    m = mujoco.MjModel.from_xml_string(ALL["free_spinner"])
    d = mujoco.MjData(m)
    rng = np.random.default_rng(5)
    d.xfrc_applied[1:] = rng.normal(size=(m.nbody - 1, 6))
    d.qfrc_applied[:] = rng.normal(size=m.nv)
    mujoco.mj_forward(m, d)
    model = jsn.from_mujoco(m)
    out = jsn.forward(model, jsn.make_data(model).replace(
        qfrc_applied=jnp.asarray(d.qfrc_applied), xfrc_applied=jnp.asarray(d.xfrc_applied)))
    np.testing.assert_allclose(out.qacc, d.qacc, rtol=1e-9, atol=1e-9)


def test_a_model_without_geoms_loads_and_follows_mujoco():
    """No geom at all (an empty world; a body given by its inertial only): loads and steps."""
    assert jsn.make_data(jsn.load_mjcf("<mujoco/>")).qpos.shape == (0,)
    xml = ("<mujoco><worldbody><body><joint name='j' type='slide' axis='0 0 1'/><inertial pos='0 0 0' mass='2' diaginertia='.1 .1 .1'/>"
           "</body></worldbody><actuator><motor joint='j'/></actuator></mujoco>")
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    model = jsn.from_mujoco(m)
    final, _ = jax.jit(jsn.rollout)(model, jsn.make_data(model), jnp.ones((5, 1)))
    for _ in range(5):
        d.ctrl[:] = 1.0
        mujoco.mj_step(m, d)
    np.testing.assert_allclose(final.qpos, d.qpos, rtol=1e-12)
    assert d.qpos[0] < 0  # gravity beats the motor
