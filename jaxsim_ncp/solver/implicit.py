"""Implicit differentiation of a solver through its optimality residual (custom_vjp).

If x* = solve(theta) satisfies g(x*, theta) = 0 and dg/dx is invertible there, the
implicit function theorem gives dx*/dtheta = -(dg/dx)^{-1} dg/dtheta, so the
vector-Jacobian product of the solver is

    (dg/dx)^T lam = x_bar,        theta_bar = -lam^T dg/dtheta        (one linear solve)

computed at the solution with `jax.vjp` of g. The solver's iterations are never
differentiated: reverse mode costs one factorization and one residual VJP whatever the
iteration count, and the iterations need not be differentiable at all. They run outside the
custom_vjp, on inputs without tangents, and their result is named `SOLUTION`
(`jax.ad_checkpoint.checkpoint_name`): a checkpoint that saves it (`rollout(checkpoint=...)`)
replays only the linearization at the solution in the backward pass, not the iterations.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .. import linalg

Theta = TypeVar("Theta")
X = jax.Array

SOLUTION = "implicit_solver_solution"  # `checkpoint_name` of a solver's (x, info)


def _zero_cotangent(x):
    """A zero cotangent for x: zeros for floating arrays, float0 for integer and boolean ones."""
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


def _dense_lu(residual: Callable[[X, Any], X]):
    """Default factorization: LU of the dense Jacobian dg/dx (fine for small x)."""

    def factorize(x, theta):
        return linalg.lu_factor(jax.jacfwd(residual)(x, theta))

    def solve_transposed(factor, b):
        return linalg.lu_solve(factor, b, trans=True)

    return factorize, solve_transposed


def implicit_solver(
    solver: Callable[[Theta, Any], tuple[X, Any]],
    residual: Callable[[X, Theta], X],
    factorize: Callable[[X, Theta], Any] | None = None,
    solve_transposed: Callable[[Any, X], X] | None = None,
    linearization_point: Callable[[X, Theta, Any], X] | None = None,
    solved_from_info: Callable[[Any], X] | None = None,
    fallback: Callable[[Theta, X, X], Theta] | None = None,
) -> Callable[[Theta, Any], tuple[X, Any]]:
    """Wrap `solver(theta, aux) -> (x, info)` so reverse mode uses the implicit function theorem.

    residual(x, theta): the optimality condition g, zero at the solution (same shape as x).
    factorize(x, theta) -> factor and solve_transposed(factor, b) -> lam with
    (dg/dx)^T lam = b: the linear algebra of the backward pass. The factor is computed
    in the forward pass of reverse mode (a pytree of arrays), so the backward pass only
    back-substitutes; by default the dense Jacobian of g is LU-factorized.

    linearization_point(x, theta, aux) -> x_lin: where to differentiate (default x
    itself). The interior-point solver returns its hard solution but differentiates a
    relaxed (smoother) point; residual and factorization are evaluated there.

    solved_from_info(info) -> bool: whether x is close enough to a solution of g = 0 to differentiate
    it (default: always). Where it is not, or where the transposed solve is not finite, the implicit
    function theorem says nothing about x: theta's cotangent is then fallback(theta, x, x_bar)
    (a surrogate derivative of the returned x), or zero without a fallback.

    Gradients flow to every floating leaf of theta. `aux` (starting point, tolerances
    scale, ...) and `info` (iteration counts, ...) are treated as constants: at a
    solution, x does not depend on where the iterations started.
    """
    if factorize is None or solve_transposed is None:
        factorize, solve_transposed = _dense_lu(residual)

    @jax.custom_vjp
    def differentiated(x, info, theta, aux):
        """(x, info) as they are; reverse mode gives theta the implicit derivative of x(theta)."""
        return x, info

    def differentiated_fwd(x, info, theta, aux):
        solved = jnp.asarray(True) if solved_from_info is None else solved_from_info(info)
        x_lin = x if linearization_point is None else linearization_point(x, theta, aux)
        return (x, info), (x_lin, theta, aux, factorize(x_lin, theta), solved, x, info)

    @linalg.full_precision  # traced by reverse mode, outside the forward's context
    def differentiated_bwd(saved, cotangent):
        x_lin, theta, aux, factor, solved, x, info = saved
        x_bar, _ = cotangent
        lam = solve_transposed(factor, x_bar)
        # far from any solution (the solver flags it) or a singular dg/dx (a degenerate one): no
        # implicit derivative exists; NaN or a huge value here would poison every gradient upstream
        implicit = solved & jnp.all(jnp.isfinite(lam))
        _, residual_vjp = jax.vjp(lambda th: residual(x_lin, th), theta)
        (theta_bar,) = residual_vjp(-jnp.where(implicit, lam, 0.0))
        if fallback is not None:
            theta_bar = jax.tree.map(lambda a, b: jnp.where(implicit, a, b), theta_bar, fallback(theta, x, x_bar))
        zero = functools.partial(jax.tree.map, _zero_cotangent)
        return zero(x), zero(info), theta_bar, zero(aux)

    differentiated.defvjp(differentiated_fwd, differentiated_bwd)

    def solve(theta, aux):
        # the iterations see no tangents: they are never differentiated. Their results are named
        # SOLUTION so that a checkpointed step can keep them and replay only the linearization
        x, info = solver(jax.lax.stop_gradient(theta), jax.lax.stop_gradient(aux))
        x, info = jax.tree.map(lambda v: checkpoint_name(v, SOLUTION), (x, info))
        return differentiated(x, info, theta, aux)

    return solve
