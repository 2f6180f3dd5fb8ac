"""Reliability: no deadlock-prone kernels, clear errors for bad parameters, per-world
failure flags that never leak into other worlds, bitwise determinism."""

import pathlib
import re
import subprocess
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import jaxsim_ncp as jsn
from jaxsim_ncp import adjoint, linalg

# a free box and a capsule on a plane, a motor-driven hinge pendulum, two balls far from them:
# contacts, a limit, ctrl
SCENE = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <geom name="floor" type="plane" size="3 3 0.1"/>
    <body name="box" pos="0 0 0.099"><freejoint/><geom name="box" type="box" size="0.1 0.1 0.1"/></body>
    <body name="capsule" pos="0.3 0 0.3" euler="0 80 0"><freejoint/>
      <geom name="capsule" type="capsule" size="0.05 0.1"/></body>
    <body name="pendulum" pos="-0.5 0 0.6">
      <joint name="swing" type="hinge" axis="0 1 0" range="-1 1" limited="true" damping="0.05"/>
      <geom name="rod" type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03" contype="0" conaffinity="0"/>
    </body>
    <body name="ball_a" pos="2 0 0.05"><freejoint/><geom name="ball_a" size="0.05"/></body>
    <body name="ball_b" pos="2 1 1"><freejoint/><geom name="ball_b" size="0.05"/></body>
  </worldbody>
  <actuator><motor name="drive" joint="swing" gear="2"/></actuator>
</mujoco>
"""
BALL_B_Z = 7 + 7 + 1 + 7 + 2  # qpos index of ball_b's height (box, capsule: 7 each, swing 1, ball_a 7)


@pytest.fixture(scope="module")
def scene():
    # capacity: one pair per narrow-phase function; only ball_a meets the floor in a clean world
    return jsn.load_mjcf(SCENE, iterations=20, ls_iterations=20, maxval=1e4, max_geom_pairs=1)


# jaxlib 0.10 runs a LAPACK kernel's batch on the calling thread below this many flops and splits it
# over XLA's thread pool (the deadlock of issue #11) above; its per-matrix costs (lapack_kernels.cc)
_LAPACK_INLINE_WORK = 200_000
_LAPACK_COST = {"potrf": lambda a: a[-1] ** 3 // 3, "getrf": lambda a: a[-1] ** 3, "trsm": lambda a, b: b[-2] ** 2 * b[-1]}


def _lapack_work(text: str) -> list[tuple[str, int]]:
    """(kernel, batch x per-matrix cost) of every custom call of a lowered module; only LAPACK's
    potrf, getrf and trsm are allowed (anything else fails the parse)."""
    calls = []
    for line in text.splitlines():
        if "custom_call" not in line:
            continue
        m = re.search(r"custom_call @lapack_[sd](potrf|getrf|trsm)_ffi\(.*: \((.*?)\) ->", line)
        assert m, line.strip()[:200]
        shapes = [tuple(int(d) for d in t.split("x")[:-1]) for t in re.findall(r"tensor<([^>]*)>", m.group(2))]
        calls.append((m.group(1), int(np.prod(shapes[0][:-2])) * _LAPACK_COST[m.group(1)](*shapes)))
    return calls


# a box on a plane and a limited hinge: every solve of the pipeline, small enough to trace quickly
BOX_AND_HINGE = """
<mujoco>
  <worldbody>
    <geom type="plane" size="1 1 0.1"/>
    <body pos="0 0 0.099"><freejoint/><geom type="box" size="0.1 0.1 0.1"/></body>
    <body pos="0 1 1"><joint type="hinge" range="-1 1" limited="true"/><geom size="0.1" contype="0" conaffinity="0"/></body>
  </worldbody>
</mujoco>
"""


def _low_precision_products(text: str) -> list[str]:
    return sorted({line.strip()[:160] for line in text.splitlines() if "dot_general" in line and "HIGHEST" not in line})


@pytest.mark.parametrize("grad_mode, solver", [("unroll", "newton"), ("implicit", "ncp")])
def test_batched_step_and_gradient_keep_lapack_off_the_thread_pool_and_products_at_full_precision(grad_mode, solver):
    """jaxlib's CPU LAPACK kernels block XLA pool threads on work scheduled to the same pool and
    deadlock when several run at once (issue #11): every LAPACK call of ours, also of a batch of
    2048 worlds (chunked), stays below the work at which jaxlib uses the pool.
    Every matrix product, forward and backward, asks for full precision (GPUs default to TF32)."""
    model = jsn.load_mjcf(BOX_AND_HINGE, grad_mode=grad_mode, integrator="implicitfast", solver=solver)
    data = jsn.make_data(model)
    batch = jnp.zeros((2048, model.nv))

    def loss(v):
        final, _ = jsn.rollout(model, data.replace(qvel=v), jnp.zeros((1, model.nu)))
        return jnp.sum(final.qpos**2)

    step_text = jax.jit(jax.vmap(lambda v: jsn.step(model, data.replace(qvel=v)))).lower(batch).as_text()
    grad_text = jax.jit(jax.vmap(jax.grad(loss))).lower(batch).as_text()
    calls = _lapack_work(step_text) + _lapack_work(grad_text)
    assert {kernel for kernel, _ in calls} == {"potrf", "getrf", "trsm"}  # Cholesky and LU
    assert max(work for _, work in calls) < _LAPACK_INLINE_WORK
    assert "dot_general" in grad_text
    assert _low_precision_products(step_text) == [] and _low_precision_products(grad_text) == []


# two independent batched factorizations in one program, on two cores (XLA sizes its pool from the
# process's CPU affinity)
_TWO_FACTORIZATIONS = r"""
import os, sys
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import jax, jax.numpy as jnp, numpy as np
from jaxsim_ncp import linalg
factor = jnp.linalg.cholesky if sys.argv[1] == "jaxlib" else jax.vmap(linalg.cho_factor)
x = np.random.default_rng(0).standard_normal((256, 27, 27)).astype(np.float32)
a = x @ x.transpose(0, 2, 1) + 27 * np.eye(27, dtype=np.float32)
run = jax.jit(lambda a: jnp.sum(factor(a)) + jnp.sum(factor(2 * a)))
for r in range(20):
    run(a + r).block_until_ready()
print("DONE")
"""


def test_two_batched_factorizations_running_at_once_do_not_deadlock():
    """Issue #11's hang, reduced: with jaxlib's batched potrf (`jnp.linalg.cholesky`, argument
    "jaxlib") this program hung at its first call in 3 of 3 runs on 2 cores, each call blocking a
    pool thread until chunks queued behind the other's finish. `cho_factor` gives LAPACK chunks
    small enough to run on the calling thread: 20 calls complete."""
    child = subprocess.run([sys.executable, "-c", _TWO_FACTORIZATIONS, "ours"], capture_output=True, text=True, timeout=120)
    assert child.stdout.strip() == "DONE", child.stderr[-2000:]


def test_linalg_matches_numpy_and_stays_finite_when_ill_conditioned():
    rng = np.random.default_rng(0)
    cho_factor, solve_spd, solve = jax.jit(linalg.cho_factor), jax.jit(linalg.solve_spd), jax.jit(linalg.solve)
    lu_solve_t = jax.jit(lambda m, r: linalg.lu_solve(linalg.lu_factor(m), r, trans=True))
    for n in (3, 12):
        b = rng.normal(size=(n, n))
        a = b @ b.T + n * np.eye(n)
        r = rng.normal(size=n)
        np.testing.assert_allclose(cho_factor(a), np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(solve_spd(a, r), np.linalg.solve(a, r), rtol=1e-10)
        np.testing.assert_allclose(solve(b, r), np.linalg.solve(b, r), rtol=1e-8)
        np.testing.assert_allclose(lu_solve_t(b, r), np.linalg.solve(b.T, r), rtol=1e-8)
        # the GPU branch of the LU (XLA's own LU and triangular solves), called directly
        factor = linalg._lu_factor_native(jnp.asarray(b))
        for rhs, trans in ((r, False), (r, True), (np.stack([r, 2 * r], axis=1), False)):
            ref = np.linalg.solve(b.T if trans else b, rhs)
            np.testing.assert_allclose(linalg._lu_solve_native(*factor, jnp.asarray(rhs), trans), ref, rtol=1e-8)
        # ... and of the Cholesky (the CPU's kernels in one call, as on GPUs)
        lower = linalg._cho_factor_native(jnp.asarray(a)[None])[0]
        np.testing.assert_allclose(lower, np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)
        for rhs in (r[:, None], np.stack([r, 2 * r], axis=1)):
            x = linalg._cho_solve_native(lower[None], jnp.asarray(rhs)[None])[0]
            np.testing.assert_allclose(x, np.linalg.solve(a, rhs), rtol=1e-10)
            np.testing.assert_allclose(linalg.cho_solve(lower, rhs), np.linalg.solve(a, rhs), rtol=1e-10)
        # gradients through custom_linear_solve: A_bar = -A^-T x_bar x^T, b_bar = A^-T x_bar
        for mat, fn in ((a, linalg.solve_spd), (b, linalg.solve)):
            x = np.linalg.solve(mat, r)
            b_bar = np.linalg.solve(mat.T, np.cos(x))
            g_mat, g_r = jax.jit(jax.grad(lambda m, v: jnp.sum(jnp.sin(fn(m, v))), argnums=(0, 1)))(mat, r)
            np.testing.assert_allclose(g_r, b_bar, rtol=1e-8)
            np.testing.assert_allclose(g_mat, -np.outer(b_bar, x), rtol=1e-8, atol=1e-12)
    # block diagonal (the mass matrix over kinematic trees): blocks of sizes 2, 3, 2 (two batched
    # solves), labels out of order; values and gradients of the dense solve (on the blocks)
    labels = (4, 4, 1, 1, 1, 7, 7)
    blocks = linalg.diagonal_blocks(labels)
    assert [blk.shape for blk in blocks] == [(2, 2), (1, 3)]
    same = np.equal.outer(labels, labels)
    k = rng.normal(size=(7, 7))
    c = np.where(same, k @ k.T + 7 * np.eye(7), 0.0)
    r = rng.normal(size=7)
    np.testing.assert_allclose(linalg.solve_spd_blocks(c, r, blocks), np.linalg.solve(c, r), rtol=1e-12)
    grads = [jax.grad(lambda m, v: jnp.sum(jnp.sin(fn(m, v))), argnums=(0, 1))(c, r)
             for fn in (linalg.solve_spd, lambda m, v: linalg.solve_spd_blocks(m, v, blocks))]
    np.testing.assert_allclose(grads[1][1], grads[0][1], rtol=1e-12)
    np.testing.assert_allclose(grads[1][0], np.where(same, grads[0][0], 0.0), rtol=1e-12, atol=1e-15)
    # the NCP's solves (pivots floored), float64 and, on a nonsymmetric matrix of condition
    # ~1e6 (positive-definite symmetric part), float32 backward error
    k = rng.normal(size=(8, 8))
    u = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    c = u @ np.diag(np.logspace(0, 6, 8)) @ u.T + (k - k.T)
    r = rng.normal(size=8)
    floored_solve = jax.jit(lambda m, v, t: linalg.lu_solve(linalg.factor_for_solves(m), v, t), static_argnums=2)
    for trans in (False, True):
        np.testing.assert_allclose(floored_solve(c, r, trans), np.linalg.solve(c.T if trans else c, r), rtol=1e-9)
        x = np.asarray(floored_solve(jnp.asarray(c, jnp.float32), jnp.asarray(r, jnp.float32), trans), np.float64)
        backward_error = np.linalg.norm(r - (c.T if trans else c) @ x) / (np.linalg.norm(c, 2) * np.linalg.norm(x))
        assert backward_error < 10 * np.finfo(np.float32).eps, backward_error
    # positive definite, but beyond float32's precision: finite factor instead of NaN
    u = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    a32 = jnp.asarray(u @ np.diag([1e11, 1e3, 1.0, 1e-2, 1e-3, 1e-3]) @ u.T, jnp.float32)
    assert np.all(np.isfinite(np.asarray(cho_factor(a32))))
    # a shifted or diagonal factor, finite and positive definite, also when indefinite
    for m in (a32, a32.at[0, 0].set(-1.0)):
        lower = np.asarray(cho_factor(m), np.float64)
        assert np.all(np.isfinite(lower)) and np.all(np.diagonal(lower) > 0)
    # ... batched: one world falls back; the others are bit-identical to unbatched calls, and its own
    # factor is the unbatched fallback's (the fallback runs only where it is needed)
    spd = jnp.asarray(u @ np.diag([4.0, 3.0, 2.0, 1.0, 0.5, 0.25]) @ u.T, jnp.float32)
    batch = jnp.stack([spd, a32.at[0, 0].set(-1.0), 2 * spd])
    batched = np.asarray(jax.vmap(cho_factor)(batch))
    for k in range(3):
        np.testing.assert_array_equal(batched[k], np.asarray(cho_factor(batch[k])))
    np.testing.assert_array_equal(jax.vmap(cho_factor)(batch[::2]), batched[::2])
    # a vmapped batch above LAPACK's inline work (5 x 60^3 / 3 flops) runs in chunks (three of 2, one padded),
    # nested vmaps fold into one batch: each factor and solve bit-identical to its unbatched call
    k = rng.normal(size=(5, 60, 60))
    spd60 = k @ k.transpose(0, 2, 1) + 60 * np.eye(60)
    rhs60 = rng.normal(size=(5, 60))

    def factor_and_solve(m, v):
        lower = linalg.cho_factor(m)
        return lower, linalg.cho_solve(lower, v)

    single = [jax.jit(factor_and_solve)(spd60[i], rhs60[i]) for i in range(5)]
    for fn, args in ((jax.vmap(factor_and_solve), (spd60, rhs60)),
                     (jax.vmap(jax.vmap(factor_and_solve), in_axes=(None, 0)), (spd60, np.stack([rhs60, rhs60])))):
        lowers, xs = jax.jit(fn)(*args)
        lowers, xs = lowers.reshape(-1, 60, 60)[:5], xs.reshape(-1, 60)[-5:]
        for i in range(5):
            np.testing.assert_array_equal(lowers[i], single[i][0])
            np.testing.assert_array_equal(xs[i], single[i][1])
    # the LU likewise (5 x 40^3 flops: two chunks of 3, the second padded)
    g = rng.normal(size=(5, 40, 40))
    rhs40 = rng.normal(size=(5, 40))

    def lu_and_solve(m, v):
        factor = linalg.lu_factor(m)
        return factor[0], linalg.lu_solve(factor, v, trans=True)

    lus, xs = jax.jit(jax.vmap(lu_and_solve))(g, rhs40)
    for i in range(5):
        lu, x = jax.jit(lu_and_solve)(g[i], rhs40[i])
        np.testing.assert_array_equal(lus[i], lu)
        np.testing.assert_array_equal(xs[i], x)
        np.testing.assert_allclose(x, np.linalg.solve(g[i].T, rhs40[i]), rtol=1e-8)
    assert np.all(np.isfinite(np.asarray(solve_spd(a32, jnp.ones(6, jnp.float32)))))
    # a singular matrix: the NCP's factor raises the zero pivot, its solves stay finite
    assert np.all(np.isfinite(np.asarray(floored_solve(jnp.asarray([[1.0, 2.0], [2.0, 4.0]]), jnp.ones(2), True))))



def test_elliptic_cone_hessian_is_finite_where_the_tangential_velocity_nearly_vanishes():
    """Float32 middle zone at T = 1e-20 (T^3 underflows to 0): the cone Hessian is finite and equals
    MuJoCo's formula evaluated in float64. Its inf made an unrolled CFD gradient NaN (fuzz seed 4003)."""
    from jaxsim_ncp.solver import newton

    mu, T, Dm = 0.8, 1e-20, 3.0
    U = np.array([0.3 * T, 0.6 * T, 0.8 * T, 0.0, 0.0, 0.0])  # -T/mu < N < mu T: the middle zone
    scale = np.array([mu, 1.0, 1.0, 0.5, 0.5, 0.5])
    Ut, N = U[1:], U[0]
    ref = np.zeros((6, 6))
    ref[0, 0], ref[0, 1:], ref[1:, 0] = 1.0, -mu / T * Ut, -mu / T * Ut
    ref[1:, 1:] = mu * N / T**3 * np.outer(Ut, Ut) + (mu**2 - mu * N / T) * np.eye(5)
    ref *= Dm * np.outer(scale, scale)
    f32 = lambda x: jnp.asarray(np.atleast_1d(x)[None] if np.ndim(x) else [x], jnp.float32)  # noqa: E731
    middle = (jnp.array([True]), f32(U), f32(N), f32(T), f32(Dm))
    cone = newton._Cone(f32(mu), f32(scale), f32(Dm))
    hessian = np.asarray(newton._cone_hessian(middle, cone)[0], np.float64)
    np.testing.assert_allclose(hessian, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


BAD_PARAMETERS = [
    (lambda m: m.body_mass, lambda m: m.body_mass.at[1].set(-1.0), 'body_mass of body "box".*positive'),
    (lambda m: m.body_mass, lambda m: m.body_mass.at[3].set(0.0), 'body_mass of body "pendulum"'),
    (lambda m: m.body_inertia, lambda m: m.body_inertia.at[2].set(jnp.array([1.0, 0.1, 0.1])), 'body_inertia of body "capsule".*triangle'),
    (lambda m: m.body_inertia, lambda m: m.body_inertia.at[1, 0].set(-1e-3), 'body_inertia of body "box".*positive'),
    (lambda m: m.geom_friction, lambda m: m.geom_friction.at[2, 0].set(-0.1), 'geom_friction of geom "capsule".*non-negative'),
    (lambda m: m.geom_size, lambda m: m.geom_size.at[1, 2].set(0.0), 'geom_size of geom "box".*positive'),
    (lambda m: m.geom_solref, lambda m: m.geom_solref.at[1].set(jnp.array([0.02, -1.0])), 'geom_solref of geom "box".*solref'),
    (lambda m: m.geom_solimp, lambda m: m.geom_solimp.at[2, 1].set(1.5), 'geom_solimp of geom "capsule".*solimp'),
    (lambda m: m.jnt_solimp, lambda m: m.jnt_solimp.at[2, 4].set(0.5), 'jnt_solimp of joint "swing".*power'),
    (lambda m: m.dof_damping, lambda m: m.dof_damping.at[12].set(jnp.nan), 'dof_damping of joint "swing" \\(dof 12\\): non-finite'),
    (lambda m: m.dof_armature, lambda m: m.dof_armature.at[12].set(-1.0), 'dof_armature of joint "swing".*non-negative'),
    (lambda m: m.geom_pos, lambda m: m.geom_pos.at[0, 2].set(jnp.inf), 'geom_pos of geom "floor": non-finite'),
    (lambda m: m.actuator_gear, lambda m: m.actuator_gear.at[0, 0].set(jnp.nan), 'actuator_gear of actuator "drive": non-finite'),
    (lambda m: m.actuator_delay, lambda m: m.actuator_delay.at[0].set(-0.01), 'actuator_delay of actuator "drive".*non-negative'),
    (lambda m: m.opt.timestep, lambda m: jnp.asarray(0.0), "opt.timestep: must be positive"),
    (lambda m: m.opt.gravity, lambda m: m.opt.gravity.at[2].set(jnp.nan), "opt.gravity.*non-finite"),
    (lambda m: m.opt.density, lambda m: jnp.asarray(1.2), "opt.density.*loaded without a medium"),
    (lambda m: m.geom_size, lambda m: m.geom_size[:2], r"geom_size has shape \(2, 3\), expected \(6, 3\)"),
]


@pytest.mark.parametrize("where,value,message", BAD_PARAMETERS)
def test_check_model_names_field_and_element(scene, where, value, message):
    with pytest.raises(jsn.ModelError, match=message):
        jsn.check_model(eqx.tree_at(where, scene, value(scene)))


def test_check_model_names_the_world_of_a_stacked_batch(scene):
    batch = jax.tree.map(lambda x: jnp.stack([x] * 3), scene)
    jsn.check_model(batch)
    bad = eqx.tree_at(lambda m: m.body_mass, batch, batch.body_mass.at[2, 1].set(-2.0))
    with pytest.raises(jsn.ModelError, match=r'body_mass of body "box" in world \(2,\)'):
        jsn.check_model(bad)


def test_load_time_overrides_are_validated():
    with pytest.raises(jsn.ModelError, match="opt.timestep"):
        jsn.load_mjcf(SCENE, timestep=-0.01)
    with pytest.raises(ValueError, match="maxval"):
        jsn.load_mjcf(SCENE, maxval=float("nan"))


def test_a_non_finite_geom_size_is_named_not_the_inertia_compiled_from_it():
    """MuJoCo's compiler derives the body's mass, inertia and invweights from an infinite size: the
    error names the geom's size, the input, and says where a float32 model's inf came from."""
    xml = SCENE.replace('size="0.1 0.1 0.1"', 'size="{} 0.1 0.1"', 1)
    assert xml != SCENE
    with pytest.raises(jsn.ModelError, match=r'^geom_size of geom "box": non-finite value$'):
        jsn.load_mjcf(xml.format("inf"))
    with warnings.catch_warnings():  # the error is the message: no numpy "overflow encountered in cast" before it
        warnings.simplefilter("error")
        with pytest.raises(jsn.ModelError, match=r'^geom_size of geom "box": non-finite value \(float32 holds'):
            jsn.load_mjcf(xml.format("1e200"), dtype=jnp.float32)


def test_failing_worlds_are_flagged_and_isolated_and_runs_are_bitwise_deterministic(scene):
    """64 worlds, each with its own copy of the model (as a parameter sweep or system identification
    batches them): one NaN control, one exploding under a huge applied force, one with more candidate
    pairs than the contact capacity, and two whose model an optimizer could have made invalid under
    jit (a NaN solref, which once sank the box through the floor unflagged, and a zero inertia).
    The other 59 are bit-identical to a clean run of the same program, and repeated runs are
    bit-identical."""
    model = scene
    data = jsn.make_data(model)
    worlds, steps = 64, 30
    rng = np.random.default_rng(1)
    qpos = jnp.broadcast_to(model.qpos0, (worlds, model.nq))
    qvel = jnp.asarray(rng.normal(scale=0.5, size=(worlds, model.nv))).at[:, 13:].set(0.0)  # the balls start at rest
    ctrl = jnp.asarray(rng.uniform(-1, 1, size=(worlds, steps, model.nu)))
    force = jnp.zeros((worlds, model.nv))
    models = jax.tree.map(lambda x: jnp.stack([x] * worlds) if isinstance(x, jax.Array) else x, model)
    axes = jax.tree.map(lambda x: 0 if isinstance(x, jax.Array) else None, model)
    run = jax.jit(jax.vmap(lambda m, q, v, u, f: jsn.rollout(m, data.replace(qpos=q, qvel=v, qfrc_applied=f), u)[1],
                           in_axes=(axes, 0, 0, 0, 0)))  # fmt: skip
    clean = run(models, qpos, qvel, ctrl, force)
    again = run(models, qpos, qvel, ctrl, force)
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(again)):
        np.testing.assert_array_equal(a, b)

    nan_world, exploding_world, full_world, nan_solref_world, inertia_world = 5, 40, 51, 20, 33
    bad_models = eqx.tree_at(lambda m: (m.geom_solref, m.body_inertia), models,
                             (models.geom_solref.at[nan_solref_world, 1, 0].set(jnp.nan),
                              models.body_inertia.at[inertia_world, 2].set(0.0)))  # fmt: skip
    with pytest.raises(jsn.ModelError, match=r'geom_solref of geom "box" in world \(20,\): non-finite'):
        jsn.check_model(bad_models)  # on the host, the error names it
    dirty = run(
        bad_models,
        qpos.at[full_world, BALL_B_Z].set(0.05),  # ball_b on the floor too: two plane-sphere candidates, capacity 1
        qvel, ctrl.at[nan_world, 7, 0].set(jnp.nan), force.at[exploding_world, 0].set(1e9),
    )  # fmt: skip
    bad_model_worlds = [nan_solref_world, inertia_world]
    others = np.setdiff1d(np.arange(worlds), [nan_world, exploding_world, full_world] + bad_model_worlds)
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty)):
        np.testing.assert_array_equal(np.asarray(a)[others], np.asarray(b)[others])
    assert not np.any(np.asarray(clean.diverged))
    final_flags = np.asarray(dirty.diverged[:, -1])
    assert np.nonzero(final_flags)[0].tolist() == sorted([nan_world, exploding_world] + bad_model_worlds)

    warning = np.asarray(dirty.warning[:, -1])
    when = np.asarray(dirty.warning_time[:, -1])
    assert warning[nan_world, jsn.WarningKind.BAD_INPUT] == 1
    assert when[nan_world, jsn.WarningKind.BAD_INPUT] == pytest.approx(7 * 0.005)
    assert warning[exploding_world, jsn.WarningKind.BAD_QVEL] == 1
    assert warning[full_world, jsn.WarningKind.CONTACTFULL] == steps and when[full_world, jsn.WarningKind.CONTACTFULL] == 0
    assert np.all(warning[others, : jsn.WarningKind.SOLVER] == 0)
    assert np.all(warning[np.r_[others, nan_world, exploding_world], jsn.WarningKind.CONTACTFULL] == 0)
    # an invalid model is flagged at the first step and its world held at its initial state
    assert np.all(warning[bad_model_worlds, jsn.WarningKind.BAD_MODEL] == 1)
    assert np.all(when[bad_model_worlds, jsn.WarningKind.BAD_MODEL] == 0)
    assert not np.any(warning[np.setdiff1d(np.arange(worlds), bad_model_worlds), jsn.WarningKind.BAD_MODEL])
    np.testing.assert_array_equal(np.asarray(dirty.qpos)[bad_model_worlds, -1], np.asarray(qpos)[bad_model_worlds])
    # the diverged worlds keep their last good state, finite
    assert np.all(np.isfinite(np.asarray(dirty.qpos)))
    np.testing.assert_array_equal(dirty.qpos[nan_world, 7], dirty.qpos[nan_world, 6])
    # one world, unbatched, gives the same numbers as its lane of the batch (to round-off: XLA
    # vectorizes the batched program differently), and bit-identical ones when run again
    run_single = jax.jit(lambda v, u: jsn.rollout(model, data.replace(qvel=v), u)[1])
    single = run_single(qvel[0], ctrl[0])
    np.testing.assert_allclose(single.qpos, clean.qpos[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(run_single(qvel[0], ctrl[0]))):
        np.testing.assert_array_equal(a, b)


MOCAP_PUSH = """
<mujoco>
  <worldbody>
    <geom type="plane" size="1 1 0.1"/>
    <body name="box" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1"/></body>
    <body name="pusher" mocap="true" pos="0.15 0 0.1"><geom type="sphere" size="0.06"/></body>
  </worldbody>
</mujoco>
"""


def test_a_world_with_a_bad_input_or_initial_state_leaves_the_shared_gradient_finite_and_unchanged():
    """A NaN mocap pose, a NaN initial velocity, a float32 force of 1e30 (beyond the inputs' bound) or
    a torque of 1.8e19 (within it, but inf inside the step) in one world is flagged there (BAD_INPUT,
    BAD_QVEL, BAD_QACC), and the gradient of the batch's loss w.r.t. a parameter the worlds share is
    the clean world's alone. Before, NaN reached it through 0 * NaN or 0 * inf in the bad world's
    backward pass, even with that world's loss masked out."""
    model = jsn.load_mjcf(MOCAP_PUSH, dtype=jnp.float32)
    data = jsn.make_data(model)
    mocap_pos = jnp.stack([data.mocap_pos] * 5)
    qvel = jnp.stack([data.qvel.at[0].set(-0.2)] * 5)
    force = jnp.zeros((5, model.nv), jnp.float32)

    def batch_loss(friction, mocap_pos, qvel, force, weight):
        def world(mocap_pos, qvel, force):
            m = eqx.tree_at(lambda m: m.geom_friction, model, friction)
            start = data.replace(mocap_pos=mocap_pos, qvel=qvel, qfrc_applied=force)
            final, _ = jsn.rollout(m, start, jnp.zeros((3, 0), jnp.float32))
            return jnp.where(final.diverged, 0.0, jnp.sum(final.qpos**2)), final

        losses, final = jax.vmap(world)(mocap_pos, qvel, force)
        return jnp.sum(weight * losses), final

    grad = jax.jit(jax.grad(batch_loss, has_aux=True))
    clean, _ = grad(model.geom_friction, mocap_pos, qvel, force, jnp.array([1.0, 0.0, 0.0, 0.0, 0.0]))
    dirty, final = grad(model.geom_friction, mocap_pos.at[1, 0, 0].set(jnp.nan), qvel.at[2, 1].set(jnp.nan),
                        force.at[3, 0].set(1e30).at[4, 4].set(1.8e19), jnp.ones(5))  # fmt: skip
    assert np.asarray(final.diverged).tolist() == [False, True, True, True, True]
    assert np.asarray(final.warning[:, jsn.WarningKind.BAD_INPUT]).tolist() == [0, 1, 0, 1, 0]
    assert final.warning[2, jsn.WarningKind.BAD_QVEL] == 1
    assert final.warning[4, jsn.WarningKind.BAD_QACC] == 1
    assert np.isnan(final.qvel[2, 1])  # the state it came with is held, not replaced
    assert np.any(clean != 0.0)
    np.testing.assert_array_equal(dirty, clean)


def test_auto_reset_restarts_a_diverged_world_from_qpos0():
    model = jsn.load_mjcf(SCENE, auto_reset=True, maxval=1e3)
    data = jsn.make_data(model)
    force = jnp.zeros(model.nv).at[0].set(1e8)  # the box is flung beyond maxval in the first step
    final = jax.jit(jsn.step)(model, data.replace(qfrc_applied=force))
    assert not bool(final.diverged)
    assert int(final.warning[jsn.WarningKind.BAD_QVEL]) == 1
    np.testing.assert_array_equal(final.qpos, model.qpos0)
    np.testing.assert_array_equal(final.qvel, jnp.zeros(model.nv))
    assert float(final.time) == pytest.approx(0.005)


ZERO_QUATERNIONS = """
<mujoco>
  <worldbody>
    <geom type="plane" size="1 1 0.1"/>
    <body name="box" pos="0 0 0.2"><freejoint/><geom type="box" size="0.1 0.1 0.1"/></body>
    <body name="arm" pos="1 0 1">
      <joint name="ball" type="ball" range="0 0.5" limited="true" stiffness="2" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.2 0 -0.3" size="0.02"/>
    </body>
    <body name="target" mocap="true" pos="0 1 0.5"><geom type="box" size="0.05 0.1 0.1" contype="0" conaffinity="0"/></body>
  </worldbody>
  <actuator><motor name="twist" joint="ball" gear="0 0 1"/></actuator>
  <sensor><ballquat joint="ball"/><framequat objtype="body" objname="target"/></sensor>
</mujoco>
"""


def test_a_zero_quaternion_is_the_identity_as_in_mujoco_with_finite_gradients():
    """A zero (or round-off) quaternion in qpos or mocap_quat is a finite input: MuJoCo's
    mju_normalize4 reads it as no rotation (kinematics, springs, limits, sensors, integration). It
    made a NaN inertia here, a diverged world and NaN gradients."""
    mj = mujoco.MjModel.from_xml_string(ZERO_QUATERNIONS)
    model = jsn.from_mujoco(mj, dtype=jnp.float64)
    qpos = np.array(mj.qpos0)
    qpos[3:7] = 0.0  # the free body's quaternion
    qpos[7:11] = [1e-20, 0, 0, 0]  # the ball joint's: |q| below mjMINVAL
    mocap_quat = np.zeros((1, 4))
    ctrl = np.full((4, 1), 0.3)
    mjd = mujoco.MjData(mj)
    mjd.qpos[:], mjd.mocap_quat[:] = qpos, mocap_quat
    expected = []
    for u in ctrl:
        mjd.ctrl[:] = u
        mujoco.mj_step(mj, mjd)
        expected.append((mjd.qpos.copy(), mjd.sensordata.copy()))

    def loss(qpos0):
        data = jsn.make_data(model).replace(qpos=qpos0, mocap_quat=jnp.asarray(mocap_quat))
        final, traj = jsn.rollout(model, data, jnp.asarray(ctrl))
        return jnp.sum(final.qpos**2) + jnp.sum(final.sensordata), traj

    (_, traj), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(jnp.asarray(qpos))
    assert not np.any(traj.diverged)
    for t, (qpos_t, sensordata_t) in enumerate(expected):
        np.testing.assert_allclose(traj.qpos[t], qpos_t, atol=1e-12)
        np.testing.assert_allclose(traj.sensordata[t], sensordata_t, atol=1e-12)
    assert np.all(np.isfinite(grad))


def test_unrolled_newton_gradient_stays_finite_where_the_search_direction_vanishes():
    """float32, grad_mode="unroll": a sphere resting deep inside another (a fuzz scene found on a GPU);
    near convergence the line search's curvature d2 ~ |p|^2 is tiny and the derivative of its
    Newton point d1/d2 formed 1/d2^2, which overflows float32: NaN gradients with finite states
    (the step length is now held fixed in the derivative)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
    import fuzz

    structure = fuzz.Structure(types=("sphere", "sphere"), condim=(3, 6), cone="pyramidal", grad_mode="unroll")
    group = fuzz.make_group(structure, 4, seed=5, dtype=jnp.float32)
    model = jax.tree.map(lambda x: x[3], group.model)
    data = jsn.make_data(model).replace(qpos=jnp.asarray(group.qpos[3], jnp.float32))

    def loss(qvel0):
        final, _ = jsn.rollout(model, data.replace(qvel=qvel0), jnp.zeros((10, 0), jnp.float32))
        return jnp.sum(final.qpos[:3] ** 2) + jnp.sum(final.qvel**2)

    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(group.qvel[3], jnp.float32))
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))


def test_unrolled_newton_gradient_does_not_amplify_round_off_at_rest():
    """float32, grad_mode="unroll": a cylinder resting on its face (a fuzz scene found on a GPU, whose
    200-step rollout gradient grew to 1e10 where float64 and implicit mode give 7e3). Contact damps
    a resting body, so one step's velocity Jacobian has no entry above 1; differentiating the line
    search's step length (float32 round-off where the Newton direction vanishes) made it up to 12."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
    import fuzz

    structure = fuzz.Structure(types=("ellipsoid", "cylinder"), condim=(6, 6), cone="pyramidal", grad_mode="unroll")
    group = fuzz.make_group(structure, 1, seed=7, dtype=jnp.float32)
    model = jax.tree.map(lambda x: x[0], group.model)
    # two states of the scene's float32 rollout (steps 119 and 165); the cylinder is dofs 6-11
    qpos = [[-0.20030899345874786, -0.3425211012363434, 0.13330531120300293, -0.36818018555641174, 0.3525950312614441,
             0.8560493588447571, 0.0854378491640091, 0.10338000953197479, 0.09869399666786194, 0.02789885364472866,
             -0.0001587175065651536, -0.9846521019935608, -0.1745285987854004, 0.00023410354333464056],
            [-0.2733786404132843, -0.34111320972442627, 0.10913658142089844, -0.023918861523270607, 0.44331151247024536,
             0.8369590044021606, 0.320003867149353, 0.10338000953197479, 0.09869399666786194, 0.02789885364472866,
             -0.00015883530431892723, -0.9846521019935608, -0.1745285987854004, 0.00023427691485267133]]  # fmt: skip
    qvel = [[0.10276522487401962, 0.32824400067329407, -0.1840277910232544, 2.965902090072632, -2.168813467025757,
             1.5720351934432983, 2.0120033639159374e-08, 1.9579813326231488e-08, 5.7764047767250304e-08,
             -4.1022551044989086e-07, -9.185183102999872e-07, 1.1502549607245172e-10],
            [0.2430189549922943, -0.10601454228162766, 0.007068268489092588, 3.0312697887420654, 2.9059526920318604,
             1.3387829065322876, 2.0128416267084503e-08, 1.955492301419781e-08, 5.777062739298344e-08,
             -4.107109816686716e-07, -9.194793619826669e-07, 2.7502338947882343e-11]]  # fmt: skip

    @jax.jit
    def velocity_jacobian(qpos, qvel):
        data = jsn.make_data(model).replace(qpos=qpos)
        return jax.jacrev(lambda v: jsn.step(model, data.replace(qvel=v)).qvel)(qvel)

    for q, v in zip(qpos, qvel):
        J = np.asarray(velocity_jacobian(jnp.asarray(q, jnp.float32), jnp.asarray(v, jnp.float32)))
        assert np.all(np.isfinite(J)) and np.abs(J[6:, 6:]).max() <= 1.0 + 1e-4


def test_unrolled_newton_gradient_is_the_implicit_one_where_the_warm_start_has_converged():
    """float64: a box at rest on a plane, its warm start already the solution (the solver is done
    before its first iteration, as at nearly every step of a resting rollout). Unrolled reverse mode
    gives the implicit derivative there. Before, a converged island passed on its start's derivative:
    zero for a warm start given as input; in a rollout, the previous step's times (1 - alpha) per
    search step, which compounded until 500-step float32 gradients of fuzz scenes were NaN (GPU)."""
    xml = """<mujoco><option timestep="0.005" iterations="10" ls_iterations="10"/><worldbody>
      <geom type="plane" size="2 2 .1"/><body pos="0 0 .099"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
      </worldbody></mujoco>"""
    models = {mode: jsn.load_mjcf(xml, grad_mode=mode) for mode in ("implicit", "unroll")}
    data = jsn.make_data(models["implicit"]).replace(qvel=jnp.asarray([0.1, 0, 0, 0, 0, 0.5]))

    @jax.jit
    def jacobians(data):
        data = data.replace(qacc_warmstart=jsn.forward(models["implicit"], data).qacc)  # the solution

        def next_qvel(mode, qvel):
            return jsn.step(models[mode], data.replace(qvel=qvel))

        jac = {mode: jax.jacrev(lambda v, mode=mode: next_qvel(mode, v).qvel)(data.qvel) for mode in models}
        return jac, next_qvel("unroll", data.qvel).solver_niter

    jac, niter = jacobians(data)
    assert int(niter) == 0  # the warm start is the solution: no iteration runs
    assert np.abs(np.asarray(jac["implicit"])).max() > 0.5
    np.testing.assert_allclose(jac["unroll"], jac["implicit"], rtol=1e-8, atol=1e-8)


def test_a_singular_mass_matrix_is_refused_at_load():
    """Four slide joints on one body (the mjx test model general_dyntype.xml): M is singular, MuJoCo
    warns (mjWARN_INERTIA) and resets every step; we refuse the model, naming the dof's joint."""
    xml = """<mujoco><worldbody><body><joint name="x" type="slide" axis="1 0 0"/><joint type="slide" axis="0 1 0"/>
      <joint type="slide" axis="0 0 1"/><joint type="slide" axis="1 1 0"/><geom type="box" size=".05 .05 .05"/>
      </body></worldbody></mujoco>"""
    with pytest.raises(jsn.ModelError, match="inertia matrix is singular at qpos0.*joint 'x'"):
        jsn.load_mjcf(xml)
    jsn.load_mjcf(xml.replace('axis="1 1 0"', 'axis="1 1 0" armature="0.01"'))  # armature makes it regular


def test_the_rescaled_adjoint_takes_only_the_fields_a_step_reads():
    """`rollout` rescales the carried state's adjoint in one opaque backward node (`renormalize`); each
    field in it keeps its derivative alive through every step. The fields a step recomputes (frames,
    contacts, Jacobians, mass matrix) have zero cotangents and are left out (`adjoint.leaves_read`:
    dead-code elimination of the step's jaxpr): with all of them, the sphere-capsule fuzz program's
    gradient compiled to 38% more HLO than without rescaling, now 2%."""
    xml = """<mujoco><worldbody><geom type="plane" size="1 1 1"/>
      <body pos="0 0 0.099"><freejoint/><geom type="sphere" size=".1"/></body>
      <body pos="0.3 0 0.2"><joint name="arm" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0.2 0 0" size=".05"/></body>
      <body mocap="true" pos="1 0 0"><geom type="box" size=".1 .1 .1" contype="0" conaffinity="0"/></body>
      </worldbody><actuator><motor joint="arm"/></actuator></mujoco>"""
    model = jsn.load_mjcf(xml)
    data = jsn.make_data(model)
    reads = adjoint.leaves_read(jsn.step, model, data)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(data)[0]]
    read = {p for p, r in zip(paths, reads) if r}
    state = {".time", ".qpos", ".qvel", ".ctrl", ".qfrc_applied", ".xfrc_applied", ".mocap_pos", ".mocap_quat", ".qacc_warmstart"}
    assert state <= read, state - read
    derived = {".xpos", ".xmat", ".geom_xpos", ".cinert", ".cdof", ".qM", ".qacc", ".qfrc_bias", ".qfrc_constraint", ".efc_J", ".efc_force"}
    derived |= {p for p in paths if p.startswith(".contact")}
    assert not read & derived, read & derived


def test_only_model_leaves_that_can_be_differentiated_get_an_adjoint_accumulator():
    """`rollout` sums the model's cotangent in the rescaled frame through one accumulator per model
    leaf; a concrete leaf (closed over, a constant to every transformation) gets none, a traced one
    does, and the gradient with respect to it matches central differences (float64)."""
    model = jsn.load_mjcf("""<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="1 1 .1"/>
      <body pos="0 0 .2"><freejoint/><geom type="sphere" size=".05" mass="1"/></body></worldbody></mujoco>""")
    data = jsn.make_data(model).replace(qvel=jnp.array([0.3, 0.0, -1.0, 0.0, 2.0, 0.0]))
    assert adjoint.accumulator(model, jnp.zeros((), data.time.dtype)) == ((), ())
    counts = []

    def loss(mass, friction):
        m = eqx.tree_at(lambda m: (m.body_mass, m.geom_friction), model, (mass, friction))
        counts.append(len(adjoint.accumulator(m, jnp.zeros((), data.time.dtype))[0]))
        final, _ = jsn.rollout(m, data, jnp.zeros((30, 0)))
        return jnp.sum(final.qpos[:3] ** 2) + jnp.sum(final.qvel**2)

    args = (model.body_mass, model.geom_friction)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(*args)
    assert counts == [2]
    rng = np.random.default_rng(0)
    dirs = [jnp.asarray(rng.normal(size=np.shape(a))) * jnp.where(a != 0, 1.0, 0.0) for a in args]
    eps = 1e-6
    fd = (loss(*(a + eps * d for a, d in zip(args, dirs))) - loss(*(a - eps * d for a, d in zip(args, dirs)))) / (2 * eps)
    ad = sum(jnp.vdot(g, d) for g, d in zip(grads, dirs))
    np.testing.assert_allclose(float(ad), float(fd), rtol=1e-5)


def test_a_gradient_beyond_float32_comes_back_as_signed_inf_not_nan():
    """Two inverted pendulums held exactly at their tops (the state never moves) for 800 steps: the
    adjoint grows backward by e^(8 s * 16 /s) and e^(8 s * 13 /s), past float32's 3.4e38. The plain
    scan's backward pass overflowed to NaN; `rollout` rescales its adjoint (jaxsim_ncp.adjoint), so
    each entry of the float32 gradient (initial velocity, every control, gravity: a model leaf) is
    the float64 one where that fits, and +-inf with the float64 sign where it does not. The loss
    weighs the short pendulum by +1e-8 and the long one by -1: gravity's per-step contributions
    overflow with both signs (long one first, short one last), and are summed before being
    converted back. A chunked checkpointed rollout gives the same gradient, also as a vmapped batch of
    two worlds sharing the model and controls, whose losses are weighted 1 and 1e-20 (so their
    adjoints are rescaled at different steps: JAX sums an unbatched value's cotangent over the batch,
    and a log-scale shared by the worlds made these gradients NaN): the shared gradients are the
    first world's, each world's initial velocity gets its own."""
    xml = """<mujoco><option timestep="0.01"><flag contact="disable"/></option><worldbody>
      <body pos="0 0 1"><joint name="a" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 0.05" size="0.005" mass="1"/></body>
      <body pos="1 0 1"><joint name="b" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 0.07" size="0.005" mass="1"/></body>
      </worldbody><actuator><motor joint="a"/><motor joint="b"/></actuator></mujoco>"""
    steps = 800

    def gradient(dtype, checkpoint=False, weights=None):
        model = jsn.load_mjcf(xml, dtype=dtype)
        data = jsn.make_data(model)

        def loss(qvel, ctrl, gravity):
            m = eqx.tree_at(lambda m: m.opt.gravity, model, gravity)
            final, traj = jsn.rollout(m, data.replace(qvel=qvel), ctrl, checkpoint=checkpoint)
            return 1e-8 * traj.qpos[-1, 0] - traj.qpos[-1, 1] + jnp.sum(final.qvel * jnp.array([1e-8, -1.0]))

        args = (data.qvel, jnp.zeros((steps, 2), dtype), model.opt.gravity)
        if weights is not None:
            args = (jnp.stack([data.qvel] * len(weights)),) + args[1:]
            w = jnp.asarray(weights, dtype)
            batch_loss = lambda qvel, ctrl, gravity: jnp.sum(w * jax.vmap(loss, (0, None, None))(qvel, ctrl, gravity))  # noqa: E731
            return [np.asarray(g, np.float64) for g in jax.jit(jax.grad(batch_loss, argnums=(0, 1, 2)))(*args)]
        return [np.asarray(g, np.float64).ravel() for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)]

    exact, single = gradient(jnp.float64), gradient(jnp.float32)
    for g32, g64 in zip(single, exact):
        assert not np.isnan(g32).any()
        fits = np.abs(g64) < 1e37
        np.testing.assert_allclose(g32[fits], g64[fits], rtol=1e-3, atol=1e-6)
        beyond = np.abs(g64) > 1e39
        assert np.array_equal(g32[beyond], np.sign(g64[beyond]) * np.inf)
    assert (np.abs(exact[1]) > 1e39).sum() > 50 and np.isfinite(single[1]).sum() > 800  # both regimes tested
    assert exact[2][0] > 1e39  # gravity: the sum of contributions beyond the dtype of both signs
    qvel, ctrl, gravity = gradient(jnp.float32, checkpoint=100, weights=[1.0, 1e-20])
    for a, b in zip([qvel[0], ctrl.ravel(), gravity], single):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(qvel[1], 1e-20 * exact[0], rtol=1e-3)  # finite: 1e-20 of the first world's
