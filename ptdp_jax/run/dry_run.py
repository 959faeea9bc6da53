"""`--dry-run`: the run's checks and its compile, without a step (ptdp-train --dry-run)."""
from __future__ import annotations

import time
from typing import Any, Mapping

from ptdp_jax.checkpoint import lock as LK
from ptdp_jax.parallel.distributed import maybe_initialize
from ptdp_jax.run.loop import _compile_step, _for_devices, _load, _setup
from ptdp_jax.training import preflight as preflight


@LK.released_on_return
def dry_run(config=None, *, mesh_shape=None, overrides: Mapping[str, Any] | None = None,
            log=print, distributed: Mapping[str, Any] | None = None) -> dict:
    """Validate, open the data, check the memory estimate, build the mesh and compile
    the train step without running it; report memory per device (the estimate and XLA's
    memory analysis, against what a device has) and FLOPs per step. Returns the numbers
    as a dict; refuses (MemoryCheckError) a run that would not fit, as train() does."""
    from ptdp_jax.training import metrics as MX
    from ptdp_jax.training.memory import device_memory_bytes

    loaded = _load(config, mesh_shape, overrides)
    maybe_initialize(**dict(distributed or {}))
    cfg = _for_devices(loaded, log).config
    run = _setup(cfg)                                      # a dry run fills the cache too
    est, compiled, tx = run.estimate, run.compiled, run.tx
    t0 = time.perf_counter()
    exe = _compile_step(cfg, compiled, tx)
    seconds = time.perf_counter() - t0
    mem = exe.memory_analysis()
    have = device_memory_bytes()
    n_dev = cfg.parallel.num_devices
    out = {"compile_s": seconds, "model_flops_per_step": MX.model_flops_per_iteration(cfg),
           "model_flops_per_step_recompute": MX.model_flops_per_iteration(cfg, cfg.recompute),
           "devices": n_dev, "device_bytes": have,
           "estimate_bytes": est.total if est is not None else None}
    if mem is not None:
        out.update(argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
                   temp_bytes=mem.temp_size_in_bytes, alias_bytes=mem.alias_size_in_bytes,
                   total_bytes=preflight.compiled_bytes(exe))
    gib = lambda b: f"{b / 2**30:.3f} GiB"
    d, p, t = cfg.parallel.mesh_shape
    log(f"dry run: {cfg.model.arch} {cfg.model.num_layers}x{cfg.model.hidden_size}, mesh "
        f"(data, pipe, tensor) = ({d}, {p}, {t}), {cfg.microbatch_split}; the train step "
        f"compiled in {seconds:.1f} s")
    if est is not None:
        log(f"  memory per device (estimate): {est.describe()}")
    if mem is not None:
        log(f"  memory per device (XLA): {gib(out['total_bytes'])} = arguments "
            f"{gib(out['argument_bytes'])} + outputs {gib(out['output_bytes'])} + temporaries "
            f"{gib(out['temp_bytes'])} - donated {gib(out['alias_bytes'])}")
    if have is not None:
        log(f"  a device has {gib(have)}")
    log(f"  model FLOPs per step: {out['model_flops_per_step']:.4g} "
        f"({out['model_flops_per_step'] / n_dev:.4g} per device; with recomputation "
        f"{out['model_flops_per_step_recompute']:.4g})")
    return out
