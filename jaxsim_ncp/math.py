"""Quaternions, spatial algebra and safe norms.

Quaternions are (w, x, y, z), as in MuJoCo. Spatial motion and force vectors are
6-vectors (angular; linear), as in MuJoCo's com-based quantities (`cdof`, `cvel`,
`cinert`). Every function here has finite gradients everywhere, including at zero
vectors and identity rotations (Taylor branches behind a double `where`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

def tree_where(pred, a, b):
    """jnp.where(pred, x, y) leaf by leaf over two pytrees of one structure."""
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def pad_with_last(x: Array, count: int) -> Array:
    """x with `count` copies of its last entry appended along the leading axis."""
    return jnp.concatenate([x, jnp.repeat(x[-1:], count, axis=0)]) if count else x


def map_chunks(fn, args: tuple, size: int):
    """fn(*args) over the leading axis of every leaf of `args` (one size), in chunks of at most
    `size` entries run one after another (`lax.map`), as even as possible; the last chunk is padded
    with copies of the last entry, dropped from the result. fn maps a batch to a batch."""
    count = jax.tree.leaves(args)[0].shape[0]
    if count <= size:
        return fn(*args)
    chunks = -(-count // size)
    size = -(-count // chunks)
    pad = chunks * size - count

    split = lambda x: pad_with_last(x, pad).reshape(chunks, size, *x.shape[1:])  # noqa: E731
    out = jax.lax.map(lambda xs: fn(*xs), jax.tree.map(split, args))
    return jax.tree.map(lambda o: o.reshape(chunks * size, *o.shape[2:])[:count], out)


def prefix_count(flags: Bool[Array, " n"], block: int = 64) -> Int[Array, " n"]:
    """Inclusive running count of the true flags: blocks of `block`, each counted by a product with a
    triangle of ones, plus the counts of the blocks before it (the same product once more). Exact:
    0/1 products summed in float32 below 2^24. `jnp.cumsum` lowers to a reduce-window, whose CPU code
    takes n^2 steps; a log-depth `associative_scan` took 2x this time (3842 flags, 64 worlds)."""
    n = flags.shape[0]
    blocks = -(-n // block)
    x = jnp.pad(flags.astype(jnp.float32), (0, blocks * block - n)).reshape(blocks, block)
    within = x @ jnp.triu(jnp.ones((block, block), jnp.float32))
    before = within[:, -1] @ jnp.triu(jnp.ones((blocks, blocks), jnp.float32), 1)
    return (within + before[:, None]).reshape(-1)[:n].astype(jnp.int32)


def true_first(flags: Bool[Array, " n"], count: int) -> Int[Array, " count"]:
    """The first `count` indices of a stable sort that puts the true flags first: the true ones in
    order, then the false ones in order. A running count and a binary search per place, not a sort
    (XLA's CPU sort of a few thousand keys per world was a quarter of a four-humanoid step)."""
    count = min(count, flags.shape[0])
    true, false = prefix_count(flags), prefix_count(~flags)
    place = jnp.arange(count, dtype=jnp.int32)
    n_true = true[-1]
    # the (p+1)-th true index is the first whose inclusive count exceeds p
    first = jnp.searchsorted(true, place, side="right", method="scan")
    rest = jnp.searchsorted(false, place - n_true, side="right", method="scan")
    return jnp.where(place < n_true, first, rest).astype(jnp.int32)


def recomputed(fn):
    """fn whose reverse-mode residuals are its arguments alone (`jax.checkpoint`; keyword
    arguments are static). Its intermediates (a quaternion's components, a norm's square, the
    nine entries of a rotation matrix) are recomputed from them in the backward pass instead of
    each being saved: in a differentiated `scan` every residual is one more buffer written per
    step. For the helpers below (and the kinematics' level step) the humanoid's 100-step gradient
    went from 409 to 190 per-step residual stores, 0.82x the time at one world, the same at 64;
    the forward pass is unchanged (a checkpoint only acts when differentiated)."""

    @functools.wraps(fn)
    def wrapped(*args, **static):
        return jax.checkpoint(functools.partial(fn, **static) if static else fn)(*args)

    return wrapped


@recomputed
def small_matmul(a: Float[Array, "... m k"], b: Float[Array, "... k n"]) -> Float[Array, "... m n"]:
    """a @ b for a small inner size k (a contact frame times its Jacobian) as k fused multiply-adds.

    Batched over contacts and worlds, XLA:CPU runs a `dot` of such shapes as thousands of tiny matrix
    products (the humanoid's contact frames times their Jacobians, 256 worlds: 1.1 ms of a 10 ms
    step); elementwise, it fuses with its neighbours. Not for code that reverse mode differentiates
    through many such products: the transpose becomes reductions over the broadcast axes, slower
    than a dot's (the humanoid's kinematics written this way: its gradient 25% slower)."""
    out = a[..., :, 0, None] * b[..., None, 0, :]
    for k in range(1, a.shape[-1]):
        out = out + a[..., :, k, None] * b[..., None, k, :]
    return out


@jax.custom_jvp
def quotient(num: Array, den: Array) -> Array:
    """num / den, differentiated as (d num - q d den) / den with q = num / den.

    The textbook derivative -num / den**2 squares den: for |den| < ~1e-19 that overflows float32
    (and underflows to 0 below ~1e-23, giving 0 / 0), so a quotient the computation then discards
    (an unused candidate, a `where` branch) turns its zero cotangent into 0 * inf = NaN. This form
    is finite wherever q and 1 / den are; the value is num / den, bit for bit.
    """
    return num / den


@quotient.defjvp
def _quotient_jvp(primals, tangents):
    (num, den), (dnum, dden) = primals, tangents
    q = num / den
    return q, (dnum - q * dden) / den


_SMALL_SQ = 1e-6  # below this squared angle the Taylor branches are exact to ~1e-21


def safe_quotient(num: Array, den: Array, ok: Array) -> Array:
    """num / den where ok, 0 elsewhere: the unused branch never divides by zero and the used one is
    differentiated as `quotient` (finite however small den is)."""
    return jnp.where(ok, quotient(num, jnp.where(ok, den, 1.0)), 0.0)


# A GPU keeps float32 subnormals (XLA's CPU flushes them to 0). For a round-off vector of 1e-20
# (the cross product of two parallel box edges in planar motion, in a candidate the computation
# then discards) |x|^2 = 1e-40 is nonzero there, and the textbook derivatives of |x| and x / |x|
# pass through 1 / |x|^2 (JAX's quotient rule; d sqrt(s) / ds = 1 / (2 |x|) times a cotangent of
# order 1 / |x|): inf in float32, and 0 * inf = NaN for a discarded candidate's zero cotangent.
# Both are differentiated through 1 / |x| alone.


@jax.custom_jvp
def _norm_last(x: Float[Array, "... n"]) -> Float[Array, "..."]:
    sq = jnp.sum(x * x, axis=-1)
    is_zero = sq == 0.0
    return jnp.where(is_zero, 0.0, jnp.sqrt(jnp.where(is_zero, 1.0, sq)))


@_norm_last.defjvp
def _norm_last_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    n = _norm_last(x)
    zero = n == 0.0
    inverse = jnp.where(zero, 0.0, 1.0 / jnp.where(zero, 1.0, n))  # finite: |x|^2 is at least a subnormal
    return n, jnp.sum((x * inverse[..., None]) * dx, axis=-1)  # d|x| = x / |x| . dx, 0 at 0


@recomputed
def safe_norm(x: Float[Array, "... n"], axis: int = -1) -> Float[Array, "..."]:
    """Euclidean norm; its gradient is 0 at 0 instead of NaN, and finite however small |x| is."""
    return _norm_last(jnp.moveaxis(x, axis, -1))


@recomputed
def normalize(x: Float[Array, "... n"], axis: int = -1) -> Float[Array, "... n"]:
    """x / |x|, returning x unchanged where |x| == 0; the gradient is finite however small |x| is
    (a `quotient` of x and `safe_norm`)."""
    n = safe_norm(x, axis=axis)
    return quotient(x, jnp.expand_dims(jnp.where(n == 0.0, 1.0, n), axis))


MINVAL = 1e-15  # mjMINVAL


@recomputed
def quat_normalize(q: Float[Array, "... 4"]) -> Float[Array, "... 4"]:
    """A unit quaternion from q, the identity where |q| < mjMINVAL (mju_normalize4): a zero quaternion
    in qpos or mocap_quat is a finite input MuJoCo simulates as no rotation; its derivative there is 0."""
    n = safe_norm(q)[..., None]
    degenerate = n < MINVAL
    identity = jnp.zeros_like(q).at[..., 0].set(1.0)
    return jnp.where(degenerate, identity, quotient(q, jnp.where(degenerate, 1.0, n)))


@recomputed
def quat_mul(a: Float[Array, "... 4"], b: Float[Array, "... 4"]) -> Float[Array, "... 4"]:
    """Hamilton product a * b."""
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return jnp.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_conj(q: Float[Array, "... 4"]) -> Float[Array, "... 4"]:
    return q * jnp.array([1.0, -1.0, -1.0, -1.0], dtype=q.dtype)


@recomputed
def quat_to_mat(q: Float[Array, "... 4"]) -> Float[Array, "... 3 3"]:
    """Rotation matrix of a unit quaternion."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz = x * y, x * z, y * z
    wx, wy, wz = w * x, w * y, w * z
    rows = [
        jnp.stack([1 - 2 * (yy + zz), 2 * (xy - wz), 2 * (xz + wy)], -1),
        jnp.stack([2 * (xy + wz), 1 - 2 * (xx + zz), 2 * (yz - wx)], -1),
        jnp.stack([2 * (xz - wy), 2 * (yz + wx), 1 - 2 * (xx + yy)], -1),
    ]
    return jnp.stack(rows, axis=-2)


@recomputed
def quat_rotate(q: Float[Array, "... 4"], v: Float[Array, "... 3"]) -> Float[Array, "... 3"]:
    """Rotate v by the unit quaternion q (v' = q v q*)."""
    return jnp.einsum("...ij,...j->...i", quat_to_mat(q), v)


@recomputed
def axis_angle_to_quat(axis: Float[Array, "... 3"], angle: Float[Array, "..."]) -> Float[Array, "... 4"]:
    """Quaternion of a rotation by `angle` about the unit vector `axis`."""
    half = 0.5 * angle
    return jnp.concatenate([jnp.cos(half)[..., None], jnp.sin(half)[..., None] * axis], axis=-1)


@recomputed
def quat_exp_half(rotvec: Float[Array, "... 3"]) -> Float[Array, "... 4"]:
    """Quaternion of the rotation vector `rotvec` (axis * angle): (cos(θ/2), sin(θ/2) axis).

    Smooth at rotvec = 0 (Taylor branch), so gradients are finite there.
    """
    half = 0.5 * rotvec
    s = jnp.sum(half * half, axis=-1)
    small = s < _SMALL_SQ
    s_safe = jnp.where(small, 1.0, s)
    phi = jnp.sqrt(s_safe)
    cos_phi = jnp.where(small, 1.0 - s / 2 + s * s / 24, jnp.cos(phi))
    sinc_phi = jnp.where(small, 1.0 - s / 6 + s * s / 120, jnp.sin(phi) / phi)
    return jnp.concatenate([cos_phi[..., None], sinc_phi[..., None] * half], axis=-1)


@recomputed
def quat_integrate(q: Float[Array, "... 4"], omega: Float[Array, "... 3"], h) -> Float[Array, "... 4"]:
    """Advance q by the body-frame angular velocity omega for time h (mju_quatIntegrate).

    q <- normalize(q) * exp(h omega / 2), then renormalized (a zero q becomes the identity, as in MuJoCo).
    """
    q = normalize(q)
    return quat_normalize(quat_mul(q, quat_exp_half(omega * h)))


@recomputed
def so3_right_jacobian(phi: Float[Array, "... 3"]) -> Float[Array, "... 3 3"]:
    """J_r(phi) of the SO(3) exponential: exp(phi + d) = exp(phi) exp(J_r(phi) d) to first order,
    J_r = I - (1 - cos t) / t^2 [phi]x + (t - sin t) / t^3 [phi]x^2, t = |phi| (series below 1e-4)."""
    t2 = jnp.sum(phi * phi, axis=-1)[..., None, None]
    small = t2 < 1e-8
    t = jnp.sqrt(jnp.where(small, 1.0, t2))
    a = jnp.where(small, 0.5 - t2 / 24, (1 - jnp.cos(t)) / t**2)
    b = jnp.where(small, 1.0 / 6 - t2 / 120, (t - jnp.sin(t)) / t**3)
    K = skew(phi)
    return jnp.eye(3, dtype=phi.dtype) - a * K + b * (K @ K)


@recomputed
def quat_to_rotvec(q: Float[Array, "... 4"]) -> Float[Array, "... 3"]:
    """Rotation vector (axis * angle, angle in [-pi, pi]) of a unit quaternion (mju_quat2Vel, dt=1)."""
    w = q[..., 0]
    v = q[..., 1:]
    sign = jnp.where(w < 0, -1.0, 1.0)
    a = jnp.abs(w)
    s2 = jnp.sum(v * v, axis=-1)
    small = s2 < _SMALL_SQ * a * a
    s_safe = jnp.sqrt(jnp.where(small, 1.0, s2))
    a_safe = jnp.where(small, a, 1.0)
    # 2 atan2(s, a) / s, with its Taylor series 2/a (1 - s^2 / (3 a^2)) for s << a.
    factor = jnp.where(
        small,
        2.0 / a_safe * (1.0 - s2 / (3.0 * a_safe * a_safe)),
        2.0 * jnp.arctan2(s_safe, a) / s_safe,
    )
    return (sign * factor)[..., None] * v


@recomputed
def quat_sub(qa: Float[Array, "... 4"], qb: Float[Array, "... 4"]) -> Float[Array, "... 3"]:
    """Angular displacement taking qb to qa, in qb's frame (mju_subQuat)."""
    return quat_to_rotvec(quat_mul(quat_conj(qb), qa))


# ---------------------------------------------------------------- spatial algebra


@recomputed
def cross_motion(v: Float[Array, "... 6"], m: Float[Array, "... 6"]) -> Float[Array, "... 6"]:
    """Motion cross product v x m (mju_crossMotion)."""
    w, vl = v[..., :3], v[..., 3:]
    ma, ml = m[..., :3], m[..., 3:]
    # the three products as one `cross` (one kernel, not three)
    wma, wml, vma = jnp.cross(jnp.stack([w, w, vl]), jnp.stack([ma, ml, ma]))
    return jnp.concatenate([wma, wml + vma], axis=-1)


@recomputed
def cross_force(v: Float[Array, "... 6"], f: Float[Array, "... 6"]) -> Float[Array, "... 6"]:
    """Force cross product v x* f (mju_crossForce)."""
    w, vl = v[..., :3], v[..., 3:]
    fa, fl = f[..., :3], f[..., 3:]
    wfa, vfl, wfl = jnp.cross(jnp.stack([w, vl, w]), jnp.stack([fa, fl, fl]))
    return jnp.concatenate([wfa + vfl, wfl], axis=-1)


@recomputed
def skew(r: Float[Array, "... 3"]) -> Float[Array, "... 3 3"]:
    """Matrix [r]x with [r]x v = r x v."""
    x, y, z = r[..., 0], r[..., 1], r[..., 2]
    zero = jnp.zeros_like(x)
    return jnp.stack(
        [
            jnp.stack([zero, -z, y], -1),
            jnp.stack([z, zero, -x], -1),
            jnp.stack([-y, x, zero], -1),
        ],
        axis=-2,
    )


@recomputed
def spatial_inertia(
    mass: Float[Array, "..."],
    inertia_world: Float[Array, "... 3 3"],
    offset: Float[Array, "... 3"],
) -> Float[Array, "... 6 6"]:
    """6x6 spatial inertia about a point o, for a body whose com is at o + offset.

    Maps a motion (omega; v_o) to momentum (L_o; p):
    [[I_c - m [r]x^2, m [r]x], [-m [r]x, m 1]] with r = offset.
    """
    rx = skew(offset)
    m = mass[..., None, None]
    eye = jnp.broadcast_to(jnp.eye(3, dtype=rx.dtype), rx.shape)
    top = jnp.concatenate([inertia_world - m * (rx @ rx), m * rx], axis=-1)
    bottom = jnp.concatenate([-m * rx, m * eye], axis=-1)
    return jnp.concatenate([top, bottom], axis=-2)


@recomputed
def make_frame(normal: Float[Array, "3"], tangent: Float[Array, "3"] | None = None) -> Float[Array, "3 3"]:
    """Contact frame (rows: normal, tangent1, tangent2) as MuJoCo's mju_makeFrame builds it.

    tangent1 is the given hint made orthogonal to the normal; with no usable hint
    (|hint|^2 < 0.25) it starts from (0,1,0), or (0,0,1) when |normal_y| >= 0.5.
    """
    n = normalize(normal)
    default = jnp.where(jnp.abs(n[1]) < 0.5, jnp.array([0.0, 1.0, 0.0], n.dtype), jnp.array([0.0, 0.0, 1.0], n.dtype))
    if tangent is None:
        t = default
    else:
        t = jnp.where(jnp.dot(tangent, tangent) < 0.25, default, tangent)
    t = normalize(t - n * jnp.dot(n, t))
    return jnp.stack([n, t, jnp.cross(n, t)])
