"""The compiled train step the loop dispatches.

With delayed FP8 scaling (train.fp8_recipe=delayed) a second step is compiled in the background
while the first steps run: the steady one (Sharder.fp8_steady), which rounds each operand at
its history's scale without first waiting for the tensor's own amax. The two give the same
numbers while every history row holds a scale; each step's metrics say whether the step after
next may run steady (training/fp8_state.steady_ready), so a loop that reads a step's metrics
one step late still switches safely. The loop waits for the second compile only where it can
first use it (the third step, unless the compile is done by then).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from ptdp_jax.training.fp8_state import READY_METRIC as READY


class Steps:
    """Callable (state, batch) -> (state, metrics); call `saw(metrics)` for each step read."""

    def __init__(self, first, compile_steady=None, log=print):
        self.first, self.steady = first, None
        self._announced = False
        self._log, self._ready = log, False
        self._pending: Future | None = None
        if compile_steady is not None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="ptdp-compile")
            self._pending = pool.submit(compile_steady)
            pool.shutdown(wait=False)

    def __call__(self, state, batch):
        if self._pending is not None and (self._ready or self._pending.done()):
            if not self._pending.done():
                self._log("ptdp_jax: delayed FP8 scaling: waiting for its steady step's compile "
                          "(once)")
            self._take(self._pending)
        if self._ready and self.steady is not None:
            if not self._announced:
                self._announced = True
                self._log("ptdp_jax: delayed FP8 scaling: every history row holds a scale; the "
                          "steps round without waiting for each tensor's amax from here")
            return self.steady(state, batch)
        return self.first(state, batch)

    def saw(self, metrics) -> None:
        self._ready = bool(metrics.get(READY, False))

    def _take(self, future):
        self._pending = None
        try:
            self.steady = future.result()
        except Exception as e:           # it may not fit where the first did: keep the first
            self._log(f"ptdp_jax: delayed FP8 scaling keeps rounding after each tensor's amax; "
                      f"its steady step did not compile ({e})")
