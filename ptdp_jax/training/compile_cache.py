"""The persistent compilation cache (`run.compile_cache`): a run started again with the same
config, mesh and software (a resume after a preemption, the next job of an array, a run after
`ptdp-train --dry-run`) loads its compiled train step from disk instead of compiling it again.
Compiling takes minutes for deep pipelines (the 7.5B GPT's zb-phased v 3 step: ~4 min),
seconds without pipelining.

    auto  (true) JAX's own cache directory where one is set (JAX_COMPILATION_CACHE_DIR), else
          $XDG_CACHE_HOME/ptdp_jax/xla (~/.cache/ptdp_jax/xla), at most 8 GiB where
          the `filelock` package is installed (JAX's eviction needs it) (default)
    off   no cache (false; on the command line and in YAML `off` reads as false)
    DIR   that directory

JAX opens the directory at the cache's first use in the process and keeps it (a later change
is ignored), so train() and dry_run() set it before they compile anything."""
from __future__ import annotations

import jax

from ptdp_jax.config import decisions as D
DEFAULT_MAX_BYTES = 8 * 2 ** 30      # the default directory's bound (JAX evicts the oldest)


def default_dir() -> str:
    return D.compile_cache_dir("auto", None)


def _can_evict() -> bool:
    """JAX's cache evicts (jax_compilation_cache_max_size) only with `filelock` installed;
    without it a bound would fail the first compile, so the cache then grows unbounded."""
    try:
        import filelock  # noqa: F401
    except ImportError:
        return False
    return True


def use_compile_cache(setting: bool | str) -> str | None:
    """Point JAX's persistent compilation cache at `setting` (auto / true, off / false, or a
    directory: decisions.compile_cache_dir); returns the directory, or None for off."""
    path = D.compile_cache_dir(setting, jax.config.jax_compilation_cache_dir)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if path == default_dir() and jax.config.jax_compilation_cache_max_size == -1 \
            and _can_evict():               # ours: bounded, least recently used out first
        jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_BYTES)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    return path
