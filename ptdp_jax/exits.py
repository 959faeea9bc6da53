"""The exit codes of the command-line tools, in one place (docs/troubleshooting.md).

    from ptdp_jax.exits import ExitCode
    sys.exit(ExitCode.CONFIG)

This module imports nothing from ptdp_jax, so that every other module may import it.
"""
from __future__ import annotations

import enum
import os
import sys


class ExitCode(enum.IntEnum):
    OK = 0                  # done (also after SIGTERM / Ctrl-C / train.stop_*: checkpoint written
                            # where checkpoint.dir is set)
    ERROR = 1               # anything else (a bug, an unexpected failure: with a traceback)
    CONFIG = 2              # a bad config, argument or input file, or a run that cannot fit in
                            # memory (tuning.skip_memory_check); nothing was started
    STOPPED = 3             # stopped after 5 non-finite steps in a row (each skipped)
    PEER_LOST = 4           # multi-process: another process died or failed, this one stopped
    DISTRIBUTED_INIT = 5    # multi-process: jax.distributed could not start (peers missing)
    CHECKPOINT = 6          # a checkpoint could not be read or written
    OUT_OF_MEMORY = 7       # a device ran out of memory while running (the step, evaluation, a
                            # checkpoint's copy or generation): one line says which and what to
                            # change; the full text is in run.dir/errors.log
    INTERRUPTED = 130       # a second Ctrl-C, or one before training: stopped at once


def short_error(e: BaseException, limit: int = 400) -> str:
    """An exception's message on one line, cut at `limit` characters."""
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit] + " ..."


ERROR_LOG = "errors.log"


def write_error_log(run_dir, title: str, text: str) -> str | None:
    """Append `text` under a dated `title` to run.dir/errors.log; the file's path, or None
    where it cannot be written (the one-line message still reaches the terminal)."""
    import time
    from pathlib import Path
    if not run_dir:
        return None
    path = Path(run_dir) / ERROR_LOG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {title}\n{text.rstrip()}\n\n")
    except OSError:
        return None
    return str(path)


def leave_now(code: int, message: str = "") -> None:
    """Print `message` (to stderr), then exit with `code` at once, skipping the interpreter's
    teardown: after a Ctrl-C has interrupted XLA (a compile, a transfer) that teardown can
    crash (exit 139). Whatever was still being written (a checkpoint in flight) is dropped."""
    if message:
        print(message, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(int(code))
