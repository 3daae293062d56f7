"""Detect and count the OOM kills of one job cgroup (:class:`OomWatch`), each kill once.

The kernel's OOM killer stays in charge; geco only watches. Per job cgroup an
:class:`OomWatch` holds one file descriptor the runloop polls:

* cgroup v1: an eventfd registered through ``cgroup.event_control`` for the
  job's ``memory.oom_control``. The kernel signals it when the cgroup *enters*
  OOM -- before the victim is chosen and before ``oom_kill`` (Linux >= 4.13)
  in ``memory.oom_control`` counts the kill -- and once more when the cgroup
  is removed. A wake-up that finds the counter unchanged is therefore checked
  again shortly after (:class:`geco.oom.OomMonitor` does that).
* cgroup v2: an inotify watch on ``memory.events``, which the kernel marks
  modified *after* it counted ``oom_kill`` (hierarchically: kills in a job's
  sub-cgroups count too).

Counting is the kernel's: the ``oom_kill`` counter compared with the number
already reported, which is kept in ``<state_dir>/oom/<job>.<task>`` together
with the boot id and the cgroup's inode, so a restarted gecod neither repeats
nor misses a kill, and a re-created cgroup of the same name (a re-queued job)
starts from zero. A watch reports the kills that happened while nobody
watched at its first :meth:`OomWatch.check`, as :class:`OomEvent` values
(named from the kernel log, :mod:`geco.oom.kmsg`, when it has the line).

:class:`OomWatch` belongs to the runloop's thread.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from geco import atomicfile, jobfiles, log
from geco.cgroup import Backend, Limits, check_key
from geco.errors import CgroupError, GecoError
from geco.jobkey import JobKey
from geco.oom.fdowner import FdOwner
from geco.oom.kmsg import KernelLog, _is_under
from geco.resourceset import short_hostname

__all__ = ["OomEvent", "OomWatch", "open_inotify", "parse_keyed", "remove_counts"]

_log = log.get("oom.watch")

# A kill while the job used less than this share of its limit was not the
# job's doing: the node as a whole ran short (HTCondor's rule, starter.rst).
_NODE_WIDE_BELOW = 0.9
_STATE_MAGIC = b"geco-oom-v1"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

# inotify(7)
_IN_MODIFY = 0x00000002


# ---------------------------------------------------------------------------
# parsing cgroup counters (bytes in, values out)
# ---------------------------------------------------------------------------


def parse_keyed(data: bytes) -> dict[str, int]:
    """Parse a flat-keyed cgroup file (``memory.events``, ``memory.oom_control``).

    Parameters
    ----------
    data: the file's bytes: one ``<name> <decimal>`` per line.

    Returns
    -------
    name -> value; lines of another shape are skipped (a kernel may add some).
    """
    out: dict[str, int] = {}
    for line in data.splitlines():
        name, sep, value = line.strip().partition(b" ")
        value = value.strip()
        if sep and name and value.isdigit():
            out[name.decode("ascii", "replace")] = int(value)
    return out


# ---------------------------------------------------------------------------
# inotify (cgroup v2)
# ---------------------------------------------------------------------------


@functools.cache
def _libc() -> ctypes.CDLL:
    # ctypes, not cffi: two libc calls with int and char* arguments, and the
    # module stays standard-library only like geco.cgroup, so it also runs in
    # the minimal cgroup v2 test machine; cffi would need a cdef at run time
    # (ABI mode) or a compiled extension for the same two calls.
    # ctypes.util is imported here, not at the top: it pulls in subprocess and
    # shutil, and only cgroup v2 watches get here (once: the result is cached).
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_init1.restype = ctypes.c_int
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_add_watch.restype = ctypes.c_int
    return libc


def open_inotify(path: Path, mask: int = _IN_MODIFY) -> int:
    """Return a non-blocking inotify fd that turns readable when ``path`` is modified.

    cgroupfs marks ``memory.events`` (and every ``*.events`` file) modified when
    a counter in it changes; on a plain file any write does.

    Raises
    ------
    OSError
        from ``inotify_init1`` or ``inotify_add_watch`` (errno and path set).
    """
    libc = _libc()
    fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, os.strerror(err), str(path))
    return fd


# ---------------------------------------------------------------------------
# events
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OomEvent:
    """One OOM kill in a job's cgroup."""

    key: JobKey
    node: str  # this host's short name
    # the limit that applied, in bytes (the one the job was closest to); 0: the job had none
    limit: int
    # the job's peak use of that kind in bytes (v1 ``max_usage_in_bytes``, page cache
    # included; v2 ``memory.peak``); 0 when the kernel has none
    peak: int
    # the victim, from the kernel log; 0 and "" when its line could not be found
    pid: int = 0
    command: str = ""
    kill_count: int = 1  # the kernel's ``oom_kill`` counter for the job at this kill
    limit_kind: str = "ram"  # or "ram+swap" (v1 memsw, v2 memory + swap)
    # "job" when the kernel log says the job's own limit was hit, "node" when it says the
    # node (or a parent cgroup) ran out, "" when there was no line to tell
    scope: str = ""

    @property
    def job_id(self) -> int:
        """The Grid Engine job number."""
        return self.key.job

    @property
    def task_id(self) -> int:
        """The array task (1 for a non-array job)."""
        return self.key.task

    @property
    def node_wide(self) -> bool:
        """True when the node ran out of memory, not the job out of its request.

        The kernel log says so (a node-wide or parent cgroup OOM), or the job
        had no limit, or its peak stayed below 90 % of its limit.
        """
        if self.scope == "node" or self.limit <= 0:
            return True
        return self.peak < self.limit * _NODE_WIDE_BELOW


def _memory_figures(limits: Limits, usage: Mapping[str, int], version: int) -> tuple[int, int, str]:
    """Return (limit, peak, kind) for the limit the job came closest to."""
    ram, total = limits.ram, limits.memory_swap
    choices: list[tuple[int, int, str]] = []
    if ram:
        choices.append((ram, usage.get("memory_peak", 0), "ram"))
    if total > ram:
        # v1 has a RAM+swap peak; v2 only separate peaks, whose sum is an upper bound
        both = usage.get("memsw_peak", 0) if version == 1 else \
            usage.get("memory_peak", 0) + usage.get("swap_peak", 0)
        choices.append((total, both, "ram+swap"))
    if not choices:
        return 0, usage.get("memory_peak", 0), "ram"
    # the first (RAM) wins a tie: that is the request users know
    return max(choices, key=lambda c: c[1] / c[0])


# ---------------------------------------------------------------------------
# the persisted count
# ---------------------------------------------------------------------------


def _read_counts(path: Path) -> tuple[str, int] | None:
    """Return (incarnation, reported) from a count file, or None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log.warning("cannot read the OOM count file %s (%s); kills of this job may be "
                     "reported again", path, exc)
        return None
    fields = dict(part.split(b"=", 1) for part in data.split()[1:] if b"=" in part)
    if not data.startswith(_STATE_MAGIC + b" ") or not fields.get(b"reported", b"").isdigit():
        _log.warning("the OOM count file %s is not geco's (%r); kills of this job may be "
                     "reported again", path, data[:80])
        return None
    return fields.get(b"incarnation", b"").decode("ascii", "replace"), int(fields[b"reported"])


def remove_counts(state_dir: Path, key: JobKey) -> None:
    """Remove the job's OOM count file (at job end); a missing file is fine.

    Raises
    ------
    GecoError
        when it exists and cannot be removed.
    """
    atomicfile.remove(jobfiles.oom_count(state_dir, key), "OOM count file")


@functools.cache
def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "unknown"


# ---------------------------------------------------------------------------
# the watch
# ---------------------------------------------------------------------------


class OomWatch(FdOwner):
    """Watch one job cgroup for OOM kills (see the module docstring).

    Parameters
    ----------
    backend: the node's cgroup backend (v1 or v2).
    key: the job's ``<job>.<task>``.
    state_dir: where ``oom/<job>.<task>`` keeps the count already reported.
    kmsg: the shared kernel log, or None to name no victims.
    node: this host's name in reports (default: the short host name).

    Raises
    ------
    CgroupError
        when the job has no memory cgroup, the kernel cannot notify (no
        ``cgroup.event_control``, inotify refused), or it keeps no ``oom_kill``
        counter (v1 before Linux 4.13).
    """

    def __init__(self, backend: Backend, key: JobKey, *, state_dir: Path,
                 kmsg: KernelLog | None = None, node: str | None = None) -> None:
        self.key = check_key(key)
        self.backend = backend
        self.version = backend.version
        self.node = node or short_hostname()
        self.directory = backend.paths(key)["memory"]
        cgroup_paths = backend.cgroup_paths(key)
        self.cgroup_path = cgroup_paths.get("memory", cgroup_paths.get("", ""))
        self._kmsg = kmsg
        self._counts_file = jobfiles.oom_count(state_dir, key)
        self._counter_file = self.directory / (
            "memory.oom_control" if self.version == 1 else "memory.events")
        self.gone = False
        self._incarnation = self._current_incarnation()
        if self._incarnation is None:
            raise CgroupError(f"job {key} has no memory cgroup", key=key, path=self.directory)
        count = self._read_counter()
        if count is None:
            raise CgroupError(
                f"{self._counter_file.name} of job {key} has no oom_kill counter (cgroup v1 "
                f"has it from Linux 4.13 on), so OOM kills cannot be counted",
                key=key, path=self._counter_file)
        saved = _read_counts(self._counts_file)
        # a count file of another cgroup of this name (before a reboot, a
        # re-queued job) or one above the kernel's counter says nothing here
        self.reported = saved[1] if saved and saved[0] == self._incarnation \
            and saved[1] <= count else 0
        self._limits = self._try_limits()
        self._fd = self._open_notifier()

    def __repr__(self) -> str:
        return f"OomWatch({self.key!r}, v{self.version}, reported={self.reported})"

    def _current_incarnation(self) -> str | None:
        try:
            ino = os.stat(self.directory).st_ino
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CgroupError.from_oserror("cannot stat the job's memory cgroup", exc,
                                           key=self.key, path=self.directory) from exc
        return f"{_boot_id()}/{ino}"

    def _open_notifier(self) -> int:
        if self.version == 2:
            try:
                return open_inotify(self._counter_file)
            except OSError as exc:
                raise CgroupError.from_oserror(
                    f"cannot watch {self._counter_file.name} of job {self.key}", exc,
                    key=self.key, path=self._counter_file) from exc
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        control = self.directory / "cgroup.event_control"
        try:
            ofd = os.open(self._counter_file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                cfd = os.open(control, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(cfd, f"{efd} {ofd}".encode("ascii"))
                finally:
                    os.close(cfd)
            finally:
                # the kernel only needs the file to find the event type; the
                # registration lives on with the eventfd
                os.close(ofd)
        except OSError as exc:
            os.close(efd)
            raise CgroupError.from_oserror(
                f"cannot register for OOM notifications of job {self.key} in {control.name}",
                exc, key=self.key, path=control) from exc
        return efd

    def on_readable(self) -> list[OomEvent]:
        """Drain the notification and return the kills not reported before (usually one).

        An empty list on cgroup v1 may mean the kill is not counted yet (the
        eventfd fires first): call :meth:`check` again shortly. :attr:`gone`
        turns True when the cgroup was removed.

        Raises
        ------
        CgroupError
            when the counter cannot be read for another reason than removal.
        """
        try:
            if self.version == 1:
                os.eventfd_read(self._fd)
            else:
                while os.read(self._fd, 4096):
                    pass
        except BlockingIOError:
            pass  # nothing pending: a spurious wake-up, or drained by an earlier call
        return self.check()

    def check(self) -> list[OomEvent]:
        """Read the kernel's counter; return one event per kill not reported yet, oldest first.

        The new count is saved (atomically) before the events are returned:
        a restarted gecod never reports a kill twice. (A crash in the moment
        between this return and the journal record would lose that report;
        repeating reports after every restart would be the worse failure.)

        Raises
        ------
        CgroupError
            when the counter cannot be read for another reason than removal.
        """
        if self.gone:
            return []
        if self._current_incarnation() != self._incarnation:
            self.gone = True  # removed, maybe re-created for another run of the job
            return []
        count = self._read_counter()
        if count is None:
            self.gone = True
            return []
        new = count - self.reported
        if new <= 0:
            return []
        records = self._kmsg.claim(self.cgroup_path, new) if self._kmsg else []
        limit, peak, kind = self._figures()
        events = []
        # lines found belong to the latest kills: older ones may predate the kernel log reader
        unnamed = new - len(records)
        for i in range(new):
            event = OomEvent(key=self.key, node=self.node, limit=limit, peak=peak,
                             kill_count=self.reported + i + 1, limit_kind=kind)
            if i >= unnamed:
                record = records[i - unnamed]
                scope = "job" if record.oom_memcg is not None and \
                    _is_under(record.oom_memcg, self.cgroup_path) else "node"
                event = replace(event, pid=record.pid, command=record.command, scope=scope)
            events.append(event)
        self.reported = count
        self._save()
        return events

    def _read_counter(self) -> int | None:
        """The kernel's ``oom_kill``, or None when the cgroup is gone (v1/v2 alike)."""
        try:
            data = self._counter_file.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # removed while open
                return None
            raise CgroupError.from_oserror(f"cannot read {self._counter_file.name}", exc,
                                           key=self.key, path=self._counter_file) from exc
        return parse_keyed(data).get("oom_kill")

    def _try_limits(self) -> Limits | None:
        try:
            return self.backend.read_limits(self.key)
        except CgroupError:
            return None

    def _figures(self) -> tuple[int, int, str]:
        limits = self._try_limits() or self._limits or Limits()
        self._limits = limits
        try:
            usage = self.backend.usage(self.key)
        except CgroupError as exc:
            _log.debug("no memory figures for job %s: %s", self.key, exc)
            usage = {}
        return _memory_figures(limits, usage, self.version)

    def _save(self) -> None:
        data = b"%s incarnation=%s reported=%d\n" % (
            _STATE_MAGIC, (self._incarnation or "").encode("ascii"), self.reported)
        try:
            atomicfile.write_atomic(self._counts_file, data, mode=0o644, make_dir=True,
                                   what="OOM count file")
        except GecoError as exc:
            # the count in memory still prevents repeats while this gecod runs
            _log.error("job %s: %s; a gecod restart may report its OOM kills again",
                       self.key, exc)

    def forget(self) -> None:
        """Remove the persisted count (the job is over); errors are logged, not raised."""
        try:
            self._counts_file.unlink(missing_ok=True)
        except OSError as exc:
            _log.warning("cannot remove the OOM count file %s: %s", self._counts_file, exc)

