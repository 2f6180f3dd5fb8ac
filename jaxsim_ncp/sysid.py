"""System identification: fit model parameters to observed trajectories by gradient descent.

    result = jsn.sysid.fit(model, lambda m: (m.geom_size, m.geom_friction), qpos, qvel, ctrl,
                           lower=(0.01, 0.0), upper=(0.2, 2.0), horizon=50, iterations=200)
    result.model, result.params, result.loss_history, print(result.summary())

The loss is multi-step-ahead over trajectory segments: each segment of `horizon` steps
starts from the *observed* state and is simulated with the observed controls, so errors
cannot compound over a long recording and the loss stays smooth in the parameters:

    L(theta) = mean over segments s, steps k of
               |qpos_sim - qpos_obs|^2 + qvel_weight |qvel_sim - qvel_obs|^2

(quaternions compared with their sign aligned). Bounds are enforced by a smooth
reparameterization of each element, so the optimizer (optax, Adam by default) works on
unconstrained latents z and every step is a relative one:

    lower and upper: theta = lo + (hi - lo) sigmoid(z)
    lower only:      theta = lo + (theta0 - lo) exp(z)
    upper only:      theta = hi - (hi - theta0) exp(z)
    neither:         theta = theta0 + max(|theta0|, 1e-3) z

Activations are not observed: segments start with `act = 0`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float

from .forward import step
from .types import Data, Model, make_data

PyTree = Any


@dataclasses.dataclass
class FitResult:
    """model: the model with the best parameters found; params: those parameters (the
    structure of `where(model)` or of the `params` given); initial_params; loss_history
    (iterations,), the loss at each iterate; param_history: params per iterate (leading
    axis iterations); best_iteration; names: one name per parameter leaf; nonfinite_grads:
    iterations whose gradient had non-finite entries (set to zero)."""

    model: Model
    params: PyTree
    initial_params: PyTree
    loss_history: np.ndarray
    param_history: PyTree
    best_iteration: int
    names: list[str]
    nonfinite_grads: int

    def summary(self) -> str:
        """One line per parameter leaf: initial -> fitted values, and the loss."""
        lines = [f"loss {self.loss_history[0]:.4g} -> {self.loss_history[self.best_iteration]:.4g} "
                 f"(best of {len(self.loss_history)} iterates, #{self.best_iteration})"]  # fmt: skip
        for name, p0, p in zip(self.names, jax.tree.leaves(self.initial_params), jax.tree.leaves(self.params)):
            lines.append(f"{name}: {np.array2string(np.asarray(p0), precision=5)} -> "
                         f"{np.array2string(np.asarray(p), precision=5)}")  # fmt: skip
        return "\n".join(lines)


def _broadcast_bound(bound, params: PyTree, fill: float) -> PyTree:
    """None -> fill everywhere; a scalar -> every element; else a pytree matching params."""
    if bound is None:
        return jax.tree.map(lambda p: jnp.full(jnp.shape(p), fill, jnp.result_type(p)), params)
    if not isinstance(bound, (tuple, list, dict)) and jnp.ndim(bound) == 0:
        return jax.tree.map(lambda p: jnp.full(jnp.shape(p), bound, jnp.result_type(p)), params)
    bound = jax.tree.map(lambda b: fill if b is None else b, bound, is_leaf=lambda b: b is None)
    return jax.tree.map(lambda b, p: jnp.broadcast_to(jnp.asarray(b, jnp.result_type(p)), jnp.shape(p)), bound, params)


class _Reparam(eqx.Module):
    """theta(z) per element for the four bound cases (module docstring); z = 0 is theta0
    except in the two-sided case, where z0 = logit of theta0's position in [lo, hi]."""

    theta0: Array
    lo: Array
    hi: Array

    def _parts(self):
        has_lo, has_hi = jnp.isfinite(self.lo), jnp.isfinite(self.hi)
        lo = jnp.where(has_lo, self.lo, 0.0)  # finite stand-ins keep unused branches NaN-free
        hi = jnp.where(has_hi, self.hi, 1.0)
        return has_lo, has_hi, lo, hi

    def theta(self, z: Array) -> Array:
        has_lo, has_hi, lo, hi = self._parts()
        both = lo + (hi - lo) * jax.nn.sigmoid(z)
        lower = lo + (self.theta0 - lo) * jnp.exp(z)
        upper = hi - (hi - self.theta0) * jnp.exp(z)
        free = self.theta0 + jnp.maximum(jnp.abs(self.theta0), 1e-3) * z
        return jnp.where(has_lo & has_hi, both, jnp.where(has_lo, lower, jnp.where(has_hi, upper, free)))

    def z0(self) -> Array:
        has_lo, has_hi, lo, hi = self._parts()
        frac = jnp.clip((self.theta0 - lo) / (hi - lo), 1e-4, 1 - 1e-4)
        return jnp.where(has_lo & has_hi, jnp.log(frac) - jnp.log1p(-frac), 0.0)


def _is_reparam(x) -> bool:
    return isinstance(x, _Reparam)


class _Problem(eqx.Module):
    """Everything a fit iteration reads. Arrays (the model's parameters, the segments, the
    bounds) are arguments of the compiled update, not constants, so fitting again from
    another start (same model structure, `apply` and optimizer) reuses the compiled program."""

    model: Model
    segments: tuple
    reparam: PyTree
    mask: PyTree
    params: PyTree
    apply: Callable = eqx.field(static=True)
    optimizer: optax.GradientTransformation = eqx.field(static=True)
    qvel_weight: float = eqx.field(static=True)

    def theta(self, z: PyTree) -> PyTree:
        values = jax.tree.map(lambda r, zi: r.theta(zi), self.reparam, z, is_leaf=_is_reparam)
        return jax.tree.map(lambda m, v, p: jnp.where(m, v, p), self.mask, values, self.params)

    def loss(self, z: PyTree) -> Array:
        fitted = self.apply(self.model, self.theta(z))
        data0 = make_data(fitted)
        return jnp.mean(jax.vmap(lambda *s: segment_loss(fitted, data0, *s, self.qvel_weight))(*self.segments))


@eqx.filter_jit
def _update(problem: _Problem, z: PyTree, opt_state):
    """One optimizer step on the latents; non-finite gradient entries are zeroed (and reported)."""
    value, grad = jax.value_and_grad(problem.loss)(z)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grad)]))
    grad = jax.tree.map(lambda g: jnp.where(jnp.isfinite(g), g, 0.0), grad)
    updates, opt_state = problem.optimizer.update(grad, opt_state, z)
    return optax.apply_updates(z, updates), opt_state, value, finite, problem.theta(z)


@functools.lru_cache(maxsize=None)
def _adam(learning_rate: float) -> optax.GradientTransformation:
    """The default optimizer, one object per learning rate (a new one would recompile the update)."""
    return optax.adam(learning_rate)


def _check_bounds(names, params, lo, hi, mask):
    """Fitted elements must start finite and strictly inside non-empty bounds; elements
    the mask holds fixed only need to be finite (a fixed damping may sit at its bound 0)."""
    leaves = zip(names, *(jax.tree.leaves(x) for x in (params, lo, hi, mask)))
    for name, p, a, b, m in leaves:
        p, a, b, m = np.asarray(p), np.asarray(a), np.asarray(b), np.asarray(m)
        if not np.all(np.isfinite(p)):
            raise ValueError(f"sysid: initial value of {name} is not finite: {p}")
        if np.any(m & (a >= b)):
            raise ValueError(f"sysid: bounds of {name} are empty (lower >= upper)")
        if np.any(m & ((np.isfinite(a) & (p <= a)) | (np.isfinite(b) & (p >= b)))):
            raise ValueError(f"sysid: initial value of {name} ({p}) must lie strictly inside its bounds [{a}, {b}]")


def segments(qpos, qvel, ctrl, horizon: int, stride: int):
    """Cut (N, T+1, .) recordings into segments: start states (S, nq), (S, nv); controls
    (S, horizon, nu); targets (S, horizon, nq), (S, horizon, nv)."""
    t = qpos.shape[1] - 1
    if horizon < 1 or horizon > t:
        raise ValueError(f"sysid: horizon must be in [1, {t}] (the recording has {t} steps), got {horizon}")
    starts = np.arange(0, t - horizon + 1, stride)
    window = starts[:, None] + np.arange(1, horizon + 1)[None]

    def cut(x, idx):  # (N, T, .) -> (N * S, horizon, .)
        return x[:, idx].reshape((x.shape[0] * len(starts), horizon, x.shape[2]))

    return (
        qpos[:, starts].reshape(-1, qpos.shape[-1]),
        qvel[:, starts].reshape(-1, qvel.shape[-1]),
        cut(ctrl, window - 1),
        cut(qpos, window),
        cut(qvel, window),
    )


def qpos_error(model: Model, qpos: Array, target: Array) -> Array:
    """qpos - target with each quaternion's sign aligned to the target's (q and -q are one rotation)."""
    err = qpos - target
    for adr in model.topology.quat_coords[0]:
        q, t = qpos[..., adr : adr + 4], target[..., adr : adr + 4]
        sign = jnp.where(jnp.sum(q * t, axis=-1, keepdims=True) < 0, -1.0, 1.0)
        err = err.at[..., adr : adr + 4].set(q - sign * t)
    return err


def segment_loss(model: Model, data0: Data, qpos0, qvel0, ctrl, qpos_obs, qvel_obs, qvel_weight: float) -> Array:
    """Mean squared multi-step-ahead error of one segment (module docstring)."""

    def body(d, u):
        d = step(model, d.replace(ctrl=u))
        return d, (d.qpos, d.qvel)

    _, (qpos, qvel) = jax.lax.scan(body, data0.replace(qpos=qpos0, qvel=qvel0), ctrl)
    err_q = jnp.sum(qpos_error(model, qpos, qpos_obs) ** 2, axis=-1)
    err_v = jnp.sum((qvel - qvel_obs) ** 2, axis=-1)
    return jnp.mean(err_q + qvel_weight * err_v)


def _batched(x, ndim: int, name: str):
    x = jnp.asarray(x)
    if x.ndim == ndim - 1:
        x = x[None]
    if x.ndim != ndim:
        raise ValueError(f"sysid: {name} must have shape (T, .) or (N, T, .), got {x.shape}")
    return x


def fit(
    model: Model,
    where: Callable[[Model], PyTree],
    qpos: Float[Array, "*N T1 nq"],
    qvel: Float[Array, "*N T1 nv"],
    ctrl: Float[Array, "*N T nu"] | None = None,
    **kwargs,
) -> FitResult:
    """Fit the Model leaves selected by `where` (as in `eqx.tree_at`, e.g.
    `lambda m: (m.geom_size, m.body_mass)`) to recorded trajectories; see `fit_params`."""
    return fit_params(model, where(model), lambda m, p: eqx.tree_at(where, m, p), qpos, qvel, ctrl, **kwargs)


def fit_params(
    model: Model,
    params: PyTree,
    apply: Callable[[Model, PyTree], Model],
    qpos: Float[Array, "*N T1 nq"],
    qvel: Float[Array, "*N T1 nv"],
    ctrl: Float[Array, "*N T nu"] | None = None,
    *,
    lower: PyTree = None,
    upper: PyTree = None,
    mask: PyTree = None,
    horizon: int = 20,
    stride: int | None = None,
    qvel_weight: float = 0.01,
    optimizer: optax.GradientTransformation | None = None,
    learning_rate: float = 0.05,
    iterations: int = 200,
    names: list[str] | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> FitResult:
    """Fit `params` (any pytree of arrays; `apply(model, params)` builds the model from
    them, e.g. a cube's side length setting both geom_size and body_inertia) to recorded
    trajectories.

    qpos (T+1, nq), qvel (T+1, nv), ctrl (T, nu) or with a leading axis of N recordings,
    sampled at the model's timestep (ctrl may be None when nu = 0). lower/upper: bounds
    (None, a scalar for every element, or a pytree like params whose leaves may be None);
    mask: pytree of bools like params, True where an element is fitted (default: all; a
    fixed element keeps its value and may sit on its bound);
    horizon, stride: segment length and spacing in steps (stride defaults to horizon);
    optimizer: any optax transformation (default `optax.adam(learning_rate)`), applied to
    the latents; progress(iteration, loss) is called after each iteration. Returns the
    best iterate (lowest loss) as a `FitResult`.
    """
    qpos, qvel = _batched(qpos, 3, "qpos"), _batched(qvel, 3, "qvel")
    n, t1 = qpos.shape[:2]
    if ctrl is None:
        ctrl = jnp.zeros((n, t1 - 1, model.nu), model.dtype)
    ctrl = _batched(ctrl, 3, "ctrl")
    if qpos.shape[2] != model.nq or qvel.shape[:2] != (n, t1) or qvel.shape[2] != model.nv:
        raise ValueError(f"sysid: qpos {qpos.shape} / qvel {qvel.shape} do not match the model (nq={model.nq}, nv={model.nv})")
    if ctrl.shape != (n, t1 - 1, model.nu):
        raise ValueError(f"sysid: ctrl must have shape {(n, t1 - 1, model.nu)}, got {ctrl.shape}")
    seg = [jnp.asarray(x, model.dtype) for x in segments(qpos, qvel, ctrl, horizon, stride or horizon)]

    params = jax.tree.map(lambda p: jnp.asarray(p, model.dtype), params)
    leaves_with_path = jax.tree_util.tree_leaves_with_path(params)
    names = names or [jax.tree_util.keystr(path) or "params" for path, _ in leaves_with_path]
    if len(names) != len(leaves_with_path):
        raise ValueError(f"sysid: {len(names)} names for {len(leaves_with_path)} parameter leaves")
    lo, hi = _broadcast_bound(lower, params, -np.inf), _broadcast_bound(upper, params, np.inf)
    mask = jax.tree.map(lambda p: jnp.ones(jnp.shape(p), bool), params) if mask is None else jax.tree.map(
        lambda m, p: jnp.broadcast_to(jnp.asarray(m, bool), jnp.shape(p)), mask, params)  # fmt: skip
    _check_bounds(names, params, lo, hi, mask)
    problem = _Problem(
        model=model, segments=tuple(seg), reparam=jax.tree.map(_Reparam, params, lo, hi), mask=mask, params=params,
        apply=apply, optimizer=optimizer if optimizer is not None else _adam(learning_rate), qvel_weight=qvel_weight,
    )  # fmt: skip
    z = jax.tree.map(lambda r: r.z0(), problem.reparam, is_leaf=_is_reparam)
    opt_state = problem.optimizer.init(z)
    losses, history, nonfinite = [], [], 0
    for it in range(iterations):
        z, opt_state, value, finite, current = _update(problem, z, opt_state)
        losses.append(float(value))
        history.append(current)
        nonfinite += int(not bool(finite))
        if progress is not None:
            progress(it, losses[-1])
    losses_np = np.asarray(losses)
    best = int(np.nanargmin(np.where(np.isfinite(losses_np), losses_np, np.nan))) if np.isfinite(losses_np).any() else 0
    best_params = history[best] if history else params
    return FitResult(
        model=apply(model, best_params),
        params=best_params,
        initial_params=params,
        loss_history=losses_np,
        param_history=jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *history) if history else params,
        best_iteration=best,
        names=names,
        nonfinite_grads=nonfinite,
    )
