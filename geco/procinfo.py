"""What ``/proc`` says about a process that will not die: its state, command and wait channel.

When a job's cgroup does not empty after SIGKILL, the admin needs to know why
before walking to the node: ``D (disk sleep)`` in ``nfs_wait_bit_killable``
is a hung NFS server, ``D`` in ``__refrigerator`` a frozen cgroup, ``Z`` a
zombie whose parent does not reap it. These readers give exactly that.

Every file is read as bytes (a command name is whatever the job chose) and a
process that is gone, or a file the kernel does not provide, reads as ``""``:
a report about a stuck process must never fail because the process just died.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["boot_time", "command", "state", "wchan"]

_PROC = Path("/proc")


def _read(path: Path) -> bytes | None:
    """The file's bytes, or None when it cannot be read (process gone, no such file)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def state(pid: int, proc: Path = _PROC) -> str:
    """Return the state letter and name of ``pid``, as ``D (disk sleep)``; ``""`` when gone.

    From the ``State:`` line of ``/proc/<pid>/status``, the one that names the
    letter (``/proc/<pid>/stat`` has the letter alone).
    """
    data = _read(proc / str(pid) / "status")
    if data is None:
        return ""
    for line in data.splitlines():
        name, sep, value = line.partition(b":")
        if sep and name == b"State":
            return value.strip().decode("ascii", "replace")
    return ""


def command(pid: int, proc: Path = _PROC) -> str:
    """Return the command name of ``pid`` (``/proc/<pid>/comm``); ``""`` when gone."""
    data = _read(proc / str(pid) / "comm")
    return "" if data is None else data.rstrip(b"\n").decode("utf-8", "replace")


def wchan(pid: int, proc: Path = _PROC) -> str:
    """Return the kernel function ``pid`` sleeps in (``/proc/<pid>/wchan``).

    ``""`` when it is running (the kernel says ``0``), gone, or the kernel
    hides the symbol (no kallsyms).
    """
    data = _read(proc / str(pid) / "wchan")
    if data is None:
        return ""
    text = data.strip().decode("ascii", "replace")
    return "" if text == "0" else text


def boot_time(proc: Path = _PROC) -> float:
    """Return when this machine booted, in seconds since the epoch (``btime`` of ``/proc/stat``).

    Returns 0.0 when ``/proc/stat`` has no such line (then nothing counts as
    older than the boot).
    """
    data = _read(proc / "stat") or b""
    for line in data.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"btime" and value.strip().isdigit():
            return float(value)
    return 0.0
