"""Tendon wrapping around spheres and cylinders (MuJoCo's mju_wrap), one segment at a time.

A straight segment x0 -> x1 that would pass through the wrapping geom's circle is replaced
by x0 -> t0, an arc t0 -> t1 on the circle and t1 -> x1, with t0, t1 the shorter pair of
tangent points. A sphere wraps in the plane of x0, x1 and its centre; a cylinder in its
local xy plane, the arc then rising linearly along z. A side site inside the geom selects
the "inside" wrap: one contact point, the root of asin(A z) + asin(B z) - 2 asin(z) + G = 0
by Newton's method (at most 20 steps, to |f| <= max(1e-10, 10 eps)). The path length is
stationary in that point: MuJoCo 4's lengths agree to ~1e-15, its points only to ~1e-7.
A side site outside the geom follows MuJoCo 4.0's rule (changelog 4.0.0, "Changed the
semantics of sidesite"; the older half-plane rule and MJX differ): the path is the shortest
one winding around the circle the same way as the polyline e0 -> side -> e1. With signed
angles W = ang(e0, side) + ang(side, e1) and theta = ang(e0, e1) (W - theta is 0 or +-2 pi),
the segment stays straight where W = theta and it misses the circle; otherwise it wraps
counter-clockwise where W > 0, clockwise where W < 0, the arc possibly longer than pi.
Whether a side site is inside is decided every step (it may sit on another body).

Every branch is computed and selected with `jnp.where` (vmappable) on guarded inputs, so
gradients stay finite on both sides of a switch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import math

MINVAL = 1e-15  # mjMINVAL


def _safe_div(a, b):
    return a / jnp.where(jnp.abs(b) < MINVAL, 1.0, b)


def _sqrt_pos(x):
    """sqrt(max(x, 0)) with a finite gradient at 0."""
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def _cross2(a, b):
    return a[0] * b[1] - a[1] * b[0]


def _is_intersect(p1, p2, p3, p4):
    """Do segments p1-p2 and p3-p4 intersect (2D)?"""
    det = (p4[1] - p3[1]) * (p2[0] - p1[0]) - (p4[0] - p3[0]) * (p2[1] - p1[1])
    a = _safe_div((p4[0] - p3[0]) * (p1[1] - p3[1]) - (p4[1] - p3[1]) * (p1[0] - p3[0]), det)
    b = _safe_div((p2[0] - p1[0]) * (p1[1] - p3[1]) - (p2[1] - p1[1]) * (p1[0] - p3[0]), det)
    return (jnp.abs(det) >= MINVAL) & (a >= 0) & (a <= 1) & (b >= 0) & (b <= 1)


def _length_circle(p0, p1, second, radius):
    """Arc length from p0 to p1 on the circle, the long way round where the turn direction asks."""
    degenerate = jnp.all(p0 == 0) | jnp.all(p1 == 0)  # no wrap; keeps arctan2's gradient finite
    p0 = jnp.where(degenerate, jnp.ones_like(p0), p0)
    angle = jnp.arctan2(jnp.abs(_cross2(p0, p1)), jnp.dot(p0, p1))  # acos of the normalized dot, gradient-safe
    turn = p0[1] * p1[0] - p0[0] * p1[1]
    flip = ((turn > 0) & second) | ((turn < 0) & ~second)
    return radius * jnp.where(flip, 2 * jnp.pi - angle, angle)


def _no_wrap_and_clear(e0, e1, radius):
    """(no wrap possible: an end inside the circle or a degenerate segment, the segment misses the circle)."""
    sqlen0, sqlen1, sqrad = e0 @ e0, e1 @ e1, radius * radius
    dif = e1 - e0
    dd = dif @ dif
    nearest = jnp.clip(-_safe_div(dif @ e0, dd), 0.0, 1.0) * dif + e0
    return (sqlen0 < sqrad) | (sqlen1 < sqrad) | (radius < MINVAL) | (dd < MINVAL), nearest @ nearest > sqrad


def _wrap_circle(end, radius):
    """2D wrap of end[0:2] -> end[2:4] around a circle at the origin: (length or -1, points (4,))."""
    e0, e1 = end[:2], end[2:]
    sqlen0, sqlen1, sqrad = e0 @ e0, e1 @ e1, radius * radius
    invalid, clear = _no_wrap_and_clear(e0, e1, radius)
    none = invalid | clear
    sqrt0, sqrt1 = _sqrt_pos(sqlen0 - sqrad), _sqrt_pos(sqlen1 - sqrad)
    sols, goods = [], []
    for sgn in (1.0, -1.0):
        s0 = jnp.stack([e0[0] * sqrad + sgn * radius * e0[1] * sqrt0, e0[1] * sqrad - sgn * radius * e0[0] * sqrt0])
        s1 = jnp.stack([e1[0] * sqrad - sgn * radius * e1[1] * sqrt1, e1[1] * sqrad + sgn * radius * e1[0] * sqrt1])
        s0, s1 = _safe_div(s0, sqlen0), _safe_div(s1, sqlen1)
        good = -jnp.sum((s0 - s1) ** 2)  # the shorter chord
        goods.append(jnp.where(_is_intersect(e0, s0, e1, s1), -10000.0, good))
        sols.append((s0, s1))
    second = ~(goods[0] > goods[1])
    p0 = jnp.where(second, sols[1][0], sols[0][0])
    p1 = jnp.where(second, sols[1][1], sols[0][1])
    none = none | _is_intersect(e0, p0, e1, p1)
    return jnp.where(none, -1.0, _length_circle(p0, p1, second, radius)), jnp.concatenate([p0, p1])


def _angle(a, b):
    """Signed angle from a to b (2D), in (-pi, pi]; finite gradient where a or b is 0."""
    y, x = _cross2(a, b), jnp.dot(a, b)
    zero = (y == 0) & (x == 0)
    return jnp.where(zero, 0.0, jnp.arctan2(y, jnp.where(zero, 1.0, x)))


def _wrap_sided(end, side, radius):
    """2D wrap with a side site outside the circle (MuJoCo 4.0, module docstring): (length or -1, points (4,))."""
    e0, e1 = end[:2], end[2:]
    invalid, clear = _no_wrap_and_clear(e0, e1, radius)
    winding = _angle(e0, side) + _angle(side, e1)
    none = invalid | (clear & (jnp.abs(winding - _angle(e0, e1)) < jnp.pi))
    sigma = jnp.where(winding > 0, 1.0, -1.0)
    # tangent points at polar angles angle(e) +- acos(r / |e|), travelling sigma-wise from t0 to t1
    len0, len1 = math.safe_norm(e0), math.safe_norm(e1)
    acos0 = jnp.arccos(jnp.where(none, 0.5, _safe_div(radius, len0)))
    acos1 = jnp.arccos(jnp.where(none, 0.5, _safe_div(radius, len1)))
    a0 = _angle(jnp.ones_like(e0).at[1].set(0.0), e0) + sigma * acos0
    a1 = _angle(jnp.ones_like(e1).at[1].set(0.0), e1) - sigma * acos1
    arc = jnp.mod(sigma * (a1 - a0), 2 * jnp.pi)
    points = radius * jnp.stack([jnp.cos(a0), jnp.sin(a0), jnp.cos(a1), jnp.sin(a1)])
    return jnp.where(none, -1.0, radius * arc), points


def _wrap_inside(end, radius):
    """2D inside wrap (side site within the circle): (0 or -1, points (4,)), both points equal."""
    e0, e1 = end[:2], end[2:]
    len0, len1 = math.safe_norm(e0), math.safe_norm(e1)
    dif = e1 - e0
    dd = dif @ dif
    a = -_safe_div(dif @ e0, dd)
    crosses = (dd > MINVAL) & (a > 0) & (a < 1) & (math.safe_norm(e0 + a * dif) <= radius)
    none = (len0 <= radius) | (len1 <= radius) | (radius < MINVAL) | (len0 < MINVAL) | (len1 < MINVAL) | crosses

    average = radius * math.normalize(0.5 * (e0 + e1))  # the fallback of a numerical failure
    A, B = radius / jnp.maximum(len0, radius), radius / jnp.maximum(len1, radius)  # < 1 wherever it is used
    cos_g = _safe_div(len0 * len0 + len1 * len1 - dd, 2 * len0 * len1)
    none = none | (cos_g < -1 + MINVAL)
    G = jnp.arccos(jnp.clip(cos_g, -1 + MINVAL, 1 - MINVAL))

    def asin(x):  # arcsin clamped to [-1, 1] (Newton iterates of a hopeless case may step outside), finite gradient
        ok = jnp.abs(x) < 1
        return jnp.where(ok, jnp.arcsin(jnp.where(ok, x, 0.0)), jnp.sign(x) * jnp.pi / 2)

    def f_of(z):
        return asin(A * z) + asin(B * z) - 2 * asin(z) + G

    tol = max(1e-10, 10 * float(jnp.finfo(end.dtype).eps))
    z = jnp.asarray(1 - 1e-7, end.dtype)
    f = f_of(z)
    fallback = (cos_g > 1 - MINVAL) | (f > 0)
    done = fallback | (jnp.abs(f) <= tol)

    def newton(_, carry):
        z, f, done, fallback, count = carry
        inv = lambda c: 1.0 / jnp.maximum(MINVAL, _sqrt_pos(1 - z * z * c * c))  # noqa: E731
        df = A * inv(A) + B * inv(B) - 2 * inv(1.0)
        z1 = z - _safe_div(f, df)
        bad = (df > -MINVAL) | (z1 > z)
        f1 = f_of(z1)
        step = ~done & ~bad
        fallback = fallback | (~done & bad) | (step & (f1 > tol))
        z, f = jnp.where(step, z1, z), jnp.where(step, f1, f)
        done = done | bad | (jnp.abs(f) <= tol) | fallback
        return z, f, done, fallback, count + step

    z, f, done, fallback, count = jax.lax.fori_loop(0, 20, newton, (z, f, done, fallback, 0))
    fallback = fallback | (count >= 20)  # as MuJoCo: all 20 steps taken counts as no convergence
    first = _cross2(e0, e1) > 0
    vec = math.normalize(jnp.where(first, e0, e1))
    ang = asin(z) - asin(jnp.where(first, A, B) * z)
    c, s = jnp.cos(ang), jnp.sin(ang)
    point = radius * jnp.stack([c * vec[0] - s * vec[1], s * vec[0] + c * vec[1]])
    point = jnp.where(fallback, average, point)
    return jnp.where(none, -1.0, 0.0), jnp.concatenate([point, point])


def wrap(x0, x1, xpos, xmat, radius, cylinder, has_side, side):
    """mju_wrap: (length of the wrapped part or -1 for no wrap, tangent points t0, t1 (world)).

    x0, x1: segment ends; xpos, xmat, radius: the geom; cylinder: bool (else a sphere);
    has_side: the element has a side site, at `side` (world): inside the geom it selects the
    inside wrap, outside it the side of the circle (MuJoCo 4.0's rule).
    """
    p0, p1 = xmat.T @ (x0 - xpos), xmat.T @ (x1 - xpos)
    side = xmat.T @ (side - xpos)
    inside = has_side & (math.safe_norm(side) < radius)
    sided = has_side & ~inside
    none = (math.safe_norm(p0) < MINVAL) | (math.safe_norm(p1) < MINVAL)
    # sphere: the plane of p0, p1 and the centre (another normal when they are parallel)
    axis0 = math.normalize(p0)
    normal = jnp.cross(p0, p1)
    parallel = math.safe_norm(normal) < MINVAL
    mag = jnp.abs(axis0)
    i = jnp.where((mag[1] > mag[0]) & (mag[1] > mag[2]), 1, jnp.where((mag[2] > mag[0]) & (mag[2] > mag[1]), 2, 0))
    other = jnp.where(jnp.arange(3) == i, 0.0, 1.0).astype(p0.dtype)
    normal = math.normalize(jnp.where(parallel, jnp.cross(axis0, other), normal))
    axis1 = math.normalize(jnp.cross(normal, axis0))
    ex, ey = jnp.eye(3, dtype=p0.dtype)[0], jnp.eye(3, dtype=p0.dtype)[1]
    axis0, axis1 = jnp.where(cylinder, ex, axis0), jnp.where(cylinder, ey, axis1)

    end = jnp.stack([p0 @ axis0, p0 @ axis1, p1 @ axis0, p1 @ axis1])
    len_in, pnt_in = _wrap_inside(end, radius)
    len_circ, pnt_circ = _wrap_circle(end, radius)
    len_side, pnt_side = _wrap_sided(end, jnp.stack([side @ axis0, side @ axis1]), radius)
    wlen = jnp.where(inside, len_in, jnp.where(sided, len_side, len_circ))
    pnt = jnp.where(inside, pnt_in, jnp.where(sided, pnt_side, pnt_circ))
    wrapped = ~none & (wlen >= 0)

    res0 = axis0 * pnt[0] + axis1 * pnt[1]
    res1 = axis0 * pnt[2] + axis1 * pnt[3]
    # cylinder: the arc rises linearly with path length between the two ends' heights
    l0 = math.safe_norm(p0[:2] - res0[:2])
    l1 = math.safe_norm(p1[:2] - res1[:2])
    total = l0 + wlen + l1
    z0 = p0[2] + (p1[2] - p0[2]) * _safe_div(l0, total)
    z1 = p0[2] + (p1[2] - p0[2]) * _safe_div(l0 + wlen, total)
    res0 = jnp.where(cylinder, res0.at[2].set(z0), res0)
    res1 = jnp.where(cylinder, res1.at[2].set(z1), res1)
    wlen = jnp.where(cylinder, math.safe_norm(jnp.stack([wlen, z1 - z0])), wlen)
    return jnp.where(wrapped, wlen, -1.0), xmat @ res0 + xpos, xmat @ res1 + xpos
