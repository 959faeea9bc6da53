import os

# 8 fake CPU devices for the mesh tests; must be set before jax is imported.
# --xla_backend_optimization_level=0: XLA's CPU compiles of the tiny test models take
# about a third of the time (every comparison in the tests is between runs with the same flags).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=0")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """A per-module cache for the embedded corpus's token file."""
    return tmp_path_factory.mktemp("data_cache")
