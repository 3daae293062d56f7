"""Name the victims of OOM kills from the kernel log (``/dev/kmsg``).

Who was killed comes from the
``oom-kill:...,oom_memcg=<cg>,task_memcg=<cg>,task=<comm>,pid=<pid>,uid=<uid>``
line (Linux >= 4.19), matched to the job by its cgroup path. The kernel
rate-limits that line (10 per 5 s); a kill whose line is missing is reported
as "a process", never dropped.

:class:`KernelLog` belongs to the runloop's thread. Reading ``/dev/kmsg``
needs CAP_SYSLOG when ``kernel.dmesg_restrict=1``, and no systemd
``PrivateDevices=``/``ProtectKernelLogs=``; without it reports name no process.
"""

from __future__ import annotations

import collections
import os
import re
from dataclasses import dataclass
from pathlib import Path

from geco import log
from geco.errors import GecoError
from geco.oom.fdowner import FdOwner

__all__ = ["KMSG", "KernelLog", "KillRecord", "parse_oom_kill"]

_log = log.get("oom.kmsg")

KMSG = Path("/dev/kmsg")
# Kill lines kept for watches that have not asked for them yet (other jobs'
# kills, kills of cgroups nobody watches); the oldest go first.
_KEEP_RECORDS = 256


# ---------------------------------------------------------------------------
# parsing the kill line (bytes in, values out)
# ---------------------------------------------------------------------------


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


class KernelLog(FdOwner):
    """``/dev/kmsg``, opened once, read from its end on, kill lines kept until a watch claims them.

    Each ``read(2)`` of ``/dev/kmsg`` returns one record; the reader's position
    is its own, so opening it does not disturb ``dmesg`` or journald. The fd is
    pollable: it turns readable when the kernel logs anything, and
    :class:`geco.oom.OomMonitor` uses that to re-check the watches when a kill
    was logged (the ``Killed process`` line comes after the kill was counted).

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



def _seq_of(header: bytes) -> int:
    parts = header.split(b",")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
