"""geco's one reader of ``/proc``: a process's command, ids, parent, state, start, open devices.

Everything geco asks the kernel about a process goes through here, with one
root (:data:`ROOT`, a parameter only for tests with a fake tree). Every file is
read as bytes (a command name is whatever the job chose) and a process that is
gone, or a file the kernel does not provide, reads as "gone" (``""``, ``None``
or ``0``): a report or a check must never fail because the process just died.

Why not psutil (measured for issue 33; README, Layout), reader by reader:

* the hooks' readers (:func:`seconds_since_start`, :func:`ppid`, :func:`comm`,
  :func:`cwd`, :func:`read` of ``cmdline``): psutil's import (26-35 ms) costs as much
  as a hook's own imports;
* the rules' readers (:func:`real_uid`, :func:`uids`, :func:`ppid`, :func:`cwd` for
  gecod's requests, ssh and strays): geco pins the process they decide on (a pidfd,
  its start time), where ``psutil.Process`` opens ``/proc/<pid>`` again by pid per read;
* the scans (:func:`stat_fields`, :func:`comm` over every pid, strays): 4.5 us a name
  here against psutil's 44 us;
* ``geco status --job``'s names (:func:`comm`): psutil's name reads a 15-character
  name's whole command line (7.8 ms for 2 MB), a cost the job sets on gecod's answer;
* :func:`char_devices_open`: psutil's ``open_files`` stats each path (a FUSE server
  the job runs can hold it), where this asks statx for the type alone, never synced;
* :func:`state` (its letter), :func:`wchan`, :func:`boot_time`, a root per call
  (tests' fixture trees; ``psutil.PROCFS_PATH`` is one global): not in psutil.
"""

from __future__ import annotations

import functools
import os
import stat
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["ROOT", "boot_time", "char_devices_open", "comm", "cwd", "ppid", "read", "real_uid",
           "seconds_since_start", "stat_fields", "state", "status_field", "uids", "wchan"]

ROOT = Path("/proc")


def _path(proc: Path, pid: int | str, name: str) -> str:
    # a string, not Path arithmetic: gecod reads a few of these per request
    return f"{proc}/{pid}/{name}"


def read(pid: int | str, name: str, proc: Path = ROOT) -> bytes | None:
    """The bytes of ``/proc/<pid>/<name>``; None when it cannot be read (gone, no such file)."""
    # os.read, not a buffered file: a scan of every pid (geco.job.strays) reads thousands
    try:
        fd = os.open(_path(proc, pid, name), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 16384):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def comm(pid: int, proc: Path = ROOT) -> str:
    """Return the command name of ``pid`` (``/proc/<pid>/comm``); ``""`` when gone."""
    data = read(pid, "comm", proc)
    return "" if data is None else data.rstrip(b"\n").decode("utf-8", "replace")


def status_field(pid: int, name: bytes, proc: Path = ROOT) -> bytes | None:
    """The value of the ``<name>:`` line of ``/proc/<pid>/status``; None when gone or absent."""
    data = read(pid, "status", proc)
    if data is None:
        return None
    for line in data.split(b"\n"):
        key, sep, value = line.partition(b":")
        if sep and key == name:
            return value.strip()
    return None


def uids(pid: int, proc: Path = ROOT) -> tuple[int, int] | None:
    """(real, effective) uid of ``pid`` (``Uid: real effective saved fs``); None when gone."""
    value = status_field(pid, b"Uid", proc)
    fields = value.split() if value is not None else []
    if len(fields) < 2 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    return int(fields[0]), int(fields[1])


def real_uid(pid: int, proc: Path = ROOT) -> int | None:
    """The real uid of ``pid``; None when gone."""
    both = uids(pid, proc)
    return None if both is None else both[0]


def state(pid: int, proc: Path = ROOT) -> str:
    """Return the state letter and name of ``pid``, as ``D (disk sleep)``; ``""`` when gone.

    From the ``State:`` line of ``/proc/<pid>/status``, the one that names the
    letter (``/proc/<pid>/stat`` has the letter alone).
    """
    value = status_field(pid, b"State", proc)
    return "" if value is None else value.decode("ascii", "replace")


def stat_fields(pid: int | str, proc: Path = ROOT) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command: ``[0]`` the state letter,
    ``[1]`` the ppid, ``[19]`` the start time in clock ticks after boot; None when gone.

    Split after the *last* ``)``, so a command name with spaces or parens cannot
    shift the fields.
    """
    data = read(pid, "stat", proc)
    if data is None or b")" not in data:
        return None
    return data[data.rindex(b")") + 2:].split()


def ppid(pid: int, proc: Path = ROOT) -> int:
    """Return the parent pid of ``pid`` (0 when gone)."""
    fields = stat_fields(pid, proc)
    return int(fields[1]) if fields is not None and len(fields) > 1 else 0


def cwd(pid: int, proc: Path = ROOT) -> str:
    """The working directory of ``pid``, as the kernel names it.

    Raises
    ------
    FileNotFoundError
        when the process is gone.
    OSError
        when the link cannot be read (another user's process, without privilege).
    """
    return os.readlink(_path(proc, pid, "cwd"))


def wchan(pid: int, proc: Path = ROOT) -> str:
    """Return the kernel function ``pid`` sleeps in (``/proc/<pid>/wchan``).

    ``""`` when it is running (the kernel says ``0``), gone, or the kernel
    hides the symbol (no kallsyms).
    """
    data = read(pid, "wchan", proc)
    if data is None:
        return ""
    text = data.strip().decode("ascii", "replace")
    return "" if text == "0" else text


def boot_time(proc: Path = ROOT) -> float:
    """Return when this machine booted, in seconds since the epoch (``btime`` of ``/proc/stat``).

    Returns 0.0 when ``/proc/stat`` has no such line (then nothing counts as
    older than the boot).
    """
    try:
        data = (proc / "stat").read_bytes()
    except OSError:
        return 0.0
    for line in data.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"btime" and value.strip().isdigit():
            return float(value)
    return 0.0


def seconds_since_start(pid: int | str = "self", proc: Path = ROOT) -> float:
    """Seconds since ``pid`` was started (for this process: since its exec, interpreter
    start-up included); 0.0 when unknown. The kernel gives the start in clock ticks
    (10 ms), rounded down, so this is an upper bound, at most one tick high."""
    fields = stat_fields(pid, proc)
    if fields is None or len(fields) < 20:
        return 0.0
    now = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock /proc start times count on
    return max(0.0, now - int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def char_devices_open(pid: int, proc: Path = ROOT) -> Iterator[int]:
    """The device numbers (``st_rdev``) of the character devices ``pid`` holds open, one per
    fd, as its ``/proc/<pid>/fd`` lists them; nothing more once it is gone.

    Each fd's file is asked for its type alone, from the kernel's cache (statx with
    ``STATX_TYPE`` and ``AT_STATX_DONT_SYNC``): a file on NFS, or on a FUSE filesystem
    whose daemon the job runs, never makes the look wait on its server. A generator, so
    a caller on a time budget can stop between two fds.
    """
    try:
        entries = os.scandir(_path(proc, pid, "fd"))
    except OSError:
        return
    rdev = _char_rdev()
    with entries:
        while True:
            try:
                entry = next(entries)
            except StopIteration:
                return
            except OSError:  # gone meanwhile
                return
            found = rdev(entry.path)
            if found is not None:
                yield found


# statx(2): the file type only, never synced with a network filesystem's server
_AT_FDCWD = -100
_AT_STATX_DONT_SYNC = 0x4000
_STATX_TYPE = 0x0001
_STATX_SIZE = 256  # struct statx; stx_mode (u16) at 28, stx_rdev_major/minor (u32) at 128


@functools.cache
def _char_rdev() -> Callable[[str], int | None]:
    """The function that tells a path's character device number (None: not one, gone):
    statx through ctypes (loaded on first use: only a GPU job's end needs it), else
    ``os.stat`` where the C library has no statx (glibc < 2.28)."""
    import ctypes

    found = getattr(ctypes.CDLL(None, use_errno=True), "statx", None)
    if found is None:
        return _stat_rdev
    statx: Callable[..., int] = found

    def statx_rdev(path: str) -> int | None:
        buf = ctypes.create_string_buffer(_STATX_SIZE)
        if statx(_AT_FDCWD, os.fsencode(path), _AT_STATX_DONT_SYNC, _STATX_TYPE, buf) != 0:
            return None
        (mode,) = struct.unpack_from("<H", buf, 28)
        major, minor = struct.unpack_from("<II", buf, 128)
        return os.makedev(major, minor) if stat.S_ISCHR(mode) else None
    return statx_rdev


def _stat_rdev(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISCHR(st.st_mode) else None
