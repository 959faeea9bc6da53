"""One training run at a time in a checkpoint.dir: an exclusive `fcntl.flock` on
`<checkpoint.dir>/.ptdp.lock` (format.LOCK_FILE), taken by process 0 of a run before it
compiles and held until train() (or dry_run()) returns, when the file is removed; the
process's exit releases the lock too, however it ends (a killed run leaves the file, which
the next run takes over). A second run is refused at its start (CheckpointError, exit 6)
naming the holder's pid and host, which the file records. Readers (ptdp-eval, ptdp-export,
ptdp-generate) take no lock; a directory scan skips the file (a dot file)."""
from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import socket
import time
import warnings
from pathlib import Path

import jax

from ptdp_jax.checkpoint.format import LOCK_FILE, CheckpointError
from ptdp_jax.paths import unwritable

_HELD: dict[Path, int] = {}          # directory -> the descriptor of a lock this process holds
_IN_USE = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _holder(fd: int) -> str:
    """Who holds the lock, in words, from the file: 'pid 12 on host h since 10:00:00'."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on host {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid and host not recorded"


def _same_file(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        st, ours = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino)


def _open_locked(path: Path) -> int:
    """A descriptor of `path` holding its flock (OSError, with the holder in words as its
    `holder`, where it cannot be had). A file removed by its holder between our open and our
    lock is opened again, so that two runs never hold two files of one name."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            e.holder = _holder(fd)
            os.close(fd)
            raise
        if _same_file(path, fd):
            return fd
        os.close(fd)


def acquire(directory: Path) -> None:
    """Take the lock of `directory` (made if missing) and record this process in it;
    CheckpointError naming the directory and the holder where another run holds it. On a
    file system without locks: one warning, and the run goes on unlocked."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = _open_locked(directory / LOCK_FILE)
    except OSError as e:
        if e.errno not in _IN_USE:
            warnings.warn(f"checkpoint.dir {directory}: cannot lock {LOCK_FILE} ({e.strerror}): "
                          f"a second run in this directory is not refused", stacklevel=2)
            return
        raise CheckpointError(
            f"checkpoint.dir {directory} is in use by another run ({e.holder}): two runs in "
            f"one checkpoint.dir would overwrite each other's checkpoints; wait for it to end "
            f"or give this run another checkpoint.dir") from None
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    _HELD[directory] = fd


def release(directory: Path) -> None:
    """Give back the lock of `directory` if this process holds it: the file is removed while
    still locked, then the descriptor closed (which releases the flock)."""
    directory = Path(directory)
    fd = _HELD.pop(directory, None)
    if fd is None:
        return
    try:
        os.unlink(directory / LOCK_FILE)
    except OSError:
        pass
    finally:
        os.close(fd)


def lock_checkpoint_dir(cfg) -> None:
    """Before a run compiles: process 0 takes checkpoint.dir's lock (acquire). Nothing without
    a checkpoint.dir; a directory that cannot take files is left to check_checkpoint_dir,
    which refuses it with the reason."""
    if not cfg.checkpoint.dir or jax.process_index() != 0:
        return
    directory = Path(os.path.expanduser(cfg.checkpoint.dir)).absolute()
    if unwritable(directory) is None:
        acquire(directory)


def released_on_return(fn):
    """`fn` (train, dry_run) releasing, when it returns or raises, the locks it took."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = set(_HELD)
        try:
            return fn(*args, **kwargs)
        finally:
            for directory in set(_HELD) - before:
                release(directory)
    return wrapper
