"""What every `ptdp-*` command does around its main(argv) (docs/troubleshooting.md):

    @command("ptdp-export", starts_jax=True)
    def main(argv=None) -> int: ...

- a warning is one line, `ptdp-export: warning: ...` (not its source line and code);
- with starts_jax, a device count in XLA_FLAGS that is not a whole number is refused in one
  line before jax starts (XLA would print its 94-line flag list and abort);
- an OSError about a path (paths.os_error_line) ends the command with one line,
  `ptdp-export: error: PATH: cause`, and exit 2 instead of a traceback;
- with quiet_pipe, a reader that closed stdout (`ptdp-plan ... | head -1`) ends it with exit 0
  and no traceback (the rest of the output is dropped).
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import warnings

from ptdp_jax.exits import ExitCode
from ptdp_jax.paths import os_error_line

DEVICE_COUNT = "--xla_force_host_platform_device_count"


def drop_stdout() -> None:
    """Point stdout at /dev/null: its reader has gone, and the flush at exit must not fail."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def xla_flags_problem(environ=os.environ) -> str | None:
    """Why XLA_FLAGS' CPU device count cannot be read (it must be --FLAG=N, N >= 1), or None."""
    for word in environ.get("XLA_FLAGS", "").split():
        name, _, value = word.partition("=")
        if name == DEVICE_COUNT and not (re.fullmatch(r"\d+", value) and int(value) >= 1):
            return (f"XLA_FLAGS: {word!r}: the number of CPU devices must be a whole number "
                    f">= 1, e.g. {DEVICE_COUNT}=8")
    return None


@contextlib.contextmanager
def one_line_warnings(prog: str):
    """Within: a printed warning is `prog: warning: MESSAGE` on one line."""
    def formatwarning(message, category, filename, lineno, line=None):
        return f"{prog}: warning: {' '.join(str(message).split())}\n"
    before = warnings.formatwarning
    warnings.formatwarning = formatwarning
    try:
        yield
    finally:
        warnings.formatwarning = before


def command(prog: str, quiet_pipe: bool = True, starts_jax: bool = False):
    """Decorator of a command's main(argv) -> exit code, as the module doc says."""
    def wrap(main):
        @functools.wraps(main)
        def run(argv=None) -> int:
            why = xla_flags_problem() if starts_jax else None
            if why:
                print(f"{prog}: error: {why}", file=sys.stderr)
                return ExitCode.CONFIG
            with one_line_warnings(prog):
                return _run(main, argv, prog, quiet_pipe)
        return run
    return wrap


def _run(main, argv, prog: str, quiet_pipe: bool) -> int:
    """main(argv), with a path's OSError and a closed stdout as the module doc says."""
    try:
        code = main(argv)
        if quiet_pipe:
            sys.stdout.flush()          # a closed pipe shows here, not at exit (code 120)
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
