"""When a run stops before train.steps: a signal (SIGTERM, Ctrl-C), train.stop_at_step,
or train.stop_after_minutes (Megatron's --exit-signal-handler, --exit-interval,
--exit-duration-in-mins). Each ends the step in flight; the loop then writes a
checkpoint (with checkpoint.dir) and returns normally, so the command exits 0. A
second Ctrl-C raises KeyboardInterrupt at once; a second SIGTERM is ignored, also while
ptdp-train ends after the run (quiet_after_a_stop).

    stopper = Stopper(cfg)
    ...
    why = stopper.check(step)      # None, or why to stop (the same on every process)
    stopper.restore()              # the previous signal handlers
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Any


_QUIET_AFTER_A_STOP = False     # within quiet_after_a_stop (ptdp-train)


@contextlib.contextmanager
def quiet_after_a_stop():
    """Around ptdp-train's run: where a signal stops it, SIGTERM is ignored from then on in the
    process (StopSignal.restore), so a second SIGTERM while the command ends (a scheduler's
    repeat) leaves it to exit 0 as after one, instead of killing it (exit 143)."""
    global _QUIET_AFTER_A_STOP
    _QUIET_AFTER_A_STOP = True
    try:
        yield
    finally:
        _QUIET_AFTER_A_STOP = False


class StopSignal:
    """Installs SIGTERM and SIGINT handlers that only set a flag (the training loop
    finishes its step, writes a checkpoint and exits). A second SIGINT raises
    KeyboardInterrupt at once. `restore()` puts the previous handlers back.
    Outside the main thread (where Python cannot install handlers) it does nothing.
    The flag is this process's; in a multi-process run the loop must agree on it
    across processes (Stopper does, once per step)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, signals=SIGNALS):
        self.requested = False
        self.name = ""
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        self.name = signal.Signals(signum).name

    def restore(self) -> None:
        """The previous handlers back; after a stop by signal under quiet_after_a_stop, SIGTERM
        ignored instead (SIG_IGN: Python's teardown puts its own handlers back to the
        default, which kills, while jax is still shutting down)."""
        for sig, handler in self._previous.items():
            if sig == signal.SIGTERM and self.requested and _QUIET_AFTER_A_STOP:
                handler = signal.SIG_IGN    # kept through the interpreter's teardown too
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


class Stopper:
    """The stop conditions of a run (see the module doc).

    One process: a signal or the time limit stops the run after the step in flight. Several
    processes must stop at the same step, and a signal may reach only some of them, so they
    agree on it; the agreement (`cross_process.any_process_later`, a tiny all-device program) is
    dispatched at one check and read at the next, so the loop never waits for the step in
    flight to find out (a read waits only for the step before, which the loop has read
    already): a signal then stops every process one step later than alone.
    train.stop_at_step needs no agreement (every process has the same config)."""

    def __init__(self, cfg):
        self.stop_at = cfg.train.stop_at_step
        self.minutes = cfg.train.stop_after_minutes
        self.t0 = time.monotonic()
        self.guard = StopSignal()
        self.by_signal = False
        self._agreement = None         # several processes: the one dispatched at the last check

    def check(self, step: int) -> str | None:
        """After `step` steps: why the run stops now, or None. All processes agree."""
        import jax

        from ptdp_jax.parallel.cross_process import any_process_later

        here = None                                     # this process's own reason, if any
        if self.guard.requested:
            here = f"received {self.guard.name}"
        elif self.minutes and time.monotonic() - self.t0 >= 60 * self.minutes:
            here = (f"train.stop_after_minutes={self.minutes:g} (ran "
                    f"{(time.monotonic() - self.t0) / 60:.1f} min)")
        if jax.process_count() > 1:
            agreed, self._agreement = self._agreement, any_process_later(here is not None)
            if agreed is None or not agreed():
                here = None                             # not agreed yet: on at the next check
            elif here is None:
                here = "a stop request on another process"
        if here is not None:
            self.by_signal = here.startswith("received")
            return here
        if self.stop_at and step >= self.stop_at:
            return f"train.stop_at_step={self.stop_at}"
        return None

    def restore(self) -> None:
        self.guard.restore()
