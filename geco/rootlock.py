"""Locks that only root can take, taken within a time bound.

An ``flock`` on a file a user can open is a lock that user can hold: ``flock`` grants
``LOCK_EX`` on a read-only descriptor. So root's locks on shared state (a job's usage
samples, the node's health ledgers) are never taken on the files users read: each is a
separate ``0600`` file of root's in a root-owned directory, which no user can open.
Root's writers serialize on it; readers take no lock, since every file they read is
replaced whole (renamed into place) or only appended to.

Even a lock only root holds is taken within a bound: a writer stuck on a hung disk
costs the next one its ``wait``, never a job's end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from geco.errors import GecoError

__all__ = ["held"]

_MODE = 0o600
# Seconds between two tries for the lock.
_STEP = 0.005


@contextlib.contextmanager
def held(path: Path, *, wait: float, what: str) -> Iterator[None]:
    """Hold the exclusive lock ``path`` (root's ``0600`` file, made when missing) for the
    with-block.

    Raises
    ------
    GecoError
        when it cannot be opened or made root's alone, or is not had within ``wait``
        seconds ("the <what> is busy").
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _MODE)
    except OSError as exc:
        raise GecoError.from_oserror(f"cannot open the lock of the {what}", exc,
                                     path=path) from exc
    try:
        st = os.fstat(fd)
        if st.st_uid != 0:
            raise GecoError(f"{path} must be root's, the lock of the {what}")
        if stat.S_IMODE(st.st_mode) & 0o077:  # made by hand, or by an older geco
            _private(fd, path, what)
        _take(fd, path, wait, what)
        yield
    finally:
        os.close(fd)  # the lock goes with its descriptor


def _private(fd: int, path: Path, what: str) -> None:
    """No user opens the lock from now on (one who has it open already: the wait bounds
    what they can do with it)."""
    try:
        os.fchmod(fd, _MODE)
    except OSError as exc:
        raise GecoError.from_oserror(f"cannot make the lock of the {what} root's alone", exc,
                                     path=path) from exc


def _take(fd: int, path: Path, wait: float, what: str) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise GecoError(f"the {what} is busy: {path} was not free within "
                                f"{wait:g} s") from None
        time.sleep(_STEP)
