"""File-level access to cgroupfs and /proc: the one place ``OSError`` becomes ``CgroupError``.

Every file is read as bytes and written with one ``os.write`` of the exact
bytes: a cgroup file acts on each ``write(2)``, so buffered text I/O that
splits, delays or adds to a write would change what the kernel sees. Each
error names the file and the errno and chains the ``OSError``.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from geco import log
from geco._tuple import NamedTuple
from geco.errors import CgroupError

__all__ = [
    "Mount",
    "cgroup_error",
    "favors_dynmods",
    "make_dir",
    "parse_mountinfo",
    "poll_until",
    "proc_cgroups",
    "read_bytes",
    "read_int",
    "read_keyed",
    "read_pids",
    "read_str",
    "read_xattr",
    "remove_tree",
    "rmdir_quietly",
    "set_value",
    "signal_pid",
    "unique",
    "walk_dirs",
    "write_bytes",
    "write_each",
]

_log = log.get("cgroup._fs")

# Poll intervals while waiting for the kernel (freeze, empty cgroup): start
# short so the common case is fast, cap so a long wait costs little CPU.
_POLL_FIRST = 0.002
_POLL_MAX = 0.05


class Mount(NamedTuple):
    """One line of ``/proc/<pid>/mountinfo`` (only the fields geco needs).

    Attributes
    ----------
    mount_point: where it is mounted.
    root: the path inside the filesystem that is mounted there (``/`` unless a
        bind mount or a cgroup namespace shows only a subtree).
    fstype: ``cgroup``, ``cgroup2``, ``tmpfs``, ...
    super_options: the per-superblock options; for cgroup v1 these name the
        controllers of the hierarchy (``rw,cpu,cpuacct``).
    """

    mount_point: Path
    root: str
    fstype: str
    super_options: tuple[str, ...]


def _unescape(field: bytes) -> str:
    """Undo mountinfo's octal escapes (``\\040`` = space) and decode like the OS does."""
    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field)
    return os.fsdecode(raw)


def parse_mountinfo(data: bytes) -> list[Mount]:
    """Parse ``/proc/<pid>/mountinfo`` text.

    Each line is ``id parent maj:min root mount_point options [optional...] -
    fstype source super_options`` (proc(5)); the optional fields end at ``-``.
    Lines that do not have that shape are skipped.
    """
    mounts = []
    for line in data.splitlines():
        fields = line.split(b" ")
        try:
            dash = fields.index(b"-", 6)
        except ValueError:
            continue
        if len(fields) < dash + 4:
            continue
        mounts.append(Mount(mount_point=Path(_unescape(fields[4])), root=_unescape(fields[3]),
                            fstype=fields[dash + 1].decode("ascii", "replace"),
                            super_options=tuple(fields[dash + 3].decode("ascii", "replace")
                                                .split(","))))
    return mounts


def favors_dynmods(mounts: Iterable[Mount]) -> bool:
    """True when a cgroup hierarchy is mounted ``favordynmods`` (or the kernel was booted
    with ``cgroup_favordynmods=true``, which shows the same way).

    The kernel serializes every move between cgroups with one lock for the whole
    machine (``cgroup_threadgroup_rwsem``). In its default mode the lock's first
    taker after a quiet moment (a grace period without moves, often under 1 ms)
    waits for an RCU grace period, milliseconds, and every move queued behind it
    waits too. One hierarchy mounted ``favordynmods`` keeps the lock ready for
    good, at the cost of a slower fork and exit everywhere.
    """
    return any(m.fstype in ("cgroup", "cgroup2") and "favordynmods" in m.super_options
               for m in mounts)


def proc_cgroups(proc: Path, pid: int) -> dict[str, str] | None:
    """Return the cgroup paths of ``pid`` from ``/proc/<pid>/cgroup``, or None if it is gone.

    Returns
    -------
    ``{controller: path}`` for every v1 hierarchy (co-mounted controllers each
    get the path; named hierarchies appear as ``name=systemd``), and ``""`` for
    the cgroup2 line (``0::/path``).

    Raises
    ------
    CgroupError
        when the file exists but cannot be read for another reason.
    """
    path = proc / str(pid) / "cgroup"
    try:
        data = read_bytes(path)
    except CgroupError as exc:
        if exc.fields.get("errno") in ("ENOENT", "ESRCH"):
            return None
        raise
    result: dict[str, str] = {}
    for line in data.splitlines():
        parts = line.split(b":", 2)
        if len(parts) != 3:
            continue
        cgpath = os.fsdecode(parts[2])
        if parts[0] == b"0" and parts[1] == b"":
            result[""] = cgpath
            continue
        for ctrl in parts[1].split(b","):
            result[ctrl.decode("ascii", "replace")] = cgpath
    return result


def cgroup_error(what: str, exc: OSError, *, hint: str = "", **fields: object) -> CgroupError:
    """Translate an ``OSError`` into a :class:`CgroupError` naming errno, plus an optional hint."""
    err = CgroupError.from_oserror(what, exc, **fields)
    msg = f"{err.msg}; {hint}" if hint else err.msg
    return CgroupError(msg, **err.fields)


def read_bytes(path: Path) -> bytes:
    """Return the whole content of a cgroup or /proc file.

    Raises
    ------
    CgroupError
        with ``path`` and ``errno`` when the file cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    except OSError as exc:
        raise cgroup_error(f"cannot read {path.name}", exc, path=path) from exc


def read_str(path: Path) -> str:
    """Return a one-value cgroup file's content without the trailing newline."""
    return read_bytes(path).strip().decode("ascii", "replace")


def read_xattr(path: Path, name: str) -> bytes | None:
    """Return the extended attribute ``name`` of a cgroup directory, or None when it has none.

    systemd marks the cgroups of its units with ``user.*`` attributes
    (``user.invocation_id``, ``user.delegate``); the ``user.`` namespace is
    readable without CAP_SYS_ADMIN, which gecod does not have.

    Raises
    ------
    CgroupError
        when the directory cannot be read for another reason than "no such
        attribute" or "attributes not supported here".
    """
    try:
        return os.getxattr(path, name)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise cgroup_error(f"cannot read the attribute {name}", exc, path=path) from exc


def write_bytes(path: Path | str, data: bytes, *, hints: Mapping[int, str] | None = None,
                **fields: object) -> None:
    """Write ``data`` to a cgroup file with exactly one ``write(2)``.

    Parameters
    ----------
    path: the file.
    data: the exact bytes; cgroup files reject a partial value, so no newline is
        added (``b"\\n"`` alone is how an empty list is written).
    hints: errno -> sentence saying what that errno means for this file.
    **fields: extra facts for the error (``key=``, ``pid=``).

    Raises
    ------
    CgroupError
        with ``path``, ``errno`` and the value when the kernel refuses the write.
    """
    write_each(path, [data], hints=hints, **fields)


def write_each(path: Path | str, values: Sequence[bytes], *,
               hints: Mapping[int, str] | None = None, **fields: object) -> None:
    """Write each of ``values`` to a cgroup file with one ``write(2)`` apiece, in order,
    through one open file (a file such as ``devices.deny`` takes one rule per write).

    Parameters and errors as :func:`write_bytes`; the error names the value refused, and
    the values after it are not written.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _write_error(path, values[0] if values else b"", exc, hints, fields) from exc
    try:
        for data in values:
            try:
                written = os.write(fd, data)
            except OSError as exc:
                raise _write_error(path, data, exc, hints, fields) from exc
            if written != len(data):
                raise CgroupError(f"short write of {_shown(data)} to {os.path.basename(path)}: "
                                  f"{written} of {len(data)} bytes", path=Path(path), **fields)
    finally:
        os.close(fd)


def _write_error(path: Path | str, data: bytes, exc: OSError,
                 hints: Mapping[int, str] | None, fields: Mapping[str, object]) -> CgroupError:
    hint = (hints or {}).get(exc.errno or 0, "")
    return cgroup_error(f"cannot write {_shown(data)} to {os.path.basename(path)}", exc,
                        hint=hint, path=Path(path), **fields)


def _shown(data: bytes) -> str:
    return data.decode("ascii", "backslashreplace").strip() or "(empty)"


def read_int(path: Path) -> int:
    """Return a cgroup file holding one decimal number.

    Raises
    ------
    CgroupError
        when the file cannot be read or does not hold a number.
    """
    text = read_str(path)
    try:
        return int(text)
    except ValueError:
        raise CgroupError(f"{path.name} must hold a number, got {text!r}", path=path) from None


def read_keyed(path: Path) -> dict[str, int]:
    """Return a flat-keyed cgroup file (``oom_kill 3`` per line) as a dict, skipping odd lines."""
    out: dict[str, int] = {}
    for line in read_bytes(path).splitlines():
        name, _, value = line.partition(b" ")
        if value.strip().isdigit():
            out[name.decode("ascii", "replace")] = int(value)
    return out


def set_value(path: Path, value: str, *, missing_hint: str = "",
              hints: Mapping[int, str] | None = None, **fields: object) -> None:
    """Write ``value`` to a one-value cgroup file unless it already holds exactly that.

    Skipping equal values keeps a repeated ``create`` free of side effects; an
    empty value is written as a lone newline (a zero-length write is ignored by
    the kernel).

    Raises
    ------
    CgroupError
        when the file cannot be read or written; ``missing_hint`` is added when
        the file does not exist (controller not enabled, cgroup not created).
    """
    try:
        current = read_str(path)
    except CgroupError as exc:
        if missing_hint and exc.fields.get("errno") == "ENOENT":
            raise CgroupError(f"{exc.msg}; {missing_hint}", **exc.fields) from exc
        raise
    if current != value:
        write_bytes(path, value.encode("ascii") or b"\n", hints=hints, **fields)


def make_dir(path: Path) -> bool:
    """Create a cgroup directory (mode 0755); return False when it already existed.

    Raises
    ------
    CgroupError
        when the kernel refuses for another reason (no parent, no permission).
    """
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return False
    except OSError as exc:
        raise cgroup_error("cannot create the cgroup", exc, path=path) from exc
    return True


def rmdir_quietly(path: Path) -> None:
    """Undo a mkdir of ours; if it cannot be undone (a process raced in), destroy() reports it."""
    try:
        os.rmdir(path)
    except OSError as exc:
        _log.debug("could not remove %s again: %s", path, exc)


def remove_tree(path: Path) -> list[Path]:
    """Remove a cgroup directory and any sub-cgroups, deepest first.

    Returns
    -------
    The directories the kernel refused to remove because they are busy (EBUSY:
    processes or child cgroups left). A directory that is already gone is fine.

    Raises
    ------
    CgroupError
        for any other error.
    """
    busy: list[Path] = []
    for sub in reversed(list(walk_dirs(path))):
        try:
            os.rmdir(sub)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                busy.append(sub)
                continue
            raise cgroup_error("cannot remove the cgroup", exc, path=sub) from exc
    return busy


def walk_dirs(path: Path) -> Iterator[Path]:
    """Yield ``path`` and every cgroup directory below it, parents before children.

    A directory that vanishes while walking is skipped (cgroups come and go).
    """
    if not path.is_dir():
        return
    yield path
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from walk_dirs(Path(entry.path))


def read_pids(path: Path) -> list[int]:
    """Return the pids in ``cgroup.procs`` of one directory (empty when it is gone)."""
    try:
        data = read_bytes(path / "cgroup.procs")
    except CgroupError as exc:
        if exc.fields.get("errno") == "ENOENT":
            return []
        raise
    return [int(tok) for tok in data.split()]


def poll_until(done: Callable[[], bool], timeout: float) -> bool:
    """Call ``done`` until it returns True or ``timeout`` seconds have passed.

    Returns
    -------
    The last result of ``done`` (it is always called at least once, and once
    more at the deadline, so a slow machine never loses the last chance).
    """
    deadline = time.monotonic() + max(timeout, 0.0)
    pause = _POLL_FIRST
    while True:
        if done():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return done()
        time.sleep(min(pause, left))
        pause = min(pause * 2, _POLL_MAX)


def signal_pid(pid: int, sig: int, still_member: Callable[[int], bool]) -> bool:
    """Send ``sig`` to ``pid`` only while it is still a member of the job; True if sent.

    A pid read from ``cgroup.procs`` may exit and be recycled by an unrelated
    process before the signal goes out. A pidfd pins the process first; the
    membership check then reads the cgroup of exactly that process, and
    ``pidfd_send_signal`` can only reach it, never a newcomer with the old pid.

    Raises
    ------
    CgroupError
        when the kernel refuses for a reason other than "no such process".
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOENT):
            raise cgroup_error(f"cannot open process {pid}", exc, pid=pid) from exc
        # Linux < 5.3 has no pidfd; EINVAL (ENOENT on Linux 6.9 and later) is a process half
        # gone (its pid still listed, its thread group released) or a thread's id: check,
        # then signal by number; the race is as narrow as it can be without a pidfd
        if not still_member(pid):
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        except OSError as exc2:
            raise cgroup_error(f"cannot signal process {pid}", exc2, pid=pid) from exc2
        return True
    try:
        if not still_member(pid):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    except OSError as exc:
        raise cgroup_error(f"cannot signal process {pid}", exc, pid=pid) from exc
    finally:
        os.close(fd)


def unique(dirs: Iterable[Path]) -> list[Path]:
    """The distinct directories of ``dirs`` in their first order."""
    return list(dict.fromkeys(dirs))
