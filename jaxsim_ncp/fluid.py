"""Fluid forces (mj_fluid): drag, lift and added mass of bodies moving through a medium.

Active when the model's `option/density` or `option/viscosity` is nonzero. Each body with
mass moves through a fluid of density rho and viscosity beta blowing at `option/wind`; its
velocity relative to the wind, in a local frame, gives a local wrench that is applied at the
frame's origin (mj_applyFT). Two models, chosen per body as MuJoCo chooses:

* inertia box (default): the box with the body's mass and principal inertia,
  b_x = sqrt(6 (I_y + I_z - I_x) / m) etc., in the inertial frame (xipos, ximat);
  viscous (Stokes) drag of the sphere of diameter d = mean(b): torque -pi d^3 beta w,
  force -3 pi d beta v; quadratic drag: force_x -= rho/2 b_y b_z |v_x| v_x, torque_x -=
  rho b_x (b_y^4 + b_z^4) / 64 |w_x| w_x (and cyclically).
* ellipsoid (any geom of the body with `fluidshape="ellipsoid"`): per such geom, the
  ellipsoid of its semi-axes in the geom frame (geom_xpos, geom_xmat), with the coefficients
  MuJoCo compiles into geom_fluid (interaction, blunt/slender/angular drag, Kutta and Magnus
  lift, virtual mass and inertia): added-mass gyroscopic terms, Magnus lift rho V c_M w x v,
  Kutta lift, and linear plus quadratic drag of the projected area (MuJoCo's Computation
  chapter, "Fluid forces", and Tasora et al.).

Every coefficient is a model leaf (body_mass, body_inertia, geom_size, geom_fluid,
opt.density, opt.viscosity, opt.wind), so fluid parameters can be identified by gradient.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import math, smooth
from .collision.primitives import CAPSULE, CYLINDER, SPHERE
from .types import Data, Model

_MINVAL = 1e-15  # mjMINVAL


def _inertia_box(model: Model, w, v, body: np.ndarray):
    """Local torque and force of the inertia-box model (mj_inertiaBoxFluidModel)."""
    mass = model.body_mass[body][:, None]
    inertia = model.body_inertia[body]
    total = jnp.sum(inertia, axis=-1, keepdims=True)
    box = jnp.sqrt(jnp.maximum(_MINVAL, total - 2.0 * inertia) / jnp.maximum(mass, _MINVAL) * 6.0)
    rho, beta = model.opt.density, model.opt.viscosity
    diam = jnp.mean(box, axis=-1, keepdims=True)
    torque = -jnp.pi * diam**3 * beta * w
    force = -3.0 * jnp.pi * diam * beta * v
    bx, by, bz = box[:, 0], box[:, 1], box[:, 2]
    area = jnp.stack([by * bz, bx * bz, bx * by], axis=-1)
    force = force - 0.5 * rho * area * jnp.abs(v) * v
    arm = jnp.stack([bx * (by**4 + bz**4), by * (bx**4 + bz**4), bz * (bx**4 + by**4)], axis=-1)
    torque = torque - rho * arm * jnp.abs(w) * w / 64.0
    return torque, force


def semi_axes(types: np.ndarray, size: Float[Array, "n 3"]) -> Float[Array, "n 3"]:
    """The ellipsoid standing in for each geom (mju_geomSemiAxes)."""
    r, second = size[:, 0], size[:, 1]
    sphere = jnp.stack([r, r, r], axis=-1)
    capsule = jnp.stack([r, r, second + r], axis=-1)
    cylinder = jnp.stack([r, r, second], axis=-1)
    t = np.asarray(types)[:, None]
    return jnp.where(t == SPHERE, sphere, jnp.where(t == CAPSULE, capsule, jnp.where(t == CYLINDER, cylinder, size)))


def _safe_sqrt(x):
    """sqrt with a finite derivative at 0 (where the terms it scales vanish)."""
    return jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)


def _positive(x):
    """x where positive, else 1: a divisor whose quotient is multiplied away where x is 0."""
    return jnp.where(x > 0, x, 1.0)


def _ellipsoid(model: Model, w, v, size, coef):
    """Local torque and force of the ellipsoid model (mj_ellipsoidFluidModel): added mass
    (mj_addedMassForces without the acceleration term) and mj_viscousForces."""
    rho, beta = model.opt.density, model.opt.viscosity
    interaction, blunt, slender, angular, kutta, magnus = (coef[:, k] for k in range(6))
    virtual_mass, virtual_inertia = coef[:, 6:9], coef[:, 9:12]
    # added mass: the fluid's momentum moving with the body
    lin_mom = rho * virtual_mass * v
    ang_mom = rho * virtual_inertia * w
    torque = jnp.cross(lin_mom, v) + jnp.cross(ang_mom, w)
    force = jnp.cross(lin_mom, w)
    # lift and drag
    s0, s1, s2 = size[:, 0], size[:, 1], size[:, 2]
    volume = 4.0 / 3.0 * jnp.pi * s0 * s1 * s2
    d_max, d_min = jnp.max(size, axis=-1), jnp.min(size, axis=-1)
    d_mid = jnp.sum(size, axis=-1) - d_max - d_min
    area_max = jnp.pi * d_max * d_mid
    magnus_force = (magnus * rho * volume)[:, None] * jnp.cross(w, v)
    # the ellipsoid projected along the flow, computed in the flow's unit direction u with the
    # squared cross-section products cross_sq scaled to at most 1 (A_proj and the lift are
    # homogeneous in both, so no power of a small speed or size underflows); MuJoCo 4 floors
    # nothing here and has no projected area (nor lift) below |v| = MINVAL
    cross_sq = jnp.stack([(s1 * s2) ** 2, (s2 * s0) ** 2, (s0 * s1) ** 2], axis=-1)
    scale = jnp.max(cross_sq, axis=-1)
    c = cross_sq / _positive(scale)[:, None]
    speed = math.safe_norm(v)
    moving = speed > _MINVAL
    u = v / jnp.where(moving, speed, 1.0)[:, None]
    proj_num = jnp.sum(c * u**2, axis=-1)  # proj_num / (|v|^2 scale)
    proj_denom = jnp.sum(c**2 * u**2, axis=-1)  # proj_denom / (|v|^2 scale^2)
    area_proj = jnp.where(moving, jnp.pi * _safe_sqrt(scale * proj_denom / _positive(proj_num)), 0.0)
    # Kutta lift: circulation kutta rho cos(alpha) A_proj (n x v) with the (not unit) normal
    # n = cross_sq v and cos(alpha) = proj_num / (|v| proj_denom); force circulation x v
    lift = kutta * rho * area_proj * proj_num / _positive(proj_denom) * speed**2
    kutta_force = lift[:, None] * jnp.cross(jnp.cross(c * u, u), u)
    sphere_diam = 2.0 / 3.0 * jnp.sum(size, axis=-1)
    moment_max = 8.0 / 15.0 * jnp.pi * d_mid * d_max**4
    # per axis k: the largest moment of the ellipsoid about axis k, 8/15 pi s_k max(s_k+1, s_k+2)^4
    others = jnp.maximum(jnp.roll(size, -1, axis=-1), jnp.roll(size, -2, axis=-1))
    moments = 8.0 / 15.0 * jnp.pi * size * others**4
    mom_visc = w * (angular[:, None] * moments + slender[:, None] * (moment_max[:, None] - moments))
    drag_lin = beta * 3.0 * jnp.pi * sphere_diam + rho * speed * (area_proj * blunt + slender * (area_max - area_proj))
    drag_ang = beta * jnp.pi * sphere_diam**3 + rho * math.safe_norm(mom_visc)
    torque = torque - drag_ang[:, None] * w
    force = force + magnus_force + kutta_force - drag_lin[:, None] * v
    return interaction[:, None] * torque, interaction[:, None] * force


def enabled(model: Model) -> bool:
    """Fluid forces take part: a medium at load, and not both springs and dampers disabled (mj_passive)."""
    return model.opt.fluid and not (model.opt.disabled("spring") and model.opt.disabled("damper"))


def _frame_force(model: Model, data: Data, body: np.ndarray, pos, rot, local_wrench):
    """Generalized force of the local wrenches local_wrench(w, v) of frames (pos, rot) fixed to
    `body`, w and v their velocity relative to the wind in their own axes; massless bodies skipped."""
    w, v = smooth.object_velocity(model, data, body, pos, rot)
    torque, force = local_wrench(w, v - jnp.einsum("nji,j->ni", rot, model.opt.wind))
    has_mass = (model.body_mass[body] >= _MINVAL)[:, None]
    world = lambda x: jnp.einsum("nij,nj->ni", rot, jnp.where(has_mass, x, 0.0))  # noqa: E731
    return jnp.sum(smooth.wrench_moment(model, data, body, pos, world(force), world(torque)), axis=0)


def fluid_force(model: Model, data: Data) -> Float[Array, " nv"]:
    """qfrc_fluid: the generalized force of the fluid on every body with mass (mj_fluid)."""
    topo = model.topology
    qfrc = jnp.zeros(model.nv, model.dtype)
    uses_ellipsoid = np.asarray(topo.body_fluid_ellipsoid, dtype=bool)
    boxes = np.nonzero(~uses_ellipsoid[1:])[0] + 1  # the world body has no mass
    if len(boxes):
        box = lambda w, v: _inertia_box(model, w, v, boxes)  # noqa: E731
        qfrc = qfrc + _frame_force(model, data, boxes, data.xipos[boxes], data.ximat[boxes], box)
    geom_body = np.asarray(topo.geom_bodyid, dtype=np.int64)
    geoms = np.nonzero(uses_ellipsoid[geom_body] & np.asarray(topo.geom_fluid_interaction, dtype=bool))[0]
    if len(geoms):
        size = semi_axes(np.asarray(topo.geom_type)[geoms], model.geom_size[geoms])
        ellipsoid = lambda w, v: _ellipsoid(model, w, v, size, model.geom_fluid[geoms])  # noqa: E731
        qfrc = qfrc + _frame_force(model, data, geom_body[geoms], data.geom_xpos[geoms], data.geom_xmat[geoms], ellipsoid)
    return qfrc
