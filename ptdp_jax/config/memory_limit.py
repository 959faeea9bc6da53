"""One memory limit for every command: the share of a GPU's memory JAX's allocator takes is
set before the backend starts (decisions.memory_fraction), so that ptdp-plan, the estimate,
the pre-flight and the run all plan against the same bytes; and words that say where a
device's limit comes from and how to change it.

    use_planned_fraction()          # in a command's main(), before jax starts its backend
    limit_words(device)             # "... (XLA_PYTHON_CLIENT_MEM_FRACTION=0.92, set by ...)"
    device_memory_bytes()           # what a device has (None if unknown)
"""
from __future__ import annotations

import os

from ptdp_jax.config import decisions as D

VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"
JAX_DEFAULT = 0.75
_SET_HERE = False


def use_planned_fraction(environ=None) -> float | None:
    """Set XLA_PYTHON_CLIENT_MEM_FRACTION to the planned fraction unless the user set an
    allocator variable; the fraction set (None: the user's settings stand)."""
    global _SET_HERE
    env = os.environ if environ is None else environ
    fraction = D.memory_fraction(env)
    if fraction is not None:
        env[VARIABLE] = str(fraction)
        _SET_HERE = env is os.environ
    return fraction


def fraction_in_use(environ=None) -> tuple[float, str]:
    """(the fraction JAX's allocator takes, where it comes from, in words)."""
    env = os.environ if environ is None else environ
    value = env.get(VARIABLE)
    if value and _SET_HERE:
        return float(value), "set by ptdp_jax's commands"
    if value:
        try:
            return float(value), "as set in the environment"
        except ValueError:
            return JAX_DEFAULT, f"{VARIABLE}={value!r} is not a number; JAX's default"
    if env.get("XLA_PYTHON_CLIENT_ALLOCATOR") == "platform":
        return 1.0, "XLA_PYTHON_CLIENT_ALLOCATOR=platform: no pool, the whole device"
    return JAX_DEFAULT, "JAX's default"


def limit_words(platform: str, environ=None) -> str:
    """Where a GPU's memory limit comes from and how to change it ('' on CPU)."""
    if platform != "gpu":
        return ""
    fraction, source = fraction_in_use(environ)
    return (f"the limit is {VARIABLE}={fraction:g} of the device's memory ({source}); set "
            f"{VARIABLE} (up to about 0.95; CUDA's libraries need the rest) before the command "
            f"to change it")


def device_memory_bytes(device=None) -> int | None:
    """Memory of one device: a GPU's `memory_stats()['bytes_limit']` when it reports one; a CPU
    device: the host's RAM (os.sysconf) divided by the number of local devices; None if unknown.
    device: a jax Device (None: the first local device)."""
    import jax
    dev = device if device is not None else jax.local_devices()[0]
    if dev.platform == "cpu":
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
        cpus = [d for d in jax.local_devices() if d.platform == "cpu"]
        return int(ram // max(1, len(cpus)))
    try:
        stats = dev.memory_stats() or {}
    except Exception:          # backends without memory stats
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None
