"""Orbax's reports around a failed read or write kept off the terminal: the one CheckpointError
says it in a line, and what orbax printed goes to run.dir/errors.log."""
from __future__ import annotations

import logging
import sys
import traceback
import warnings


_QUIET_LOOP = False


def quiet_closed_loop() -> None:
    """Drop (once installed, for the process) the reports that follow a failed orbax
    restore: 'Event loop is closed' from tensorstore's reads still in flight, the errors and
    warnings of the read coroutines never awaited once the first read failed, and asyncio's
    'exception was never retrieved' of the other failed reads; nothing is lost, but each
    printed a traceback around the one clear CheckpointError."""
    global _QUIET_LOOP
    if _QUIET_LOOP:
        return
    previous = sys.unraisablehook

    def hook(u):
        if isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed":
            return
        if "orbax" in getattr(getattr(u.object, "cr_code", None), "co_filename", ""):
            return
        previous(u)
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_unretrieved_read_errors)
    warnings.filterwarnings("ignore", r"coroutine '_read\w*' was never awaited", RuntimeWarning)
    _QUIET_LOOP = True


class _OrbaxThreadErrors(logging.Filter):
    """Keeps orbax's background-thread errors (a failed write, with its traceback, once per
    thread) off the terminal: into run.dir/errors.log instead. The save's CheckpointError says
    the cause in one line."""

    def __init__(self):
        super().__init__()
        self.run_dir = None

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text.startswith("Waiting for previous save to complete"):
            return False                      # the run's checkpoint_s counts that wait
        if record.levelno < logging.ERROR or not text.startswith("[process="):
            return True
        from ptdp_jax.exits import write_error_log
        detail = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
        write_error_log(self.run_dir, "orbax: " + text.splitlines()[0][:300], text + "\n" + detail)
        return False


_ORBAX_ERRORS = _OrbaxThreadErrors()


def quiet_orbax_errors(run_dir) -> None:
    """Install (once; the newest run_dir wins) the filter of _OrbaxThreadErrors on absl's
    logger, and quiet_closed_loop's hooks: a failed save then prints nothing but its error."""
    _ORBAX_ERRORS.run_dir = run_dir
    logger = logging.getLogger("absl")
    if _ORBAX_ERRORS not in logger.filters:
        logger.addFilter(_ORBAX_ERRORS)
    quiet_closed_loop()


def _unretrieved_read_errors(record: logging.LogRecord) -> bool:
    """False for asyncio's report of a failed orbax/tensorstore read nobody awaited."""
    message = record.getMessage()
    if "exception was never retrieved" not in message:
        return True
    exc = record.exc_info[1] if record.exc_info else None
    frames = traceback.walk_tb(exc.__traceback__) if exc is not None else ()
    from_orbax = any("orbax" in frame.f_code.co_filename for frame, _ in frames)
    return not (from_orbax or "OCDBT" in message or "TensorStore" in message)
