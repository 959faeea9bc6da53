"""What a save needs beyond orbax: the state copied to host memory one array at a time, the
disk space a run's checkpoints take (checked before compiling), and the cause of a failed write
in words.

    host = canonical_on_host(cfg, tx, state, canonical_shardings)   # before orbax's save
    release(host)                                                   # once orbax has its copy
    check_disk(cfg, tx, existing_steps)                             # CheckpointError if short

A save runs between steps, when the step's temporaries are free, so its device memory beside
the train state is one array's canonical copy (the largest: `largest_layer_bytes`), not the
whole state's: each stacked-layer array is re-laid out on its devices and moved to host memory
before the next one is. The host then holds the state twice for a moment (these copies, and the
ones orbax writes from), until `release`.
"""
from __future__ import annotations

import errno
import math
import os
import shutil
from pathlib import Path

import jax

from ptdp_jax.checkpoint.format import CheckpointError
from ptdp_jax.training.state import canonical_layer_fn, layer_marks

HOST_MEMORY = "pinned_host"          # where a save's copies wait for orbax's write
ROOM_FACTOR = 1.02                   # a checkpoint's files beside its raw bytes (metadata,
                                     # OCDBT manifests; 0.3-0.6% measured on CPU)


# ----------------------------------------------------------------------------- host copies

def canonical_on_host(cfg, tx, state, canonical_sh):
    """The canonical train state (a TrainState of jax.Arrays in host memory, sharded as
    `canonical_sh` says): layer arrays converted one at a time, each device copy deleted once
    its host copy is complete."""
    marks = layer_marks(cfg, tx, state)

    def one(x, sharding, is_layer):
        host = sharding.with_memory_kind(HOST_MEMORY)
        if not is_layer:
            return jax.device_put(x, host)
        on_device = canonical_layer_fn(cfg, sharding)(x)
        out = jax.device_put(on_device, host)
        out.block_until_ready()
        on_device.delete()
        return out
    return jax.tree.map(one, state, canonical_sh, marks)


def release(tree) -> None:
    """Free the buffers of a tree of jax.Arrays now, not when the last reference goes (orbax
    keeps its arguments until the background write ends)."""
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and not x.is_deleted():
            x.delete()


# ----------------------------------------------------------------------------- sizes

def checkpoint_bytes(abstract_state) -> int:
    """Bytes of one checkpoint on disk (the canonical state's arrays, plus ROOM_FACTOR)."""
    raw = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(abstract_state))
    return int(raw * ROOM_FACTOR)


def largest_layer_bytes(abstract_state, devices: int) -> int:
    """The largest array's bytes on one device (a save's device-side copy), spread evenly over
    `devices` (an upper bound for the arrays that are replicated)."""
    sizes = [math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(abstract_state)]
    return int(max(sizes, default=0) / max(1, devices))


def saves_in_run(cfg, start: int) -> int:
    """How many checkpoints a run from `start` writes if it reaches train.steps."""
    t, every = cfg.train, cfg.checkpoint.every
    end = t.stop_at_step if t.stop_at_step and t.stop_at_step < t.steps else t.steps
    if end <= start:
        return 0
    periodic = (end // every - start // every) if every else 0
    last_is_periodic = bool(every) and end % every == 0
    return periodic + (0 if last_is_periodic else 1)


def tree_bytes(directory: Path) -> int:
    """Bytes of the files under `directory`."""
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())


def free_bytes(directory: Path) -> int:
    """Free bytes on the disk that holds `directory` (or its nearest existing parent)."""
    where = Path(directory).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free


def disk_need(cfg, per_checkpoint: int, existing: int, start: int) -> tuple[int, int]:
    """(checkpoints this run writes, bytes of free disk it needs at its fullest): at most
    checkpoint.keep stay, and each new one is written before the oldest is removed, so the
    directory holds up to keep + 1 at once; `existing` are already there."""
    writes = saves_in_run(cfg, start)
    at_once = min(existing + writes, cfg.checkpoint.keep + 1)
    return writes, max(0, at_once - existing) * per_checkpoint


def check_disk(cfg, directory: Path, per_checkpoint: int, existing: int, start: int,
               reclaimed: int = 0) -> None:
    """CheckpointError, before anything compiles, when the disk under checkpoint.dir cannot
    hold the checkpoints this run keeps at once (`reclaimed`: bytes of the earlier run's
    checkpoints that checkpoint.resume=overwrite removes first)."""
    writes, need = disk_need(cfg, per_checkpoint, existing, start)
    if not need:
        return
    free = free_bytes(directory) + reclaimed
    if free >= need:
        return
    gb = lambda b: f"{b / 1e9:.1f} GB"
    one = per_checkpoint <= free
    at_once = need // per_checkpoint
    raise CheckpointError(
        f"checkpoint.dir {directory}: a checkpoint of this run is {gb(per_checkpoint)} and the "
        f"disk there has {gb(free)} free; this run writes {writes} (checkpoint.every="
        f"{cfg.checkpoint.every}, train.steps={cfg.train.steps}) and keeps up to "
        f"checkpoint.keep={cfg.checkpoint.keep}, with each new one written before the oldest is "
        f"removed: {at_once} more at once, {gb(need)}. "
        + ("Free space there, point checkpoint.dir to a larger disk, or save less often "
           "(checkpoint.every=0 saves at the end only)" if one else
           "Not even one fits: point checkpoint.dir to a larger disk or free space there"))


# ----------------------------------------------------------------------------- failures

def failure_cause(e: BaseException | None) -> str:
    """A failed write's cause in words: 'disk full', 'permission denied', 'the directory
    vanished', 'out of device memory', or 'write failed'."""
    seen = 0
    while e is not None and seen < 20:
        text = str(e)
        code = getattr(e, "errno", None)
        if code == errno.ENOSPC or "No space left on device" in text or "os_error_code='28'" in text:
            return "disk full"
        if code in (errno.EACCES, errno.EPERM, errno.EROFS) or "Permission denied" in text \
                or "Read-only file system" in text:
            return "permission denied"
        if code == errno.ENOENT or "No such file or directory" in text:
            return "the directory vanished"
        if "Out of memory" in text or "out of memory" in text:
            return "out of device memory"
        e = e.__cause__ or e.__context__
        seen += 1
    return "write failed"


def directory_gone(directory: Path) -> bool:
    return not os.path.isdir(directory)
