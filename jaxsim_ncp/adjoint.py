"""Rescaled adjoints for rollouts: a gradient too large for the dtype comes back as +-inf, not NaN.

The adjoint of an unstable trajectory (an inverted pendulum held at its top, a chaotic contact
scene) grows geometrically backward in time. Past the dtype's largest number (float32: 3.4e38)
the backward pass overflows, and inf - inf or inf * 0 inside the next step's derivative makes
NaN, which says nothing: the true derivative exists, it is only too large to store.

`rollout` therefore carries, next to its state, a log-scale `ls` that only the backward pass
uses (its primal value is 0 throughout). Between steps `renormalize` divides the cotangent of
the carried data by its largest entry m once m exceeds sqrt(dtype max), and adds log m to the
cotangent of `ls`: the carry's cotangent is then the true one times exp(-ls_bar), never
overflowing. Where a cotangent leaves the carry (a step's control, a per-step output, the initial
data) `unscaled` / `emitted` / `enter` convert it back, so an entry beyond the dtype becomes +-inf
with the true derivative's sign, and a zero stays zero. The model's cotangent is summed over the
steps in the scaled frame (below), then converted: +-inf with the sign of the sum even where the
steps' contributions overflow with both signs.

Below the threshold nothing is rescaled (the cotangents are multiplied by exp(0) = 1): the
gradients are those of the plain scan up to XLA's rounding (a Newton rollout's state and control
gradients are bitwise equal, its model gradients and an NCP rollout's within 1e-11 relative)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np


_ZERO = jax.custom_derivatives.SymbolicZero


def _is_float(x) -> bool:
    """A cotangent leaf that holds numbers: not a symbolic zero (an output nothing depends on), not
    the float0 of an integer leaf. The rules below see symbolic zeros, so a rollout's unused
    per-step outputs cost nothing."""
    return not isinstance(x, _ZERO) and jnp.issubdtype(x.dtype, jnp.inexact)


def _floats(tree):
    return [x for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, _ZERO)) if _is_float(x)]


def _map_floats(fn, tree):
    """fn on the floating leaves of a cotangent tree; a symbolic zero stays zero (None)."""
    return jax.tree.map(lambda x: None if isinstance(x, _ZERO) else fn(x) if _is_float(x) else x, tree,
                        is_leaf=lambda x: isinstance(x, _ZERO))  # fmt: skip


def _count(taps):
    """A residual that holds len(taps) in its (static) shape."""
    return jnp.zeros((len(taps), 0))


def _log_scale(g_ls):
    """ls's cotangent: the log of the factor the carry's cotangent is scaled down by."""
    return jnp.zeros(g_ls.aval.shape, g_ls.aval.dtype) if isinstance(g_ls, _ZERO) else g_ls


def _values(tree):
    """The primal values of a `symbolic_zeros` fwd rule's arguments."""
    return jax.tree.map(lambda p: p.value, tree, is_leaf=lambda x: isinstance(x, jax.custom_derivatives.CustomVJPPrimal))


def _times_exp(g, log_scale):
    """g * exp(log_scale) as ((g f) f) f with f = exp(log_scale / 3), zero where g is zero (inf * 0
    would be NaN). exp(log_scale) itself may not fit where the product does; f does wherever the
    product is finite and g is a normal number (|log_scale| / 3 stays below log(dtype max) while
    log_scale < log(max) - log(tiny)), and the partial products move monotonically towards the
    result. At log_scale = 0, f = 1 exactly: nothing changes."""
    f = jnp.exp(log_scale / 3.0).astype(g.dtype)
    return jnp.where(g == 0, jnp.zeros_like(g), g * f * f * f)


def batched_zero(trees, dtype):
    """A scalar 0 that is batched (under `jax.vmap`) wherever a floating leaf of trees is.

    The log-scale, the model's accumulators and the carried data must be batched whenever the
    carry's cotangent is: JAX sums the cotangent of an unbatched input of a custom_vjp over the
    batch, which would add one world's log-scale to another's and mix cotangents of different
    scales (a shared model's gradient over a vmapped batch came back NaN once any world's adjoint
    was rescaled). Selected, not computed, from the leaves: exactly 0 even where a leaf is NaN."""
    zero = jnp.zeros((), dtype)
    for x in jax.tree.leaves(trees):
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact) and jnp.size(x):
            zero = jnp.where(False, jnp.ravel(x)[0].astype(dtype), zero)
    return zero


def spread(tree, zero):
    """tree with its floating leaves batched like zero (`batched_zero`), their values unchanged."""
    return jax.tree.map(lambda x: jnp.where(zero != 0, jnp.zeros_like(x), x) if _is_float(x) else x, tree)


@jax.custom_vjp
def enter(data, zero, taps):
    """(data, ls = zero): the start of a rescaled scan; the backward pass returns data's true
    cotangent, and the final log-scale as each tap's (`accumulator`). zero: `batched_zero`."""
    return data, zero


def _enter_fwd(data, zero, taps):
    return enter(*_values((data, zero, taps))), _count(taps)


def _enter_bwd(n, g):
    g_data, g_ls = g[0], _log_scale(g[1])
    return _map_floats(lambda x: _times_exp(x, g_ls), g_data), None, (g_ls,) * n.shape[0]


enter.defvjp(_enter_fwd, _enter_bwd, symbolic_zeros=True)


@jax.custom_vjp
def _renormalize(data, ls, taps):
    return data, ls


def _renormalize_fwd(data, ls, taps):
    return _values((data, ls)), _count(taps)


def _renormalize_bwd(n, g):
    g_data, g_ls = g[0], _log_scale(g[1])
    largest = jnp.max(jnp.stack([jnp.zeros_like(g_ls)] + [jnp.max(jnp.abs(x), initial=0.0).astype(g_ls.dtype) for x in _floats(g_data)]))
    factor = jnp.where(largest > np.sqrt(jnp.finfo(g_ls.dtype).max), largest, jnp.ones_like(largest))  # NaN stays NaN
    log_factor = jnp.log(factor)
    return _map_floats(lambda x: x / factor.astype(x.dtype), g_data), g_ls + log_factor, (log_factor,) * n.shape[0]


_renormalize.defvjp(_renormalize_fwd, _renormalize_bwd, symbolic_zeros=True)


def renormalize(data, ls, taps, reads: list[bool] | None = None):
    """Identity on (data, ls); the backward pass scales data's cotangent down to at most 1 once its
    largest entry exceeds sqrt(dtype max), adds the log of the factor to ls's and returns it as each
    tap's (`rescaled`). With `reads` (a flag per leaf of data, `leaves_read`) only the leaves the
    next step reads take part: the others' cotangents are zero, and leaving them out of this one
    opaque backward node lets JAX drop their derivatives altogether."""
    if reads is None:
        return _renormalize(data, ls, taps)
    leaves, treedef = jax.tree.flatten(data)
    kept = [i for i, r in enumerate(reads) if r]
    scaled, ls = _renormalize([leaves[i] for i in kept], ls, taps)
    for i, x in zip(kept, scaled):
        leaves[i] = x
    return treedef.unflatten(leaves), ls


def _inputs_read(fn, *args) -> list[bool] | None:
    """Which leaves of args `fn(*args)` reads: the inputs its jaxpr keeps after dead-code elimination.
    Tracing here costs nothing extra when fn is jitted (the trace is cached and reused by the call
    that follows). None (every leaf) where JAX's DCE is unavailable."""
    try:
        from jax._src.interpreters.partial_eval import dce_jaxpr
    except ImportError:  # a JAX without it: every leaf, correct and only slower
        return None
    closed = jax.make_jaxpr(fn)(*args)
    _, used = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return list(used)


def leaves_read(step, model, data) -> list[bool] | None:
    """Which leaves of data `step(model, data)` reads (`_inputs_read`)."""
    used = _inputs_read(step, model, data)
    return None if used is None else used[len(jax.tree.leaves(model)):]  # model's leaves, then data's


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Static:
    """A residual that is part of the tree's structure, not an array."""

    value: tuple


def _instantiated(g):
    """A symbolic zero cotangent as an array (float0 for an integer or boolean leaf)."""
    if not isinstance(g, _ZERO):
        return g
    if g.aval.dtype == jax.dtypes.float0:
        return np.zeros(g.aval.shape, jax.dtypes.float0)
    return jnp.zeros(g.aval.shape, g.aval.dtype)


def discarding(fn):
    """fn(*args) -> (out, discard), whose reverse mode gives args a zero cotangent where discard holds.

    A world whose step is discarded (a diverged world keeps its last good state: `jnp.where(discard,
    held, computed)`) still runs the step's backward pass, with a zero cotangent; where its
    computation overflowed (a float32 torque of 1.8e19 on a 0.2 m box: inf inside the step),
    0 * inf = NaN, and under vmap that NaN is summed into the gradient of every parameter the worlds
    share. Here the backward pass's result is replaced by zeros for such a world (a select: NaN does
    not pass it). fn is linearized with respect to the perturbed arguments only (`symbolic_zeros`):
    a parameter nobody differentiates costs nothing, as without the wrapper. Only the leaves fn
    reads are arguments of the custom_vjp (`_inputs_read`): an argument of one always counts as
    read (JAX's dead-code elimination keeps them all), and the rollout's backward pass
    differentiates every leaf that is read. The cost: fn is linearized for all its outputs, whether
    a loss reads them or not (the humanoid's 100-step float32 gradient: 14% more XLA temporary
    memory without `checkpoint`, none with it; its time unchanged within noise)."""

    def wrapped(*args):
        leaves, treedef = jax.tree.flatten(args)
        used = _inputs_read(fn, *args) or [True] * len(leaves)
        kept = [i for i, u in enumerate(used) if u]

        def call(*read):
            given = dict(zip(kept, read))  # a leaf fn never reads takes any value: zeros
            full = [given[i] if i in given else jnp.zeros(jnp.shape(x), jnp.result_type(x)) for i, x in enumerate(leaves)]
            return fn(*treedef.unflatten(full))

        @jax.custom_vjp
        def guarded(*read):
            return call(*read)

        def guarded_fwd(*read):
            perturbed = [p.perturbed for p in read]
            values = [p.value for p in read]

            def of_perturbed(*xs):
                it = iter(xs)
                return call(*[next(it) if p else v for p, v in zip(perturbed, values)])

            result, pullback = jax.vjp(of_perturbed, *[v for p, v in zip(perturbed, values) if p])
            return result, (pullback, result[1], _Static(tuple(perturbed)))

        def guarded_bwd(saved, cotangent):
            pullback, discard, perturbed = saved[0], saved[1], saved[2].value
            cotangent = jax.tree.map(_instantiated, cotangent, is_leaf=lambda g: isinstance(g, _ZERO))
            masked = iter(_map_floats(lambda g: jnp.where(discard, jnp.zeros_like(g), g), pullback(cotangent)))
            return tuple(next(masked) if p else None for p in perturbed)

        guarded.defvjp(guarded_fwd, guarded_bwd, symbolic_zeros=True)
        return guarded(*[leaves[i] for i in kept])

    return wrapped


# The model's cotangent. A step's model cotangent is in the carry's scaled frame; converted back
# step by step, contributions beyond the dtype with both signs would sum to inf - inf. It is summed
# in the scaled frame instead, in the cotangent of an accumulator `acc` (one per floating leaf of
# the model; its value a copy of the leaf, batched like the carry) that the scan carries: the step
# reads it in the leaf's place (`borrow`), so each step's cotangent adds to it, `rescaled`
# divides it by the factor `renormalize` divides the state's by (passed as a tap's cotangent), and
# `accumulator` converts the sum back at the start. Each leaf has its own acc and taps, which
# depend on that leaf only: JAX computes the cotangents of the leaves that are differentiated.


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _tapped(x, zero, sign):
    """(x, tap = zero), both batched like zero; the backward pass multiplies x's cotangent by
    exp(sign * tap's)."""
    return spread(x, zero), zero


def _tapped_fwd(x, zero, sign):
    return _tapped(*_values((x, zero)), sign), None


def _tapped_bwd(sign, _, g):
    g_x, g_tap = g[0], _log_scale(g[1])
    return _map_floats(lambda y: _times_exp(y, sign * g_tap), g_x), None


_tapped.defvjp(_tapped_fwd, _tapped_bwd, symbolic_zeros=True)


def _borrowed(x) -> bool:
    """A model leaf that gets an accumulator: a floating one that may be differentiated, i.e. a
    tracer. A concrete array (a leaf the caller closed over) is a constant to every transformation;
    borrowing it would only cost: the step would read the carried accumulator instead, so to the
    scan's partial evaluation every value computed from it stops being loop-invariant and is stored
    at every step (the humanoid's 100-step gradient with the
    model closed over: 190 -> 154 per-step residual stores)."""
    return isinstance(x, jax.core.Tracer) and jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def borrowed_leaves(model) -> list:
    return [x for x in jax.tree.leaves(model) if _borrowed(x)]


def accumulator(model, zero) -> tuple[tuple, tuple]:
    """(acc, taps): an acc and a zero tap per borrowed leaf of the model (`_borrowed`); the backward
    pass returns each acc's cotangent at its true size (the taps' cotangents, from `enter`, being
    the log-scale at the start) as its leaf's. zero: `batched_zero`."""
    return tuple(zip(*[_tapped(x, zero, 1.0) for x in borrowed_leaves(model)])) or ((), ())


def rescaled(acc: tuple, ls) -> tuple[tuple, tuple]:
    """(acc, taps); the backward pass divides each acc's cotangent by exp(its tap's), the factor
    the state's was divided by in the same step (`renormalize`). ls: the carried log-scale (0)."""
    return tuple(zip(*[_tapped(a, ls, -1.0) for a in acc])) or ((), ())


def borrow(model, acc: tuple):
    """The model as a step reads it: its borrowed leaves replaced by their accumulators (the same
    values, batched like the carry: under vmap a shared leaf's cotangent would arrive summed over
    the worlds, each in its own scale), so their cotangents go to acc's."""
    leaves, treedef = jax.tree.flatten(model)
    accs = iter(acc)  # one per borrowed leaf, in leaf order (`accumulator`)
    return treedef.unflatten([next(accs) if _borrowed(x) else x for x in leaves])


@jax.custom_vjp
def unscaled(x, ls):
    """Identity on what a step reads besides the carry and the model (its control): its cotangent,
    computed in the carry's scaled frame, is returned at its true size."""
    return x, ls


def _unscaled_fwd(x, ls):
    return _values((x, ls)), None


def _unscaled_bwd(_, g):
    g_x, g_ls = g[0], _log_scale(g[1])
    return _map_floats(lambda y: _times_exp(y, g_ls), g_x), g_ls


unscaled.defvjp(_unscaled_fwd, _unscaled_bwd, symbolic_zeros=True)


@jax.custom_vjp
def emitted(y, ls):
    """Identity on a per-step output: its (true) cotangent enters the carry's scaled frame."""
    return y, ls


def _emitted_fwd(y, ls):
    return _values((y, ls)), None


def _emitted_bwd(_, g):
    g_y, g_ls = g[0], _log_scale(g[1])
    return _map_floats(lambda x: _times_exp(x, -g_ls), g_y), g_ls


emitted.defvjp(_emitted_fwd, _emitted_bwd, symbolic_zeros=True)


class Identity:
    """The same operations without rescaling (`rollout(..., rescale_adjoint=False)`)."""

    batched_zero = staticmethod(lambda trees, dtype: jnp.zeros((), dtype))
    spread = staticmethod(lambda tree, zero: tree)
    enter = staticmethod(lambda data, zero, taps: (data, zero))
    renormalize = staticmethod(lambda data, ls, taps, reads=None: (data, ls))
    accumulator = staticmethod(lambda model, zero: ((), ()))
    rescaled = staticmethod(lambda acc, ls: (acc, ()))
    borrow = staticmethod(lambda model, acc: model)
    unscaled = staticmethod(lambda x, ls: (x, ls))
    emitted = staticmethod(lambda y, ls: (y, ls))
