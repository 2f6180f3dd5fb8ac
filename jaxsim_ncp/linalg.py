"""Dense linear solves. Cholesky: LAPACK (potrf, trsm) on the CPU, cuSOLVER / cuBLAS on GPUs.
LU: plain XLA loops on the CPU, XLA's own factorizations elsewhere (on a GPU a loop of n dependent
steps is n kernel launches: the 100-cube pile's Newton step, nv = 600, took 190 ms on an H100
with loops and 5.7 ms without).

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


def _rows_loop(n: int, body, init):
    """fori_loop(0, n, body, init). Never unrolled: unrolling 8x8 factorizations (vmapped over
    contacts) made both compile and run time worse (NCP step 38 s -> 24 s compile, Newton
    step 22.6 s -> 17.8 s compile and 2.4 -> 0.9 ms per step on the slide test scene)."""
    return jax.lax.fori_loop(0, n, body, init)


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
        return out.reshape(axis_size, -1, *out.shape[1:]), True

    return run


def _lapack(kernel, cost: int, threaded: bool, *args):
    """kernel(*args) on a batch (the leading axis). On the CPU (`threaded=False`) a batch whose
    work `len * cost` reaches `_LAPACK_INLINE_WORK` runs chunk by chunk (`lax.map`), each chunk
    below it, so jaxlib never hands LAPACK work to XLA's thread pool; elsewhere in one call."""
    count = args[0].shape[0]
    chunk = count if threaded else max(1, (_LAPACK_INLINE_WORK - 1) // max(1, cost))
    if count <= chunk:
        return kernel(*args)
    chunks = -(-count // chunk)
    chunk = -(-count // chunks)  # as even as possible; the last chunk padded with copies of the last entry
    padded = [jnp.concatenate([x, jnp.repeat(x[-1:], chunks * chunk - count, axis=0)]) for x in args]
    out = jax.lax.map(lambda xs: kernel(*xs), tuple(x.reshape(chunks, chunk, *x.shape[1:]) for x in padded))
    return out.reshape(chunks * chunk, *out.shape[2:])[:count]


def _shifted_cholesky(a: Float[Array, "b n n"], shift) -> tuple[Float[Array, "b n n"], Array]:
    """LAPACK's (potrf) Cholesky factors of a + shift diag|a|, and which matrices it factored (a
    failed factor is NaN throughout, so its diagonal is enough to tell)."""
    d = jnp.abs(jnp.diagonal(a, axis1=-2, axis2=-1)) + jnp.finfo(a.dtype).tiny
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    lower = jax.lax.linalg.cholesky(a + shift * d[..., None] * eye, symmetrize_input=False)
    return lower, jnp.all(jnp.isfinite(jnp.diagonal(lower, axis1=-2, axis2=-1)), axis=-1)[:, None, None]


def _cho_factor_chunk(a: Float[Array, "b n n"]) -> Float[Array, "b n n"]:
    """Factors of a + eps diag|a| (a relative change within rounding). Where the working precision
    cannot factor a matrix, a + sqrt(eps) diag|a|'s and, failing that too, diag|a|'s, computed only
    if some matrix failed (a `cond`: a select would run every factorization; on an H100 that doubled
    the humanoid's and the pile's Cholesky time). Each matrix's factor is the one it gets alone."""
    eps, tiny = jnp.finfo(a.dtype).eps, jnp.finfo(a.dtype).tiny
    lower, ok = _shifted_cholesky(a, eps)

    def repaired():
        retry, retry_ok = _shifted_cholesky(a, jnp.sqrt(eps))
        d = jnp.sqrt(jnp.abs(jnp.diagonal(a, axis1=-2, axis2=-1)) + tiny)
        diagonal = d[..., None] * jnp.eye(a.shape[-1], dtype=a.dtype)
        return jnp.where(ok, lower, jnp.where(retry_ok, retry, diagonal))

    return jax.lax.cond(jnp.all(ok), lambda: lower, repaired)


def _cho_factor_batch(a: Float[Array, "b n n"], threaded: bool) -> Float[Array, "b n n"]:
    return _lapack(_cho_factor_chunk, a.shape[-1] ** 3 // 3, threaded, a)  # jaxlib's cost of potrf


def _cho_solve_batch(lower: Float[Array, "b n n"], b: Float[Array, "b n k"], threaded: bool) -> Float[Array, "b n k"]:
    solve = functools.partial(jax.lax.linalg.triangular_solve, left_side=True, lower=True)
    cost = lower.shape[-1] ** 2 * b.shape[-1]  # jaxlib's for trsm
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


def _lu_factor_loop(a):
    """Doolittle LU with partial pivoting as a row loop.

    Rows are never swapped inside the loop: `free` marks the rows not yet chosen as pivots, the
    pivot row is read with a mask, and one gather at the end puts the rows in pivot order. A
    per-world row swap is a batched gather of the whole matrix at every step under vmap; this
    form is elementwise and factors 2x faster (27x27, 16 worlds: 440 -> 214 us), bit for bit the
    same factor.
    """
    a = jnp.asarray(a)
    n = a.shape[-1]
    idx = jnp.arange(n, dtype=jnp.int32)

    def eliminate(k, carry):
        lu, free, perm = carry
        column = lu[:, k]
        p = jnp.argmax(jnp.where(free, jnp.abs(column), -1.0)).astype(jnp.int32)
        pivot_row = jnp.sum(jnp.where((idx == p)[:, None], lu, 0.0), axis=0)
        free = free & (idx != p)
        factors = jnp.where(free, column / pivot_row[k], 0.0)
        lu = lu - jnp.outer(factors, jnp.where(idx > k, pivot_row, 0.0))
        lu = jnp.where((idx == k)[None, :] & free[:, None], factors[:, None], lu)
        return lu, free, jnp.where(idx == k, p, perm)

    lu, _, perm = _rows_loop(n, eliminate, (a, jnp.ones(n, bool), idx))
    return lu[perm], perm


def _triangular_solve(t, b, lower: bool, unit_diagonal: bool = False):
    """Solve T x = b for triangular T (b: (n,) or (n, k)): forward substitution if lower, else backward."""
    t, b = jnp.asarray(t), jnp.asarray(b)
    n = t.shape[0]

    def row(k, x):
        i = k if lower else n - 1 - k
        xi = b[i] - t[i, :] @ x  # entries of x not solved yet are still zero
        return x.at[i].set(xi if unit_diagonal else xi / t[i, i])

    return _rows_loop(n, row, jnp.zeros_like(b))


def _lu_solve_loop(lu, perm, b, trans: bool):
    # L's unit diagonal is implied: the unit-diagonal solves never read it
    if not trans:
        return _triangular_solve(lu, _triangular_solve(lu, b[perm], lower=True, unit_diagonal=True), lower=False)
    y = _triangular_solve(lu.T, _triangular_solve(lu.T, b, lower=True), lower=False, unit_diagonal=True)
    return jnp.zeros_like(y).at[perm].set(y)


def _lu_factor_native(a):
    lu, _, perm = jax.lax.linalg.lu(a)
    return lu, perm.astype(jnp.int32)


def _lu_solve_native(lu, perm, b, trans: bool):
    column = b.ndim == 1
    b = b[:, None] if column else b
    solve = functools.partial(jax.lax.linalg.triangular_solve, left_side=True, transpose_a=trans)
    if not trans:
        x = solve(lu, solve(lu, b[perm], lower=True, unit_diagonal=True), lower=False)
    else:
        y = solve(lu, solve(lu, b, lower=False), lower=True, unit_diagonal=True)
        x = jnp.zeros_like(y).at[perm].set(y)
    return x[:, 0] if column else x


# On the CPU the row loops (no LAPACK kernel, see above); on GPUs XLA's own LU and triangular
# solves (cuBLAS batched getrf / trsm), where a loop of n tiny dependent steps costs n launches.


def lu_factor(a: Float[Array, "n n"]) -> tuple[Float[Array, "n n"], Int[Array, " n"]]:
    """LU with partial pivoting: (lu, perm) with a[perm] = L U, L unit lower and U upper packed in lu."""
    return jax.lax.platform_dependent(jnp.asarray(a), cpu=_lu_factor_loop, default=_lu_factor_native)


def lu_solve(factor, b: Float[Array, "n ..."], trans: bool = False) -> Float[Array, "n ..."]:
    """a^-1 b (trans: a^-T b) from `lu_factor`'s (lu, perm) (not differentiated: use `solve`)."""
    lu, perm = factor
    return jax.lax.platform_dependent(
        lu, perm, jnp.asarray(b),
        cpu=functools.partial(_lu_solve_loop, trans=trans), default=functools.partial(_lu_solve_native, trans=trans),
    )  # fmt: skip


# ------------------------------------------------------------------ LU without pivoting (the NCP's solves)


def _lu_factor_unpivoted(a):
    """Doolittle LU without pivoting: n dependent steps of one fused rank-1 update each (the
    pivot search and the pivot row's gather of `_lu_factor_loop` are reductions that XLA cannot
    fuse with it). A pivot smaller than eps times its row's largest entry keeps its sign and is
    raised to that size (the factor of a nearby matrix, as `cho_factor` clamps)."""
    n = a.shape[-1]
    idx = jnp.arange(n, dtype=jnp.int32)
    floors = jnp.finfo(a.dtype).eps * jnp.max(jnp.abs(a), axis=1) + jnp.finfo(a.dtype).tiny

    def eliminate(k, lu):
        row = lu[k]
        pivot, floor = row[k], floors[k]
        pivot = jnp.where(jnp.abs(pivot) < floor, jnp.where(pivot < 0, -floor, floor), pivot)
        row = jnp.where(idx == k, pivot, row)
        factors = jnp.where(idx > k, lu[:, k] / pivot, 0.0)
        lu = jnp.where((idx == k)[:, None], row[None, :], lu - jnp.outer(factors, jnp.where(idx > k, row, 0.0)))
        return jnp.where((idx == k)[None, :] & (idx > k)[:, None], factors[:, None], lu)

    return _rows_loop(n, eliminate, a)


def factor_for_solves(a: Float[Array, "n n"]) -> tuple[Float[Array, "n n"], Int[Array, " n"]]:
    """(lu, perm) as `lu_factor`, for `solve_with`: on the CPU without pivoting
    (`_lu_factor_unpivoted`; perm the identity), elsewhere XLA's (cuBLAS batched getrf on GPUs).

    Meant for matrices whose leading blocks stay well away from singular (the NCP's reduced Newton
    matrix: the mass matrix plus contact terms, the equality rows last). Humanoid NCP iteration
    (2-core CPU, float32), against `lu_factor` / `lu_solve`: 92 -> 62 us (1 world), 956 -> 670 us
    (16 worlds) together with the NCP's residual reuse and unit-block products, at the same
    iteration counts. (An explicit inverse was as fast but, not backward stable, left 79 of
    50 000 humanoid steps unconverged against 53, even with two refinement steps.)
    """
    a = jnp.asarray(a)
    n = a.shape[-1]
    return jax.lax.platform_dependent(
        a, cpu=lambda a: (_lu_factor_unpivoted(a), jnp.arange(n, dtype=jnp.int32)), default=_lu_factor_native
    )


def _substitute_by_columns(t, b, lower: bool, unit_diagonal: bool, columns: bool = True):
    """Solve T x = b for triangular T by columns: once x_k is known, x_k times T's column k leaves
    the right-hand side (columns=False: T's row k, i.e. solve T^T x = b with T^T triangular the
    other way). Each step is one elementwise update (`_triangular_solve`'s row form takes a dot and
    a scatter per row, each a separate kernel under vmap)."""
    n = t.shape[0]
    idx = jnp.arange(n, dtype=jnp.int32)

    def step(i, y):
        k = i if lower else n - 1 - i
        col = t[:, k] if columns else t[k, :]
        xk = y[k] if unit_diagonal else y[k] / t[k, k]
        rest = (idx > k) if lower else (idx < k)
        return jnp.where(idx == k, xk, y - xk * jnp.where(rest, col, 0.0))

    return _rows_loop(n, step, b)


def _lu_solve_unpivoted(lu, b, trans: bool):
    if not trans:  # L U x = b
        y = _substitute_by_columns(lu, b, lower=True, unit_diagonal=True)
        return _substitute_by_columns(lu, y, lower=False, unit_diagonal=False)
    # U^T L^T x = b: U^T is lower (its columns are U's rows), L^T upper
    y = _substitute_by_columns(lu, b, lower=True, unit_diagonal=False, columns=False)
    return _substitute_by_columns(lu, y, lower=False, unit_diagonal=True, columns=False)


def solve_with(factor, b: Float[Array, " n"], trans: bool = False) -> Float[Array, " n"]:
    """a^-1 b (trans: a^-T b) from `factor_for_solves`'s (lu, perm) (b a vector)."""
    lu, perm = factor
    return jax.lax.platform_dependent(
        lu, perm, jnp.asarray(b),
        cpu=lambda lu, perm, b: _lu_solve_unpivoted(lu, b, trans),
        default=functools.partial(_lu_solve_native, trans=trans),
    )  # fmt: skip


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
