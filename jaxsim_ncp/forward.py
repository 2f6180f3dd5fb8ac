"""The pipeline: forward(), step(), rollout(), in MuJoCo's stage order.

forward: kinematics -> com -> tendons -> inertia -> velocities -> passive -> bias (+ tendon
armature) -> actuation
-> smooth acceleration -> collision -> constraint rows -> Newton solve (or, with
solver="ncp", the interior-point NCP that returns the next velocity) -> sensors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import actuation, adjoint, constraint, history, linalg, math, passive, sensor, smooth, tendon, validate
from . import cfd as cfd_lib
from .collision import collide
from .collision.primitives import CAPSULE, PLANE
from .integrate import adaptive, fixed
from .solver import implicit, ncp, newton, noslip
from .types import Data, Model, WarningKind


@linalg.full_precision
@jax.jit
def forward(model: Model, data: Data) -> Data:
    """Fill every derived quantity of `data` and the acceleration qacc (mj_forward)."""
    data = validate.conform_data(model, data)
    data = smooth.kinematics(model, data)
    data = smooth.com_pos(model, data)
    data = tendon.tendon(model, data)
    data = smooth.crb(model, data)
    data = smooth.com_vel(model, data)
    if _contacts_first(model):  # adhesion (the contact force, the actuators' moments) needs the contacts
        data = data.replace(contact=collide(model, data))
    data = passive.passive(model, data)
    data = smooth.rne(model, data)
    data = tendon.armature(model, data)
    data = actuation.actuation(model, data)
    qfrc_smooth = (
        data.qfrc_passive - data.qfrc_bias + data.qfrc_applied + data.qfrc_actuator
        + smooth.xfrc_to_qfrc(model, data)
    )
    # M is block diagonal over the kinematic trees, unless a tendon's armature couples them
    trees = None if model.ntendon else linalg.diagonal_blocks(model.topology.dof_treeid)
    qacc_smooth = linalg.solve_spd(data.qM, qfrc_smooth) if trees is None else linalg.solve_spd_blocks(data.qM, qfrc_smooth, trees)
    data = data.replace(qfrc_smooth=qfrc_smooth, qacc_smooth=qacc_smooth)
    if model.opt.energy:  # mj_energyPos, mj_energyVel
        data = data.replace(energy=jnp.stack(sensor.energy(model, data)))
    return sensor.sensors(model, _constraint_solve(model, data))


def _contacts_first(model: Model) -> bool:
    """Whether the contacts are found before the smooth forces (MuJoCo's order): contact adhesion and
    adhesion actuators read them; otherwise collision waits until the constraint stage."""
    return bool(model.constraints.ncon) and (model.topology.has_adhesion or actuation.body_transmissions(model))


def _constraint_solve(model: Model, data: Data) -> Data:
    """Collision, constraint rows and the Newton solve (mj_collision, mj_makeConstraint, mj_fwdConstraint)."""
    layout = model.constraints
    if layout.nefc == 0:
        return data.replace(
            qacc=data.qacc_smooth, qfrc_constraint=jnp.zeros_like(data.qacc_smooth),
            solver_niter=jnp.zeros((), jnp.int32), solver_converged=jnp.ones((), bool),
            solver_residual=jnp.zeros_like(data.time),
        )  # fmt: skip
    if model.opt.solver == "ncp":
        return _ncp_solve(model, data)
    if layout.ncon and not _contacts_first(model):  # else collided before the passive forces
        data = data.replace(contact=collide(model, data))
    efc, sol = _newton(model, data)
    if model.opt.cfd is not None and layout.ncon:
        sol, cfd_contact = _newton_cfd(model, data, sol)
        data = data.replace(contact=data.contact.replace(overflow=data.contact.overflow | cfd_contact.overflow))
    # MuJoCo's scaled gradient norm of the Newton cost at the solution: |M a - f - J^T force| / (meaninertia nv)
    gradient = data.qM @ sol.qacc - data.qfrc_smooth - sol.qfrc_constraint
    return data.replace(
        qacc=sol.qacc,
        qfrc_constraint=sol.qfrc_constraint,
        efc_J=constraint.dense_jacobian(efc),
        efc_pos=efc.pos,
        efc_margin=efc.margin,
        efc_D=efc.D,
        efc_aref=efc.aref,
        efc_force=sol.efc_force,
        efc_mask=efc.mask,
        solver_niter=sol.iterations,
        solver_converged=sol.converged,
        solver_residual=jax.lax.stop_gradient(
            jnp.linalg.norm(gradient) / (model.opt.meaninertia * max(1, model.nv))
        ),
    )


def _newton(model: Model, data: Data, cfd=None) -> tuple[constraint.Efc, newton.Solution]:
    """The rows of data.contact's efc contacts and their Newton solve."""
    contacts = constraint.efc_contacts(model, data.contact)
    efc = constraint.make_efc(model, data, cfd, contacts)
    sol = newton.solve(model, data.qM, data.qfrc_smooth, data.qacc_smooth, data.qacc_warmstart, efc,
                       contacts.contact.friction, contacts.geom)  # fmt: skip
    if model.opt.noslip_iterations > 0:
        qacc, force, qfrc = noslip.solve(model, data.qM, data.qacc_smooth, efc, sol.efc_force, contacts.contact.friction,
                                         contacts.slots, contacts.geom)  # fmt: skip
        sol = sol._replace(qacc=qacc, efc_force=force, qfrc_constraint=qfrc)
    return efc, sol


def _newton_cfd(model: Model, data: Data, sol: newton.Solution):
    """Contacts from distance (cfd.py): solve again with contacts out to `cfd.width`, and keep
    `sol`'s values with that solve's derivative (straight-through, DiffMJX eq. S8). Returns
    the solution and the wider contact set."""
    cfd = model.opt.cfd
    d = data.replace(contact=collide(model, data, pair_reach=cfd_lib.pair_reach(cfd, model.topology.geom_names)))
    _, soft = _newton(model, d, cfd)
    return sol._replace(
        qacc=cfd_lib.straight_through(sol.qacc, soft.qacc),
        qfrc_constraint=cfd_lib.straight_through(sol.qfrc_constraint, soft.qfrc_constraint),
    ), d.contact


def _lookahead(model: Model, data: Data, length: jax.Array):
    """Detection distances for the hard-contact solver: how far a geom (or a limited joint) can move this step.

    A geom's speed is bounded by |v_center| + |omega| rbound; its lookahead is twice the
    distance it covers in a step at that speed, plus h^2 |g| and 1% of the length scale
    (so resting contacts stay in the set). The speed is the larger of the start velocity's and
    that of v + h qacc_smooth, where the smooth forces alone take it by the end of the step:
    actuators can drive a joint through its limit, or a foot into the floor, faster than the
    start velocity says (the MJX humanoid at dt = 0.05: a limit left out of the problem was
    crossed by 0.11 rad in one step). Not differentiated: it only selects contacts.
    """
    h = model.opt.timestep
    topo = model.topology
    body = np.asarray(topo.geom_bodyid, dtype=np.int64)
    root = np.asarray(topo.body_rootid, dtype=np.int64)[body]
    dofs = np.asarray(topo.jnt_dofadr, dtype=np.int64)[np.asarray(model.constraints.limit_jnts, dtype=np.int64)]
    tendons = np.asarray(model.constraints.limit_tendons, dtype=np.int64)

    def speeds(qvel, cvel):
        """(geom speed bound, limited joint and tendon speeds) at generalized velocity qvel (body velocities cvel)."""
        ang, lin = cvel[body, :3], cvel[body, 3:]
        center = lin + jnp.cross(ang, data.geom_xpos - data.subtree_com[root])
        geom = jnp.linalg.norm(center, axis=-1) + jnp.linalg.norm(ang, axis=-1) * model.geom_rbound
        return geom, jnp.abs(jnp.concatenate([qvel[dofs], data.ten_J[tendons] @ qvel]))

    qvel_end = data.qvel + h * data.qacc_smooth
    geom_start, limit_start = speeds(data.qvel, data.cvel)  # forward's mj_comVel already holds them
    geom_end, limit_end = speeds(qvel_end, smooth.com_vel(model, data.replace(qvel=qvel_end)).cvel)
    floor = h**2 * jnp.linalg.norm(model.opt.gravity) + 0.01 * length
    geom = 2.0 * h * jnp.maximum(geom_start, geom_end) + floor
    limit = 2.0 * h * jnp.maximum(limit_start, limit_end) + 0.01
    return jax.lax.stop_gradient(geom), jax.lax.stop_gradient(limit)


def _following_units(model: Model) -> np.ndarray:
    """Per NCP unit (limits, then contact slots; no contact capacity): True where the unit's gap
    follows the iterate in a nonlinear pass (`ncp.solve_nonlinear`). That needs the unit to be the
    same feature of its pair at every configuration: limits, pairs with one contact, a capsule's two
    ends on a plane (the other pairs pack their contacts, a box's first four corners below a plane,
    manifolds: a slot can hold another corner at the next configuration). And a contact must touch a
    link of an articulated chain (a body that is not the root of its tree): joints turning by up to
    1 rad per step swing it on an arc the linearized gap cannot follow (the dt = 0.05 humanoid's
    feet). A free body's contacts keep their pass's rows: re-linearized passes already stop them
    (drops at dt = 0.05: no penetration), and with their gaps following, 1000 randomized drop
    worlds converged less often (99.99 -> 99.79% of steps, most of it in three worlds that then
    diverged, a capsule spinning up over ~20 steps at dt = 0.05)."""
    layout, topo = model.constraints, model.topology
    root = np.asarray(topo.body_rootid, np.int64)
    body = np.asarray(topo.geom_bodyid, np.int64)[layout.contact_geom] if layout.ncon else np.zeros((0, 2), np.int64)
    link = np.any((root[body] != body) & (body != 0), axis=1)
    same = [np.full(len(g.geom1) * g.n_slots, g.n_slots == 1 or tuple(g.types) == (PLANE, CAPSULE)) for g in layout.groups]
    return np.concatenate([np.ones(layout.nl, bool), np.concatenate([np.zeros(0, bool), *same]) & link])


def _moving(rows: constraint.UnitRows) -> dict:
    """The fields of NCP rows that change with the configuration (the rest are the pairs' and
    the model's: friction, scales, layout)."""
    return dict(J=rows.J, gap=rows.gap, Je=rows.Je, pos_e=rows.pos_e, active=rows.active)


def _ncp_solve(model: Model, data: Data) -> Data:
    """Collision within reach of the step, NCP rows and the interior-point solve (solver/ncp.py).

    The NCP returns the next velocity; qacc = (v+ - v) / h and qfrc_constraint = impulse / h,
    so `fixed.advance` with that qacc is the step. efc_force holds the impulses / h in
    MuJoCo's elliptic row layout (efc_D, efc_aref stay zero: there is no soft model).

    The gap is linearized at the start of the step. Where that leaves a unit penetrating
    deeper than 1e-5 L at the new configuration q1 = q (+) h v1 (rotating bodies: the
    contact point moves), the step is solved again with rows re-linearized at q1:
    gap(q (+) h v) ~ gap(q1) + h J(q1) (v - v1), up to `opt.ncp_passes` passes in all,
    and each world keeps the pass that penetrates least among those that ended near a solution
    (the first one when it does not penetrate: re-linearizing can also make things worse when
    the contact set changes between passes). With n > 1 passes a step costs n solves and
    n + 2 kinematics and collisions (the passes are one `lax.scan`, compiled once, run without
    gradients; the kept pass's rows are evaluated once more, differentiably, and its solution
    differentiated there); the choices are selects, so batches stay vmapped.

    With `ncp_nonlinear_gap` (default) and contacts on links of articulated chains
    (`_following_units`), the passes after the first evaluate those units' gaps at every
    interior-point iterate instead (`ncp.solve_nonlinear`, one kinematics and collision per
    iteration), impulse directions and friction rows at q (units that come into reach only at
    the pass's start configuration: there); a kept nonlinear pass is differentiated as the problem
    re-linearized at its own solution v*, which it solves (exactly, where all directions are at q).
    A nonlinear pass that gains kinetic energy (directions at q, gaps at q (+) h v: the impulses
    can do work) is not kept, and the next one takes all directions where it ended; one that runs
    out of iterations goes on in the next.

    With a contact capacity (`max_geom_pairs`) the units are compacted before their Jacobians
    are built (`constraint.unit_rows`): the solve's size follows the capacity, not the number of
    pairs, and its results go back to the full layout (efc_*, contact slots).
    """
    layout, opt = model.constraints, model.opt
    h = opt.timestep
    length = opt.meansize
    geom_reach, limit_reach = _lookahead(model, data, length)
    mass = fixed.effective_mass(model, data, always_damp=True)
    momentum = mass @ data.qvel + h * data.qfrc_smooth
    g = jnp.linalg.norm(opt.gravity) if not opt.disabled("gravity") else jnp.zeros_like(h)
    a_ref = jnp.where(g > 0, g, length / h**2)
    # float32 cannot resolve a cone pair closer than ~eps to its boundary (a sliding contact sits
    # kappa / speed inside it): kappa and the tolerance are floored at 100 eps (1.2e-5 in float32)
    floor = 100 * float(jnp.finfo(h.dtype).eps)
    tolerance, kappa = max(opt.tolerance, floor), max(opt.kappa, floor)
    kappa_grad = max(opt.kappa_grad, kappa)

    def recovery_limited(rows):
        """A unit penetrating deeper than h * ncp_recovery_speed at the start of the step is pushed out
        by that much only: gap(q) + h J v >= 0 becomes max(gap(q), -h v_max) + h J v >= 0 (a
        re-linearized pass's shifted gap is its estimate of gap(q)). Bodies that start deeply
        interpenetrating separate over several steps instead of at depth / h in one."""
        return rows._replace(gap=jnp.maximum(rows.gap, -h * opt.ncp_recovery_speed))

    def rows_at(qvel_lin=None, data=data):
        """Contacts and rows at q1 = q (+) h qvel_lin, gaps linearized about qvel_lin (None: at q)."""
        d = data
        if qvel_lin is not None:
            d = data.replace(qpos=smooth.integrate_pos(model, data.qpos, qvel_lin, h))
            d = tendon.tendon(model, smooth.com_pos(model, smooth.kinematics(model, d)))
        if layout.ncon:
            d = d.replace(contact=collide(model, d, geom_reach))
        rows = constraint.unit_rows(model, d, limit_reach)
        if qvel_lin is not None:
            rows = rows._replace(gap=rows.gap - h * (rows.J[:, 0] @ qvel_lin), pos_e=rows.pos_e - h * (rows.Je @ qvel_lin))
        return d.contact, recovery_limited(rows)

    def problem(rows, step, G=None):
        mass, momentum, a_ref, h = step
        return ncp.Problem(
            M=mass, momentum=momentum, h=h, J=rows.J, gap=rows.gap, mu=rows.mu, Je=rows.Je, pos_e=rows.pos_e,
            P=a_ref * h / rows.inv_mass, Pe=a_ref * h / rows.inv_mass_e, L=length, V=length / h,
            active=rows.active.astype(h.dtype), friction=jnp.asarray(rows.friction, h.dtype), G=G,
        )  # fmt: skip

    def full_layout(rows, sol):
        return sol._replace(impulse=constraint.expand_units(model, rows, sol.impulse))

    def solve(rows, skip=False, kappa=kappa, step=(mass, momentum, a_ref, h), solved=None, start=None, G=None):
        p = problem(rows, step, G)
        return full_layout(rows, ncp.solve(p, kappa, kappa_grad, tolerance, opt.iterations, opt.ncp_early_exit, skip, solved, start))

    def nonlinear_rows(rows0, rows, v):
        """A nonlinear pass's problem rows at velocity v: rows0 (the pass's start: units, impulse
        directions, tangents) with the gap and normal row of `rows` (at q (+) h v, linearized about v)
        for every unit present in both whose gap follows the iterate (`_following_units`);
        returns (rows, G) for `problem`. The normal row is d gap(q (+) h v) / d(h v): a rotation
        integrated as q exp(h w) moves the tangent at q (+) h v by J_r(h w) h dw (`math.so3_right_jacobian`),
        which the implicit gradient needs (at dt = 0.05 the humanoid's root turns ~0.3 rad per step)."""
        same = rows.active & rows0.active & following
        normal = rows.J[:, 0]
        _, rot = model.topology.quat_coords
        if len(rot):
            blocks = np.asarray(rot)[:, None] + np.arange(3)
            turned = jnp.einsum("ukj,kji->uki", normal[:, blocks], math.so3_right_jacobian(h * v[blocks]))
            normal = normal.at[:, blocks].set(turned)
        gap = rows.gap + h * (rows.J[:, 0] - normal) @ v  # gap(q (+) h v) - h normal v (rows_at shifted by J v)
        normal = jnp.where(same[:, None], normal, rows0.J[:, 0])
        return rows0._replace(gap=jnp.where(same, gap, rows0.gap)), rows0.J.at[:, 0].set(normal)

    def with_new_units(rows_q, rows_start):
        """A nonlinear pass's fixed rows: those at q (rows_q), and for the units that came into reach
        only at the pass's start configuration (rows_start: a contact the lookahead at q missed, the
        other end of a capsule) the rows there, so that those units take part too (their gaps follow
        the iterate like the others'; their impulse directions depend on that earlier solution)."""
        new = rows_start.active & ~rows_q.active
        merged = {k: jnp.where(new.reshape(new.shape + (1,) * (getattr(rows_q, k).ndim - 1)), getattr(rows_start, k), getattr(rows_q, k))
                  for k in ("J", "gap", "active")}  # fmt: skip
        return rows_q._replace(**merged)

    def penetration(rows, qvel_lin):
        """Depth of the deepest active unit at q (+) h qvel_lin (rows evaluated there; 0: none)."""
        true_gap = rows.gap + h * (rows.J[:, 0] @ qvel_lin)
        return jnp.maximum(0.0, -jnp.min(jnp.where(rows.active, true_gap, jnp.inf), initial=jnp.inf))

    # the passes only choose where to linearize and solve there: they see the inputs without their
    # gradients, and the kept pass is differentiated once, its rows evaluated again (Table V humanoid,
    # forward + gradient: 1.18 -> 1.02 ms per step, its compile 30 -> 20 s: reverse mode had relaxed,
    # factored and back-substituted the solves of all three rounds)
    frozen_data, frozen_step = jax.lax.stop_gradient((data, (mass, momentum, a_ref, h)))

    def one_pass(carry, flags):
        """Judge the last pass at its new configuration; solve again, re-linearized there, if it penetrates."""
        first, judge_only = flags
        best, best_depth, last, at_q = carry
        qvel_lin = jnp.where(first, 0.0, last[0].qvel)
        contact, rows = rows_at(qvel_lin, frozen_data)
        if nonlinear:  # the rows at q, kept from the first round
            at_q = jax.tree.map(lambda a, b: jnp.where(first, a, b), _moving(rows), at_q)
        depth = jnp.where(first, jnp.inf, penetration(rows, qvel_lin))
        # a pass that ended far from any solution (`ncp.NEAR_SOLUTION`) counts only where no other is, however
        # little it penetrates (1000 randomized drop worlds x 50 steps: unconverged 5 -> 1, diverged worlds 2 -> 0)
        near = last[0].converged | (last[0].residual <= ncp.NEAR_SOLUTION)
        # nor a nonlinear pass that leaves more kinetic energy than the smooth forces alone would:
        # contact impulses do no positive work where v = 0 is feasible, but with directions at q and
        # gaps at q (+) h v they can (a humanoid falling at 1 m/s, turning at 6 rad/s: +15%)
        energetic = False
        if nonlinear:
            energetic = (last[2] > 0) & (last[0].qvel @ frozen_step[0] @ last[0].qvel > 1.001 * energy_free)
            near = near & ~energetic
        # and among passes within 1e-6 L of the same depth the converged one, or the one closest to converging
        unconverged = jnp.where(last[0].converged, 0.0, 1e-6 * length * (1.0 + last[0].residual / ncp.NEAR_SOLUTION))
        score = depth + jnp.where(near, unconverged, 1e6 * length)
        better = score < best_depth
        best, best_depth = math.tree_where(better, last, best), jnp.where(better, score, best_depth)
        # a nonlinear pass that ran out of iterations near its solution goes on from there in the next
        needed = (first | (depth > 1e-5 * length) | energetic | ((last[2] > 0) & ~last[0].converged)) & ~judge_only
        # a re-linearized pass starts from the last pass's solution (`ncp.warm_point`)
        start = (last[0].qvel, last[0].impulse[rows.index], last[0].impulse_e, ~first)
        linear_pass = lambda: (solve(rows, skip=~needed, step=frozen_step, start=start), qvel_lin, 0)  # noqa: E731
        if not nonlinear:
            new = linear_pass()
        else:  # the first pass linear, the later ones with the gap evaluated at every iterate

            def nonlinear_pass():
                # impulse directions and tangents at q, as in the first pass: they depend on no earlier
                # pass's solution, so the implicit gradient at the solution is exact (`ncp.solve_nonlinear`).
                # After a pass that gained energy they are taken where that pass ended instead (Dojo's
                # directions at the next configuration, up to one pass; the gradient then holds them fixed)
                rows_q = math.tree_where(energetic, rows, with_new_units(rows._replace(**at_q), rows))

                def at(rows_v, v):  # model parameters (friction, sizes) reach the rows: cut here, not differentiated
                    rows_v, G = nonlinear_rows(rows_q, rows_v, v)
                    return jax.lax.stop_gradient(problem(rows_v, frozen_step, G))

                # the pass starts at v = start[0] = qvel_lin, where `rows` already are
                sol = ncp.solve_nonlinear(at(rows, qvel_lin), lambda v: at(rows_at(v, frozen_data)[1], v), kappa, tolerance,
                                          opt.iterations, opt.ncp_early_exit, ~needed, jax.lax.stop_gradient(start[:3]))  # fmt: skip
                return full_layout(rows_q, sol), jnp.zeros_like(qvel_lin), jnp.where(energetic, 2, 1)

            new = jax.lax.cond(first, linear_pass, nonlinear_pass)
        last = math.tree_where(needed, new, last)
        return (best, best_depth, last, at_q), None

    # the units keep their slots from one configuration to the next unless a contact capacity compacts them
    following = _following_units(model)
    nonlinear = opt.ncp_nonlinear_gap and opt.max_geom_pairs is None and bool(following[layout.nl :].any())
    if opt.ncp_passes == 1:
        contact, rows = rows_at()
        sol = solve(rows)
    else:  # the passes, then a round that only judges the last one (one traced collision for all rounds)
        def shapes():  # of a pass's result and of the rows at q (data's contact slots have a collision's shapes)
            rows = constraint.unit_rows(model, data, limit_reach)
            return (solve(rows), data.qvel, 0), _moving(rows)

        empty, no_rows = jax.tree.map(jnp.zeros_like, jax.eval_shape(shapes))
        if nonlinear:
            v_free = linalg.solve_spd(frozen_step[0], frozen_step[1])
            energy_free = v_free @ frozen_step[1]  # 2 x the kinetic energy without constraint impulses
        else:
            no_rows = None
        rounds = np.arange(opt.ncp_passes + 1)
        flags = (jnp.asarray(rounds == 0), jnp.asarray(rounds == opt.ncp_passes))
        (best, _, _, _), _ = jax.lax.scan(one_pass, (empty, jnp.asarray(jnp.inf, h.dtype), empty, no_rows), flags)
        # the model's parameters (and the lookahead, from qvel) reach the passes too: cut here, so that
        # the kept pass's linearization point is held fixed for them as for the state (reverse mode
        # had transposed every pass through every collision and solve)
        kept, qvel_lin, kept_mode = jax.lax.stop_gradient(best)
        G = None
        if not nonlinear:
            contact, rows = rows_at(qvel_lin)
        else:  # a nonlinear pass's solution solves its rows at its own velocity (`ncp.solve_nonlinear`)
            # the rows the pass took at its start configuration, taken at its end (one collision less:
            # its gradient then holds them at the end, where they differ by one pass's change); both
            # configurations in one vmapped collision (one traced copy, forward and backward)
            v_end = jax.lax.stop_gradient(kept.qvel)
            both = jax.vmap(rows_at)(jnp.stack([qvel_lin, v_end]))
            contact, rows = jax.tree.map(lambda x: x[0], both)
            at_end = jax.tree.map(lambda x: x[1], both[1])
            fixed_rows = math.tree_where(kept_mode == 2, at_end, with_new_units(rows, at_end))
            rows_end, G_end = nonlinear_rows(fixed_rows, at_end, v_end)
            rows = math.tree_where(kept_mode > 0, rows_end, rows)
            G = jnp.where(kept_mode > 0, G_end, rows.J)
        sol = solve(rows, solved=(kept.x, kept.converged, kept.iterations), G=G)

    def generalized(rows, sol):
        """J^T impulse of a solve, in generalized coordinates."""
        return rows.Je.T @ sol.impulse_e + jnp.einsum("ckn,ck->n", rows.J, sol.impulse[rows.index])

    impulse = generalized(rows, sol)
    if opt.cfd is not None and layout.ncon:
        # contacts from distance (cfd.py): the gradient comes from one more solve in which every
        # unit of cfd's pairs within cfd.width also takes part, complementarity relaxed to kappa_grad (gamma s =
        # kappa_grad: a push that decays with the gap), differentiated exactly (straight-through)
        wide = collide(model, data, geom_reach, cfd_lib.pair_reach(opt.cfd, model.topology.geom_names))
        soft_rows = recovery_limited(constraint.unit_rows(model, data.replace(contact=wide), limit_reach))
        soft = solve(soft_rows, kappa=kappa_grad)
        contact = contact.replace(overflow=contact.overflow | wide.overflow)
        sol = sol._replace(**{k: cfd_lib.straight_through(getattr(sol, k), getattr(soft, k)) for k in ("qvel", "impulse", "impulse_e")})
        impulse = cfd_lib.straight_through(impulse, generalized(soft_rows, soft))
    efc_force, efc_J, efc_pos, efc_mask = _ncp_efc(model, rows, sol)
    return data.replace(
        contact=contact,
        qacc=(sol.qvel - data.qvel) / h,
        qfrc_constraint=impulse / h,
        efc_J=efc_J,
        efc_pos=efc_pos,
        efc_force=efc_force / h,
        efc_mask=efc_mask,
        solver_niter=sol.iterations,
        solver_converged=sol.converged,
        solver_residual=sol.residual,
    )


def _ncp_efc(model: Model, rows: constraint.UnitRows, sol: ncp.Solution):
    """Impulses, Jacobian rows, distances and masks of the NCP in MuJoCo's elliptic efc layout
    (the units' contacts are the efc contacts, in order)."""
    layout = model.constraints
    nl = layout.nl
    unit = np.concatenate([np.arange(nl), nl + layout.row_contact]).astype(np.int64)
    axis = np.concatenate([np.zeros(nl, np.int64), layout.row_axis]).astype(np.int64)
    force = jnp.concatenate([sol.impulse_e, sol.impulse[rows.index[unit], axis]])  # sol.impulse: full layout
    J = jnp.concatenate([rows.Je, rows.J[unit, axis]])
    pos = jnp.concatenate([rows.pos_e, rows.gap[unit]])
    mask = jnp.concatenate([jnp.ones(layout.ne, bool), rows.active[unit]])
    return force, J, pos, mask


def _sane(x: jax.Array) -> jax.Array:
    """Entries of an input a step can compute with: finite, and beneath the square root of the dtype's
    largest number (a float32 force of 1e30 makes inf inside the step)."""
    return jnp.abs(x) <= np.sqrt(jnp.finfo(x.dtype).max)  # NaN compares False


def _sane_or_zero(x):
    return jnp.where(_sane(x), x, 0.0)


def _bad(x: jax.Array, maxval: float) -> jax.Array:
    """MuJoCo's mju_isBad over an array: any entry non-finite or beyond maxval in magnitude."""
    return ~jnp.all(jnp.abs(x) <= maxval)  # NaN compares False


@linalg.full_precision
@jax.jit
def step(model: Model, data: Data) -> Data:
    """Advance one timestep with the model's integrator (mj_step).

    Per-world checks (counted in `data.warning`, see `WarningKind`): a world with
    controls, applied forces or mocap poses that are non-finite or beyond the square root of
    the dtype's largest number (BAD_INPUT; they are zeroed before use, so the world's own
    quantities stay finite), a state on entry that is non-finite or beyond `opt.maxval`
    (computed with as qpos0 at rest, for the same reason), or whose acceleration or new state
    is non-finite or beyond `opt.maxval` (BAD_QACC, BAD_QPOS, BAD_QVEL) gets
    `diverged=True` and keeps its last good state (and time), or, with
    `opt.auto_reset`, restarts from qpos0 at rest (its time runs on). A solver that
    stops at its iteration limit counts a SOLVER warning; an adaptive integrator that hits
    max_steps counts INTEGRATOR and diverges like a bad state, and so does a world whose model
    has a parameter no step can be computed with (BAD_MODEL: a model edited under jit or vmap). Every
    decision is per world, so one bad world in a vmapped batch never changes the others. Reverse
    mode gives the inputs of a world's discarded step a zero cotangent (`adjoint.discarding`), even
    where the step overflowed inside.
    """
    return _checked_step(model, data, validate.invalid_parameters(model))


@jax.jit
def _checked_step(model: Model, data: Data, invalid_model: jax.Array) -> Data:
    """`step`, with the model's parameter check given (`rollout` makes it once, outside its loop: in
    the loop the model's leaves are carried accumulators, batched like the state)."""
    data = validate.conform_data(model, data)
    given = data  # the world's inputs and state as they came: the held state of a bad world, the returned inputs
    inputs = ("ctrl", "qfrc_applied", "xfrc_applied", "mocap_pos", "mocap_quat")
    bad_input = ~jnp.all(jnp.stack([jnp.all(_sane(getattr(data, f))) for f in inputs]))
    # a bad state on entry (a NaN initial state: MuJoCo's mj_checkPos, mj_checkVel) is computed with as qpos0
    # at rest, and flagged, as a bad input is zeroed: the world's contacts, sensors and solver stay finite and
    # its warnings name the cause. The gradients of shared parameters would stay finite without either: a
    # discarded step's backward pass gives zero (`adjoint.discarding`)
    maxval = model.opt.maxval
    bad_qpos_in, bad_qvel_in = _bad(data.qpos, maxval), _bad(data.qvel, maxval) | _bad(data.act, maxval)
    bad_state_in = bad_qpos_in | bad_qvel_in
    data = data.replace(
        **{f: _sane_or_zero(getattr(data, f)) for f in inputs},  # a zero mocap_quat reads as the identity
        qpos=jnp.where(bad_state_in, model.qpos0.astype(data.qpos.dtype), data.qpos),
        qvel=jnp.where(bad_state_in, 0.0, data.qvel),
        act=jnp.where(bad_state_in, 0.0, data.act),
    )
    entry = jnp.stack([bad_input, bad_qpos_in, bad_qvel_in, invalid_model])
    (new, substeps, raw, recorded, fresh), discard = adjoint.discarding(_advance)(model, data, entry)
    fired = raw & ~data.diverged  # a frozen world checks nothing more
    warning = data.warning + fired.astype(jnp.int32)
    warning_time = jnp.where(fired & (data.warning == 0), data.time, data.warning_time)
    if model.opt.auto_reset:  # restart from qpos0 at rest; the clock runs on
        fallback = (model.qpos0.astype(data.qpos.dtype), jnp.zeros_like(data.qvel), jnp.zeros_like(data.act), new.time,
                    jnp.zeros_like(data.qacc_warmstart), recorded, passive.initial_plastic(model))  # fmt: skip
        diverged = data.diverged
    else:  # freeze at the last good state (a state bad on entry stays as it came)
        fallback = (given.qpos, given.qvel, given.act, data.time, data.qacc_warmstart, data.history, data.plastic)
        diverged = discard
    qpos, qvel, act, time, warmstart, buffers, plastic = (jnp.where(discard, f, n) for f, n in zip(fallback, fresh))
    return new.replace(
        plastic=plastic,
        qpos=qpos,
        qvel=qvel,
        act=act,
        time=time,
        qacc_warmstart=warmstart,
        history=buffers,
        **{f: getattr(given, f) for f in inputs},
        diverged=diverged,
        warning=warning,
        warning_time=warning_time,
        substeps=substeps,
    )


@jax.jit
def _advance(model: Model, data: Data, entry: jax.Array):
    """The step a world computes: forward, the integrator, the history buffers and plasticity.

    entry: the checks made before (bad input, bad qpos or qvel on entry, a bad model). Returns
    ((new, substeps, raw, recorded, fresh), discard): raw holds every `WarningKind` check, a frozen
    world's included; fresh the state's next values; discard whether the world keeps another state
    instead (diverged before, or now). `step` differentiates it through `adjoint.discarding`."""
    bad_input, bad_qpos_in, bad_qvel_in, invalid_model = entry
    data = forward(model, data)
    integrator = model.opt.integrator
    substeps, completed = jnp.ones((), jnp.int32), jnp.ones((), bool)
    if model.opt.solver == "ncp":  # qacc is already the velocity-level step of the integrator's mass matrix
        new = fixed.advance(model, data, data.act_dot, data.qacc)
    elif integrator == "euler":
        new = fixed.euler(model, data)
    elif integrator in ("implicitfast", "implicit"):
        new = fixed.implicit(model, data)
    elif integrator == "rk4":
        new = fixed.rk4(model, data, forward)
    elif integrator == "adaptive":
        new, substeps, completed = adaptive.advance(model, data, forward)
    else:
        raise ValueError(f"unknown integrator {integrator!r}")
    maxval = model.opt.maxval
    raw = jnp.stack([
        bad_input,
        bad_qpos_in | _bad(new.qpos, maxval),
        bad_qvel_in | _bad(new.qvel, maxval) | _bad(new.act, maxval),
        _bad(data.qacc, maxval),
        ~data.solver_converged,
        ~completed,
        data.contact.overflow,
        invalid_model,
    ])  # fmt: skip
    bad = jnp.any(raw[:4]) | raw[WarningKind.INTEGRATOR] | raw[WarningKind.BAD_MODEL]
    # the history buffers record the controls and the buffered sensors' current values, which
    # sensordata does not hold for a delayed sensor (mj_advance recomputes them too)
    buffered = tuple(b.index for b in history.sensor_buffers(model))
    values = sensor.current_values(model, data, buffered) if buffered else None
    if buffered and model.opt.disabled("sensor"):
        values = history.unrefreshed(model, data, values)
    recorded = history.record(model, data, values)
    warm = new.qacc_warmstart if integrator == "rk4" else data.qacc  # the last forward's qacc (RK4: its last stage's)
    plastic = passive.plasticity(model, data, new.qpos)  # the springs yield at the new configuration
    fresh = (new.qpos, new.qvel, new.act, new.time, warm, recorded, plastic)
    return (new, substeps, raw, recorded, fresh), data.diverged | bad


@linalg.full_precision
def rollout(
    model: Model, data: Data, ctrl: jax.Array, checkpoint: bool | int | str = False, rescale_adjoint: bool = True
) -> tuple[Data, Data]:
    """Apply ctrl[t] and step, for t = 0..T-1 (lax.scan). Returns (final, traj).

    traj is a Data with a leading T axis: traj[t] is the Data returned by the t-th step.
    checkpoint=True rematerializes each step in the backward pass (memory O(T) states,
    not O(T) full Data), all but its solver's iterations: their solution is kept
    (`implicit.SOLUTION`: qacc, or the NCP's point) and the step is linearized there; checkpoint=k (int > 1)
    also scans in checkpointed chunks of k steps, so reverse mode stores only T/k carries
    plus the k of the chunk being differentiated; checkpoint="sqrt" takes k = ceil(sqrt(T)),
    which minimizes T/k + k: memory O(sqrt T) states for one more forward pass (each step
    runs twice before its backward pass instead of once).
    rescale_adjoint: reverse mode carries the state's adjoint rescaled (`adjoint`), so a gradient
    beyond the dtype comes back as +-inf, not NaN; False saves its cost (humanoid, 100-step
    gradient, float32, CPU: 6% of the XLA memory at B = 64, 24% at B = 1, 0-10% of the time).
    """
    data = validate.conform_data(model, data)
    ctrl = jnp.asarray(ctrl, dtype=data.ctrl.dtype)
    if ctrl.ndim != 2 or ctrl.shape[1] != model.nu:
        raise ValueError(f"ctrl must have shape (T, nu={model.nu}), got {ctrl.shape}")
    if checkpoint == "sqrt":
        checkpoint = max(1, int(np.ceil(np.sqrt(ctrl.shape[0]))))
    elif not (isinstance(checkpoint, (bool, int, np.integer)) and checkpoint >= 0):
        raise ValueError(f"checkpoint must be False, True, a chunk length k >= 1 or 'sqrt', got {checkpoint!r}")

    # the carry is (data, log-scale of its adjoint, the adjoint accumulator of the model's floating
    # leaves); forward values are untouched either way
    ops = adjoint if rescale_adjoint else adjoint.Identity
    dtype = data.time.dtype

    # only the leaves a step reads go through `renormalize`: its backward pass is one opaque node, so
    # every leaf in it keeps its derivative alive, and the derived fields (contacts, Jacobians, ...)
    # would be differentiated through every step although the next step recomputes them
    invalid_model = validate.invalid_parameters(model)
    model_step = lambda m, d: _checked_step(m, d, invalid_model)  # noqa: E731
    reads = adjoint.leaves_read(model_step, model, data) if rescale_adjoint else None

    def body(carry, u):
        d, ls, acc = carry
        acc, taps = ops.rescaled(acc, ls)
        d, ls = ops.renormalize(d, ls, taps, reads)
        u, ls = ops.unscaled(u, ls)
        d = model_step(ops.borrow(model, acc), d.replace(ctrl=u))
        out, ls = ops.emitted(d, ls)
        return (d, ls, acc), out

    zero = ops.batched_zero((data, ctrl, adjoint.borrowed_leaves(model)), dtype)  # batched like any of them
    acc, taps = ops.accumulator(model, zero)
    start = (*ops.enter(ops.spread(data, zero), zero, taps), acc)
    ctrl = ops.spread(ctrl, zero)  # batched like the carry, whose frame its cotangent is computed in
    if checkpoint:
        # each step keeps its solver's solution: the backward pass replays the rest of the step and
        # linearizes there, without the iterations (humanoid, 100-step gradient: about 0.75x the time
        # of replaying everything, memory unchanged)
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.save_only_these_names(implicit.SOLUTION))
    if not checkpoint or checkpoint is True or int(checkpoint) <= 1 or ctrl.shape[0] <= int(checkpoint):
        (final, _, _), traj = jax.lax.scan(body, start, ctrl)
        return final, traj

    k = int(checkpoint)
    n_chunks, rem = divmod(ctrl.shape[0], k)

    @jax.checkpoint
    def chunk(carry, u_chunk):
        return jax.lax.scan(body, carry, u_chunk)

    carry, traj = jax.lax.scan(chunk, start, ctrl[: n_chunks * k].reshape(n_chunks, k, model.nu))
    traj = jax.tree.map(lambda x: x.reshape((n_chunks * k,) + x.shape[2:]), traj)
    if rem:
        carry, tail = jax.lax.scan(body, carry, ctrl[n_chunks * k :])
        traj = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), traj, tail)
    return carry[0], traj
