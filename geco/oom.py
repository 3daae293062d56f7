"""OOM kills in job cgroups: detect each one, count it once, tell the owner and the journal.

The kernel's OOM killer stays in charge; geco only watches. Per job cgroup an
:class:`OomWatch` holds one file descriptor the runloop polls:

* cgroup v1: an eventfd registered through ``cgroup.event_control`` for the
  job's ``memory.oom_control``. The kernel signals it when the cgroup *enters*
  OOM -- before the victim is chosen and before ``oom_kill`` (Linux >= 4.13)
  in ``memory.oom_control`` counts the kill -- and once more when the cgroup
  is removed. A wake-up that finds the counter unchanged is therefore checked
  again shortly after (:class:`OomMonitor` does that).
* cgroup v2: an inotify watch on ``memory.events``, which the kernel marks
  modified *after* it counted ``oom_kill`` (hierarchically: kills in a job's
  sub-cgroups count too).

Counting is the kernel's: the ``oom_kill`` counter compared with the number
already reported, which is kept in ``<state_dir>/oom/<job>.<task>`` together
with the boot id and the cgroup's inode, so a restarted gecod neither repeats
nor misses a kill, and a re-created cgroup of the same name (a re-queued job)
starts from zero. A watch reports the kills that happened while nobody
watched at its first :meth:`OomWatch.check`.

Who was killed comes from the kernel log (``/dev/kmsg``, :class:`KernelLog`):
the ``oom-kill:...,oom_memcg=<cg>,task_memcg=<cg>,task=<comm>,pid=<pid>,uid=<uid>``
line (Linux >= 4.19), matched to the job by its cgroup path. The kernel
rate-limits that line (10 per 5 s); a kill whose line is missing is reported
as "a process", never dropped.

What the owner reads (:func:`owner_message`, HTCondor's style: limit, peak,
remedy) is appended to the job's stderr file as the owner
(:func:`append_to_owner_file`); the journal gets the same text with
``GECO_EVENT=oom`` (:func:`handle`). A kill while the job was well below its
limit (< 90 %), or one the kernel log puts outside the job's cgroup, is a
node-wide shortage and says so instead of blaming the job.

Policy (``[gecod] oom``): ``kernel`` reports only; ``kill-job`` also ends the
whole job at its first kill, as Slurm's ``OOMKillStep`` does.

Threads: :class:`OomWatch`, :class:`KernelLog` and :class:`OomMonitor` belong
to the runloop's thread; :func:`handle` blocks (a fork per owner message, the
cgroup kill) and runs in a worker.

What gecod needs for all of it (each part degrades on its own, logged): read
access to ``/dev/kmsg`` (CAP_SYSLOG when ``kernel.dmesg_restrict=1``; no
systemd ``PrivateDevices=``/``ProtectKernelLogs=``), CAP_SETUID and CAP_SETGID
to write as the owner, the owners' output files writable in its mount
namespace (no ``ProtectHome=``/``ProtectSystem=strict`` over them), and
CAP_KILL for ``kill-job``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import os
import pwd
import re
import select
import selectors
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any, Protocol

from geco import log, sgejob, statefile
from geco.cgroup import Backend, Limits, check_key
from geco.errors import CgroupError, GecoError
from geco.resource import ResourceSet, short_hostname
from geco.units import format_memory, parse_memory

__all__ = [
    "KMSG",
    "POLICIES",
    "KernelLog",
    "KillRecord",
    "Loop",
    "OomEvent",
    "OomMonitor",
    "OomWatch",
    "RequestHint",
    "StderrTarget",
    "append_to_owner_file",
    "check_policy",
    "handle",
    "open_inotify",
    "owner_message",
    "parse_keyed",
    "parse_oom_kill",
    "remove_state",
    "request_hint",
    "stderr_target",
    "suggest_request",
]

_log = log.get("oom")

KMSG = Path("/dev/kmsg")
POLICIES = ("kernel", "kill-job")
# A kill while the job used less than this share of its limit was not the
# job's doing: the node as a whole ran short (HTCondor's rule, starter.rst).
_NODE_WIDE_BELOW = 0.9
# Suggested request = this x the peak per slot, rounded up to a friendly value.
_HEADROOM = Decimal("1.5")
# Kill lines kept for watches that have not asked for them yet (other jobs'
# kills, kills of cgroups nobody watches); the oldest go first.
_KEEP_RECORDS = 256
# A v1 wake-up comes before the kill is counted; look again after these delays.
_RECHECK_AFTER = (0.01, 0.1, 1.0)
_STATE_MAGIC = b"geco-oom-v1"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_PAGE = os.sysconf("SC_PAGE_SIZE")

# inotify(7)
_IN_MODIFY = 0x00000002


# ---------------------------------------------------------------------------
# parsing kernel text (bytes in, values out)
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


@dataclass(frozen=True, slots=True)
class KillRecord:
    """One ``oom-kill:`` line of the kernel log.

    Attributes
    ----------
    seq: the record's sequence number in the kernel log.
    constraint: ``CONSTRAINT_MEMCG`` (a cgroup's limit), ``CONSTRAINT_NONE``
        (the whole node), ``CONSTRAINT_CPUSET`` or ``CONSTRAINT_MEMORY_POLICY``.
    oom_memcg: the cgroup whose limit was hit, or None for a node-wide OOM
        (``global_oom``).
    task_memcg: the victim's memory cgroup ("" when the kernel printed none).
    command: the victim's name (``comm``, at most 15 bytes; the kernel log
        escapes unprintable bytes as ``\\xNN``).
    pid, uid: the victim's.
    """

    seq: int
    constraint: str
    oom_memcg: str | None
    task_memcg: str
    command: str
    pid: int
    uid: int

    def belongs_to(self, cgroup_path: str) -> bool:
        """True when the victim was in ``cgroup_path`` (or below it)."""
        where = self.task_memcg or self.oom_memcg
        return where is not None and _is_under(where, cgroup_path)


_OOM_TAIL_RE = re.compile(rb",task=(?P<comm>.*),pid=(?P<pid>[0-9]+),uid=(?P<uid>[0-9]+)\s*\Z")
_CONSTRAINT_RE = re.compile(rb"oom-kill:constraint=(?P<c>[A-Z_]+)")


def parse_oom_kill(message: bytes, seq: int = 0) -> KillRecord | None:
    """Parse the text of an ``oom-kill:`` kernel log line (``mm/oom_kill.c``, ``dump_oom_victim``).

    The line is ``oom-kill:constraint=..,nodemask=..,cpuset=..,mems_allowed=..``
    then ``,oom_memcg=<path>`` or ``,global_oom``, then ``,task_memcg=<path>``
    and ``,task=<comm>,pid=<pid>,uid=<uid>``. It is taken apart from the end:
    ``mems_allowed`` may hold commas (``0,2``) and the command name is the
    user's choice (it may hold ``,pid=``), but the pid and uid are digits.

    Parameters
    ----------
    message: the line without the ``/dev/kmsg`` header (``prio,seq,usec,flags;``).
    seq: its sequence number.

    Returns
    -------
    The record, or None when the text is not such a line.
    """
    if not message.startswith(b"oom-kill:"):
        return None
    tail = _OOM_TAIL_RE.search(message)
    constraint = _CONSTRAINT_RE.match(message)
    if tail is None or constraint is None:
        return None
    head = message[:tail.start()]
    task_memcg = b""
    before, sep, after = head.rpartition(b",task_memcg=")
    if sep:
        head, task_memcg = before, after
    oom_memcg: bytes | None = None
    if not head.endswith(b",global_oom"):
        before, sep, after = head.rpartition(b",oom_memcg=")
        oom_memcg = after if sep else None
    return KillRecord(seq=seq, constraint=constraint["c"].decode("ascii"),
                      oom_memcg=None if oom_memcg is None else os.fsdecode(oom_memcg),
                      task_memcg=os.fsdecode(task_memcg),
                      command=tail["comm"].decode("utf-8", "backslashreplace"),
                      pid=int(tail["pid"]), uid=int(tail["uid"]))


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# ---------------------------------------------------------------------------
# the kernel log
# ---------------------------------------------------------------------------


class KernelLog:
    """``/dev/kmsg``, opened once, read from its end on, kill lines kept until a watch claims them.

    Each ``read(2)`` of ``/dev/kmsg`` returns one record; the reader's position
    is its own, so opening it does not disturb ``dmesg`` or journald. The fd is
    pollable: it turns readable when the kernel logs anything, and
    :class:`OomMonitor` uses that to re-check the watches when a kill was logged
    (the ``Killed process`` line comes after the kill was counted).

    Use :meth:`open`; :meth:`fileno` is for the runloop.
    """

    # Every record fits (the kernel's limit is ~8 KiB with its dictionary);
    # a smaller buffer would make read(2) fail with EINVAL.
    _BUFFER = 16384

    def __init__(self, fd: int, path: Path = KMSG) -> None:
        self._fd = fd
        self.path = path
        self._records: collections.deque[KillRecord] = collections.deque(maxlen=_KEEP_RECORDS)
        self.lost = 0  # times the kernel overwrote records before they were read
        # kill lines read so far (oom-kill: and Killed process): a change means
        # some counter moved, whoever's read consumed the line
        self.kills_seen = 0

    @classmethod
    def open(cls, path: Path = KMSG) -> KernelLog:
        """Open the kernel log without blocking and skip what is already in it.

        Raises
        ------
        GecoError
            when it cannot be opened (no such device in a container, no
            CAP_SYSLOG with ``kernel.dmesg_restrict=1``).
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise GecoError.from_oserror(f"cannot open the kernel log {path}", exc,
                                         path=path) from exc
        try:
            # older records are other incarnations' business; seeking needs no data
            os.lseek(fd, 0, os.SEEK_END)
        except OSError as exc:
            os.close(fd)
            raise GecoError.from_oserror(f"cannot seek to the end of {path}", exc,
                                         path=path) from exc
        return cls(fd, path)

    def fileno(self) -> int:
        """The fd, for the runloop."""
        return self._fd

    def drain(self) -> int:
        """Read every record logged since the last call; keep the ``oom-kill:`` lines.

        Returns
        -------
        How many of the new records report an OOM kill (``oom-kill:`` or
        ``Killed process`` lines; :attr:`kills_seen` adds them all up).
        """
        seen = 0
        while self._fd >= 0:
            try:
                record = os.read(self._fd, self._BUFFER)
            except BlockingIOError:
                break
            except BrokenPipeError:
                # EPIPE: records we had not read yet were overwritten; reading goes on after them
                self.lost += 1
                continue
            except OSError as exc:
                _log.warning("cannot read the kernel log %s (%s); OOM reports will name no "
                             "process until gecod restarts", self.path, exc)
                self.close()
                break
            if not record:
                break
            header, _, rest = record.partition(b";")
            message = rest.split(b"\n", 1)[0]
            if message.startswith(b"oom-kill:"):
                seen += 1
                parsed = parse_oom_kill(message, _seq_of(header))
                if parsed is not None:
                    self._records.append(parsed)
            elif b"Killed process" in message:
                seen += 1
        self.kills_seen += seen
        return seen

    def claim(self, cgroup_path: str, count: int) -> list[KillRecord]:
        """Take up to ``count`` kill lines of ``cgroup_path`` (oldest first) out of the buffer."""
        self.drain()
        mine = [r for r in self._records if r.belongs_to(cgroup_path)][:count]
        for record in mine:
            self._records.remove(record)
        return mine

    def close(self) -> None:
        """Close the fd (remove it from the runloop first); closing twice is harmless."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> KernelLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seq_of(header: bytes) -> int:
    parts = header.split(b",")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


# ---------------------------------------------------------------------------
# inotify (cgroup v2)
# ---------------------------------------------------------------------------


@functools.cache
def _libc() -> ctypes.CDLL:
    # ctypes, not cffi: two libc calls with int and char* arguments, and the
    # module stays standard-library only like geco.cgroup, so it also runs in
    # the minimal cgroup v2 test machine; cffi would need a cdef at run time
    # (ABI mode) or a compiled extension for the same two calls.
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
    """One OOM kill in a job's cgroup.

    Attributes
    ----------
    key: ``<job>.<task>``.
    node: this host's short name.
    limit: the limit that applied in bytes (the one the job was closest to),
        0 = the job had none.
    peak: the job's peak use of that kind in bytes (v1 ``max_usage_in_bytes``
        (page cache included), v2 ``memory.peak``; 0 when the kernel has none).
    pid, command: the victim, from the kernel log; ``0`` and ``""`` when its
        line could not be found.
    kill_count: the kernel's ``oom_kill`` counter for the job at this kill
        (1 for the first one).
    limit_kind: ``"ram"`` or ``"ram+swap"`` (v1 memsw / v2 memory + swap).
    scope: ``"job"`` when the kernel log says the job's own limit was hit,
        ``"node"`` when it says the node (or a parent cgroup) ran out, ``""``
        when there was no line to tell.
    """

    key: str
    node: str
    limit: int
    peak: int
    pid: int = 0
    command: str = ""
    kill_count: int = 1
    limit_kind: str = "ram"
    scope: str = ""

    @property
    def job_id(self) -> int:
        """The Grid Engine job number."""
        return int(self.key.partition(".")[0])

    @property
    def task_id(self) -> int:
        """The array task (1 for a non-array job)."""
        return int(self.key.partition(".")[2])

    @property
    def node_wide(self) -> bool:
        """True when the node ran out of memory, not the job out of its request.

        The kernel log says so (a node-wide or parent cgroup OOM), or the job
        had no limit, or its peak stayed below 90 % of its limit.
        """
        if self.scope == "node" or self.limit <= 0:
            return True
        return self.peak < self.limit * _NODE_WIDE_BELOW


@dataclass(frozen=True, slots=True)
class RequestHint:
    """What the job asked Grid Engine for on this node: the requests a remedy names.

    Attributes
    ----------
    slots: slots on this node.
    m_mem_free: per-slot ``-l m_mem_free`` in bytes (0 = not requested).
    h_vmem: per-slot ``-l h_vmem`` in bytes (0 = not requested).
    is_array: an array job is named ``42.1``, another job just ``42``.
    """

    slots: int = 1
    m_mem_free: int = 0
    h_vmem: int = 0
    is_array: bool = True


def request_hint(rs: ResourceSet | None, host: str | None = None) -> RequestHint | None:
    """Return the requests of ``rs`` on ``host`` (default this host), or None when unknown."""
    if rs is None:
        return None
    node = rs.node(host)
    if node is None:
        return None
    slots = max(node.slots, 1)
    return RequestHint(slots=slots, m_mem_free=-(-node.memory_limit // slots),
                       h_vmem=-(-node.vmem_limit // slots), is_array=rs.is_array)


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


def _state_path(state_dir: Path, key: str) -> Path:
    return state_dir / "oom" / check_key(key)


def _read_state(path: Path) -> tuple[str, int] | None:
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


def remove_state(state_dir: Path, key: str) -> None:
    """Remove the job's OOM count file (at job end); a missing file is fine.

    Raises
    ------
    GecoError
        when it exists and cannot be removed.
    """
    path = _state_path(state_dir, key)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise GecoError.from_oserror("cannot remove the OOM count file", exc, path=path) from exc


@functools.cache
def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "unknown"


# ---------------------------------------------------------------------------
# the watch
# ---------------------------------------------------------------------------


class OomWatch:
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

    def __init__(self, backend: Backend, key: str, *, state_dir: Path,
                 kmsg: KernelLog | None = None, node: str | None = None) -> None:
        self.key = check_key(key)
        self.backend = backend
        self.version = backend.version
        self.node = node or short_hostname()
        self.directory = backend.paths(key)["memory"]
        cgroup_paths = backend.cgroup_paths(key)
        self.cgroup_path = cgroup_paths.get("memory", cgroup_paths.get("", ""))
        self._kmsg = kmsg
        self._state = _state_path(state_dir, key)
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
        saved = _read_state(self._state)
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

    def fileno(self) -> int:
        """The fd the runloop polls for reading."""
        return self._fd

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
            statefile.write_atomic(self._state, data, mode=0o644, make_dir=True,
                                   what="OOM count file")
        except GecoError as exc:
            # the count in memory still prevents repeats while this gecod runs
            _log.error("job %s: %s; a gecod restart may report its OOM kills again",
                       self.key, exc)

    def forget(self) -> None:
        """Remove the persisted count (the job is over); errors are logged, not raised."""
        try:
            self._state.unlink(missing_ok=True)
        except OSError as exc:
            _log.warning("cannot remove the OOM count file %s: %s", self._state, exc)

    def close(self) -> None:
        """Close the fd (remove it from the runloop first); closing twice is harmless."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OomWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# what the owner reads
# ---------------------------------------------------------------------------


def _ceil_2_digits(value: Decimal, smallest: Decimal) -> Decimal:
    """``value`` rounded up to two significant digits, in steps of at least ``smallest``."""
    if value <= 0:
        return smallest
    step = max(Decimal(1).scaleb(value.adjusted() - 1), smallest)
    return (value / step).to_integral_value(rounding=ROUND_CEILING) * step


def suggest_request(peak: int, current: int = 0) -> str:
    """Return a friendly per-slot request for a job that peaked at ``peak`` bytes per slot.

    About 1.5 x the peak, and always above ``current`` (the request that was
    too small), rounded *up* to two significant digits in M, G or T
    (powers of 1024, as Grid Engine reads them): ``300M``, ``1.4G``, ``12G``.

    Parameters
    ----------
    peak: peak use per slot in bytes.
    current: the per-slot request in force, bytes (0 = none).

    Returns
    -------
    A memory value Grid Engine accepts after ``-l m_mem_free=``/``h_vmem=``.
    """
    want = max(Decimal(peak) * _HEADROOM, Decimal(current + 1), Decimal(1 << 20))
    for unit, size, smallest in (("M", 1 << 20, Decimal(1)), ("G", 1 << 30, Decimal("0.1")),
                                 ("T", 1 << 40, Decimal("0.1"))):
        rounded = _ceil_2_digits(want / size, smallest)
        if rounded < 1000 or unit == "T":
            return f"{format(rounded.normalize(), 'f')}{unit}"
    raise AssertionError("unreachable: T takes any size")


def _job_label(event: OomEvent, hint: RequestHint | None) -> str:
    if hint is not None and not hint.is_array:
        return str(event.job_id)
    return event.key


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _binding_requests(event: OomEvent, hint: RequestHint) -> list[tuple[str, int]]:
    """The requests (name, per-slot bytes) that set ``event.limit``, m_mem_free first."""
    # h_vmem caps RAM+swap and, in geco, RAM too; m_mem_free caps RAM only
    names = ("h_vmem",) if event.limit_kind == "ram+swap" else ("m_mem_free", "h_vmem")
    per_slot = {"m_mem_free": hint.m_mem_free, "h_vmem": hint.h_vmem}
    # the kernel keeps limits in whole pages; per-slot values were rounded up
    slack = _PAGE + hint.slots
    return [(n, per_slot[n]) for n in names
            if per_slot[n] and abs(per_slot[n] * hint.slots - event.limit) < slack]


def owner_message(event: OomEvent, request_hint: RequestHint | None) -> str:
    """Return the paragraph the job's owner reads about ``event`` (one line, starts "geco:").

    Parameters
    ----------
    event: the kill.
    request_hint: the job's requests on this node; None when unknown (the
        remedy then names no ``-l`` option).

    Returns
    -------
    For a job over its limit: what happened, the limit and the request that
    set it, the peak, and a larger request to resubmit with (about 1.5 x the
    peak per slot). For a node-wide shortage (:attr:`OomEvent.node_wide`): that
    the job was not at fault and a larger request would not help.
    """
    job = _job_label(event, request_hint)
    victim = f"process {event.pid}" if event.pid else "a process"
    if event.pid and event.command:
        victim += f" ({event.command})"
    limit, peak = format_memory(event.limit), format_memory(event.peak)
    if event.node_wide:
        detail = f"peak use {peak} of {limit}" if event.limit > 0 else "it has none on this node"
        return (f"geco: job {job} on node {event.node} lost {victim} to the kernel's "
                f"out-of-memory killer, but the job was not over its memory limit ({detail}): "
                f"the node as a whole ran out of memory. This is not the job's fault and a "
                f"larger request would not help; if the job failed, resubmit it unchanged.")
    label = "Memory+swap limit" if event.limit_kind == "ram+swap" else "Memory limit"
    binding = _binding_requests(event, request_hint) if request_hint is not None else []
    head = (f"geco: job {job} on node {event.node} used more memory than it requested and "
            f"the kernel stopped {victim}.")
    if not binding or request_hint is None:
        return (f"{head} {label}: {limit}; peak use: {peak}. Resubmit with a larger memory "
                f"request (about {suggest_request(event.peak, event.limit)} for this node "
                f"in total).")
    slots = request_hint.slots
    name, per_slot = binding[0]
    suggestion = suggest_request(-(-event.peak // slots), per_slot)
    raise_names = [n for n, _ in binding]
    # h_vmem also caps RAM: below the new value it would become the limit
    if event.limit_kind == "ram" and "h_vmem" not in raise_names \
            and 0 < request_hint.h_vmem < (parse_memory(suggestion) or 0):
        raise_names.append("h_vmem")
    remedy = ",".join(f"{n}={suggestion}" for n in raise_names)
    return (f"{head} {label}: {limit} (-l {name}={format_memory(per_slot)} per slot x "
            f"{_plural(slots, 'slot')}); peak use: {peak}. Resubmit with a larger request, "
            f"for example -l {remedy}.")


# ---------------------------------------------------------------------------
# the job's stderr file, written as its owner
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StderrTarget:
    """Where the job's stderr goes, and whose it is.

    Attributes
    ----------
    path: the file; or, when it came from ``-e <dir>`` (the default: the
        working directory), the directory the file is in.
    name_in_dir: the file's name when ``path`` is a directory
        (``<job_name>.e<job_id>[.<task>]``, as sge_shepherd names it); ""
        when ``path`` is known to be the file.
    owner: the job owner's user name (``job_owner`` in the spooled config).
    """

    path: Path
    name_in_dir: str
    owner: str


def _read_env(path: Path) -> dict[bytes, bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the job's spooled environment", exc,
                                     path=path) from exc
    return sgejob.parse_key_values(data)


def stderr_target(spool_dir: Path) -> StderrTarget | None:
    """Return where the job's stderr goes, from its execd spool dir (``active_jobs/<job>.<task>``).

    ``SGE_STDERR_PATH`` (``SGE_STDOUT_PATH`` when ``merge_stderr`` is 1, i.e.
    ``-j y``) from the spooled ``environment`` when it is there. Son of Grid
    Engine 8.1.9 does not spool those (sge_shepherd sets them for the job
    only), so then ``stderr_path``/``stdout_path`` from the spooled
    ``config``: a file, or a directory in which sge_shepherd names the file
    ``<job_name>.e<job_id>`` (``.<task>`` for array tasks). Whether it is a
    directory is decided when writing, as the owner: root may not even see
    into an NFS home (root_squash).

    Returns
    -------
    The target, or None when the job's stderr goes to ``/dev/null`` or nowhere.

    Raises
    ------
    GecoError
        when the spool's ``config`` cannot be read or names no ``job_owner``.
    """
    config = sgejob.read_config(spool_dir)
    owner = config.get("job_owner", "")
    if not owner:
        raise GecoError("the job's spooled config names no job_owner",
                        path=spool_dir / "config")
    merged = config.get("merge_stderr", "0").strip().lower() in ("1", "true", "yes", "y")
    env = _read_env(spool_dir / "environment")
    from_env = env.get(b"SGE_STDOUT_PATH" if merged else b"SGE_STDERR_PATH", b"")
    if from_env:
        path = Path(os.fsdecode(from_env))
        return None if path == Path("/dev/null") else StderrTarget(path, "", owner)
    raw = config.get("stdout_path" if merged else "stderr_path", "")
    if not raw or Path(raw) == Path("/dev/null"):
        return None
    path = Path(raw)
    if not path.is_absolute():
        path = Path(config.get("cwd", "/")) / path
    task = config.get("ja_task_id", "0")
    name = f"{config.get('job_name', '')}.{'o' if merged else 'e'}{config.get('job_id', '')}"
    if task not in ("", "0"):
        name += f".{task}"
    return StderrTarget(path, name, owner)


_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_WHY = {errno.ENOENT: "the file is gone, and geco never creates one",
        errno.ELOOP: "it is a symbolic link, which geco does not follow",
        errno.EACCES: "the job owner may not write it",
        errno.EPERM: "the job owner may not write it",
        errno.EISDIR: "it is a directory",
        errno.ENOTDIR: "a part of the path is not a directory"}


def _append_child(result: int, path: bytes, alternative: bytes, data: bytes, uid: int,
                  gid: int) -> None:
    """The forked child: become the owner, append; report ``ok <n>`` or ``<errno> <step> <n>``.

    ``<n>`` says which path it was at: 0 = ``path``, 1 = ``alternative``.
    """
    step, which = "setgroups", 0
    # gecod's signal wake-up fd is inherited: a signal sent to this child (it
    # runs as the user, who may signal it) must not look like one to gecod
    signal.pthread_sigmask(signal.SIG_SETMASK, signal.valid_signals())
    try:
        os.setgroups([])
        step = "setgid"
        os.setgid(gid)
        step = "setuid"
        os.setuid(uid)
        step = "open"
        try:
            fd = os.open(path, _APPEND_FLAGS)
        except IsADirectoryError:
            if not alternative:
                raise
            which = 1
            fd = os.open(alternative, _APPEND_FLAGS)
        step = "write"
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
        os.write(result, f"ok {which}".encode("ascii"))
    except OSError as exc:
        os.write(result, f"{exc.errno or 0} {step} {which}".encode("ascii"))


def append_to_owner_file(path: Path, text: str, uid: int, gid: int, *, name_in_dir: str = "",
                         timeout: float = 10.0) -> Path:
    """Append ``text`` to the owner's file ``path``, with the owner's rights only.

    A child process drops to the owner (no supplementary groups, ``gid``,
    ``uid``) before it opens the file with ``O_APPEND|O_NOFOLLOW`` and without
    ``O_CREAT``: geco never creates a file, never follows a symbolic link the
    user put in the file's place, and cannot write anything the owner could
    not -- a path the user chose cannot make root write elsewhere. A hung file
    system (NFS) costs at most ``timeout``.

    Parameters
    ----------
    path: the file, or a directory when ``name_in_dir`` is given.
    text: appended as UTF-8, as it is (add the newline yourself).
    uid, gid: the owner's ids.
    name_in_dir: when ``path`` turns out to be a directory, append to
        ``path/name_in_dir`` instead.
    timeout: seconds to wait for the child; it is then killed.

    Returns
    -------
    The file written to.

    Raises
    ------
    GecoError
        naming the path and the reason (gone, a symbolic link, not writable
        by the owner, a directory, timed out); never an ``OSError``.
    """
    alternative = path / name_in_dir if name_in_dir else None
    data = text.encode("utf-8", "surrogateescape")
    # everything the child needs is prepared here: it only makes system calls
    raw_path = os.fsencode(path)
    raw_alternative = os.fsencode(alternative) if alternative is not None else b""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        raise GecoError.from_oserror(f"cannot fork to append to {path}", exc,
                                     path=path) from exc
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            _append_child(write_end, raw_path, raw_alternative, data, uid, gid)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout)
        answer = os.read(read_end, 64) if ready else None
    finally:
        os.close(read_end)
    if answer is None:
        _kill_and_reap(pid)
        raise GecoError(f"cannot append to {path} as uid {uid}: no answer within "
                        f"{timeout:g} s (a hung file system?); the writer was killed",
                        path=path, uid=uid)
    _reap(pid)
    fields = answer.decode("ascii", "replace").split()
    if not fields:
        raise GecoError(f"cannot append to {path} as uid {uid}: the writer exited without "
                        f"an answer", path=path, uid=uid)
    if len(fields) == 2 and fields[0] == "ok":
        return alternative if fields[1] == "1" and alternative is not None else path
    code = int(fields[0]) if fields[0].isdigit() else 0
    step = fields[1] if len(fields) > 1 else "start"
    where = alternative if fields[2:] == ["1"] and alternative is not None else path
    cause = OSError(code, os.strerror(code) if code else "the writer died")
    err = GecoError.from_oserror(f"cannot append to {where} as uid {uid} ({step})", cause,
                                 path=where, uid=uid)
    why = _WHY.get(code, "") if step in ("open", "write") else ""
    if why:
        err = GecoError(f"{err.msg}; {why}", **err.fields)
    raise err from cause


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _kill_and_reap(pid: int) -> None:
    """SIGKILL the writer; reap it now, or in a thread when it is stuck in the kernel (NFS)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)
    threading.Thread(target=_reap, args=(pid,), name=f"geco-oom-reap-{pid}",
                     daemon=True).start()


def _owner_ids(user: str) -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise GecoError(f"the job owner {user!r} is not a known user on this node",
                        user=user) from None
    return pw.pw_uid, pw.pw_gid


# ---------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------


def check_policy(policy: str) -> str:
    """Return ``policy`` when it is ``kernel`` or ``kill-job``, else raise.

    Raises
    ------
    GecoError
        naming the value and the choices.
    """
    if policy not in POLICIES:
        raise GecoError(f"the OOM policy ([gecod] oom) must be kernel or kill-job, "
                        f"got {policy!r}")
    return policy


def handle(events: Sequence[OomEvent], policy: str, backend: Backend, *,
           target: StderrTarget | None = None, hint: RequestHint | None = None,
           write_timeout: float = 10.0) -> int | None:
    """Report the kills of one job and apply the policy. Blocks: run it in a worker.

    Steps, in order:

    1. one journal record per kill, at warning (``PRIORITY=4``), with
       ``GECO_EVENT=oom``, ``JOB_ID``, ``SGE_TASK_ID``, ``LIMIT``, ``PEAK``,
       ``PID``, ``COMMAND``, ``OOM_KILLS`` (the message is the owner's text
       without "geco: ");
    2. ``kill-job``: end the whole job once (``backend.kill``), journaled as
       ``GECO_EVENT=oom-job-ended``;
    3. the owner's text, one paragraph per kill, appended to the job's stderr
       file as the owner (step 2 first: a hung file must not delay the kill).

    A failure in step 2 or 3 is logged (``oom-job-end-failed``,
    ``oom-report-failed``) and never raised: the other steps still happen.

    Parameters
    ----------
    events: kills of one job, oldest first (what one :meth:`OomWatch.check` returned).
    policy: ``kernel`` or ``kill-job``.
    backend: the cgroup backend (for ``kill-job``).
    target: the job's stderr file (:func:`stderr_target`); None = journal only.
    hint: the job's requests, for the remedy (:func:`request_hint`).
    write_timeout: seconds the owner's file may take.

    Returns
    -------
    How many processes ``kill-job`` signalled, or None when it did not act.

    Raises
    ------
    GecoError
        when the policy is not one of :data:`POLICIES`.
    """
    check_policy(policy)
    if not events:
        return None
    texts = []
    for event in events:
        text = owner_message(event, hint)
        texts.append(text)
        _log.warning("%s", text.removeprefix("geco: "), extra=log.job_fields(
            event.job_id, event.task_id, "oom", LIMIT=event.limit, PEAK=event.peak,
            PID=event.pid or None, COMMAND=event.command or None,
            OOM_KILLS=event.kill_count, LIMIT_KIND=event.limit_kind,
            OOM_SCOPE="node" if event.node_wide else "job", NODE=event.node))
    last = events[-1]
    killed: int | None = None
    if policy == "kill-job":
        try:
            # not the shepherd: it must live to report the job's end and run the epilog
            killed = backend.kill_except(last.key, spare=sgejob.is_job_shepherd)
        except CgroupError as exc:
            _log.error("job %s: cannot end the job after its out-of-memory kill: %s",
                       last.key, exc, extra=log.job_fields(
                           last.job_id, last.task_id, "oom-job-end-failed", OOM_POLICY=policy))
        else:
            _log.warning("job %s: ended the whole job after an out-of-memory kill (oom = "
                         "kill-job); %d processes signalled", last.key, killed,
                         extra=log.job_fields(last.job_id, last.task_id, "oom-job-ended",
                                              OOM_POLICY=policy, PROCESSES=killed))
            texts[-1] += (" geco then ended the rest of the job, as this node is set up to "
                          "do after an out-of-memory kill.")
    if target is not None:
        try:
            uid, gid = _owner_ids(target.owner)
            append_to_owner_file(target.path, "".join(t + "\n" for t in texts), uid, gid,
                                 name_in_dir=target.name_in_dir, timeout=write_timeout)
        except GecoError as exc:
            _log.warning("job %s: the out-of-memory report did not reach the owner's file: %s",
                         last.key, exc, extra=log.job_fields(
                             last.job_id, last.task_id, "oom-report-failed",
                             PATH=target.path, OWNER=target.owner))
    return killed


# ---------------------------------------------------------------------------
# the runloop side
# ---------------------------------------------------------------------------


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """What :class:`OomMonitor` needs of gecod's runloop (:class:`geco.daemon.runloop.RunLoop`)."""

    def add_source(self, fileobj: Any, events: int,
                   callback: Callable[[Any, int], None]) -> None: ...

    def remove_source(self, fileobj: Any) -> bool: ...

    def add_timer(self, delay: float, callback: Callable[[], None],
                  repeat: float | None = None) -> Any: ...


@dataclass(slots=True)
class _Job:
    watch: OomWatch
    spool_dir: Path | None
    target: StderrTarget | None = None
    hint: RequestHint | None = None
    ended: bool = False
    rechecks: tuple[_Cancellable, ...] = ()


class OomMonitor:
    """Every job cgroup of the node under an :class:`OomWatch`, driven by gecod's runloop.

    Parameters
    ----------
    loop: the runloop (sources and timers).
    backend: the node's cgroup backend.
    state_dir: the configured ``[paths] state_dir`` (counts go to ``oom/``).
    policy: ``[gecod] oom``: ``kernel`` or ``kill-job``.
    execd_spool_dir: ``[paths] execd_spool_dir``, to find each job's stderr file;
        None = report to the journal only.
    resources_dir: the resource files (``cfg.resources_dir``), for the
        requests a remedy names; None = name none.
    executor: where :func:`handle` runs (gecod's worker pool); None = in the
        loop (tests, the bench).
    node: this host's name in reports.
    kmsg: the kernel log to name victims from; None = do not read it.
    sweep_interval: seconds between sweeps that pick up job cgroups made
        without gecod (the prolog), drop removed ones, and re-read every
        counter (v1 signals no eventfd for a node-wide OOM's kill).
    on_events: called in the loop with each batch (before :func:`handle`);
        for tests and the bench.

    Raises
    ------
    GecoError
        when the policy is not one of :data:`POLICIES`.
    """

    def __init__(self, loop: Loop, backend: Backend, *, state_dir: Path, policy: str = "kernel",
                 execd_spool_dir: Path | None = None, resources_dir: Path | None = None,
                 executor: Executor | None = None, node: str | None = None,
                 kmsg: Path | None = KMSG, sweep_interval: float = 60.0,
                 on_events: Callable[[list[OomEvent]], None] | None = None) -> None:
        self.loop = loop
        self.backend = backend
        self.state_dir = state_dir
        self.policy = check_policy(policy)
        self.execd_spool_dir = execd_spool_dir
        self.resources_dir = resources_dir
        self.executor = executor
        self.node = node or short_hostname()
        self.kmsg_path = kmsg
        self.sweep_interval = sweep_interval
        self.on_events = on_events
        self.kmsg: KernelLog | None = None
        self._jobs: dict[str, _Job] = {}
        self._sweep: _Cancellable | None = None
        self._refused: set[str] = set()
        self._kills_acked = 0

    # -- life cycle -------------------------------------------------------------

    def start(self) -> None:
        """Open the kernel log, watch every job cgroup there is, start the sweep timer."""
        if self.kmsg_path is not None:
            try:
                self.kmsg = KernelLog.open(self.kmsg_path)
            except GecoError as exc:
                _log.warning("%s: OOM reports will say 'a process' instead of naming it", exc)
            else:
                self.loop.add_source(self.kmsg, selectors.EVENT_READ, self._on_kmsg)
        self.sync()
        self._sweep = self.loop.add_timer(self.sweep_interval, self.sync,
                                          repeat=self.sweep_interval)

    def close(self) -> None:
        """Stop watching (counts stay on disk for the next gecod); closing twice is harmless."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for key in list(self._jobs):
            self.unwatch(key, forget=False)
        if self.kmsg is not None:
            self.loop.remove_source(self.kmsg)
            self.kmsg.close()
            self.kmsg = None

    @property
    def keys(self) -> list[str]:
        """The jobs being watched."""
        return list(self._jobs)

    # -- jobs ---------------------------------------------------------------------

    def watch(self, key: str, spool_dir: Path | None = None) -> bool:
        """Watch job ``key`` (its cgroup must exist); report kills it had already at once.

        Call it when gecod has made the job's cgroup (JOB_STARTED), with the
        job's spool dir when known; the sweep finds the others. Watching a
        watched job again is a no-op, unless its cgroup was re-created. Reads
        the job's spool ``config``/``environment`` and its resource file
        (small local files) to know the stderr file and the requests later,
        when the spool may already be gone.

        Returns
        -------
        True when the job is watched; False when it cannot be (logged once per job).
        """
        job = self._jobs.get(key)
        if job is not None:
            if spool_dir is not None and job.spool_dir is None:
                job.spool_dir = spool_dir
                self._resolve(key, job)
            self._check(key)  # notices a cgroup re-created under the same name
            if key in self._jobs:
                return True
        try:
            watch = OomWatch(self.backend, key, state_dir=self.state_dir, kmsg=self.kmsg,
                             node=self.node)
        except GecoError as exc:
            if key not in self._refused:
                self._refused.add(key)
                _log.warning("job %s: OOM kills will not be reported: %s", key, exc)
            return False
        self._refused.discard(key)
        job = _Job(watch, spool_dir)
        self._resolve(key, job)
        self._jobs[key] = job
        self.loop.add_source(watch, selectors.EVENT_READ, self._on_ready)
        self._deliver(job, watch.check())
        return True

    def unwatch(self, key: str, *, forget: bool = True) -> None:
        """Stop watching job ``key``; ``forget`` also removes its persisted count (job over)."""
        job = self._jobs.pop(key, None)
        if job is None:
            if forget:
                with contextlib.suppress(GecoError):
                    remove_state(self.state_dir, key)
            return
        for timer in job.rechecks:
            timer.cancel()
        self.loop.remove_source(job.watch)
        job.watch.close()
        if forget:
            job.watch.forget()

    def sync(self) -> None:
        """Watch every job cgroup there is, drop the ones that are gone, re-read every counter."""
        try:
            keys = self.backend.job_keys()
        except GecoError as exc:
            _log.error("cannot list the job cgroups for OOM watching: %s", exc)
            return
        for key in keys:
            if key not in self._jobs:
                self.watch(key)
        for key in [k for k in self._jobs if k not in keys]:
            self.unwatch(key)
        self._refused &= set(keys)
        self.check_all()
        self._prune_state(set(keys))

    def check_all(self) -> None:
        """Re-read every watched job's counter and report what is new."""
        for key in list(self._jobs):
            self._check(key)

    # -- callbacks ----------------------------------------------------------------

    def _on_ready(self, watch: OomWatch, events: int) -> None:
        job = self._jobs.get(watch.key)
        if job is None or job.watch is not watch:
            return
        try:
            found = watch.on_readable()
        except GecoError as exc:
            _log.error("job %s: cannot read its OOM counter: %s", watch.key, exc)
            return
        if watch.gone:
            self.unwatch(watch.key)
        elif found:
            self._deliver(job, found)
        elif self.backend.version == 1:
            # the v1 eventfd fires before the kill is counted (or for an OOM that
            # ended without one): look again shortly
            self._recheck_later(job)
        self._follow_kmsg()

    def _on_kmsg(self, kmsg: KernelLog, events: int) -> None:
        kmsg.drain()
        self._follow_kmsg()

    def _follow_kmsg(self) -> None:
        """Re-read every counter when the kernel logged a kill nobody has accounted for yet.

        Catches kills no notification announces (a node-wide OOM's victim in a
        v1 job) and v1 kills counted after their eventfd fired; a watch's
        :meth:`KernelLog.claim` may have read the line, so the total is compared.
        """
        if self.kmsg is None or self.kmsg.kills_seen == self._kills_acked:
            return
        self._kills_acked = self.kmsg.kills_seen
        self.check_all()

    def _recheck_later(self, job: _Job) -> None:
        for timer in job.rechecks:
            timer.cancel()
        key = job.watch.key
        job.rechecks = tuple(self.loop.add_timer(delay, functools.partial(self._check, key))
                             for delay in _RECHECK_AFTER)

    def _check(self, key: str) -> None:
        job = self._jobs.get(key)
        if job is None:
            return
        try:
            found = job.watch.check()
        except GecoError as exc:
            _log.error("job %s: cannot read its OOM counter: %s", key, exc)
            return
        if job.watch.gone:
            self.unwatch(key)
            return
        self._deliver(job, found)
        self._follow_kmsg()

    def _deliver(self, job: _Job, found: list[OomEvent]) -> None:
        if not found:
            return
        if self.on_events is not None:
            self.on_events(found)
        # the whole job is ended once; later kills (racing the kill) are only reported
        policy = "kernel" if job.ended else self.policy
        job.ended = job.ended or policy == "kill-job"
        if job.target is None:
            self._resolve(job.watch.key, job)
        work = functools.partial(handle, found, policy, self.backend, target=job.target,
                                 hint=job.hint)
        if self.executor is None:
            work()
        else:
            self.executor.submit(work)

    # -- helpers --------------------------------------------------------------------

    def _resolve(self, key: str, job: _Job) -> None:
        """Find the job's stderr file and requests (small local files, read once per job)."""
        if job.target is None and self.execd_spool_dir is not None:
            spool = job.spool_dir or sgejob.find_spool_dir(self.execd_spool_dir, key, self.node)
            if spool is not None:
                try:
                    job.target = stderr_target(spool)
                except GecoError as exc:
                    _log.debug("job %s: no stderr file for OOM reports: %s", key, exc)
        if job.hint is None and self.resources_dir is not None:
            job_id, _, task_id = key.partition(".")
            try:
                rs = statefile.read(self.resources_dir, int(job_id), int(task_id))
            except GecoError as exc:
                _log.debug("job %s: no resource file for OOM remedies: %s", key, exc)
            else:
                job.hint = request_hint(rs, self.node)

    def _prune_state(self, live: Iterable[str]) -> None:
        """Remove count files of jobs whose cgroup is gone (ended while gecod was down)."""
        live = set(live)
        try:
            names = os.listdir(self.state_dir / "oom")
        except FileNotFoundError:
            return
        except OSError as exc:
            _log.warning("cannot list %s: %s", self.state_dir / "oom", exc)
            return
        for name in names:
            if name.startswith(".") or name in live:
                continue
            with contextlib.suppress(GecoError):
                remove_state(self.state_dir, name)
