"""A device that runs out of memory mid-run, said in one line: the phase (train, eval,
checkpoint, generate), the step, the bytes XLA asked for against the device's limit, and what
to change. The full text goes to run.dir/errors.log; the command exits with
ExitCode.OUT_OF_MEMORY.

    with phase("eval", step, cfg, run_id):
        val = evaluate(...)

Test hook: PTDP_TEST_OOM=PHASE:STEP raises XLA's out-of-memory error in that phase at that
step (tests/test_faults.py).
"""
from __future__ import annotations

import os
import re
import traceback
from contextlib import contextmanager

from ptdp_jax.exits import write_error_log

PHASE_WORDS = {"train": "the train step", "eval": "the evaluation",
               "checkpoint": "the checkpoint's copy to host memory",
               "generate": "the sample's generation", "restore": "restoring the checkpoint"}
FIXES = {
    "train": "lower train.micro_batch_size, recompute more (train.recompute=selective or full) "
             "or spread the model over more devices",
    "eval": "lower train.micro_batch_size (the evaluation runs in microbatches of it) or "
            "train.eval_batches, or spread the model over more devices",
    "checkpoint": "spread the model over more devices (a save copies one array at a time, so "
                  "the step itself is at the edge: lower train.micro_batch_size)",
    "generate": "train.sample_tokens=0 skips the sample (the checkpoint is written); "
                "ptdp-generate runs it on a device with room",
    "restore": "resume on more devices, or with less memory in use on them",
}
_ASKED = re.compile(r"(?:allocat\w*|requested)\s+([0-9.]+)\s*([KMGT]i?B|B|bytes)", re.I)
_UNITS = {"B": 1, "BYTES": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10,
          "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class DeviceMemoryError(RuntimeError):
    """A device ran out of memory; str() is the one line for the user."""


def is_out_of_memory(e: BaseException) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text and ("ut of memory" in text or "allocat" in text) \
        and "No space left on device" not in text


def asked_bytes(text: str) -> float | None:
    """The bytes an XLA out-of-memory message says it asked for (None if it names none)."""
    m = _ASKED.search(text)
    return float(m.group(1)) * _UNITS[m.group(2).upper()] if m else None


def _in_use_and_limit():
    import jax
    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:
        stats = {}
    return stats.get("bytes_in_use"), stats.get("bytes_limit"), jax.local_devices()[0].platform


def describe(name: str, step: int, cfg, text: str) -> str:
    """The one line: phase, step, bytes asked against the limit, what to change."""
    from ptdp_jax.config.memory_limit import limit_words
    gib = lambda b: f"{b / 2**30:.2f} GiB"
    asked = asked_bytes(text)
    in_use, limit, platform = _in_use_and_limit()
    numbers = []
    if asked is not None:
        numbers.append(f"XLA asked for {gib(asked)}")
    if in_use is not None:
        numbers.append(f"{gib(in_use)} in use")
    if limit is not None:
        numbers.append(f"a device's limit is {gib(limit)}")
    if _host_memory(cfg, asked, in_use, limit):
        return (f"out of pinned host memory at step {step}, in {PHASE_WORDS.get(name, name)} "
                f"(XLA asked for {gib(asked)} while the device had {gib(limit - in_use)} "
                f"free): train.recompute=offload keeps selective's residuals in the host's "
                f"memory. To fit: train.recompute=full, or a smaller train.micro_batch_size")
    where = limit_words(platform)
    fixes = FIXES.get(name, FIXES["train"])
    return (f"out of device memory at step {step}, in {PHASE_WORDS.get(name, name)}"
            + (f" ({', '.join(numbers)})" if numbers else "")
            + (f"; {where}" if where else "")
            + f". To fit: {fixes}, or check that no other process holds memory on the device")


def _host_memory(cfg, asked, in_use, limit) -> bool:
    """Whether an allocation the device had room for failed in host memory: the pinned host
    buffers of train.recompute=offload."""
    offload = getattr(cfg, "recompute", None) == "offload"
    return offload and None not in (asked, in_use, limit) and asked + in_use <= limit


@contextmanager
def phase(name: str, step: int, cfg, run_id: str = ""):
    """Turn XLA's out-of-memory error inside the block into a DeviceMemoryError."""
    try:
        _test_hook(name, step)
        yield
    except DeviceMemoryError:
        raise
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        line = describe(name, step, cfg, str(e))
        log = write_error_log(cfg.run.dir, f"run {run_id}: {line}",
                              "".join(traceback.format_exception(e)))
        raise DeviceMemoryError(line + (f" (the full error: {log})" if log else "")) from None


def _test_hook(name: str, step: int) -> None:
    spec = os.environ.get("PTDP_TEST_OOM")
    if spec and spec == f"{name}:{step}":
        raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                           f"38856802304 bytes. [tf-allocator-allocation-error='']")
