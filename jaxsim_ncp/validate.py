"""Host-side validation of a Model: every error names the field, the element and, in a batch, the world.

`check_model` runs at load (`from_mujoco`) and should be called after editing
parameters with `eqx.tree_at` outside of traced code. It accepts a single model or a
batch of models stacked along leading axes (as `jax.vmap` over models uses them).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from . import dcmotor
from .types import Data, DynType, JointType, Model

_GEOM_SIZES = {2: 1, 3: 2, 4: 3, 5: 2, 6: 3}  # sphere, capsule, ellipsoid, cylinder, box: sizes used
_SHAPE_SPEC = re.compile(r"[\"']\s*([^\"']*)[\"']")
# fields MuJoCo's compiler derives from others (inertia from geom sizes, invweights from inertia):
# a non-finite input makes these non-finite too, so they are checked last and the input is named
_DERIVED = ("body_mass", "body_inertia", "body_ipos", "body_iquat", "body_invweight0", "dof_invweight0",
            "tendon_invweight0", "geom_rbound", "actuator_lengthrange", "actuator_acc0")  # fmt: skip


class ModelError(ValueError):
    """A model parameter is invalid (non-finite, unphysical or of the wrong size)."""


def _element(model: Model, field: str, index: int) -> str:
    """'body "arm"', 'joint "hinge" (dof 2)', 'geom #3', ... for entry `index` of `field`."""
    topo = model.topology

    def named(kind: str, names: tuple[str, ...], i: int) -> str:
        return f'{kind} "{names[i]}"' if i < len(names) and names[i] else f"{kind} #{i}"

    if field.startswith("body_"):
        return named("body", topo.body_names, index)
    if field.startswith("jnt_"):
        return named("joint", topo.jnt_names, index)
    if field.startswith("dof_"):
        return named("joint", topo.jnt_names, topo.dof_jntid[index]) + f" (dof {index})"
    if field in ("qpos0", "qpos_spring"):
        joint = max(j for j, adr in enumerate(topo.jnt_qposadr) if adr <= index)
        return named("joint", topo.jnt_names, joint) + f" (qpos {index})"
    if field.startswith("geom_"):
        return named("geom", topo.geom_names, index)
    if field == "actuator_ctrlrange" and topo.actuator_ctrladr:  # per control: the actuator whose block holds it
        actuator = max(a for a, adr in enumerate(topo.actuator_ctrladr) if adr <= index)
        return named("actuator", topo.actuator_names, actuator) + f" (ctrl {index})"
    if field.startswith("actuator_"):
        return named("actuator", topo.actuator_names, index)
    if field.startswith("pair_"):
        return f"contact pair #{index}"
    if field.startswith("eq_"):
        return f"equality #{index}"
    if field.startswith("tendon_"):
        return named("tendon", topo.tendon_names, index)
    if field.startswith("mesh_"):
        return named("mesh", topo.mesh_names, index)
    for prefix, kind in (("site_", "site"), ("wrap_", "tendon path element"), ("sensor_", "sensor")):
        if field.startswith(prefix):
            return f"{kind} #{index}"
    return "option"


def _expected_shape(model: Model, field: str, cls: type = Model) -> tuple[int | None, ...] | None:
    """Shape of `cls`'s field from its jaxtyping annotation ("nbody 3" -> (nbody, 3)); None entries are free."""
    annotation = cls.__annotations__.get(field, "")
    match = _SHAPE_SPEC.search(str(annotation))
    if match is None:
        return None
    sizes = {"nbody": model.nbody, "njnt": model.njnt, "nv": model.nv, "nq": model.nq, "nu": model.nu, "nactuator": model.nactuator, "na": model.na,
             "ngeom": model.ngeom, "neq": len(model.eq_obj1id), "nmocap": model.topology.nmocap,
             "nhistory": model.topology.nhistory, "nplastic": model.topology.nplastic}  # fmt: skip
    dims = match.group(1).split()
    return tuple(int(d) if d.isdigit() else sizes.get(d) for d in dims)


# the fields of Data that a step reads rather than derives
_DATA_INPUTS = ("time", "qpos", "qvel", "act", "ctrl", "qfrc_applied", "xfrc_applied", "mocap_pos", "mocap_quat",
                "eq_active", "qacc_warmstart", "history", "plastic")  # fmt: skip


def conform_data(model: Model, data: Data) -> Data:
    """`data` with every floating array in the model's dtype (the model sets the precision: float64
    state into a float32 model is computed in float32), after checking at trace time that the state
    and input fields have one world's sizes for this model (ValueError naming the field)."""
    for field in _DATA_INPUTS:
        expected, shape = _expected_shape(model, field, Data), np.shape(getattr(data, field))
        if shape != expected:
            hint = " (a batch of worlds goes through jax.vmap)" if shape[1:] == expected else ""
            raise ValueError(f"data.{field} has shape {shape}, expected {expected} for this model{hint}")
    dtype = model.dtype

    def cast(x):
        floating = x is not None and jnp.issubdtype(jnp.result_type(x), jnp.floating)
        return jnp.asarray(x, dtype) if floating and jnp.result_type(x) != dtype else x

    return jax.tree.map(cast, data).replace(eq_active=jnp.asarray(data.eq_active, bool))  # 0 / 1 switches too


class _Checker:
    def __init__(self, model: Model):
        self.model = model
        self.batch_ndim = np.ndim(model.body_mass) - 1  # leading axes of a stacked batch of models

    def fail(self, field: str, bad: np.ndarray, what: str, element_axis: bool = True) -> None:
        """Raise naming the first True entry of `bad` (batch axes first, then the element index)."""
        if not np.any(bad):
            return
        where = np.argwhere(bad)[0]
        world = f" in world {tuple(int(i) for i in where[: self.batch_ndim])}" if self.batch_ndim else ""
        element = ""
        if element_axis and len(where) > self.batch_ndim:
            element = f" of {_element(self.model, field, int(where[self.batch_ndim]))}"
        raise ModelError(f"{field}{element}{world}: {what}")

    def leaf(self, field: str) -> np.ndarray:
        if field.startswith("opt."):
            return np.asarray(getattr(self.model.opt, field[4:]))
        return np.asarray(getattr(self.model, field))


def check_model(model: Model) -> None:
    """Raise ModelError naming the first invalid parameter: field, element (by name) and world."""
    c = _Checker(model)
    arrays = [f for f, v in vars(model).items() if hasattr(v, "dtype") and hasattr(v, "shape")]
    for field in arrays:  # sizes: an edit with eqx.tree_at must keep each field's shape
        expected = _expected_shape(model, field)
        shape = np.shape(getattr(model, field))[c.batch_ndim :]
        if expected is not None and (
            len(shape) != len(expected) or any(e is not None and e != s for e, s in zip(expected, shape))
        ):
            raise ModelError(f"{field} has shape {shape}, expected {tuple('?' if e is None else e for e in expected)}")
    options = ["opt.timestep", "opt.gravity", "opt.impratio", "opt.density", "opt.viscosity", "opt.wind"]
    inputs = [f for f in arrays if f not in _DERIVED] + options
    for field in inputs + [f for f in arrays if f in _DERIVED]:
        value = c.leaf(field)
        hint = " (float32 holds magnitudes up to 3.4e38; larger become inf)" if value.dtype == np.float32 else ""
        c.fail(field, ~np.isfinite(value), "non-finite value" + (hint if np.isinf(value).any() else ""))

    c.fail("opt.timestep", ~(c.leaf("opt.timestep") > 0), "must be positive", element_axis=False)
    c.fail("opt.impratio", ~(c.leaf("opt.impratio") > 0), "must be positive", element_axis=False)
    for field in ("opt.density", "opt.viscosity"):
        c.fail(field, c.leaf(field) < 0, "must be non-negative", element_axis=False)
        if not model.opt.fluid:  # the fluid model is chosen at load; a medium added later would be ignored
            c.fail(field, c.leaf(field) != 0, "is nonzero but the model was loaded without a medium: fluid forces "
                   "are compiled in when the MJCF's option/density or option/viscosity is nonzero", element_axis=False)  # fmt: skip

    topo = model.topology
    moving = np.asarray(topo.body_jntnum) > 0  # MuJoCo's rule: welded (jointless) children may be massless
    mass, inertia = c.leaf("body_mass"), c.leaf("body_inertia")
    c.fail("body_mass", (mass < 0) | (moving & ~(mass > 0)), "must be positive for a moving body (non-negative otherwise)")
    c.fail("body_inertia", np.any((inertia < 0) | (moving[:, None] & ~(inertia > 0)), axis=-1),
           "principal inertias must be positive for a moving body (non-negative otherwise)")  # fmt: skip
    i1, i2, i3 = inertia[..., 0], inertia[..., 1], inertia[..., 2]
    slack = 1e-6 * (i1 + i2 + i3)
    c.fail("body_inertia", (i1 + i2 < i3 - slack) | (i1 + i3 < i2 - slack) | (i2 + i3 < i1 - slack),
           "principal inertias violate the triangle inequality (no rigid body has them)")  # fmt: skip

    for field in ("dof_damping", "dof_armature", "tendon_armature", "actuator_damping", "actuator_armature", "dof_frictionloss", "jnt_stiffness", "jnt_margin",
                  "jnt_springyield", "tendon_springyield",
                  "geom_margin", "geom_gap", "pair_margin", "pair_gap", "actuator_delay", "sensor_delay"):  # fmt: skip
        c.fail(field, c.leaf(field) < 0, "must be non-negative")
    for field in ("geom_friction", "pair_friction"):
        c.fail(field, np.any(c.leaf(field) < 0, axis=-1), "friction coefficients must be non-negative")

    size = c.leaf("geom_size")
    gtype = np.asarray(topo.geom_type)
    used = np.arange(3)[None, :] < np.asarray([_GEOM_SIZES.get(int(t), 0) for t in gtype])[:, None]
    c.fail("geom_size", np.any(used & ~(size > 0), axis=-1), "sizes must be positive")

    for field in ("dof_solref", "jnt_solref", "geom_solref", "pair_solref", "pair_solreffriction", "eq_solref"):
        ref = c.leaf(field)
        standard_bad = (ref[..., 0] > 0) & ~(ref[..., 1] > 0)  # negative damping ratio
        direct_bad = (ref[..., 0] <= 0) & (ref[..., 1] > 0)  # negative damping
        c.fail(field, standard_bad | direct_bad,
               "invalid solref: (timeconst > 0, dampratio > 0) or (-stiffness <= 0, -damping <= 0)")  # fmt: skip
    for field in ("dof_solimp", "jnt_solimp", "geom_solimp", "pair_solimp", "eq_solimp"):
        imp = c.leaf(field)
        bad = (
            (imp[..., 0] < 0) | (imp[..., 0] > 1) | (imp[..., 1] < 0) | (imp[..., 1] > 1) | (imp[..., 2] < 0)
            | (imp[..., 3] <= 0) | (imp[..., 3] >= 1) | (imp[..., 4] < 1)
        )  # fmt: skip
        c.fail(field, bad, "invalid solimp: need 0 <= dmin, dmax <= 1, width >= 0, 0 < midpoint < 1, power >= 1")

    for field, limited in (("actuator_ctrlrange", topo.actuator_ctrllimited),
                           ("actuator_forcerange", topo.actuator_forcelimited),
                           ("actuator_actrange", topo.actuator_actlimited)):  # fmt: skip
        rng = c.leaf(field)
        c.fail(field, np.asarray(limited, bool) & (rng[..., 0] > rng[..., 1]), "range lower bound exceeds upper bound")
    if DynType.DCMOTOR in topo.actuator_dyntype:
        _check_dc_motors(c, topo)
    quat_joint = np.asarray([t in (JointType.FREE, JointType.BALL) for t in topo.jnt_type], bool)
    jrange = c.leaf("jnt_range")
    c.fail("jnt_range", ~quat_joint & (jrange[..., 0] > jrange[..., 1]), "range lower bound exceeds upper bound")


def _check_dc_motors(c: _Checker, topo) -> None:
    """A DC motor's states are fixed at load by the signs of their parameters (slewmax, ki, thermal
    resistance, LuGre stiffness, electrical time constant): an edit that would add or remove one fails."""
    slots = np.asarray(topo.actuator_dcmotor_slots, dtype=np.int64)
    motor = np.asarray(topo.actuator_dyntype) == DynType.DCMOTOR
    for k, (array, column, name) in enumerate(dcmotor.SLOT_PARAMETERS):
        field = f"actuator_{array}"
        c.fail(field, motor & ((c.leaf(field)[..., column] > 0) != (slots[:, k] >= 0)),
               f"a DC motor's {name} changed sign: its activation state is fixed when the model is loaded (reload the MJCF)")
