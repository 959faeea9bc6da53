"""The exit codes of the command-line tools, in one place (docs/troubleshooting.md).

    from ptdp_jax.exits import ExitCode
    sys.exit(ExitCode.CONFIG)

This module imports nothing from ptdp_jax, so that every other module may import it.
"""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0                  # done (also after SIGTERM / Ctrl-C / train.stop_*: checkpoint written)
    ERROR = 1               # anything else (a bug, an unexpected failure: with a traceback)
    CONFIG = 2              # a bad config, argument or input file, or a run that cannot fit in
                            # memory (tuning.skip_memory_check); nothing was started
    STOPPED = 3             # stopped after 5 non-finite steps in a row (each skipped)
    PEER_LOST = 4           # multi-process: another process died or failed, this one stopped
    DISTRIBUTED_INIT = 5    # multi-process: jax.distributed could not start (peers missing)
    CHECKPOINT = 6          # a checkpoint could not be read or written
    INTERRUPTED = 130       # a second Ctrl-C: stopped at once, without a checkpoint


def short_error(e: BaseException, limit: int = 400) -> str:
    """An exception's message on one line, cut at `limit` characters."""
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit] + " ..."
