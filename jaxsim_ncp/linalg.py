"""Dense linear solves: Cholesky and LU through LAPACK (potrf, getrf, trsm) on the CPU, cuSOLVER /
cuBLAS on GPUs; never XLA loops (on a GPU a loop of n dependent steps is n kernel launches: the
100-cube pile's Newton step, nv = 600, took 190 ms on an H100 with loops and 5.7 ms without; on
the CPU each loop is a while loop XLA compiles into every program that factors). On the CPU the
Cholesky factor and its solves call jaxlib's LAPACK targets on row-major matrices directly (the
transpose of a column-major one: potrf and trsm on the upper triangle), where jax's own
lowerings want column-major operands and XLA transposed each factor in and out.

Deadlock (issue #11, the vmapped 27-box pile hung in half of the runs): jaxlib 0.10's CPU LAPACK
kernels split a batch whose work reaches 2e5 flops into chunks, schedule them on XLA's intra-op
thread pool and *block the calling pool thread* until they finish (`ParallelBatchMap` in
lapack_kernels.cc). When as many such calls run at once as the pool has threads (2 on a 2-core
machine; independent parts of a vmapped step run concurrently), every pool thread waits for work
only a pool thread could run. Below 2e5 flops a kernel runs its batch on the calling thread and
never touches the pool, so `_lapack` hands LAPACK only batches below that (a larger vmapped
batch goes through `lax.map` chunk by chunk; one matrix is always inline). Against the XLA loops
this replaced, the humanoid's forward pass takes 0.73x the time at B = 1 and 0.86x at B = 256.
`tests/test_reliability.py` checks every LAPACK call of a batched step and its gradient, and runs
two batched factorizations at once on two cores (jaxlib's own batched potrf hangs there).

Robustness: `cho_factor` factors a + eps diag|a| and, where the working precision still cannot
(float32, a pyramidal cone with mu at MuJoCo's 1e-5 floor makes D ~ 1e10; MuJoCo's
mju_cholFactor clamps pivots to an absolute mindiag), a + sqrt(eps) diag|a| or the diagonal: the
factor of a nearby positive-definite matrix instead of NaN, so the Newton direction stays a
descent direction and the implicit gradient stays finite. Well-conditioned matrices are
unaffected beyond rounding.

Differentiation: `solve_spd` and `solve` go through `jax.lax.custom_linear_solve`,
so gradients are the textbook ones (x = A^-1 b: b_bar = A^-T x_bar, A_bar = -b_bar x^T)
and the factorizations are never differentiated.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .math import map_chunks


def full_precision(fn):
    """Trace fn with float32 matrix products at full float32 precision.

    JAX's default on NVIDIA GPUs rounds float32 matmul inputs to TF32 (a 10-bit
    mantissa, ~1e-3 relative): measured on an H100, the NCP then stopped converging in
    15% of humanoid steps (0% on the CPU) and Newton's residual floor rose 5x. The
    precision is fixed when a product is traced, so wrapping the public entry points
    (and the custom VJPs, traced later) covers every product of the pipeline.
    """

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return wrapped


# ------------------------------------------------------------------ Cholesky

# jaxlib 0.10's CPU LAPACK kernels (lapack_kernels.cc, GetLapackBatchChunkSize) run a batch on the
# calling thread when batch * cost_per_matrix < kMinWorkPerTask = 2e5 flops (potrf: n^3 / 3,
# trsm: n^2 k); only larger batches are split over the intra-op pool, the deadlocking path.
_LAPACK_INLINE_WORK = 200_000


def _batch_function(fn):
    """fn(*args) over args with one leading batch axis, as a function that vmap calls with its
    batch folded into that axis (`custom_vmap`): one call however many vmaps are nested, and a
    `cond` inside fn stays a `cond` (a vmapped `cond` becomes a select running both branches)."""
    run = jax.custom_batching.custom_vmap(fn)

    @run.def_vmap
    def _run_batched(axis_size: int, in_batched: list[bool], *args):
        args = [x if b else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, b in zip(args, in_batched)]
        out = run(*(x.reshape(-1, *x.shape[2:]) for x in args))
        return jax.tree.map(lambda o: o.reshape(axis_size, -1, *o.shape[1:]), out), jax.tree.map(lambda _: True, out)

    return run


def _lapack(kernel, cost: int, threaded: bool, *args):
    """kernel(*args) on a batch (the leading axis). On the CPU (`threaded=False`) a batch whose
    work `len * cost` reaches `_LAPACK_INLINE_WORK` runs chunk by chunk (`lax.map`), each chunk
    below it, so jaxlib never hands LAPACK work to XLA's thread pool; elsewhere in one call."""
    if threaded:
        return kernel(*args)
    return map_chunks(kernel, args, max(1, (_LAPACK_INLINE_WORK - 1) // max(1, cost)))


def _lapack_target(routine: str, dtype) -> str:
    """jaxlib's CPU FFI target of a LAPACK routine (e.g. "potrf_ffi"), LAPACK initialized."""
    from jaxlib import lapack

    return lapack.prepare_lapack_call(routine, np.dtype(dtype))


def _char(c: str) -> np.uint8:
    return np.uint8(ord(c))


def _potrf_row_major(a: Float[Array, "b n n"]) -> tuple[Float[Array, "b n n"], Array]:
    """LAPACK's potrf on row-major matrices, with no transposes: a row-major buffer is the
    column-major transpose, so potrf's upper factor U of it ('U': a's lower triangle is read),
    read back row-major, is L = U^T with L L^T = a. Its strict upper triangle is zeroed; `ok` per
    matrix (LAPACK's info == 0). jax's `cholesky` wants column-major operands: XLA transposed every
    factor in and out, elementwise kernels that were 8% of the humanoid step's code."""
    out = jax.ffi.ffi_call(
        _lapack_target("potrf_ffi", a.dtype),
        (jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:-2], jnp.int32)),
        input_output_aliases={0: 0},
    )
    upper_t, info = out(a, uplo=_char("U"))
    return jnp.tril(upper_t), info == 0


def _trsm_row_major(lower: Float[Array, "b n n"], b: Float[Array, "b n k"], transpose: bool) -> Float[Array, "b n k"]:
    """L^-1 b (L^-T b with `transpose`) by LAPACK's trsm on the row-major factor: as a column-major
    matrix L is U = L^T, so L x = b is U^T x = b ('U', 'T') and L^T x = b is U x = b ('U', 'N')."""
    column_major = (0, 2, 1)  # major to minor
    solve = jax.ffi.ffi_call(
        _lapack_target("trsm_ffi", lower.dtype),
        jax.ShapeDtypeStruct(b.shape, b.dtype),
        input_layouts=[None, column_major],
        output_layouts=column_major,
        input_output_aliases={1: 0},
    )
    return solve(lower, b, side=_char("L"), uplo=_char("U"), trans_x=_char("N" if transpose else "T"), diag=_char("N"))


def _shifted_cholesky(a: Float[Array, "b n n"], shift, threaded: bool) -> tuple[Float[Array, "b n n"], Array]:
    """Cholesky factors of a + shift diag|a| (LAPACK's potrf on the CPU, `threaded=False`; jax's
    elsewhere) and which matrices it factored ((b, 1, 1): a failed factor is unusable)."""
    d = jnp.abs(jnp.diagonal(a, axis1=-2, axis2=-1)) + jnp.finfo(a.dtype).tiny
    shifted = a + shift * d[..., None] * jnp.eye(a.shape[-1], dtype=a.dtype)
    if not threaded:
        lower, ok = _potrf_row_major(shifted)
        return lower, ok[:, None, None]
    lower = jax.lax.linalg.cholesky(shifted, symmetrize_input=False)  # NaN throughout where it failed
    return lower, jnp.all(jnp.isfinite(jnp.diagonal(lower, axis1=-2, axis2=-1)), axis=-1)[:, None, None]


def _cho_factor_batch(a: Float[Array, "b n n"], threaded: bool) -> Float[Array, "b n n"]:
    """Factors of a + eps diag|a| (a relative change within rounding). Where the working precision
    cannot factor a matrix, a + sqrt(eps) diag|a|'s and, failing that too, diag|a|'s, computed only
    if some matrix of the batch failed (a `cond` around the chunks, not one per chunk: a select would
    run every factorization; on an H100 that doubled the humanoid's and the pile's Cholesky time).
    Each matrix's factor is the one it gets alone."""
    eps, tiny = jnp.finfo(a.dtype).eps, jnp.finfo(a.dtype).tiny
    cost = a.shape[-1] ** 3 // 3  # jaxlib's cost of potrf
    factor = functools.partial(_shifted_cholesky, threaded=threaded)
    lower, ok = _lapack(functools.partial(factor, shift=eps), cost, threaded, a)

    def repaired():
        retry, retry_ok = _lapack(functools.partial(factor, shift=jnp.sqrt(eps)), cost, threaded, a)
        d = jnp.sqrt(jnp.abs(jnp.diagonal(a, axis1=-2, axis2=-1)) + tiny)
        diagonal = d[..., None] * jnp.eye(a.shape[-1], dtype=a.dtype)
        return jnp.where(ok, lower, jnp.where(retry_ok, retry, diagonal))

    return jax.lax.cond(jnp.all(ok), lambda: lower, repaired)


def _cho_solve_batch(lower: Float[Array, "b n n"], b: Float[Array, "b n k"], threaded: bool) -> Float[Array, "b n k"]:
    cost = lower.shape[-1] ** 2 * b.shape[-1]  # jaxlib's for trsm
    if not threaded:
        return _lapack(lambda t, r: _trsm_row_major(t, _trsm_row_major(t, r, False), True), cost, threaded, lower, b)
    solve = functools.partial(jax.lax.linalg.triangular_solve, left_side=True, lower=True)
    return _lapack(lambda t, r: solve(t, solve(t, r), transpose_a=True), cost, threaded, lower, b)


_cho_factor_cpu = _batch_function(functools.partial(_cho_factor_batch, threaded=False))
_cho_factor_native = _batch_function(functools.partial(_cho_factor_batch, threaded=True))
_cho_solve_cpu = _batch_function(functools.partial(_cho_solve_batch, threaded=False))
_cho_solve_native = _batch_function(functools.partial(_cho_solve_batch, threaded=True))


def cho_factor(a: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """Lower-triangular L with L L^T = a (symmetric positive definite; the factor of a nearby
    positive-definite matrix where the precision does not suffice, never NaN: see the module
    docstring). LAPACK's potrf on the CPU (in inline-sized chunks), cuSOLVER's on GPUs."""
    return jax.lax.platform_dependent(jnp.asarray(a)[None], cpu=_cho_factor_cpu, default=_cho_factor_native)[0]


def cho_solve(lower: Float[Array, "n n"], b: Float[Array, "n ..."]) -> Float[Array, "n ..."]:
    """a^-1 b from the factor of `cho_factor` (not differentiated: use `solve_spd` for gradients)."""
    if lower.shape[0] == 0:
        return b
    b = jnp.asarray(b)
    rhs = (b[:, None] if b.ndim == 1 else b)[None]
    x = jax.lax.platform_dependent(lower[None], rhs, cpu=_cho_solve_cpu, default=_cho_solve_native)[0]
    return x[:, 0] if b.ndim == 1 else x


def solve_spd(a: Float[Array, "n n"], b: Float[Array, " n"]) -> Float[Array, " n"]:
    """a^-1 b for symmetric positive-definite a (Cholesky), differentiable in a and b."""
    if a.shape[0] == 0:
        return b
    lower = cho_factor(jax.lax.stop_gradient(a))
    return jax.lax.custom_linear_solve(
        lambda x: a @ x, b, solve=lambda _, r: cho_solve(lower, r), symmetric=True
    )


def diagonal_blocks(groups: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The index arrays of `solve_spd_blocks` for rows labelled by block (e.g. dof_treeid): one
    (k, s) array per block size s, its k blocks' rows in order."""
    labels = np.asarray(groups)
    rows = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    sizes = sorted({len(r) for r in rows})
    return tuple(np.stack([r for r in rows if len(r) == s]) for s in sizes)


def solve_spd_blocks(a: Float[Array, "n n"], b: Float[Array, " n"], blocks: tuple[np.ndarray, ...]) -> Float[Array, " n"]:
    """a^-1 b for a symmetric positive-definite a that is block diagonal over `blocks`
    (`diagonal_blocks`): one batched `solve_spd` per block size instead of a dense n x n one.
    The mass matrix of a scene of independent bodies (the 100-cube pile: 100 blocks of 6 instead
    of one 600 x 600 factorization). Differentiable like `solve_spd`; entries off the blocks,
    zero by assumption, get no gradient."""
    if len(blocks) == 1 and blocks[0].shape[0] == 1:
        return solve_spd(a, b)
    x = jnp.zeros_like(b)
    for idx in blocks:
        x = x.at[idx].set(jax.vmap(solve_spd)(a[idx[:, :, None], idx[:, None, :]], b[idx]))
    return x


# ------------------------------------------------------------------ LU (partial pivoting)


def _lu_factor_native(a):
    lu, _, perm = jax.lax.linalg.lu(a)
    return lu, perm.astype(jnp.int32)


def _lu_solve_native(lu, perm, b, trans: bool):
    """a x = b (trans: a^T x = b) with a[perm] = L U: L U x = b[perm]; U^T L^T (P x) = b."""
    column = b.ndim == 1
    b = b[:, None] if column else b
    solve = functools.partial(jax.lax.linalg.triangular_solve, left_side=True, transpose_a=trans)
    if not trans:
        x = solve(lu, solve(lu, b[perm], lower=True, unit_diagonal=True), lower=False)
    else:
        y = solve(lu, solve(lu, b, lower=False), lower=True, unit_diagonal=True)
        x = jnp.zeros_like(y).at[perm].set(y)
    return x[:, 0] if column else x


def _lu_factor_batch(a: Float[Array, "b n n"]) -> tuple[Float[Array, "b n n"], Int[Array, "b n"]]:
    return _lapack(_lu_factor_native, a.shape[-1] ** 3, False, a)  # jaxlib's cost of getrf


def _lu_solve_batch(lu, perm, b: Float[Array, "b n k"], trans: bool) -> Float[Array, "b n k"]:
    kernel = jax.vmap(functools.partial(_lu_solve_native, trans=trans))  # one batched trsm per triangle
    return _lapack(kernel, lu.shape[-1] ** 2 * b.shape[-1], False, lu, perm, b)  # jaxlib's cost of trsm


_lu_factor_cpu = _batch_function(_lu_factor_batch)
_lu_solve_cpu = {t: _batch_function(functools.partial(_lu_solve_batch, trans=t)) for t in (False, True)}


def _lu_factor_lapack(a):
    lu, perm = _lu_factor_cpu(a[None])
    return lu[0], perm[0]


def _lu_solve_lapack(lu, perm, b, trans: bool):
    rhs = b[:, None] if b.ndim == 1 else b
    x = _lu_solve_cpu[trans](lu[None], perm[None], rhs[None])[0]
    return x[:, 0] if b.ndim == 1 else x


# On the CPU LAPACK's getrf and trsm in inline-sized chunks (as the Cholesky, see the module docstring);
# on GPUs XLA's own LU and triangular solves (cuBLAS batched getrf / trsm).


def lu_factor(a: Float[Array, "n n"]) -> tuple[Float[Array, "n n"], Int[Array, " n"]]:
    """LU with partial pivoting: (lu, perm) with a[perm] = L U, L unit lower and U upper packed in lu."""
    return jax.lax.platform_dependent(jnp.asarray(a), cpu=_lu_factor_lapack, default=_lu_factor_native)


def lu_solve(factor, b: Float[Array, "n ..."], trans: bool = False) -> Float[Array, "n ..."]:
    """a^-1 b (trans: a^-T b) from `lu_factor`'s (lu, perm) (not differentiated: use `solve`)."""
    lu, perm = factor
    return jax.lax.platform_dependent(
        lu, perm, jnp.asarray(b),
        cpu=functools.partial(_lu_solve_lapack, trans=trans), default=functools.partial(_lu_solve_native, trans=trans),
    )  # fmt: skip


def factor_for_solves(a: Float[Array, "n n"]) -> tuple[Float[Array, "n n"], Int[Array, " n"]]:
    """`lu_factor` for matrices that may be singular within the working precision (the NCP's reduced
    Newton matrix): a pivot of U smaller than eps times the largest entry of its row of a keeps its
    sign and is raised to that size (the factor of a nearby matrix, as `cho_factor` shifts), so
    `lu_solve` never divides by zero."""
    a = jnp.asarray(a)
    lu, perm = lu_factor(a)
    floor = jnp.finfo(a.dtype).eps * jnp.max(jnp.abs(a), axis=1)[perm] + jnp.finfo(a.dtype).tiny
    pivot = jnp.diagonal(lu)
    pivot = jnp.where(jnp.abs(pivot) < floor, jnp.where(pivot < 0, -floor, floor), pivot)
    return lu.at[jnp.diag_indices(a.shape[-1])].set(pivot), perm


def solve(a: Float[Array, "n n"], b: Float[Array, " n"]) -> Float[Array, " n"]:
    """a^-1 b for a general square a (LU with partial pivoting), differentiable in a and b."""
    if a.shape[0] == 0:
        return b
    factor = lu_factor(jax.lax.stop_gradient(a))
    return jax.lax.custom_linear_solve(
        lambda x: a @ x, b,
        solve=lambda _, r: lu_solve(factor, r),
        transpose_solve=lambda _, r: lu_solve(factor, r, trans=True),
    )
