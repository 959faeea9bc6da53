"""What every `ptdp-*` command does around its main(argv) (docs/troubleshooting.md):

    @command("ptdp-export")
    def main(argv=None) -> int: ...

- an OSError about a path (paths.os_error_line) ends the command with one line,
  `ptdp-export: error: PATH: cause`, and exit 2 instead of a traceback;
- with quiet_pipe, a reader that closed stdout (`ptdp-plan ... | head -1`) ends it with exit 0
  and no traceback (the rest of the output is dropped).
"""
from __future__ import annotations

import functools
import os
import sys

from ptdp_jax.exits import ExitCode
from ptdp_jax.paths import os_error_line


def drop_stdout() -> None:
    """Point stdout at /dev/null: its reader has gone, and the flush at exit must not fail."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def command(prog: str, quiet_pipe: bool = True):
    """Decorator of a command's main(argv) -> exit code, as the module doc says."""
    def wrap(main):
        @functools.wraps(main)
        def run(argv=None) -> int:
            try:
                code = main(argv)
                if quiet_pipe:
                    sys.stdout.flush()      # a closed pipe shows here, not at exit (code 120)
                return code
            except BrokenPipeError:
                if not quiet_pipe:
                    raise
                drop_stdout()
                return ExitCode.OK
            except OSError as e:
                line = os_error_line(e)
                if line is None:
                    raise
                print(f"{prog}: error: {line}", file=sys.stderr)
                return ExitCode.CONFIG
        return run
    return wrap
