"""Optional smoothing of MuJoCo's discrete case switches (`Option.collision_smoothing`).

Some narrow-phase functions choose one of several candidate answers with a hard
comparison: the box face nearest a sphere centre that is inside the box (also used by
capsule-box at points of the capsule axis), the cylinder side or cap nearest a sphere
centre inside the cylinder. The depth is continuous at such a switch but its gradient
jumps, and the contact normal flips.

With `collision_smoothing = tau > 0` (a length in model units, static) the choice becomes
a softmax over the candidates' depths with temperature tau, and dist, pos and normal are
the weighted blend of the candidates' (normal renormalised). The result is smooth, its
gradient is the exact derivative of what the forward pass computes, and it equals
MuJoCo's answer up to exp(-gap/tau), where gap is how much deeper the runner-up is.
Within a few tau of a switch it differs from MuJoCo (dist by at most about 0.3 tau).
Off by default, so the forward pass matches MuJoCo.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def blend(scores: Float[Array, " k"], candidates, tau: float):
    """softmax(-scores / tau)-weighted sum of `candidates` (a pytree, leading axis k)."""
    w = jax.nn.softmax(-scores / tau)
    return jax.tree.map(lambda c: jnp.tensordot(w.astype(c.dtype), c, axes=1), candidates)
