"""Paths a command reads or writes, checked before the work and explained in one line.

    why = unwritable(Path("data"))       # None, or why no file can be made there
    line = os_error_line(e)              # an OSError naming a path, as 'PATH: cause', or None

This module imports nothing from ptdp_jax, so that every other module may import it.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

# The OSErrors that say a path is wrong (not a bug): the commands print them in one line.
PATH_ERRNOS = {
    errno.ENOENT: "no such file or folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.EEXIST: "already exists",
    errno.ENOSPC: "no space left on the disk",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ELOOP: "too many symbolic links",
}


def os_error_line(e: BaseException) -> str | None:
    """An OSError about a path as one line, 'PATH: cause' (both paths of a rename), or None
    for anything else (no path, or an errno that is not about paths)."""
    if not isinstance(e, OSError) or e.filename is None or e.errno not in PATH_ERRNOS:
        return None
    where = os.fsdecode(e.filename)
    if e.filename2 is not None:
        where += f" -> {os.fsdecode(e.filename2)}"
    return f"{where}: {PATH_ERRNOS[e.errno]}"


def nearest_existing(directory: Path) -> Path:
    """`directory`, or its nearest ancestor that exists."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def unwritable(directory: str | os.PathLike) -> str | None:
    """Why no file can be made in `directory` (or, where it does not exist yet, in its nearest
    existing ancestor, which must be a folder), in words after the path; None where one can."""
    directory = Path(directory)
    probe = nearest_existing(directory)
    if not probe.is_dir():
        return "exists and is not a directory" if probe == directory else \
            f"cannot be made: {probe} is a file, not a directory"
    where = "" if probe == directory else \
        f" (it does not exist yet; {probe} is where it would be made)"
    if not os.access(probe, os.W_OK | os.X_OK):
        cause = "read-only file system" if _read_only(probe) else "permission denied"
        return f"is not writable{where}: {cause}"
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".ptdp-write-check-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return f"is not writable{where}: {PATH_ERRNOS.get(e.errno, e.strerror or str(e))}"
    return None
