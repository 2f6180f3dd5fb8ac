"""Contacts from distance (CFD): contact gradients before bodies touch, forward pass unchanged.

DiffMJX (Paulus, Geist et al., Sec. 5, Fig. 6, Suppl. B.3): a second, *gradient-only*
contact model reports contacts out to `width` beyond each pair's margin and lets them
push weakly:

- impedance: MuJoCo's d(r) for r <= 0; for 0 < r < width it continues from d(0) and
  tapers to `dmin` at r = width along MuJoCo's spline (midpoint, power), so d and its
  slope are continuous at r = 0 (`constraint.cfd_impedance`);
- reference acceleration: the position term uses -s softplus(-r / s) instead of r
  (s = `softness`), about r in penetration and a small push apart beyond it
  (`reference_distance`: held at r = 50 s, so it never underflows within `width`).

Only contact rows are extended (`constraint.make_efc(..., cfd=...)`).

The step then runs both models and combines them with the straight-through trick on
the dynamics (eq. S8), `x_dot = sg(F) + (F_cfd - sg(F_cfd))` (`straight_through`): the
forward value is F's bit for bit, the derivative is F_cfd's, taken at the unmodified
trajectory. With the hard-contact NCP the gradient-only model relaxes the gap
complementarity of units within `width` instead (`forward._ncp_solve`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float


@dataclasses.dataclass(frozen=True)
class CFD:
    """Contacts-from-distance settings: `load_mjcf(..., cfd=CFD(width=0.1))`.

    width: distance beyond the margin (metres) out to which contacts push in the
        gradient model; the only required argument.
    dmin: impedance reached at `width` (the paper's d_c = 0, floored by MuJoCo's
        mjMINIMP = 1e-4 like every impedance).
    midpoint, power: shape of the taper (MuJoCo's solimp spline; defaults as solimp's).
    softness: length of the softplus on the reference distance; default width / 100.
    pairs: geom-name pairs (either order) that reach out to `width`, e.g.
        `(("cue", "object"),)` for the tool and the object only; every other pair keeps
        MuJoCo's contacts in the gradient model too. None (default): every pair.
    """

    width: float
    dmin: float = 0.0
    midpoint: float = 0.5
    power: float = 2.0
    softness: float | None = None
    pairs: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self):
        checks = (
            ("width", self.width, lambda v: v > 0),
            ("dmin", self.dmin, lambda v: 0 <= v < 1),
            ("midpoint", self.midpoint, lambda v: 0 < v < 1),
            ("power", self.power, lambda v: v >= 1),
            ("softness", self.softplus_length, lambda v: v > 0),
        )
        for name, value, ok in checks:
            if not (isinstance(value, (int, float)) and math.isfinite(value) and ok(value)):
                raise ValueError(f"CFD {name} is invalid: {value!r} (width > 0, 0 <= dmin < 1, 0 < midpoint < 1, power >= 1, softness > 0)")
        if self.pairs is not None:
            ok = lambda p: isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(n, str) for n in p)  # noqa: E731
            if isinstance(self.pairs, str) or not self.pairs or not all(ok(p) for p in self.pairs):
                raise ValueError(f"CFD pairs must be a non-empty sequence of (geom name, geom name) pairs, got {self.pairs!r}")
            object.__setattr__(self, "pairs", tuple(tuple(p) for p in self.pairs))  # hashable: the option is static

    @property
    def softplus_length(self) -> float:
        """The softplus length actually used."""
        return self.width / 100 if self.softness is None else self.softness


def pair_mask(pairs: tuple[tuple[str, str], ...] | None, geom_names: tuple[str, ...]) -> Bool[np.ndarray, "ngeom ngeom"] | None:
    """Which geom pairs reach out to the width (symmetric) given `CFD.pairs`; None where every pair does.

    Raises ValueError naming a geom of `pairs` that the model does not have."""
    if pairs is None:
        return None
    index = {name: i for i, name in enumerate(geom_names) if name}
    mask = np.zeros((len(geom_names), len(geom_names)), bool)
    for a, b in pairs:
        for name in (a, b):
            if name not in index:
                raise ValueError(f"CFD pairs: the model has no geom named {name!r}")
        mask[index[a], index[b]] = mask[index[b], index[a]] = True
    return mask


def pair_reach(cfd: CFD, geom_names: tuple[str, ...]) -> Float[np.ndarray, "ngeom ngeom"]:
    """Extra detection distance of each geom pair in the gradient model's collision: `width`
    for the pairs of `cfd.pairs` (every pair by default), 0 for the rest."""
    mask = pair_mask(cfd.pairs, geom_names)
    n = len(geom_names)
    return cfd.width * (np.ones((n, n), bool) if mask is None else mask)


_FAR = 50.0  # softness lengths beyond which the push apart is held constant (e^-50: far above float32's underflow)


def reference_distance(r: Array, softness: float) -> Array:
    """The position term's distance, -s softplus(-min(r / s, 50)): about r in penetration, a push
    apart decaying as s e^(-r/s) beyond the surface, held at its value at r = 50 s from there on.

    What makes a far contact push at all is that this push is positive: in float32 e^(-r/s)
    underflows to 0 beyond about 87 s (0.87 width by default), which left contacts farther out,
    though within `width`, with no force and an exactly zero gradient."""
    return -softness * jax.nn.softplus(-jnp.minimum(r / softness, _FAR))


@jax.custom_jvp
def straight_through(value: Array, surrogate: Array) -> Array:
    """sg(value) + (surrogate - sg(surrogate)) (eq. S8): `value` bit for bit, `surrogate`'s derivative.

    Where the surrogate is not finite it contributes no gradient. A custom JVP, so that a program
    that differentiates nothing (a plain rollout) does not compute the surrogate at all (XLA drops it).
    """
    return value


@straight_through.defjvp
def _straight_through_jvp(primals, tangents):
    value, surrogate = primals
    return value, jnp.where(jnp.isfinite(surrogate), tangents[1], jnp.zeros_like(tangents[1]))
