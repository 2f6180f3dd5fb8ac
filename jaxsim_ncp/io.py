"""MJCF / mujoco.MjModel -> Model, with clear errors for what we do not simulate."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings

import jax.numpy as jnp
import mujoco
import numpy as np

from . import collision, dcmotor, ray, sensor
from .cfd import CFD, pair_mask
from .collision import FUNCTIONS
from .collision.hfield import HFIELD, PARTNERS as HFIELD_PARTNERS, window as hfield_window
from .collision.convex import FUNCTIONS as CONVEX_FUNCTIONS
from .collision.mesh import FUNCTIONS as MESH_FUNCTIONS, MESH, MULTICCD_PAIRS as MESH_MULTICCD_PAIRS
from .collision.primitives import PLANE
from .collision.multiccd import PAIRS as MULTICCD_PAIRS
from .integrate import adaptive
from .types import (
    BiasType,
    ConstraintLayout,
    PairGroup,
    DynType,
    GainType,
    JointType,
    Keyframes,
    Model,
    Option,
    Topology,
    UnsupportedFeatureError,
    default_dtype,
)
from .validate import ModelError, check_model


def _keyframes(m: mujoco.MjModel, f) -> Keyframes:
    """mjModel.key_* (the compiler has filled what a <key> leaves out: qpos0, body poses, zeros)."""
    n = m.nkey
    return Keyframes(
        time=f(m.key_time), qpos=f(np.reshape(m.key_qpos, (n, m.nq))), qvel=f(np.reshape(m.key_qvel, (n, m.nv))),
        act=f(np.reshape(m.key_act, (n, m.na))), ctrl=f(np.reshape(m.key_ctrl, (n, m.nu))),
        mocap_pos=f(np.reshape(m.key_mpos, (n, m.nmocap, 3))), mocap_quat=f(np.reshape(m.key_mquat, (n, m.nmocap, 4))),
        plastic=f(np.reshape(m.key_plastic, (n, m.nplastic))),
    )


class MJCFError(ValueError):
    """The MJCF could not be read or compiled (message from the MuJoCo compiler)."""


_INTEGRATORS = {
    int(mujoco.mjtIntegrator.mjINT_EULER): "euler",
    int(mujoco.mjtIntegrator.mjINT_RK4): "rk4",
    int(mujoco.mjtIntegrator.mjINT_IMPLICITFAST): "implicitfast",
    int(mujoco.mjtIntegrator.mjINT_IMPLICIT): "implicit",
}
_SUPPORTED_INTEGRATORS = ("euler", "implicitfast", "implicit", "rk4", "adaptive")
# option/solver: MuJoCo's PGS (a dual method) is solved by the primal Newton method: the same optimum
_SOLVERS = {int(mujoco.mjtSolver.mjSOL_NEWTON): "newton", int(mujoco.mjtSolver.mjSOL_CG): "cg",
            int(mujoco.mjtSolver.mjSOL_PGS): "newton"}  # fmt: skip
_CONE = {int(mujoco.mjtCone.mjCONE_PYRAMIDAL): "pyramidal", int(mujoco.mjtCone.mjCONE_ELLIPTIC): "elliptic"}
_DISABLE_NAMES = {
    int(getattr(mujoco.mjtDisableBit, name)): name[len("mjDSBL_") :].lower()
    for name in dir(mujoco.mjtDisableBit)
    if name.startswith("mjDSBL_") and name != "mjNDISABLE"
}
# pairs MuJoCo collides with its convex collider (mjc_Convex, mjc_ConvexHField: GJK/EPA, `collision/ccd.py`)
_NATIVE_CCD = {*CONVEX_FUNCTIONS, *MULTICCD_PAIRS, *(types for types in MESH_FUNCTIONS if PLANE not in types)}
_NCP_ITERATIONS = 30  # the interior-point solver's default iteration budget (MuJoCo's 100 is for Newton)


def load_mjcf(path_or_xml: str | os.PathLike, **overrides) -> Model:
    """Compile an MJCF file path or XML string with MuJoCo and convert it (see `from_mujoco`)."""
    text = os.fspath(path_or_xml)
    if not text.strip():
        raise MJCFError("the MJCF is empty: pass a file path or an XML string")
    try:
        if text.lstrip().startswith("<"):
            mj_model = mujoco.MjModel.from_xml_string(text)
        else:
            path = pathlib.Path(text)
            if not path.is_file():
                raise FileNotFoundError(f"MJCF file not found: {path}")
            mj_model = mujoco.MjModel.from_xml_path(str(path))
    except ValueError as err:  # mujoco reports parse and compile errors as ValueError
        raise MJCFError(f"MuJoCo could not compile the MJCF: {err}") from err
    return from_mujoco(mj_model, **overrides)


def from_mujoco(
    m: mujoco.MjModel,
    *,
    timestep: float | None = None,
    integrator: str | None = None,
    solver: str | None = None,
    iterations: int | None = None,
    ls_iterations: int | None = None,
    cone: str | None = None,
    grad_mode: str = "implicit",
    collision_smoothing: float = 0.0,
    maxval: float = 1e10,
    auto_reset: bool = False,
    kappa: float = 1e-8,
    kappa_grad: float = 1e-4,
    newton_early_exit: bool | None = None,
    ncp_passes: int = 4,
    ncp_nonlinear_gap: bool = True,
    ncp_early_exit: bool = True,
    ncp_recovery_speed: float = 1.0,
    cfd: CFD | None = None,
    max_geom_pairs: int | None = None,
    max_contact_points: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int | None = None,
    ode_solver=None,
    stepsize_controller=None,
    adjoint=None,
    dtype=None,
    **unknown,
) -> Model:
    """Convert a compiled mujoco.MjModel into a jaxsim_ncp Model.

    Raises UnsupportedFeatureError naming the element and attribute of anything the
    model uses that jaxsim_ncp does not simulate.
    """
    if unknown:
        raise TypeError(f"unknown override {next(iter(unknown))!r}")
    if solver is None:
        solver = _SOLVERS[int(m.opt.solver)]
    if solver not in ("newton", "cg", "ncp"):
        raise ValueError(f"solver must be 'newton', 'cg' or 'ncp', got {solver!r}")
    if integrator is None:
        integrator = _INTEGRATORS.get(int(m.opt.integrator))
        if integrator is None:
            name = mujoco.mjtIntegrator(int(m.opt.integrator)).name
            raise UnsupportedFeatureError(
                f"option/integrator ({name}) is not supported; use one of {_SUPPORTED_INTEGRATORS} "
                "or pass integrator=... to load_mjcf"
            )
    if integrator not in _SUPPORTED_INTEGRATORS:
        raise ValueError(f"integrator must be one of {_SUPPORTED_INTEGRATORS}, got {integrator!r}")
    if cone is not None and cone not in ("pyramidal", "elliptic"):
        raise ValueError(f"cone must be 'pyramidal' or 'elliptic', got {cone!r}")
    if grad_mode not in ("implicit", "unroll"):
        raise ValueError(f"grad_mode must be 'implicit' or 'unroll', got {grad_mode!r}")
    if not (np.isfinite(collision_smoothing) and collision_smoothing >= 0):
        raise ValueError(f"collision_smoothing must be a finite length >= 0, got {collision_smoothing!r}")

    if not (np.isfinite(maxval) and maxval > 0):
        raise ValueError(f"maxval must be a finite positive bound, got {maxval!r}")
    for name, value in (("kappa", kappa), ("kappa_grad", kappa_grad)):
        if not (np.isfinite(value) and 0 < value < 1):
            raise ValueError(f"{name} must be a central-path parameter in (0, 1) (scaled units), got {value!r}")
    if cfd is not None and not isinstance(cfd, CFD):
        raise TypeError(f"cfd must be a jaxsim_ncp.CFD (e.g. CFD(width=0.1)) or None, got {cfd!r}")
    if int(ncp_passes) < 1:
        raise ValueError(f"ncp_passes must be >= 1, got {ncp_passes!r}")
    if not ncp_recovery_speed > 0:  # inf: undo any penetration within one step (Dojo)
        raise ValueError(f"ncp_recovery_speed must be a speed > 0 (inf: no limit), got {ncp_recovery_speed!r}")
    # max_geom_pairs: MJX's custom numeric unless given (-1, MJX's "no limit", overrides the file's);
    # within capacity it changes nothing. max_contact_points only when given: MJX's numeric of that
    # name drops contacts that MuJoCo C solves with, so reading it would part from MuJoCo's trajectory
    max_geom_pairs = custom_numeric(m, "max_geom_pairs") if max_geom_pairs is None else max_geom_pairs
    max_geom_pairs, max_contact_points = (None if v == -1 else v for v in (max_geom_pairs, max_contact_points))
    for name, value in (("max_geom_pairs", max_geom_pairs), ("max_contact_points", max_contact_points)):
        if value is not None and (int(value) != value or value < 1):
            raise ValueError(f"{name} must be a positive integer, -1 or None (no limit), got {value!r}")
    if kappa_grad < kappa:
        raise ValueError(f"kappa_grad ({kappa_grad}) must be >= kappa ({kappa}): gradients cannot be harder than the forward pass")
    adaptive_overrides = dict(rtol=rtol, atol=atol, max_steps=max_steps, ode_solver=ode_solver,
                              stepsize_controller=stepsize_controller, adjoint=adjoint)  # fmt: skip
    if integrator == "adaptive":
        adaptive_settings = adaptive.settings(**adaptive_overrides)
    else:
        adaptive_settings = None
        given = [k for k, v in adaptive_overrides.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to integrator='adaptive' (this model integrates with {integrator!r})")
    disableflags = tuple(name for bit, name in _DISABLE_NAMES.items() if int(m.opt.disableflags) & bit)
    _check_supported(m, disableflags)
    if solver == "cg" and grad_mode == "unroll":
        # its directions chain every earlier iterate's derivative (float32 batch gradients came back NaN)
        raise UnsupportedFeatureError(
            "grad_mode='unroll' with the CG solver (option/solver=\"CG\"): unrolled gradients differentiate Newton's "
            "iterations; use the implicit gradient (grad_mode='implicit', the default) or solver='newton'"
        )
    if solver == "ncp":
        _check_ncp(m, integrator, grad_mode, disableflags)
        cone = "elliptic"  # the NCP uses exact second-order cones; its rows are laid out as MuJoCo's elliptic ones
        if iterations is None:
            iterations = _NCP_ITERATIONS

    dt = default_dtype() if dtype is None else dtype

    def f(x):
        with np.errstate(over="ignore"):  # a float32 overflow becomes inf, which check_model names (field, element)
            return jnp.asarray(np.asarray(x, dtype=np.float64).astype(dt))

    opt = Option(
        timestep=f(m.opt.timestep if timestep is None else timestep),
        gravity=f(m.opt.gravity),
        magnetic=f(m.opt.magnetic),
        impratio=f(m.opt.impratio),
        meaninertia=f(m.stat.meaninertia),
        meansize=f(m.stat.meansize),
        density=f(m.opt.density),
        viscosity=f(m.opt.viscosity),
        wind=f(m.opt.wind),
        o_margin=f(m.opt.o_margin),
        o_solref=f(m.opt.o_solref),
        o_solimp=f(m.opt.o_solimp),
        o_friction=f(m.opt.o_friction),
        override=_override(m),
        diag_exact=bool(int(m.opt.enableflags) & int(mujoco.mjtEnableBit.mjENBL_DIAGEXACT)),
        energy=bool(int(m.opt.enableflags) & int(mujoco.mjtEnableBit.mjENBL_ENERGY)),
        fluid=bool(m.opt.density != 0 or m.opt.viscosity != 0),
        tolerance=float(m.opt.tolerance),
        ls_tolerance=float(m.opt.ls_tolerance),
        ccd_tolerance=float(m.opt.ccd_tolerance),
        ccd_iterations=int(m.opt.ccd_iterations),
        noslip_iterations=int(m.opt.noslip_iterations),
        noslip_tolerance=float(m.opt.noslip_tolerance),
        integrator=integrator,
        solver=solver,
        iterations=int(m.opt.iterations if iterations is None else iterations),
        ls_iterations=int(m.opt.ls_iterations if ls_iterations is None else ls_iterations),
        cone=cone or _CONE[int(m.opt.cone)],
        disableflags=disableflags,
        grad_mode=grad_mode,
        collision_smoothing=float(collision_smoothing),
        jacobian=("dense", "sparse", "auto")[int(m.opt.jacobian)],
        maxval=float(maxval),
        auto_reset=bool(auto_reset),
        kappa=float(kappa),
        kappa_grad=float(kappa_grad),
        newton_early_exit=None if newton_early_exit is None else bool(newton_early_exit),
        ncp_passes=int(ncp_passes),
        ncp_nonlinear_gap=bool(ncp_nonlinear_gap),
        ncp_early_exit=bool(ncp_early_exit),
        ncp_recovery_speed=float(ncp_recovery_speed),
        cfd=cfd,
        max_geom_pairs=None if max_geom_pairs is None else int(max_geom_pairs),
        max_contact_points=None if max_contact_points is None else int(max_contact_points),
        adaptive=adaptive_settings,
    )
    ints = lambda x: tuple(int(v) for v in np.asarray(x).reshape(-1))  # noqa: E731
    bools = lambda x: tuple(bool(v) for v in np.asarray(x).reshape(-1))  # noqa: E731
    names = lambda objtype, n: tuple(mujoco.mj_id2name(m, objtype, i) or "" for i in range(n))  # noqa: E731
    rangefinders = bool(np.any(np.asarray(m.sensor_type) == int(sensor.Sens.RANGEFINDER)))
    geom_fluid = np.reshape(m.geom_fluid, (m.ngeom, mujoco.mjNFLUID))
    fluid_interaction = geom_fluid[:, 0] > 0
    topology = Topology(
        body_parentid=ints(m.body_parentid),
        body_rootid=ints(m.body_rootid),
        body_jntnum=ints(m.body_jntnum),
        body_jntadr=ints(m.body_jntadr),
        jnt_type=ints(m.jnt_type),
        jnt_bodyid=ints(m.jnt_bodyid),
        jnt_qposadr=ints(m.jnt_qposadr),
        jnt_dofadr=ints(m.jnt_dofadr),
        dof_bodyid=ints(m.dof_bodyid),
        dof_jntid=ints(m.dof_jntid),
        geom_bodyid=ints(m.geom_bodyid),
        geom_type=ints(m.geom_type),
        actuator_trnid=ints(m.actuator_trnid[:, 0]),
        actuator_trntype=ints(m.actuator_trntype),
        actuator_dyntype=ints(m.actuator_dyntype),
        actuator_gaintype=ints(m.actuator_gaintype),
        actuator_biastype=ints(m.actuator_biastype),
        actuator_actadr=ints(m.actuator_actadr),
        actuator_ctrllimited=bools(m.actuator_ctrllimited),
        actuator_forcelimited=bools(m.actuator_forcelimited),
        actuator_actlimited=bools(m.actuator_actlimited),
        actuator_actearly=bools(m.actuator_actearly),
        jnt_actfrclimited=bools(m.jnt_actfrclimited),
        body_names=names(mujoco.mjtObj.mjOBJ_BODY, m.nbody),
        jnt_names=names(mujoco.mjtObj.mjOBJ_JOINT, m.njnt),
        geom_names=names(mujoco.mjtObj.mjOBJ_GEOM, m.ngeom),
        actuator_names=names(mujoco.mjtObj.mjOBJ_ACTUATOR, m.nactuator),
        site_bodyid=ints(m.site_bodyid),
        site_type=ints(m.site_type),
        hfield_nrow=ints(m.hfield_nrow),
        hfield_ncol=ints(m.hfield_ncol),
        actuator_refsite=tuple(
            int(m.actuator_trnid[a, 1]) if int(m.actuator_trntype[a]) == int(mujoco.mjtTrn.mjTRN_SITE) else -1
            for a in range(m.nactuator)
        ),
        actuator_refsite_shared_dofs=tuple(_refsite_shared_dofs(m, a) for a in range(m.nactuator)),
        actuator_nsample=ints(m.actuator_history[:, 0]),
        actuator_interp=ints(m.actuator_history[:, 1]),
        actuator_historyadr=ints(m.actuator_historyadr),
        sensor_nsample=ints(np.reshape(m.sensor_history, (-1, 2))[:, 0]),
        sensor_interp=ints(np.reshape(m.sensor_history, (-1, 2))[:, 1]),
        sensor_historyadr=ints(m.sensor_historyadr),
        nhistory=int(m.nhistory),
        actuator_ctrladr=ints(m.actuator_ctrladr),
        actuator_ctrlnum=ints(m.actuator_ctrlnum),
        actuator_ctrlspec=ints(m.actuator_ctrlspec),
        actuator_actnum=ints(m.actuator_actnum),
        actuator_pid_slew=tuple(bool(t == int(mujoco.mjtDyn.mjDYN_PID) and p[1] > 0) for t, p in zip(m.actuator_dyntype, m.actuator_dynprm)),
        actuator_dcmotor_slots=tuple(_dcmotor_slots(m, a) for a in range(m.nactuator)),
        actuator_disabled=tuple(bool(0 <= g <= 30 and int(m.opt.disableactuator) & (1 << int(g))) for g in m.actuator_group),
        actuator_slidersite=tuple(
            int(m.actuator_trnid[a, 1]) if int(m.actuator_trntype[a]) == int(mujoco.mjtTrn.mjTRN_SLIDERCRANK) else -1
            for a in range(m.nactuator)
        ),
        body_mocapid=ints(m.body_mocapid),
        has_gravcomp=bool(np.any(m.body_gravcomp != 0)),
        has_surfacevel=bool(np.any(np.asarray(m.geom_surfacevel) != 0)),
        has_adhesion=_has_adhesion(m),
        has_polynomial_springs=bool(np.any(m.jnt_stiffnesspoly != 0) or np.any(m.tendon_stiffnesspoly != 0)),
        has_polynomial_dampers=bool(np.any(m.dof_dampingpoly != 0) or np.any(m.tendon_dampingpoly != 0)
                                    or np.any(m.actuator_dampingpoly != 0)),
        jnt_actgravcomp=bools(m.jnt_actgravcomp),
        tendon_adr=ints(m.tendon_adr),
        tendon_num=ints(m.tendon_num),
        wrap_type=ints(m.wrap_type),
        wrap_objid=ints(m.wrap_objid),
        wrap_side=tuple(
            int(round(prm)) if int(t) in (int(mujoco.mjtWrap.mjWRAP_SPHERE), int(mujoco.mjtWrap.mjWRAP_CYLINDER)) else -1
            for t, prm in zip(m.wrap_type, m.wrap_prm)
        ),
        tendon_names=names(mujoco.mjtObj.mjOBJ_TENDON, m.ntendon),
        body_treeid=ints(m.body_treeid),
        dof_treeid=ints(m.dof_treeid),
        tendon_actfrclimited=bools(m.tendon_actfrclimited),
        tendon_with_armature=tuple(int(t) for t in np.nonzero(_tendon_armature(m) != 0)[0]),
        jnt_plasticadr=ints(m.jnt_plasticadr),
        tendon_plasticadr=ints(m.tendon_plasticadr),
        nplastic=int(m.nplastic),
        key_names=names(mujoco.mjtObj.mjOBJ_KEY, m.nkey),
        sensor_type=ints(m.sensor_type),
        sensor_objtype=ints(m.sensor_objtype),
        sensor_objid=ints(m.sensor_objid),
        sensor_reftype=ints(m.sensor_reftype),
        sensor_refid=ints(m.sensor_refid),
        sensor_dim=ints(m.sensor_dim),
        sensor_datatype=ints(m.sensor_datatype),
        cam_bodyid=ints(m.cam_bodyid),
        cam_mode=ints(m.cam_mode),
        cam_targetbodyid=ints(m.cam_targetbodyid),
        cam_resolution=tuple((int(w), int(h)) for w, h in np.reshape(m.cam_resolution, (-1, 2))),
        sensor_intprm=ints(np.reshape(m.sensor_intprm, (m.nsensor, -1))[:, 0]) if m.nsensor else (),
        sensor_reduce=ints(np.reshape(m.sensor_intprm, (m.nsensor, -1))[:, 1]) if m.nsensor else (),
        body_fluid_ellipsoid=tuple(
            bool(np.any(fluid_interaction[m.geom_bodyid == b])) for b in range(m.nbody)
        ),
        geom_fluid_interaction=bools(fluid_interaction),
        geom_dataid=ints(m.geom_dataid),
        geom_visible=tuple(bool(a) for a in _geom_alpha(m) != 0),
        mesh_names=names(mujoco.mjtObj.mjOBJ_MESH, m.nmesh),
    )
    if cfd is not None:
        pair_mask(cfd.pairs, topology.geom_names)  # raises on a geom the model lacks
    layout = dataclasses.replace(_constraint_layout(m, disableflags, opt.cone), max_geom_pairs=opt.max_geom_pairs,
                                 max_contact_points=opt.max_contact_points)
    if layout.max_geom_pairs is None and layout.ncon > _MANY_CONTACT_SLOTS:
        npairs = sum(len(group.geom1) for group in layout.groups)
        warnings.warn(f"{npairs} candidate geom pairs with {layout.ncon} contact slots ({layout.nefc} constraint rows): "
                      "every step collides every pair and builds rows for every slot; a contact-rich scene needs "
                      "max_geom_pairs=n (a broad phase keeps the n closest pairs per geom-type pair) and "
                      "max_contact_points=n (rows for the n deepest contacts), as MJX does", stacklevel=2)
    mesh_vert, mesh_polynormal, mesh_polyvert = _mesh_hulls(m, layout)
    topology = dataclasses.replace(topology, mesh_polyvert=mesh_polyvert)
    eq_ids = list(layout.eq_ids)
    model = Model(
        nq=int(m.nq),
        nv=int(m.nv),
        nu=int(m.nu),
        na=int(m.na),
        nbody=int(m.nbody),
        njnt=int(m.njnt),
        ngeom=int(m.ngeom),
        ntendon=int(m.ntendon),
        topology=topology,
        constraints=layout,
        opt=opt,
        body_pos=f(m.body_pos),
        body_quat=f(m.body_quat),
        body_ipos=f(m.body_ipos),
        body_iquat=f(m.body_iquat),
        body_mass=f(m.body_mass),
        body_inertia=f(m.body_inertia),
        body_invweight0=f(m.body_invweight0),
        body_gravcomp=f(m.body_gravcomp),
        jnt_pos=f(m.jnt_pos),
        jnt_axis=f(m.jnt_axis),
        jnt_stiffness=f(m.jnt_stiffness),
        jnt_springyield=f(m.jnt_springyield),
        jnt_stiffnesspoly=f(np.reshape(m.jnt_stiffnesspoly, (-1, 2))),
        jnt_actfrcrange=f(m.jnt_actfrcrange),
        qpos0=f(m.qpos0),
        qpos_spring=f(m.qpos_spring),
        dof_damping=f(m.dof_damping),
        dof_dampingpoly=f(np.reshape(m.dof_dampingpoly, (-1, 2))),
        dof_armature=f(m.dof_armature),
        dof_frictionloss=f(m.dof_frictionloss),
        dof_solref=f(m.dof_solref),
        dof_solimp=f(m.dof_solimp),
        dof_invweight0=f(m.dof_invweight0),
        jnt_range=f(m.jnt_range),
        jnt_margin=f(m.jnt_margin),
        jnt_solref=f(m.jnt_solref),
        jnt_solimp=f(m.jnt_solimp),
        geom_pos=f(m.geom_pos),
        geom_quat=f(m.geom_quat),
        geom_size=f(m.geom_size),
        geom_friction=f(m.geom_friction),
        geom_surfacevel=f(np.reshape(m.geom_surfacevel, (m.ngeom, 6))),
        geom_adhesion=f(np.reshape(m.geom_adhesion, (m.ngeom,))),
        geom_solref=f(m.geom_solref),
        geom_solimp=f(m.geom_solimp),
        geom_margin=f(m.geom_margin),
        geom_gap=f(m.geom_gap),
        geom_rbound=f(m.geom_rbound),
        geom_solmix=f(m.geom_solmix),
        geom_fluid=f(geom_fluid),
        mesh_vert=f(mesh_vert),
        mesh_polynormal=f(mesh_polynormal),
        hfield_size=f(np.reshape(m.hfield_size, (-1, 4))),
        hfield_data=f(_hfield_elevations(m)),
        geom_priority=ints(m.geom_priority),
        pair_friction=f(np.reshape(m.pair_friction, (-1, 5))),
        pair_solref=f(np.reshape(m.pair_solref, (-1, 2))),
        pair_solreffriction=f(np.reshape(m.pair_solreffriction, (-1, 2))),
        pair_solimp=f(np.reshape(m.pair_solimp, (-1, 5))),
        pair_margin=f(m.pair_margin),
        pair_gap=f(m.pair_gap),
        pair_adhesion=f(np.reshape(m.pair_adhesion, (m.npair,))),
        eq_obj1id=ints(np.asarray(m.eq_obj1id)[eq_ids]),
        eq_obj2id=ints(np.asarray(m.eq_obj2id)[eq_ids]),
        eq_data=f(np.reshape(m.eq_data, (-1, mujoco.mjNEQDATA))[eq_ids]),
        eq_solref=f(np.reshape(m.eq_solref, (-1, 2))[eq_ids]),
        eq_solimp=f(np.reshape(m.eq_solimp, (-1, 5))[eq_ids]),
        site_pos=f(np.reshape(m.site_pos, (-1, 3))),
        site_quat=f(np.reshape(m.site_quat, (-1, 4))),
        cam_pos=f(np.reshape(m.cam_pos, (-1, 3))),
        cam_quat=f(np.reshape(m.cam_quat, (-1, 4))),
        cam_pos0=f(np.reshape(m.cam_pos0, (-1, 3))),
        cam_poscom0=f(np.reshape(m.cam_poscom0, (-1, 3))),
        cam_mat0=f(np.reshape(m.cam_mat0, (-1, 3, 3))),
        cam_fovy=f(m.cam_fovy),
        cam_intrinsic=f(np.reshape(m.cam_intrinsic, (-1, 4))),
        cam_sensorsize=f(np.reshape(m.cam_sensorsize, (-1, 2))),
        site_size=f(np.reshape(m.site_size, (-1, 3))),
        wrap_prm=f(m.wrap_prm),
        tendon_stiffness=f(m.tendon_stiffness),
        tendon_springyield=f(m.tendon_springyield),
        tendon_stiffnesspoly=f(np.reshape(m.tendon_stiffnesspoly, (-1, 2))),
        tendon_lengthspring=f(np.reshape(m.tendon_lengthspring, (-1, 2))),
        tendon_damping=f(m.tendon_damping),
        tendon_dampingpoly=f(np.reshape(m.tendon_dampingpoly, (-1, 2))),
        tendon_armature=f(m.tendon_armature),
        tendon_frictionloss=f(m.tendon_frictionloss),
        tendon_range=f(np.reshape(m.tendon_range, (-1, 2))),
        tendon_margin=f(m.tendon_margin),
        tendon_solref_lim=f(np.reshape(m.tendon_solref_lim, (-1, 2))),
        tendon_solimp_lim=f(np.reshape(m.tendon_solimp_lim, (-1, 5))),
        tendon_solref_fri=f(np.reshape(m.tendon_solref_fri, (-1, 2))),
        tendon_solimp_fri=f(np.reshape(m.tendon_solimp_fri, (-1, 5))),
        tendon_length0=f(m.tendon_length0),
        tendon_invweight0=f(m.tendon_invweight0),
        tendon_actfrcrange=f(np.reshape(m.tendon_actfrcrange, (-1, 2))),
        sensor_cutoff=f(m.sensor_cutoff),
        sensor_delay=f(m.sensor_delay),
        sensor_interval=f(np.reshape(m.sensor_interval, (-1, 2))),
        actuator_gear=f(m.actuator_gear),
        actuator_gainprm=f(m.actuator_gainprm),
        actuator_biasprm=f(m.actuator_biasprm),
        actuator_dynprm=f(m.actuator_dynprm),
        actuator_ctrlrange=f(m.actuator_ctrlrange),
        actuator_forcerange=f(m.actuator_forcerange),
        actuator_actrange=f(m.actuator_actrange),
        actuator_lengthrange=f(m.actuator_lengthrange),
        actuator_acc0=f(m.actuator_acc0),
        actuator_damping=f(m.actuator_damping),
        actuator_dampingpoly=f(np.reshape(m.actuator_dampingpoly, (-1, 2))),
        actuator_armature=f(m.actuator_armature),
        actuator_cranklength=f(m.actuator_cranklength),
        actuator_delay=f(m.actuator_delay),
        geom_ray_triangles=tuple(f(t) for t in ray.geom_ray_surfaces(m)) if rangefinders else None,
        keyframes=_keyframes(m, f) if m.nkey else None,
    )
    check_model(model)
    _check_mass_matrix(m)
    return model


def _refsite_shared_dofs(m: mujoco.MjModel, a: int) -> tuple[int, ...]:
    """The dof chain both sites of a refsite transmission hang from (mj_transmission clears it)."""
    site, ref = (int(i) for i in m.actuator_trnid[a])
    if int(m.actuator_trntype[a]) != int(mujoco.mjtTrn.mjTRN_SITE) or ref < 0:
        return ()
    last = []
    for s in (site, ref):  # the last dof of the body each site is welded to (-1: none)
        b = int(m.body_weldid[m.site_bodyid[s]])
        last.append(int(m.body_dofadr[b]) + int(m.body_dofnum[b]) - 1 if m.body_dofnum[b] else -1)
    d0, d1 = last
    while d0 >= 0 and d1 >= 0 and d0 != d1:  # climb the deeper one until they meet
        if d0 < d1:
            d1 = int(m.dof_parentid[d1])
        else:
            d0 = int(m.dof_parentid[d0])
    chain = []
    while d0 >= 0 and d0 == d1:
        chain.append(d0)
        d0 = d1 = int(m.dof_parentid[d0])
    return tuple(chain)


def _check_mass_matrix(m: mujoco.MjModel) -> None:
    """MuJoCo's own test (mjWARN_INERTIA) at qpos0: a singular joint-space inertia has no dynamics.

    MuJoCo warns and then resets the state at every step; a redundant joint (three slide joints
    plus a fourth in their plane) or a moving body without mass or armature causes it.
    """
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    warning = d.warning[mujoco.mjtWarning.mjWARN_INERTIA]
    if warning.number:
        dof = int(warning.lastinfo)
        joint = _name(m, mujoco.mjtObj.mjOBJ_JOINT, int(m.dof_jntid[dof])) if dof < m.nv else "?"
        raise ModelError(
            f"the joint-space inertia matrix is singular at qpos0 (MuJoCo's mjWARN_INERTIA at dof {dof}, "
            f"joint {joint!r}): a redundant joint or a moving body without mass; remove the redundant joint "
            "or give it armature (joint/armature)"
        )


# ------------------------------------------------------------------ feature checks


def _has_adhesion(m: mujoco.MjModel) -> bool:
    """Some geom or pair has MuJoCo 4's contact adhesion."""
    return bool(np.any(np.asarray(m.geom_adhesion) != 0) or np.any(np.asarray(m.pair_adhesion) != 0))


def _override(m: mujoco.MjModel) -> bool:
    """<flag override="enable"/>: the option's contact parameters replace every contact's."""
    return bool(int(m.opt.enableflags) & int(mujoco.mjtEnableBit.mjENBL_OVERRIDE))


def _name(m: mujoco.MjModel, objtype, i: int) -> str:
    return mujoco.mj_id2name(m, objtype, i) or f"#{i}"


def _check_ncp(m: mujoco.MjModel, integrator: str, grad_mode: str, disableflags: tuple[str, ...]) -> None:
    """What the interior-point solver does not model: a clear error instead of a different simulation."""
    if integrator not in ("euler", "implicitfast"):
        raise UnsupportedFeatureError(
            f"solver='ncp' is a velocity-level time stepper: integrator={integrator!r} does not apply "
            "(use 'euler' or 'implicitfast')"
        )
    if grad_mode != "implicit":
        raise UnsupportedFeatureError("solver='ncp' differentiates implicitly only (grad_mode='implicit')")
    if int(m.opt.noslip_iterations) > 0:
        raise UnsupportedFeatureError(
            "option/noslip_iterations with solver='ncp': noslip post-processes MuJoCo's soft contacts; the NCP's "
            "friction cones are hard already (set noslip_iterations=0, or use solver='newton')"
        )
    if "frictionloss" not in disableflags and np.any(m.dof_frictionloss > 0):
        d = int(np.nonzero(m.dof_frictionloss > 0)[0][0])
        jname = _name(m, mujoco.mjtObj.mjOBJ_JOINT, int(m.dof_jntid[d]))
        raise UnsupportedFeatureError(f"joint {jname!r}/frictionloss with solver='ncp' (dry joint friction is not modelled)")
    if "frictionloss" not in disableflags and np.any(m.tendon_frictionloss > 0):
        tname = _name(m, mujoco.mjtObj.mjOBJ_TENDON, int(np.nonzero(m.tendon_frictionloss > 0)[0][0]))
        raise UnsupportedFeatureError(f"tendon {tname!r}/frictionloss with solver='ncp' (dry friction is not modelled)")
    if "contact" not in disableflags and np.any(np.asarray(m.geom_surfacevel) != 0):
        g = int(np.nonzero(np.any(np.reshape(m.geom_surfacevel, (m.ngeom, 6)) != 0, axis=1))[0][0])
        raise UnsupportedFeatureError(
            f"moving contact surfaces (geom {_name(m, mujoco.mjtObj.mjOBJ_GEOM, g)!r}/surfacevel) with solver='ncp' "
            "(use solver='newton')"
        )
    if "contact" not in disableflags and _has_adhesion(m):
        raise UnsupportedFeatureError("contact adhesion (geom/adhesion, pair/adhesion) with solver='ncp' (use solver='newton')")
    for a in np.nonzero(np.asarray(m.actuator_trntype) == int(mujoco.mjtTrn.mjTRN_BODY))[0]:
        aname = _name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, int(a))
        raise UnsupportedFeatureError(
            f"actuator {aname!r} transmission mjTRN_BODY (adhesion) with solver='ncp': its moment averages "
            "MuJoCo's soft contacts (use solver='newton')"
        )
    limit_sensors = {int(s) for s in sensor.Sens if "LIMIT" in s.name}
    for i in np.nonzero(np.isin(np.asarray(m.sensor_type), list(limit_sensors)))[0]:
        sname = _name(m, mujoco.mjtObj.mjOBJ_SENSOR, int(i))
        raise UnsupportedFeatureError(
            f"sensor {sname!r} reads MuJoCo's soft limit rows; with solver='ncp' limits are hard units "
            "(read data.efc_force, or use solver='newton')"
        )
    if "contact" not in disableflags:
        for g1, g2, pid in _candidate_pairs(m, "filterparent" not in disableflags):
            condim = _pair_condim(m, g1, g2, pid)
            if condim not in (1, 3):
                names = [_name(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (g1, g2)]
                raise UnsupportedFeatureError(
                    f"condim {condim} on the pair {names[0]!r}-{names[1]!r} (geom/condim) with solver='ncp': "
                    "only condim 1 (frictionless) and 3 (sliding friction) are modelled"
                )


_MANY_CONTACT_SLOTS = 8192  # a load without a contact capacity warns above this many slots


def _check_supported(m: mujoco.MjModel, disableflags: tuple[str, ...]) -> None:
    def unsupported(what: str):
        raise UnsupportedFeatureError(f"{what} is not supported by jaxsim_ncp yet")

    counts = {
        "nflex": "flex objects (flexcomp / deformable)",
        "nplugin": "engine plugins (plugin)",
    }
    for attr, what in counts.items():
        if int(getattr(m, attr, 0)) > 0:
            unsupported(what)
    for i in range(m.neq):
        ename = _name(m, mujoco.mjtObj.mjOBJ_EQUALITY, i)
        etype = int(m.eq_type[i])
        scalar = (int(mujoco.mjtEq.mjEQ_JOINT), int(mujoco.mjtEq.mjEQ_TENDON))
        if etype not in (int(mujoco.mjtEq.mjEQ_CONNECT), int(mujoco.mjtEq.mjEQ_WELD), *scalar):
            unsupported(f"equality {ename!r} of type {mujoco.mjtEq(etype).name} (connect, weld, joint and tendon are supported)")
    if int(m.opt.enableflags) & int(mujoco.mjtEnableBit.mjENBL_SLEEP):
        unsupported("sleeping islands (option/flag sleep)")
    if int(m.opt.enableflags) & int(mujoco.mjtEnableBit.mjENBL_SPECULATIVE):
        unsupported("speculative contacts (option/flag speculative)")

    _check_sensors(m, unsupported)
    for a in range(m.nactuator):
        aname = _name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a)
        trntype = int(m.actuator_trntype[a])
        supported = ("JOINT", "JOINTINPARENT", "SLIDERCRANK", "TENDON", "SITE", "BODY")
        if trntype not in {int(getattr(mujoco.mjtTrn, f"mjTRN_{t}")) for t in supported}:
            unsupported(f"actuator {aname!r} transmission type {trntype}")
        if int(m.actuator_dyntype[a]) not in set(DynType):
            unsupported(f"actuator {aname!r} dyntype {mujoco.mjtDyn(int(m.actuator_dyntype[a])).name}")
        if int(m.actuator_gaintype[a]) not in set(GainType):
            unsupported(f"actuator {aname!r} gaintype {mujoco.mjtGain(int(m.actuator_gaintype[a])).name}")
        if int(m.actuator_biastype[a]) not in set(BiasType):
            unsupported(f"actuator {aname!r} biastype {mujoco.mjtBias(int(m.actuator_biastype[a])).name}")
        pid = int(m.actuator_gaintype[a]) == GainType.PID
        kinds = (int(m.actuator_dyntype[a]) == DynType.DCMOTOR, int(m.actuator_gaintype[a]) == GainType.DCMOTOR,
                 int(m.actuator_biastype[a]) == BiasType.DCMOTOR)  # fmt: skip
        if any(kinds) and not all(kinds):
            unsupported(f"actuator {aname!r}: a DC motor's dynamics, gain or bias mixed with another kind (use <dcmotor>)")
        if all(kinds) and sum(k >= 0 for k in _dcmotor_slots(m, a)) != int(m.actuator_actnum[a]):
            unsupported(f"actuator {aname!r}: a DC motor whose states are not MuJoCo's (slew, integral, temperature, bristle, current)")
        blocks = pid or all(kinds)  # control blocks and several states
        if int(m.actuator_actnum[a]) > 1 and not blocks:
            unsupported(f"actuator {aname!r} with more than one activation state")
        if int(m.actuator_ctrlnum[a]) != 1 and not blocks:
            unsupported(f"actuator {aname!r} with {int(m.actuator_ctrlnum[a])} controls")
        if int(m.actuator_ctrlnum[a]) != 1 and m.actuator_delay[a] != 0:
            unsupported(f"actuator {aname!r}: a delay (actuator/delay) on an actuator with {int(m.actuator_ctrlnum[a])} controls")


def _dcmotor_slots(m: mujoco.MjModel, a: int) -> tuple[int, ...]:
    """mj_dcmotorSlots: offsets of a DC motor's slew, integral, temperature, bristle and current states
    (-1 where absent; present when slewmax, ki, the thermal resistance, sigma0, te is positive)."""
    if int(m.actuator_dyntype[a]) != DynType.DCMOTOR:
        return (-1,) * 5
    present = [getattr(m, f"actuator_{array}")[a, column] > 0 for array, column, _ in dcmotor.SLOT_PARAMETERS]
    offsets, count = [], 0
    for p in present:
        offsets.append(count if p else -1)
        count += bool(p)
    return tuple(offsets)


def _check_sensors(m: mujoco.MjModel, unsupported) -> None:
    """Every sensor must be one sensor.py simulates, on a body, xbody, geom or site."""
    frames = {int(o) for o in sensor.Obj}
    for i in range(m.nsensor):
        sname = _name(m, mujoco.mjtObj.mjOBJ_SENSOR, i)
        kind = int(m.sensor_type[i])
        if kind not in {int(s) for s in sensor.Sens}:
            unsupported(f"sensor {sname!r} of type {mujoco.mjtSensor(kind).name[len('mjSENS_'):].lower()}")
        frame_kind = kind in {int(s) for s in sensor.Sens if s.name.startswith("FRAME")} | {int(sensor.Sens.INSIDESITE)}
        for attr in ("objtype", "reftype"):
            obj = int(getattr(m, f"sensor_{attr}")[i])
            if frame_kind and obj not in frames and (attr == "objtype" or int(m.sensor_refid[i]) >= 0):
                unsupported(f"sensor {sname!r} on a {mujoco.mjtObj(obj).name[len('mjOBJ_'):].lower()} (sensor/{attr})")
        if kind in (sensor.Sens.GEOMDIST, sensor.Sens.GEOMNORMAL, sensor.Sens.GEOMFROMTO):
            _check_distance_sensor(m, i, sname, unsupported)
        if kind == sensor.Sens.RANGEFINDER and int(m.sensor_objtype[i]) != mujoco.mjtObj.mjOBJ_SITE:
            unsupported(f"sensor {sname!r}: a rangefinder on a camera (a depth image; sensor/camera)")


def _distance_sensor_pairs(m: mujoco.MjModel, i: int) -> list[tuple[int, int]]:
    """The geom pairs distance sensor i compares (a geom, or each geom of a body, on either side)."""
    first = sensor.distance_geoms(m.geom_bodyid, int(m.sensor_objtype[i]), int(m.sensor_objid[i]))
    second = sensor.distance_geoms(m.geom_bodyid, int(m.sensor_reftype[i]), int(m.sensor_refid[i]))
    return [(g1, g2) for g1 in first for g2 in second]


def _distance_sensor_geoms(m: mujoco.MjModel) -> set[int]:
    kinds = {int(sensor.Sens.GEOMDIST), int(sensor.Sens.GEOMNORMAL), int(sensor.Sens.GEOMFROMTO)}
    return {g for i in range(m.nsensor) if int(m.sensor_type[i]) in kinds for pair in _distance_sensor_pairs(m, i) for g in pair}


def _check_distance_sensor(m: mujoco.MjModel, i: int, sname: str, unsupported) -> None:
    """Every geom pair a distance sensor compares must have a narrow phase here."""
    for g1, g2 in _distance_sensor_pairs(m, i):
        t1, t2 = sorted((int(m.geom_type[g1]), int(m.geom_type[g2])))
        if (t1, t2) != (PLANE, PLANE) and collision.distance_function(t1, t2) is None:
            names = [_name(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (g1, g2)]
            unsupported(f"sensor {sname!r}: the distance of geoms {names[0]!r} and {names[1]!r} (geom/type)")


def custom_numeric(m: mujoco.MjModel, name: str) -> int | None:
    """An MJX-style <custom><numeric name=... data="n"/> setting; None when absent or <= 0 (MJX: -1, no limit)."""
    i = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_NUMERIC, name)
    if i < 0:
        return None
    value = float(m.numeric_data[m.numeric_adr[i]])
    return int(value) if value > 0 else None


def _candidate_pairs(m: mujoco.MjModel, filterparent: bool) -> list[tuple[int, int, int]]:
    """Every geom pair MuJoCo's collision stage tests, as (geom1, geom2, pair id or -1).

    Explicit <pair>s first, then the filters of the Computation chapter's "Collision
    detection": contype/conaffinity, same (welded) body, both bodies without dofs (a mocap body
    and the world: no force can act), parent-child, <exclude>, and geom pairs that are explicit
    pairs already (only those: the bodies' other geom pairs collide as usual, as in MuJoCo 4).
    """
    pairs = [(int(m.pair_geom1[p]), int(m.pair_geom2[p]), p) for p in range(m.npair)]
    excluded = {int(s) for s in np.asarray(m.exclude_signature).reshape(-1)}
    explicit = {(min(g1, g2), max(g1, g2)) for g1, g2, _ in pairs}
    weld = np.asarray(m.body_weldid)
    parent = np.asarray(m.body_parentid)
    for g1 in range(m.ngeom):
        for g2 in range(g1 + 1, m.ngeom):
            if not ((m.geom_contype[g1] & m.geom_conaffinity[g2]) or (m.geom_contype[g2] & m.geom_conaffinity[g1])):
                continue
            b1, b2 = int(m.geom_bodyid[g1]), int(m.geom_bodyid[g2])
            w1, w2 = int(weld[b1]), int(weld[b2])
            if w1 == w2 or (m.body_dofnum[w1] == 0 and m.body_dofnum[w2] == 0):
                continue
            p1, p2 = int(weld[parent[w1]]), int(weld[parent[w2]])
            if filterparent and w1 != 0 and w2 != 0 and (w1 == p2 or w2 == p1):
                continue
            if ((min(b1, b2) << 16) + max(b1, b2)) in excluded or (g1, g2) in explicit:
                continue
            pairs.append((g1, g2, -1))
    return pairs


def _mesh_hulls(m: mujoco.MjModel, layout: ConstraintLayout):
    """Convex hulls of the meshes that collide or that distance sensors measure, padded to common
    sizes: vertices (nmesh, V, 3) in the geom frame (ascending vertex id, as MuJoCo's exhaustive
    support search visits them), polygon normals (nmesh, P, 3) and polygons as hull-vertex indices
    (nmesh, P, K), -1 padded. Other meshes get one zero vertex (they are never read)."""
    geoms = {g for grp in layout.groups if MESH in grp.types for g in grp.geom1 + grp.geom2} | _distance_sensor_geoms(m)
    used = sorted({int(m.geom_dataid[g]) for g in geoms if m.geom_type[g] == MESH})
    hulls = {}
    for i in used:
        adr, num = int(m.mesh_vertadr[i]), int(m.mesh_vertnum[i])
        graph = int(m.mesh_graphadr[i])
        if graph >= 0:
            nhull = int(m.mesh_graph[graph])
            ids = np.sort(m.mesh_graph[graph + 2 + nhull : graph + 2 + 2 * nhull])
        else:
            ids = np.arange(num)
        local = {int(v): k for k, v in enumerate(ids)}
        polys, normals = [], []
        for p in range(int(m.mesh_polyadr[i]), int(m.mesh_polyadr[i] + m.mesh_polynum[i])):
            start = int(m.mesh_polyvertadr[p])
            polys.append([local[int(v)] for v in m.mesh_polyvert[start : start + int(m.mesh_polyvertnum[p])]])
            normals.append(m.mesh_polynormal[p])
        hulls[i] = (np.asarray(m.mesh_vert[adr + ids], np.float64), polys, np.asarray(normals, np.float64))
    nv = max([len(h[0]) for h in hulls.values()], default=1)
    npoly = max([len(h[1]) for h in hulls.values()], default=1)
    k = max([len(p) for h in hulls.values() for p in h[1]], default=1)
    vert = np.zeros((m.nmesh, nv, 3))
    normal = np.zeros((m.nmesh, npoly, 3))
    polyvert = np.full((m.nmesh, npoly, k), -1)
    for i, (v, polys, nrm) in hulls.items():
        vert[i] = np.concatenate([v, np.repeat(v[:1], nv - len(v), axis=0)])
        normal[i, : len(nrm)] = nrm
        for j, p in enumerate(polys):
            polyvert[i, j, : len(p)] = p
    return vert, normal, tuple(tuple(tuple(int(x) for x in row) for row in mesh) for mesh in polyvert)


def _pair_margin_gap(m: mujoco.MjModel, g1: int, g2: int, pair_id: int) -> float:
    """margin + gap of a candidate pair: the <pair>'s own, else the sum of its geoms' (the margin
    option/o_margin instead under <flag override="enable"/>)."""
    if _override(m):
        return float(m.opt.o_margin + (m.pair_gap[pair_id] if pair_id >= 0 else m.geom_gap[g1] + m.geom_gap[g2]))
    if pair_id >= 0:
        return float(m.pair_margin[pair_id] + m.pair_gap[pair_id])
    return float(m.geom_margin[g1] + m.geom_margin[g2] + m.geom_gap[g1] + m.geom_gap[g2])


def _tendon_armature(m: mujoco.MjModel) -> np.ndarray:
    """Each tendon's armature with its actuators' (armature gear^2) added, as mj_actuatorArmature."""
    armature = np.array(m.tendon_armature, dtype=np.float64)
    for a in np.nonzero(np.asarray(m.actuator_trntype) == mujoco.mjtTrn.mjTRN_TENDON)[0]:
        armature[m.actuator_trnid[a, 0]] += m.actuator_armature[a] * m.actuator_gear[a, 0] ** 2
    return armature


def _geom_alpha(m: mujoco.MjModel) -> np.ndarray:
    """Each geom's opacity as rays see it (ray_eliminate): its material's alpha if it has one."""
    matid = np.asarray(m.geom_matid)
    return np.where(matid >= 0, np.asarray(m.mat_rgba)[np.maximum(matid, 0), 3] if m.nmat else 0.0, np.asarray(m.geom_rgba)[:, 3])


def _hfield_elevations(m: mujoco.MjModel) -> np.ndarray:
    """(nhfield, largest nrow * ncol): each height field's elevations, zero-padded."""
    count = np.asarray(m.hfield_nrow) * np.asarray(m.hfield_ncol)
    out = np.zeros((m.nhfield, int(count.max(initial=1))))
    for h in range(m.nhfield):
        out[h, : count[h]] = m.hfield_data[m.hfield_adr[h] : m.hfield_adr[h] + count[h]]
    return out


def _pair_condim(m: mujoco.MjModel, g1: int, g2: int, pair_id: int) -> int:
    """condim of a contact: the pair's, the higher-priority geom's, or the max of both."""
    if pair_id >= 0:
        return int(m.pair_dim[pair_id])
    p1, p2 = int(m.geom_priority[g1]), int(m.geom_priority[g2])
    if p1 != p2:
        return int(m.geom_condim[g1] if p1 > p2 else m.geom_condim[g2])
    return int(max(m.geom_condim[g1], m.geom_condim[g2]))


def _constraint_layout(m: mujoco.MjModel, disableflags: tuple[str, ...], cone: str) -> ConstraintLayout:
    """Static contact-slot and constraint-row layout (see types.ConstraintLayout)."""
    off = lambda flag: "constraint" in disableflags or flag in disableflags  # noqa: E731
    groups = []
    if not off("contact"):
        by_types: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for g1, g2, pid in _candidate_pairs(m, "filterparent" not in disableflags):
            if m.geom_type[g1] > m.geom_type[g2]:
                g1, g2 = g2, g1
            types = (int(m.geom_type[g1]), int(m.geom_type[g2]))
            if types in ((PLANE, HFIELD), (HFIELD, HFIELD)):  # MuJoCo never collides these
                continue
            supported = types[1] in HFIELD_PARTNERS if types[0] == HFIELD else types in FUNCTIONS
            if not supported:
                n1, n2 = (mujoco.mjtGeom(t).name[len("mjGEOM_") :].lower() for t in types)
                names = [_name(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (g1, g2)]
                raise UnsupportedFeatureError(
                    f"collision between a {n1} and a {n2} (geoms {names[0]!r} and {names[1]!r}, geom/type) is "
                    "not supported yet; set their contype/conaffinity so they cannot collide"
                )
            if "nativeccd" in disableflags and (types[0] == HFIELD or types in _NATIVE_CCD):
                names = [_name(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (g1, g2)]
                raise UnsupportedFeatureError(
                    f"libccd's convex collision (option/flag nativeccd=\"disable\") for the pair {names[0]!r}-{names[1]!r}: "
                    "only MuJoCo's native GJK/EPA is reproduced; remove the flag"
                )
            key = (types, int(m.geom_dataid[g1]) if types[0] == HFIELD else -1)
            by_types.setdefault(key, []).append((g1, g2, pid))
        for (types, hfield_id), items in sorted(by_types.items()):
            g1s, g2s, pids = zip(*items)
            cells, n_slots = (), FUNCTIONS[types][1] if types in FUNCTIONS else 0
            if hfield_id >= 0:  # the cell window of the largest geom against this height field
                rbound = max(float(m.geom_rbound[g2]) + max(_pair_margin_gap(m, g1, g2, pid), 0.0) for g1, g2, pid in items)
                nrow, ncol = int(m.hfield_nrow[hfield_id]), int(m.hfield_ncol[hfield_id])
                cells = hfield_window(rbound, m.hfield_size[hfield_id], nrow, ncol)
                n_slots = 2 * cells[0] * cells[1]
            groups.append(
                PairGroup(
                    types=types,
                    geom1=g1s,
                    geom2=g2s,
                    pair_id=pids,
                    condim=tuple(_pair_condim(m, *item) for item in items),
                    n_slots=n_slots,
                    hfield=hfield_id,
                    cells=cells,
                )
            )
    eq_ids = [] if off("equality") else list(range(m.neq))  # inactive ones too: Data.eq_active switches them
    friction_dofs = () if off("frictionloss") else tuple(int(d) for d in np.nonzero(m.dof_frictionloss > 0)[0])
    friction_tendons = () if off("frictionloss") else tuple(int(t) for t in np.nonzero(m.tendon_frictionloss > 0)[0])
    limit_jnts, limit_sides, limit_tendons, limit_tendon_sides = [], [], [], []
    if not off("limit"):
        for j in np.nonzero(m.jnt_limited)[0]:
            if int(m.jnt_type[j]) == JointType.BALL:
                limit_jnts.append(int(j))
                limit_sides.append(0)
            elif int(m.jnt_type[j]) in (JointType.HINGE, JointType.SLIDE):
                limit_jnts += [int(j), int(j)]
                limit_sides += [-1, 1]
        for t in np.nonzero(m.tendon_limited)[0]:
            limit_tendons += [int(t), int(t)]
            limit_tendon_sides += [-1, 1]
    return ConstraintLayout(
        groups=tuple(groups),
        eq_ids=tuple(eq_ids),
        eq_active0=tuple(bool(m.eq_active0[i]) for i in eq_ids),
        eq_types=tuple(int(m.eq_type[i]) for i in eq_ids),
        eq_sites=tuple(bool(m.eq_objtype[i] == mujoco.mjtObj.mjOBJ_SITE) for i in eq_ids),
        friction_dofs=friction_dofs,
        friction_tendons=friction_tendons,
        limit_jnts=tuple(limit_jnts),
        limit_tendons=tuple(limit_tendons),
        limit_tendon_sides=tuple(limit_tendon_sides),
        limit_sides=tuple(limit_sides),
        cone=cone,
    )
