"""When each step ends: a thread waits for every dispatched step's outputs and notes the time.
The loop's own thread cannot: on GPUs it can be held inside the next step's dispatch (XLA's
launch blocks once the device's queue is full) and would see the step before end late, which
shortened the logged time of a step before an evaluation to a fifth.

    clock = StepClock()
    ends = clock.track(out)          # a Future of perf_counter() when `out` is ready
    clock.close()
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import jax


class StepClock:
    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ptdp-clock")

    def track(self, out) -> Future:
        """A Future of the time (time.perf_counter) at which every array of `out` is ready."""
        return self._pool.submit(_ready_at, out)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ready_at(out) -> float:
    jax.block_until_ready(out)
    return time.perf_counter()
