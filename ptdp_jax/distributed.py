"""Multi-process start-up through jax.distributed (explicit flags or the cluster's environment)."""
from __future__ import annotations

import os

import jax

from ptdp_jax.config import ConfigError

_CLUSTER_ENV = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS")


def maybe_initialize(coordinator: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None) -> bool:
    """Initialise jax.distributed when more than one process is configured.

    Explicit: all three of coordinator, num_processes, process_id. Otherwise a
    cluster environment (SLURM, Open MPI, JAX_COORDINATOR_ADDRESS) lets JAX detect
    them. A single process does nothing. Returns True if initialised."""
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ConfigError("--coordinator, --num-processes and --process-id go together; got "
                          f"coordinator={coordinator}, num_processes={num_processes}, "
                          f"process_id={process_id}")
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ConfigError(f"--process-id {process_id} must be in [0, --num-processes "
                              f"{num_processes})")
        if num_processes == 1:
            return False
        jax.distributed.initialize(coordinator, num_processes, process_id)
        return True
    if any(k in os.environ for k in _CLUSTER_ENV) and os.environ.get("PTDP_NO_DISTRIBUTED") != "1":
        jax.distributed.initialize()
        return True
    return False
