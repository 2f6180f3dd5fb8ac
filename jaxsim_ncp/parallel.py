"""Batches of worlds split over devices: each device simulates its share, vmapped, and the devices never
wait for each other.

`batched(fn)` is `jax.jit(jax.vmap(fn))` with the batch axis split over a device mesh by
`jax.shard_map`: device k runs worlds [k B/n, (k+1) B/n) as `vmap(fn)` (on CPU devices in tiles of
at most `CPU_TILE` worlds, one after another), the computation that slice (each tile) runs on one
device (with the Newton solver bit for bit; the NCP's programs differ from it in the last bit), and
a world's solver loops stop when *its tile's* worlds converge. (Handing
`jax.jit(jax.vmap(fn))` sharded inputs also works, but XLA then partitions the whole program: every
`while_loop` trip of the solvers reduces its predicate over all devices.)

    mesh = jax.make_mesh((jax.device_count(),), ("worlds",))      # all devices (every host's)
    run = jsn.batched(lambda v, u: jsn.rollout(model, data.replace(qvel=v), u), mesh)
    final, traj = run(qvel0, ctrl)                                 # (B, nv), (B, T, nu): B worlds

Arguments with `in_axes` None (a shared model, a parameter being fitted) are copied to every device;
gradients with respect to them are summed over all worlds, as with `vmap`. A batch that is not a
multiple of the device count is padded with copies of its last world, and the copies are dropped
from the results (which then come back whole on every device, not split). `donate_argnums` (as
`jax.jit`'s) lets the results reuse the arguments' memory: a simulation carried from call to call
(`data = run(data, ctrl)[0]`) then needs one copy of its state, not two.

On a CPU, `use_cpu_cores()` (right after `import jax`) gives JAX a device per core, so that the
shares run side by side: the humanoid's 1024 worlds on 2 cores took 0.47x the time of
`jax.jit(jax.vmap(...))` with tiles and two devices, 1.8-2.1x MJX's throughput
(`experiments/bench_cores.py`, `experiments/results/humanoid_cpu.md`, stop 64).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .math import map_chunks, pad_with_last
from .types import Model, make_data

CPU_TILE = 128  # at most this many worlds per tile on CPU devices (`batched`)
CPU_TILE_BYTES = 16 << 20  # and at most this much of their state (`cpu_tile`)


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (a
    container's `--cpus`, /sys/fs/cgroup/cpu.max)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def use_cpu_cores(count: int | None = None) -> int:
    """Give JAX's CPU backend `count` devices (default: `usable_cores()`, unless the CPU device count
    was already chosen: `JAX_NUM_CPU_DEVICES` / `jax_num_cpu_devices`, or XLA's
    `--xla_force_host_platform_device_count`), so that `batched` runs a share of the worlds on each
    core. Returns the number of CPU devices this process will have (or has).

    XLA:CPU runs one program's operations mostly one after another (the humanoid's vmapped step at
    B = 1024 keeps 1.3 of 2 cores busy); a device per core runs the shares side by side (2 cores:
    0.6x the time). Call it right after `import jax`, before any JAX operation: JAX fixes the CPU
    device count when its backend starts (a later call raises, unless the count is already `count`).
    Our CPU factorizations never use XLA's shared thread pool (`linalg`), so concurrent devices
    cannot deadlock there; jaxlib's own batched LAPACK kernels (MJX's Cholesky) can.
    """
    if count is None:
        chosen = jax.config.jax_num_cpu_devices
        if chosen > 0 or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
            return chosen if chosen > 0 else len(jax.local_devices(backend="cpu"))
        count = usable_cores()
    if int(count) != count or count < 1:
        raise ValueError(f"use_cpu_cores needs a count >= 1, got {count}")
    count = int(count)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        present = len(jax.local_devices(backend="cpu"))
        if present != count:
            raise RuntimeError(
                f"use_cpu_cores({count}): JAX's CPU backend already started with {present} device(s); "
                "call it right after `import jax`, before any JAX operation"
            ) from None
    return count


def cpu_tile(world_bytes: int) -> int:
    """Worlds per tile on a CPU device (`batched`) for worlds whose state takes `world_bytes` each: the
    largest power of two from 1 to `CPU_TILE` whose tile holds at most `CPU_TILE_BYTES`. A step's
    intermediate arrays grow with its state, and a tile's should stay in the cache. Measured (2 cores,
    B = 256-1024, float32): the humanoid (Data 23 kB a world) ran alike in tiles of 32 to 128 and
    slower in 256; four humanoids (624 kB) 1.2x MJX's throughput in tiles of 8 or 16, 1.0x in 64,
    0.8x in 128 (`experiments/results/humanoid_cpu.md`, stop 65)."""
    tile = 1
    while tile < CPU_TILE and 2 * tile * world_bytes <= CPU_TILE_BYTES:
        tile *= 2
    return tile


def tile_for(model: Model, mesh: Mesh | None = None) -> int:
    """`batched`'s tile for a function that simulates worlds of `model` (closed over, so `batched`
    cannot see their size): `cpu_tile` of one world's `Data` where `mesh`'s devices (default: the
    default backend's) are CPUs, 0 (no tiles) on others."""
    platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
    if platform != "cpu":
        return 0
    return cpu_tile(_bytes(jax.eval_shape(make_data, model)))


def _bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def world_mesh(devices: Sequence[jax.Device] | None = None, axis: str = "worlds") -> Mesh:
    """A one-axis mesh over `devices` (default: every device of every process)."""
    return Mesh(np.array(jax.devices() if devices is None else list(devices)), (axis,))


def batched(
    fn: Callable[..., Any],
    mesh: Mesh | None = None,
    axis: str = "worlds",
    in_axes: int | None | Sequence[int | None] = 0,
    donate_argnums: int | Sequence[int] = (),
    tile: int | None = None,
) -> Callable[..., Any]:
    """`jax.jit(jax.vmap(fn, in_axes))` with the worlds (axis 0 of every batched argument and of every
    result) split over `mesh`'s `axis` (default `world_mesh()`).

    in_axes: 0 (batched along axis 0) or None (shared by all worlds), one for all arguments or one per
    positional argument. Build it once and call it many times: each call of `batched` is a new jit.
    tile: each device runs its worlds `vmap`ped in tiles of at most this many, one tile after another
    (`lax.map`; 0: all at once). Default: on CPU devices `cpu_tile` of the batched arguments' size per
    world (`tile_for(model)` sizes them for a model that `fn` closes over), no tiles on others. XLA:CPU
    runs a vmapped program one operation at a time over all its worlds; a tile's intermediate arrays
    stay in the cache (humanoid, 1024 worlds on 2 cores: 0.8x the CPU time).
    """
    mesh = world_mesh(axis=axis) if mesh is None else mesh
    if axis not in mesh.axis_names:
        raise ValueError(f"mesh has no axis {axis!r} (its axes: {mesh.axis_names})")
    if tile is not None and (int(tile) != tile or tile < 0):
        raise ValueError(f"tile must be a count of worlds >= 0, got {tile!r}")
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    n_devices = mesh.shape[axis]
    explicit = mesh.axis_types[mesh.axis_names.index(axis)] == jax.sharding.AxisType.Explicit

    def place(x, spec: PartitionSpec):
        sharding = NamedSharding(mesh, spec)
        return jax.reshard(x, sharding) if explicit else jax.lax.with_sharding_constraint(x, sharding)

    def run(*args):
        axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
        if len(axes) != len(args) or any(a not in (0, None) for a in axes):
            raise ValueError(f"in_axes must be 0 or None, for all or per argument ({len(args)}), got {in_axes!r}")
        sizes = {x.shape[0] for a, arg in zip(axes, args) if a == 0 for x in jax.tree.leaves(arg)}
        if len(sizes) != 1:
            raise ValueError(f"the batched arguments need one leading size (the number of worlds), got {sorted(sizes)}")
        (size,) = sizes
        pad = -size % n_devices
        if pad:  # the last world again, so that every device has as many (all valid)
            grow = lambda x: pad_with_last(x, pad)  # noqa: E731
            args = tuple(jax.tree.map(grow, arg) if a == 0 else arg for a, arg in zip(axes, args))
        specs = tuple(PartitionSpec(axis) if a == 0 else PartitionSpec() for a in axes)
        # put each argument where its device's share is (a mesh of explicit axes, jax.make_mesh's
        # default, asks for this; with automatic axes it only pins the layout)
        args = tuple(jax.tree.map(lambda x, s=s: place(x, s), arg) for s, arg in zip(specs, args))

        def worlds(*args):  # one device's share, tile by tile (each tile a vmap of fn)
            def tile_of_worlds(*own):
                own = iter(own)
                return jax.vmap(fn, in_axes=axes)(*(next(own) if a == 0 else x for a, x in zip(axes, args)))

            own = tuple(x for a, x in zip(axes, args) if a == 0)
            if tile is not None:
                per_tile = int(tile)
            elif on_cpu and (count := jax.tree.leaves(own)[0].shape[0]):  # by the batched arguments' bytes per world
                per_tile = cpu_tile(_bytes(own) // count)
            else:
                per_tile = 0
            return map_chunks(tile_of_worlds, own, per_tile) if per_tile else tile_of_worlds(*own)

        # check_vma=False: the solvers' loops start from constants that each device then changes
        # (JAX's check would ask for a cast in every such carry); the forward pass reduces nothing
        # over devices (reverse mode sums a shared argument's cotangent over them)
        per_device = jax.shard_map(worlds, mesh=mesh, in_specs=specs, out_specs=PartitionSpec(axis), check_vma=False)
        out = per_device(*args)
        if not pad:
            return out
        # B worlds: gathered first (a mesh of explicit axes cannot split B unevenly)
        return jax.tree.map(lambda x: place(x, PartitionSpec())[:size], out)

    return jax.jit(run, donate_argnums=donate_argnums)
