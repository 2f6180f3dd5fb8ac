"""Validation of a Model: every error names the field, the element and, in a batch, the world.

`check_model` runs at load (`from_mujoco`) and should be called after editing
parameters with `eqx.tree_at` outside of traced code. It accepts a single model or a
batch of models stacked along leading axes (as `jax.vmap` over models uses them).
`invalid_parameters` evaluates the rules a step cannot be computed without (non-finite values,
non-positive timestep, masses, inertias, sizes) in traced code: `step` flags a world whose model
breaks one (`WarningKind.BAD_MODEL`) and holds its state.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxtyping import Array, Bool

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
    """Evaluates the parameter rules on the host (`traced=False`: a rule raises naming the first bad
    entry) or for `step` (`traced=True`: a field whose values are known while tracing, a model closed
    over, is checked on the host at trace time and adds nothing to the program; each rule tests its
    traced fields once, stacked, and `flag` ORs the rules)."""

    def __init__(self, model: Model, traced: bool = False):
        self.model, self.traced = model, traced
        self.batch_ndim = 0 if traced else np.ndim(model.body_mass) - 1  # leading axes of a stacked batch of models
        self.found: list = []

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

    def leaf(self, field: str):
        value = getattr(self.model.opt, field[4:]) if field.startswith("opt.") else getattr(self.model, field)
        return value if isinstance(value, jax.core.Tracer) else np.asarray(value)

    def rule(self, fields, bad_of, what, row: int = 0, at_runtime: bool = False) -> None:
        """`bad_of(x)` marks the invalid entries of a field's values x, a NumPy array or a tracer (rows
        of `row` numbers along the last axis, or single numbers for row = 0); `what` says why (or makes
        the text from the field's values). `at_runtime`: `step` checks it too (values it cannot compute
        with; the others describe no real body but are computed as MuJoCo does, e.g. a negative
        friction is clamped, and finite differences may cross them)."""
        if self.traced and not at_runtime:
            return
        values = [self.leaf(f) for f in fields]
        tracers = [v for v in values if isinstance(v, jax.core.Tracer)]
        if tracers and not self.traced:
            raise TypeError("check_model reads the parameters' values on the host: call it outside jit and vmap "
                            "(inside, step flags an invalid model per world: WarningKind.BAD_MODEL)")  # fmt: skip
        for field, value in zip(fields, values):
            if isinstance(value, jax.core.Tracer):
                continue
            bad = bad_of(value)
            if self.traced:
                self.found += [jnp.ones(1, bool)] if np.any(bad) else []
                continue
            per_element = bad.shape[: self.batch_ndim + 1]
            if bad.ndim > len(per_element):  # several numbers per element: the element is bad if one is
                bad = bad.reshape(per_element + (int(np.prod(bad.shape[len(per_element) :])),)).any(-1)
            self.fail(field, bad, what(value) if callable(what) else what, element_axis=not field.startswith("opt."))
        if tracers:
            stacked = jnp.concatenate([jnp.reshape(v, (-1, row) if row else (-1,)) for v in tracers])
            self.found.append(jnp.ravel(bad_of(stacked)))

    @property
    def flag(self) -> Bool[Array, ""]:
        return jnp.any(jnp.concatenate(self.found)) if self.found else jnp.zeros((), bool)


def _arrays(model: Model) -> list[str]:
    return [f for f, v in vars(model).items() if hasattr(v, "dtype") and hasattr(v, "shape")]


def check_model(model: Model) -> None:
    """Raise ModelError naming the first invalid parameter: field, element (by name) and world."""
    c = _Checker(model)
    for field in _arrays(model):  # sizes: an edit with eqx.tree_at must keep each field's shape
        expected = _expected_shape(model, field)
        shape = np.shape(getattr(model, field))[c.batch_ndim :]
        if expected is not None and (
            len(shape) != len(expected) or any(e is not None and e != s for e, s in zip(expected, shape))
        ):
            raise ModelError(f"{field} has shape {shape}, expected {tuple('?' if e is None else e for e in expected)}")
    _parameter_rules(c)


def invalid_parameters(model: Model) -> Bool[Array, ""]:
    """True where a parameter's value breaks a rule marked `at_runtime` (one no step can be computed
    with): the traced check `step` runs, so a model edited inside jit or vmap (one world of a batch of
    models) is flagged (WarningKind.BAD_MODEL) instead of simulated wrongly. `check_model` on the host
    names the field."""
    c = _Checker(model, traced=True)
    _parameter_rules(c)
    return c.flag


_NON_NEGATIVE = ("dof_damping", "dof_armature", "tendon_armature", "actuator_damping", "actuator_armature",
                 "dof_frictionloss", "jnt_stiffness", "jnt_margin", "jnt_springyield", "tendon_springyield",
                 "geom_margin", "geom_gap", "pair_margin", "pair_gap", "actuator_delay", "sensor_delay",
                 "opt.density", "opt.viscosity")  # fmt: skip
_SOLREF = ("dof_solref", "jnt_solref", "geom_solref", "pair_solref", "pair_solreffriction", "eq_solref")
_SOLIMP = ("dof_solimp", "jnt_solimp", "geom_solimp", "pair_solimp", "eq_solimp")


def _solref_bad(ref):
    standard_bad = (ref[..., 0] > 0) & ~(ref[..., 1] > 0)  # negative damping ratio
    direct_bad = (ref[..., 0] <= 0) & (ref[..., 1] > 0)  # negative damping
    return standard_bad | direct_bad


def _solimp_bad(imp):
    return (
        (imp[..., 0] < 0) | (imp[..., 0] > 1) | (imp[..., 1] < 0) | (imp[..., 1] > 1) | (imp[..., 2] < 0)
        | (imp[..., 3] <= 0) | (imp[..., 3] >= 1) | (imp[..., 4] < 1)
    )  # fmt: skip


def _triangle_bad(inertia):
    i1, i2, i3 = inertia[..., 0], inertia[..., 1], inertia[..., 2]
    slack = 1e-6 * (i1 + i2 + i3)
    return (i1 + i2 < i3 - slack) | (i1 + i3 < i2 - slack) | (i2 + i3 < i1 - slack)


def _parameter_rules(c: _Checker) -> None:
    """check_model's rules on the parameters' values (the same for the host and the traced check)."""
    model = c.model
    arrays = _arrays(model)
    options = ["opt.timestep", "opt.gravity", "opt.impratio", "opt.density", "opt.viscosity", "opt.wind"]
    floating = [f for f in arrays + options if np.issubdtype(c.leaf(f).dtype, np.floating)]
    # the inputs first: a non-finite geom size makes the inertia compiled from it non-finite too
    floating = [f for f in floating if f not in _DERIVED] + [f for f in floating if f in _DERIVED]
    overflow = " (float32 holds magnitudes up to 3.4e38; larger become inf)" if model.dtype == np.float32 else ""
    c.rule(floating, lambda x: ~(jnp.isfinite(x) if isinstance(x, jax.core.Tracer) else np.isfinite(x)),
           lambda x: "non-finite value" + (overflow if np.isinf(x).any() else ""), at_runtime=True)  # fmt: skip
    c.rule(("opt.timestep", "opt.impratio"), lambda x: ~(x > 0), "must be positive", at_runtime=True)
    c.rule(_NON_NEGATIVE, lambda x: x < 0, "must be non-negative")
    c.rule(("geom_friction", "pair_friction"), lambda x: x < 0, "friction coefficients must be non-negative")
    if not model.opt.fluid:  # the fluid model is chosen at load; a medium added later would be ignored
        c.rule(("opt.density", "opt.viscosity"), lambda x: x != 0, "is nonzero but the model was loaded without "
               "a medium: fluid forces are compiled in when the MJCF's option/density or option/viscosity is nonzero")  # fmt: skip

    topo = model.topology
    moving = np.asarray(topo.body_jntnum) > 0  # MuJoCo's rule: welded (jointless) children may be massless
    c.rule(("body_mass",), lambda x: moving & ~(x > 0), "must be positive for a moving body", at_runtime=True)
    c.rule(("body_inertia",), lambda x: moving[:, None] & ~(x > 0), "principal inertias must be positive for a moving body",
           row=3, at_runtime=True)  # fmt: skip
    c.rule(("body_mass", "body_inertia"), lambda x: x < 0, "must be non-negative")
    c.rule(("body_inertia",), _triangle_bad, "principal inertias violate the triangle inequality (no rigid body has them)", row=3)

    gtype = np.asarray(topo.geom_type)
    used = np.arange(3)[None, :] < np.asarray([_GEOM_SIZES.get(int(t), 0) for t in gtype])[:, None]
    c.rule(("geom_size",), lambda x: used & ~(x > 0), "sizes must be positive", row=3, at_runtime=True)

    c.rule(_SOLREF, _solref_bad, "invalid solref: (timeconst > 0, dampratio > 0) or (-stiffness <= 0, -damping <= 0)", row=2)
    c.rule(_SOLIMP, _solimp_bad, "invalid solimp: need 0 <= dmin, dmax <= 1, width >= 0, 0 < midpoint < 1, power >= 1", row=5)

    quat_joint = np.asarray([t in (JointType.FREE, JointType.BALL) for t in topo.jnt_type], bool)
    for field, checked in (("actuator_ctrlrange", topo.actuator_ctrllimited), ("actuator_forcerange", topo.actuator_forcelimited),
                           ("actuator_actrange", topo.actuator_actlimited), ("jnt_range", ~quat_joint)):  # fmt: skip
        checked = np.asarray(checked, bool)
        c.rule((field,), lambda r, checked=checked: checked & (r[..., 0] > r[..., 1]), "range lower bound exceeds upper bound", row=2)
    if DynType.DCMOTOR in topo.actuator_dyntype:
        _check_dc_motors(c, topo)


def _check_dc_motors(c: _Checker, topo) -> None:
    """A DC motor's states are fixed at load by the signs of their parameters (slewmax, ki, thermal
    resistance, LuGre stiffness, electrical time constant): an edit that would add or remove one fails."""
    slots = np.asarray(topo.actuator_dcmotor_slots, dtype=np.int64)
    motor = np.asarray(topo.actuator_dyntype) == DynType.DCMOTOR
    for k, (array, column, name) in enumerate(dcmotor.SLOT_PARAMETERS):
        field = f"actuator_{array}"
        present = slots[:, k] >= 0
        c.rule((field,), lambda x, column=column, present=present: motor & ((x[..., column] > 0) != present),
               f"a DC motor's {name} changed sign: its activation state is fixed when the model is loaded (reload the MJCF)",
               row=np.shape(c.leaf(field))[-1])  # fmt: skip
