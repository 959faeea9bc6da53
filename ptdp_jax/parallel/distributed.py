"""Multi-process runs: start-up through jax.distributed, a mesh that respects hosts,
and a watchdog that stops every process when one of them is lost.

Start-up (`maybe_initialize`), in this order:

1. explicit: coordinator ``host:port``, number of processes and this process's id
   (``ptdp-train --coordinator --num-processes --process-id``, or
   ``train(distributed={...})``), each defaulting to the environment variables
   ``PTDP_COORDINATOR`` (or ``JAX_COORDINATOR_ADDRESS``), ``PTDP_NUM_PROCESSES``
   and ``PTDP_PROCESS_ID`` (or ``JOB_COMPLETION_INDEX``, a Kubernetes Indexed Job's
   pod index);
2. the cluster's environment, as ``jax.distributed.initialize()`` detects it: SLURM
   (``srun``), Open MPI (``mpirun``), Kubernetes (an Indexed Job, with the
   ``kubernetes`` package installed);
3. otherwise (or with ``PTDP_NO_DISTRIBUTED=1``): a single process, nothing to do.

Before jax.distributed starts, the processes meet on the coordinator's port
(`ptdp_jax.parallel.rendezvous`): a missing peer is a DistributedError that names it.

One process per host: every process sees all of its host's accelerators (JAX's
SLURM and Open MPI detection would give each process one GPU; with one task per
node we keep them all, with several tasks per node we keep JAX's one GPU each).
On CPU, cross-process collectives go through gloo; several processes on one
machine are fine (each with ``--xla_force_host_platform_device_count``).

Mesh (`host_mesh_devices`, used by `sharding.make_mesh` when there is more than one
process): 'tensor' stays inside a process's devices, 'data' fills the rest of a
host first, then 'pipe' (Megatron's order: tensor, data, pipeline); whatever is
left of 'data' and 'pipe' crosses hosts. A 'tensor' that does not divide the
devices of one process is a ConfigError unless
``tuning.allow_cross_host_tensor=true`` (then a warning).

Failure (`ptdp_jax.parallel.watchdog.Watchdog`): each process writes a heartbeat into the coordination
service's key-value store every second and reads everyone else's. A process
whose heartbeat stops for ``heartbeat_timeout`` seconds (default 60,
``--heartbeat-timeout``, ``PTDP_HEARTBEAT_TIMEOUT``), or that reports a failure,
makes every other process print which process (and host) was lost and exit with
code 4; JAX's own heartbeat check (four times that timeout: at twice, JAX
ended a loaded process in CI before the watchdog could name the lost peer) is the backstop. If
process 0 (which runs the coordination service) dies, the others are stopped by
JAX at once with its own message ("... the leader task was preempted/died ...").
A restart of all processes resumes from the last complete checkpoint.

End (`finish`, from ``ptdp-train``): a clean run passes jax.distributed's shutdown barrier on
every process, then the others exit and process 0, which runs the coordination service,
exits last without stopping it, so that no process prints gRPC errors on the way out.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass

import numpy as np

from ptdp_jax.config.load import ConfigError
from ptdp_jax.exits import ExitCode, short_error as _short
from ptdp_jax.parallel.rendezvous import DistributedError, rendezvous
from ptdp_jax.parallel.watchdog import Watchdog

EXIT_PEER_LOST = ExitCode.PEER_LOST                # a peer process died or failed: this one stopped
EXIT_DISTRIBUTED_INIT = ExitCode.DISTRIBUTED_INIT  # jax.distributed could not be started
DEFAULT_HEARTBEAT_TIMEOUT = 60.0
DEFAULT_INIT_TIMEOUT = 300
EXIT_GRACE = 1.0                  # s: process 0 outlives the other processes at a clean end


@dataclass(frozen=True)
class ProcessSetup:
    coordinator: str
    num_processes: int
    process_id: int
    source: str                         # "explicit", "environment", "slurm", "ompi", "k8s", ...
    local_device_ids: tuple[int, ...] | None = None


_state: dict = {"setup": None, "watchdog": None}


# ----------------------------------------------------------------------------- start-up

def _env_number(name: str, kind=int):
    """The environment variable `name` as `kind` (int or float), None when unset."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        return kind(v)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"environment variable {name}={v!r} is not {what}") from None


def _env_int(name: str) -> int | None:
    return _env_number(name, int)


def _env_float(name: str) -> float | None:
    return _env_number(name, float)


def _explicit_setup(coordinator, num_processes, process_id) -> ProcessSetup | None:
    """From arguments, then PTDP_* / JAX_COORDINATOR_ADDRESS / JOB_COMPLETION_INDEX."""
    given_args = [coordinator is not None, num_processes is not None, process_id is not None]
    env_coord = os.environ.get("PTDP_COORDINATOR") or None
    coordinator = coordinator or env_coord
    num_processes = num_processes if num_processes is not None else _env_int("PTDP_NUM_PROCESSES")
    if process_id is None:
        process_id = _env_int("PTDP_PROCESS_ID")
        if process_id is None and num_processes is not None:
            process_id = _env_int("JOB_COMPLETION_INDEX")          # Kubernetes Indexed Job
    if coordinator is None and num_processes is not None:
        coordinator = os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    have = [coordinator is not None, num_processes is not None, process_id is not None]
    if not any(given_args) and not (env_coord or _env_int("PTDP_NUM_PROCESSES") is not None):
        return None                       # nothing explicit: leave it to cluster detection
    if not all(have):
        raise ConfigError(
            "--coordinator, --num-processes and --process-id go together (or PTDP_COORDINATOR, "
            "PTDP_NUM_PROCESSES and PTDP_PROCESS_ID); got "
            f"coordinator={coordinator}, num_processes={num_processes}, process_id={process_id}")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id {process_id} must be in [0, --num-processes "
                          f"{num_processes})")
    if ":" not in coordinator or not coordinator.rsplit(":", 1)[1].isdigit():
        raise ConfigError(f"--coordinator {coordinator!r} must be host:port (process 0's host "
                          f"and a free port, the same on every process)")
    return ProcessSetup(coordinator, num_processes, process_id, "explicit")


def _one_process_per_host(source: str) -> bool | None:
    """Whether the launcher started a single process on this host (None: unknown)."""
    if source == "slurm":
        n, nodes = _env_int("SLURM_NTASKS"), _env_int("SLURM_STEP_NUM_NODES") or _env_int("SLURM_NNODES")
        return None if n is None or nodes is None else n == nodes
    if source == "ompi":
        local = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE")
        return None if local is None else local == 1
    return None


def _cluster_setup(init_timeout: int) -> ProcessSetup | None:
    """What jax.distributed would detect from SLURM / Open MPI / Kubernetes, or None.
    Cheap environment checks first, so an ordinary process never touches JAX's
    cluster detection."""
    env = os.environ
    hints = ("SLURM_STEP_NODELIST" in env, "OMPI_MCA_orte_hnp_uri" in env,
             "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env)
    if not any(hints):
        return None
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError:                    # JAX moved it: let jax.distributed do everything
        return ProcessSetup("", 0, 0, "jax-auto")
    env_cls = next((c for c in ClusterEnv._cluster_types
                    if not getattr(c, "opt_in_only_method", False) and c.is_env_present()), None)
    if env_cls is None:
        return None
    coord, n, pid, local = ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, init_timeout)
    if coord is None or n is None or pid is None or n <= 1:
        return None
    source = getattr(env_cls, "name", env_cls.__name__)
    if _one_process_per_host(source):
        local = None                       # one process per host: all of its devices
    return ProcessSetup(coord, int(n), int(pid), source,
                        tuple(local) if local is not None else None)


def maybe_initialize(coordinator: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, *, heartbeat_timeout: float | None = None,
                     init_timeout: int | None = None) -> bool:
    """Initialise jax.distributed when more than one process is configured (see the
    module doc); start the peer watchdog. Returns True if this is a multi-process
    run. Idempotent. Must run before anything touches a JAX device."""
    import jax

    if _state["setup"] is not None or jax.distributed.is_initialized():
        return jax.process_count() > 1
    hb = heartbeat_timeout if heartbeat_timeout is not None else (
        _env_float("PTDP_HEARTBEAT_TIMEOUT") or DEFAULT_HEARTBEAT_TIMEOUT)
    init_timeout = int(init_timeout if init_timeout is not None else (
        _env_int("PTDP_INIT_TIMEOUT") or DEFAULT_INIT_TIMEOUT))
    if hb <= 0 or init_timeout <= 0:
        raise ConfigError(f"heartbeat timeout ({hb}) and initialization timeout "
                          f"({init_timeout}) must be positive")
    setup = _explicit_setup(coordinator, num_processes, process_id)
    if setup is None:
        if os.environ.get("PTDP_NO_DISTRIBUTED") == "1":
            return False
        setup = _cluster_setup(init_timeout)
    if setup is None or (setup.source != "jax-auto" and setup.num_processes == 1):
        return False

    if _backends_initialized():
        raise ConfigError(
            "a multi-process run is configured, but JAX's devices were already in use in this "
            "process; jax.distributed must start first (call ptdp_jax.parallel.distributed."
            "maybe_initialize() or train(distributed=...) before any other JAX call)")
    try:                                   # CPU collectives across processes (gloo)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError, KeyError):
        pass
    if setup.source != "jax-auto":
        rendezvous(setup, init_timeout)    # a missing peer: DistributedError, not a C++ abort
    kw = dict(initialization_timeout=init_timeout,
              heartbeat_timeout_seconds=int(math.ceil(max(4 * hb, hb + 30))))
    try:
        if setup.source == "jax-auto":
            jax.distributed.initialize(**kw)
        else:
            jax.distributed.initialize(
                setup.coordinator, setup.num_processes, setup.process_id,
                local_device_ids=list(setup.local_device_ids) if setup.local_device_ids else None,
                cluster_detection_method="deactivate", **kw)
    except Exception as e:
        where = (f"coordinator {setup.coordinator}, process {setup.process_id} of "
                 f"{setup.num_processes}" if setup.coordinator else "auto-detected cluster")
        raise DistributedError(
            f"jax.distributed could not start ({where}, from {setup.source}; waited up to "
            f"{init_timeout} s for every process to connect): {type(e).__name__}: "
            f"{_short(e)}") from e
    if setup.source == "jax-auto":
        from jax._src.distributed import global_state as gs
        setup = ProcessSetup(gs.coordinator_address or "", jax.process_count(),
                             jax.process_index(), "jax-auto")
    _state["setup"] = setup
    _state["watchdog"] = Watchdog.start(setup, hb)
    if jax.process_index() == 0:
        print(f"jax.distributed: {jax.process_count()} processes ({setup.source}), coordinator "
              f"{setup.coordinator}, {jax.local_device_count()} local x {jax.device_count()} "
              f"{jax.devices()[0].platform} devices", flush=True)
    return True


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):      # jax.distributed.initialize says it, too
        return False


def setup() -> ProcessSetup | None:
    """The multi-process setup of this process (None: single process)."""
    return _state["setup"]


# ----------------------------------------------------------------------------- the mesh

def _split_inside_host(d: int, p: int, r: int) -> tuple[int, int]:
    """(data, pipe) factors inside one host, d_i * p_i = r, d_i | d, p_i | p; data first."""
    for d_i in sorted((k for k in range(1, r + 1) if r % k == 0), reverse=True):
        if d % d_i == 0 and p % (r // d_i) == 0:
            return d_i, r // d_i
    raise ConfigError(f"cannot place mesh data={d} x pipe={p} on hosts of {r} tensor groups")


def host_mesh_devices(shape: tuple[int, int, int], allow_cross_host_tensor: bool = False):
    """A (data, pipe, tensor) array of all devices of a multi-process run, tensor inside
    a process (see the module doc). ConfigError for a layout that does not fit."""
    import jax
    from jax.experimental import mesh_utils

    d, p, t = shape
    n_proc, devs = jax.process_count(), jax.devices()
    per_proc: dict[int, int] = {}
    for dev in devs:
        per_proc[dev.process_index] = per_proc.get(dev.process_index, 0) + 1
    local = min(per_proc.values())
    if len(set(per_proc.values())) != 1:
        raise ConfigError(f"the {n_proc} processes have different numbers of devices "
                          f"({dict(sorted(per_proc.items()))}); a multi-process mesh needs the "
                          f"same number on every process")
    if d * p * t != len(devs):
        raise ConfigError(
            f"mesh (data, pipe, tensor) = ({d}, {p}, {t}) has {d * p * t} devices, but a "
            f"multi-process run uses all {len(devs)} ({n_proc} processes x {local} devices); "
            f"choose parallel.data x parallel.pipe x parallel.tensor = {len(devs)}")
    if t > local or local % t:
        msg = (f"parallel.tensor={t} would split tensor-parallel groups across hosts: each of "
               f"the {n_proc} processes has {local} devices, and parallel.tensor must divide "
               f"{local} (tensor parallelism all-reduces inside every layer and belongs on one "
               f"host's fast interconnect)")
        if not allow_cross_host_tensor:
            raise ConfigError(msg + "; set tuning.allow_cross_host_tensor=true to run it "
                                    "anyway")
        if jax.process_index() == 0:
            warnings.warn(msg + "; running anyway (tuning.allow_cross_host_tensor=true)",
                          stacklevel=3)
        ordered = sorted(devs, key=lambda x: (x.process_index, x.id))
        return np.asarray(ordered, dtype=object).reshape(d, p, t)
    d_i, p_i = _split_inside_host(d, p, local // t)
    return mesh_utils.create_hybrid_device_mesh(
        (d_i, p_i, t), (d // d_i, p // p_i, 1), devices=devs, process_is_granule=True)


# ----------------------------------------------------------------------------- the end of a run

def finish(ok: bool, why: str = "", exit_code: int | None = None) -> None:
    """Tell the other processes this one is done or failed (see watchdog.Watchdog.finish). With
    exit_code, leave now: on failure at once (skipping jax.distributed's shutdown barrier), on
    success in order (`_exit_in_order`). Returns only in a single-process run."""
    w = _state["watchdog"]
    if _state["setup"] is None:
        return
    if w is not None:
        w.finish(ok, why)
    if exit_code is None:
        return
    if ok:
        _exit_in_order(exit_code)
    os._exit(exit_code)


def _exit_in_order(code: int) -> None:
    """End a clean multi-process run without JAX's exit handler. There, process 0 stops the
    coordination service while every process's backend still watches the others through it
    (jaxlib >= 0.11 on GPU; the backend outlives clear_backends once its memories were
    touched), which prints gRPC "WatchTasksAsync failed ... CANCELLED" errors. Here every
    process passes jax.distributed's shutdown barrier, the others leave at once, and process
    0, which runs the service, leaves last without stopping it."""
    import logging
    import sys
    import time

    from jax._src.distributed import global_state as gs
    if _state["watchdog"] is not None:
        _state["watchdog"].stop()           # no key-value calls past this point
    try:
        if gs.preemption_sync_manager is not None:
            gs.preemption_sync_manager.shutdown()     # before the client, as JAX does
            gs.preemption_sync_manager = None
        if gs.client is not None:
            gs.client.shutdown()            # the barrier: every process has finished
    except Exception:                       # a peer already gone: nothing left to wait for
        pass
    if _state["setup"].process_id == 0:
        time.sleep(EXIT_GRACE)              # the others are gone before the service goes
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
