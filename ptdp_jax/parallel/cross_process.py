"""Values across the processes of a run: agreeing on a flag (a stop request) without
waiting for the step in flight, and gathering a sharded pytree to the host. Every
process calls these at the same points, as any collective; in a single-process run they
are plain reads."""
from __future__ import annotations

import functools

import numpy as np


def any_process_later(flag: bool):
    """Whether `flag` is true on any process (a stop signal that reached only some), without
    waiting: a one-element-a-device maximum over every device is dispatched behind whatever
    the devices run now, and the returned function reads it (waiting for it then). Every
    process must call this at the same points, as any collective. One process: the flag."""
    import jax
    if jax.process_count() == 1:
        return lambda: bool(flag)
    reduce_max, sharding = _any_program(tuple(jax.devices()))
    local = [jax.device_put(np.full((1,), int(bool(flag)), np.int32), d)
             for d in sharding.addressable_devices]
    out = reduce_max(jax.make_array_from_single_device_arrays(
        (len(sharding.mesh.devices),), sharding, local))
    if jax.devices()[0].platform == "cpu":
        # A GPU runs its programs in the order they come, on one stream; XLA:CPU may run this
        # one beside the next step, and its gloo collectives would then mix their messages
        # with the step's (seen with a subset of the devices). Tests only: wait here.
        out.block_until_ready()
    return lambda: bool(np.asarray(out.addressable_data(0)))


@functools.lru_cache(maxsize=2)
def _any_program(devices):
    """any_process_later's program for these devices (compiled once) and its input sharding:
    (n devices,) int32 split one element a device -> its maximum, on every device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.asarray(devices, dtype=object), ("all",))
    fn = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))
    return fn, NamedSharding(mesh, P("all"))


def to_host(tree, only_process0: bool = False):
    """A pytree of (possibly multi-process sharded) jax.Arrays as numpy arrays, the full
    value on every process; one leaf at a time (peak device memory: one leaf). With
    only_process0, the other processes keep nothing (they return None): each leaf is
    dropped as soon as it is gathered, so a host holds one leaf at a time, not the model."""
    import jax
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, jax.device_get(tree))
    from jax.experimental import multihost_utils
    keep = not only_process0 or jax.process_index() == 0
    leaves, treedef = jax.tree.flatten(tree)
    out = []
    for x in leaves:
        full = np.asarray(multihost_utils.process_allgather(x, tiled=True))
        out.append(full if keep else None)
        del full
    return jax.tree.unflatten(treedef, out) if keep else None
