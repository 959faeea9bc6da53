"""The memory pre-flight of a run: refuse, with the numbers and the keys that would make
it fit, a run whose memory per device exceeds what a device has, instead of letting the
kernel kill it or the allocator fail minutes later.

1. Before anything compiles (`check_memory`): ptdp_jax.training.memory's estimate (parameters,
   gradients, AdamW state, activations by schedule and recomputation, workspace) against
   `memory.device_memory_bytes()` (a GPU's memory; for CPU devices the host's RAM
   divided by the local devices).
2. Once the train step is compiled (`check_compiled`, the compile training needs anyway):
   XLA's own `memory_analysis()` of it (arguments + outputs + temporaries - donated),
   which also sees what the estimate leaves out (e.g. XLA's attention on CPU keeps the
   s x s scores).

Either refusal is a MemoryCheckError (a ConfigError: exit code 2) that names both numbers
and the settings that fit (smaller micro-batches, more recomputation, with d > 1 the state
split over 'data' by parallel.zero, another layout of the same devices) or the number of
devices the model needs. tuning.skip_memory_check=true runs anyway (e.g. when the device
reports less than it will have).

On CPU the estimate is approximate: XLA's attention there keeps s x s scores that it leaves
out. There a refusal names only the settings that clearly fit, without a change of layout: the
estimate plus those scores (before compiling: CPU_SCORE_BUFFERS of them; after: what the
estimate missed for this run, scaled by each setting's scores), so that a setting named is
not refused again by XLA's check (more recomputation and smaller micro-batches kept fewer of
them in every run measured).
"""
from __future__ import annotations

import math
import os
from dataclasses import replace

from ptdp_jax.config.load import ConfigError
from ptdp_jax.config.validation import validate

GiB = 1024 ** 3
# One micro-batch's s x s attention scores (float32) that XLA keeps on CPU beyond the estimate,
# at most, by train.recompute: 2.9, 1.9 and 0.9 of them measured (demo.yaml at seq_len 4096,
# micro-batches of 2; fewer with micro-batches of 1; 2026-11-28, 8 CPU devices)
CPU_SCORE_BUFFERS = {"none": 3, "selective": 2, "offload": 2, "full": 1}


class MemoryCheckError(ConfigError):
    """The run would not fit in device memory; the message says by how much and what fits."""


def _device_memory() -> int | None:
    from ptdp_jax.training.memory import device_memory_bytes
    return device_memory_bytes()


def _on_cpu() -> bool:
    import jax
    return jax.local_devices()[0].platform == "cpu"


def _score_bytes(cfg) -> int:
    """One micro-batch's s x s attention scores on a device, float32."""
    m, t = cfg.model, cfg.parallel.tensor
    return cfg.train.micro_batch_size * -(-m.num_heads // t) * m.seq_len ** 2 * 4


def _device_words() -> str:
    import jax
    d = jax.local_devices()[0]
    if d.platform == "cpu":
        return (f"a CPU device has {{have}} (the host's RAM shared by its "
                f"{len(jax.local_devices())} devices)")
    from ptdp_jax.config.memory_limit import limit_words
    return f"a {d.device_kind} has {{have}} ({limit_words(d.platform)})"


def _with(cfg, **keys):
    """cfg with dotted keys replaced ('train.micro_batch_size': 1, ...)."""
    sections = {}
    for key, value in keys.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return replace(cfg, **{s: replace(getattr(cfg, s), **kv) for s, kv in sections.items()})


def _candidates(cfg, n_devices: int, layouts: bool = True):
    """(description, overrides) of changes that lower memory per device, lightest first;
    with layouts=False none that changes parallel.data, pipe or tensor."""
    t, par = cfg.train, cfg.parallel
    out = []
    lighter = {"none": ["selective", "full"], "selective": ["full"], "offload": [],
               "full": []}[cfg.recompute]
    if cfg.recompute == "selective" and cfg.keeps_ffn_activation:
        out.append({"tuning.keep_ffn_activation": False})
    for r in lighter:
        out.append({"train.recompute": r})
        if r == "selective" and cfg.keeps_ffn_activation:
            out.append({"train.recompute": r, "tuning.keep_ffn_activation": False})
    if par.data * par.context > 1:   # the state split over the replicas of the weights
        out += [{"parallel.zero": z} for z in (1, 2, 3) if z > par.zero]
    mbs = [b for b in range(t.micro_batch_size - 1, 0, -1)
           if t.global_batch_size % (b * par.data) == 0]
    for b in mbs:
        out.append({"train.micro_batch_size": b})
        if lighter:
            out.append({"train.micro_batch_size": b, "train.recompute": "full"})
    n_now = par.data * par.pipe * par.tensor
    for n in sorted({n_now, n_devices}) if layouts else ():
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 4, 8, 16, 32, 64):
                if n % (tp * pp) or (tp, pp) == (par.tensor, par.pipe):
                    continue
                layout = {"parallel.data": n // (tp * pp), "parallel.pipe": pp,
                          "parallel.tensor": tp}
                if pp != par.pipe:
                    layout.update({"parallel.schedule": "1f1b" if pp > 1 else par.schedule,
                                   "parallel.virtual_stages": 1, "parallel.stage_layers": ()})
                    if pp == 1 and par.schedule in ("interleaved", "zb-v"):
                        layout["parallel.schedule"] = "1f1b"
                out.append(layout)
                if lighter:
                    out.append({**layout, "train.recompute": "full"})
    return out


def _fits(cfg, have: int, n_devices: int, limit: int = 4, extra=None) -> list[str]:
    """Up to `limit` changes under which the estimate (plus extra(cfg) bytes, if given: then
    no change of layout) fits, each with that number; a change is left out when a part of it
    (the same keys) already fits on its own."""
    from ptdp_jax.training.memory import estimate_memory
    found, taken = [], []
    for over in _candidates(cfg, n_devices, layouts=extra is None):
        keys = {k for k in over if k.split(".")[0] in ("train", "tuning")
                or k == "parallel.zero"} | \
            ({"layout"} if any(k.startswith("parallel.") and k != "parallel.zero"
                               for k in over) else set())
        if any(t <= keys for t in taken):
            continue
        try:
            c = validate(_with(cfg, **over), n_devices)
        except (ConfigError, ValueError, ZeroDivisionError):
            continue
        total = estimate_memory(c).peak + (extra(c) if extra else 0)
        if total > have:
            continue
        taken.append(keys)
        shown = {k: v for k, v in over.items() if k != "parallel.stage_layers"}
        found.append(" ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                              for k, v in shown.items()) + f" ({total / GiB:.2f} GiB)")
        if len(found) >= limit:
            break
    return found


def _devices_needed(cfg, have: int) -> int:
    """Devices of this size that the model state alone (params, grads, AdamW) fills."""
    from ptdp_jax.training.memory import estimate_memory
    one = estimate_memory(_with(cfg, **{"parallel.data": 1, "parallel.pipe": 1,
                                        "parallel.tensor": 1, "parallel.schedule": "1f1b",
                                        "parallel.virtual_stages": 1,
                                        "parallel.stage_layers": ()}))
    return max(2, math.ceil((one.params + one.grads + one.optimizer) / have))


def _refusal(cfg, what: str, need: int, have: int, detail: str = "",
             missed: int | None = None) -> MemoryCheckError:
    """The refusal; `missed`: what the estimate left out of XLA's number for this run."""
    import jax
    n_devices = len(jax.devices())
    words = _device_words().format(have=f"{have / GiB:.2f} GiB")
    msg = f"{what} needs {need / GiB:.2f} GiB per device{detail}, but {words}."
    if _on_cpu():
        if missed is None:
            extra, plus = (lambda c: CPU_SCORE_BUFFERS[c.recompute] * _score_bytes(c),
                           "3, 2 or 1 micro-batch's scores with recompute none, selective or "
                           "full")
        else:
            unit = _score_bytes(cfg)
            extra, plus = (lambda c: missed * _score_bytes(c) / unit,
                           f"the {missed / GiB:.2f} GiB it missed here, scaled to each")
        msg += (" On CPU the estimate is approximate: XLA's attention there keeps s x s "
                "scores that it leaves out.")
        fits = _fits(cfg, have, n_devices, extra=extra)
        if fits:
            msg += f" Settings that clearly fit (the estimate plus {plus}): " + "; ".join(fits)
        else:
            msg += (f" No smaller micro-batch or more recomputation clearly fits (the estimate "
                    f"plus {plus})")
    else:
        fits = _fits(cfg, have, n_devices)
        if fits:
            msg += " Settings that fit (by the estimate): " + "; ".join(fits)
        else:
            msg += (f" No smaller micro-batch, more recomputation or other layout of the "
                    f"{n_devices} devices here fits by the estimate")
    if not fits:
        needed = _devices_needed(cfg, have)
        if needed > n_devices:
            msg += (f": the model state alone (parameters, gradients, AdamW) fills {needed} "
                    f"devices of this size; spread it over more (parallel.data x pipe x tensor, "
                    f"more processes or hosts)")
    return MemoryCheckError(msg + ". tuning.skip_memory_check=true runs it anyway.")


def check_memory(cfg, log=print):
    """Before compiling: the estimate against the device (see the module doc); returns
    the MemoryEstimate (None when skipped or the device's memory is unknown)."""
    if cfg.tuning.skip_memory_check:
        return None
    _check_host_stash(cfg)
    from ptdp_jax.training.memory import estimate_memory
    have = _device_memory()
    if have is None:
        return None
    est = estimate_memory(cfg)
    if est.peak > have:
        raise _refusal(cfg, "this run", est.peak, have,
                       f" by the estimate ({est.describe().replace(' per device', '')})")
    return est


HOST_STASH_SHARE = 0.5      # of the host's RAM: the rest for data, saves and the processes


def _check_host_stash(cfg):
    """train.recompute=offload with pipelining: the stash's pinned host memory of this host's
    devices against its RAM."""
    import jax
    from ptdp_jax.pipeline.balance import chunk_layers
    from ptdp_jax.training.memory import host_stash_bytes, stash_slots
    per_device = host_stash_bytes(cfg)
    if not per_device:
        return
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    n = jax.local_device_count()
    if per_device * n > HOST_STASH_SHARE * ram:
        raise MemoryCheckError(
            f"train.recompute=offload keeps {per_device * n / GiB:.1f} GiB of the pipeline's "
            f"stash in this host's pinned memory ({n} devices x {per_device / GiB:.1f} GiB: "
            f"{stash_slots(cfg)} slots of parallel.schedule={cfg.parallel.schedule} x "
            f"{max(chunk_layers(cfg))} layers), more than {HOST_STASH_SHARE:.0%} of its "
            f"{ram / GiB:.0f} GiB of RAM: use train.recompute=full, or a smaller "
            f"train.micro_batch_size")


def compiled_bytes(executable) -> int | None:
    """Memory per device of a compiled program from XLA: arguments + outputs +
    temporaries - the donated (aliased) part; None if XLA does not say."""
    try:
        m = executable.memory_analysis()
    except Exception:
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def check_compiled(cfg, executable) -> int | None:
    """After compiling the train step, before running it: XLA's memory analysis against
    the device; returns the bytes (None when skipped or unknown)."""
    if cfg.tuning.skip_memory_check:
        return None
    have, need = _device_memory(), compiled_bytes(executable)
    if have is None or need is None:
        return need
    if need > have:
        from ptdp_jax.training.memory import estimate_memory
        missed = max(0, need - estimate_memory(cfg).total)
        raise _refusal(cfg, "the compiled train step (XLA's memory analysis)", need, have,
                       missed=missed)
    return need
