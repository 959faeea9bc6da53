import os

# 8 fake CPU devices for the mesh tests; must be set before jax is imported (subprocesses
# that tests start inherit it).
# --xla_backend_optimization_level=0: XLA's CPU compiles of the tiny test models take
# about a third of the time (every comparison in the tests is between runs with the same flags).
# The collective timeouts: when a collective's participants do not all arrive, XLA:CPU aborts
# the process ("Fatal Python error: Aborted", seen in CI; reproduced by a terminate timeout of
# 0). The CI hangs were deadlocks, not slowness (a hung worker: no CPU used, its device threads
# parked in two different collectives); the pipeline now orders its collectives on CPU
# (pipeline/routing.py). A deadlock left anywhere fails after 60 s, and `make test` runs a
# crashed worker's test once more.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=0 "
                                   "--xla_cpu_collective_call_warn_stuck_timeout_seconds=20 "
                                   "--xla_cpu_collective_call_terminate_timeout_seconds=60")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """A per-module cache for the embedded corpus's token file."""
    return tmp_path_factory.mktemp("data_cache")
