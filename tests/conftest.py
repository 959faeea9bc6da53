import os

# 8 fake CPU devices for the mesh tests; must be set before jax is imported (subprocesses
# that tests start inherit it).
# --xla_backend_optimization_level=0: XLA's CPU compiles of the tiny test models take
# about a third of the time (every comparison in the tests is between runs with the same flags).
# The collective timeouts: the fake devices share one thread pool, and on a loaded 2-core
# machine a collective's participants can take longer than XLA's default to meet; XLA then
# aborts the process ("Fatal Python error: Aborted", seen in CI; reproduced here by setting
# the terminate timeout to 0). Ten minutes instead: a slow test, not a dead worker.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=0 "
                                   "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120 "
                                   "--xla_cpu_collective_call_terminate_timeout_seconds=600 "
                                   "--xla_cpu_collective_timeout_seconds=600")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """A per-module cache for the embedded corpus's token file."""
    return tmp_path_factory.mktemp("data_cache")
