"""The persistent compilation cache (`run.compile_cache`): a run started again with the same
config, mesh and software (a resume after a preemption, the next job of an array, a run after
`ptdp-train --dry-run`) loads its compiled train step from disk instead of compiling it again.
Compiling takes minutes for deep pipelines (the 7.5B GPT's zb-phased v 3 step: ~4 min on
4x H200), seconds without pipelining.

    auto  JAX's own cache directory where one is set (JAX_COMPILATION_CACHE_DIR), else
          $XDG_CACHE_HOME/ptdp_jax/xla (~/.cache/ptdp_jax/xla) (default)
    off   no cache
    DIR   that directory (on a multi-host run, each process writes its own programs there)

JAX takes the setting at the first compile of the process, so train() applies it first."""
from __future__ import annotations

import os

import jax


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ptdp_jax", "xla")


def use_compile_cache(setting: str) -> str | None:
    """Point JAX's persistent compilation cache at `setting` (auto | off | a directory);
    returns the directory, or None for off."""
    if setting == "off":
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if setting == "auto":
        path = jax.config.jax_compilation_cache_dir or default_dir()
    else:
        path = os.path.abspath(os.path.expanduser(setting))
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    return path
