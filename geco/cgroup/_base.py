"""What both cgroup backends share: the limits record, the key rule and the interface.

Nothing here knows a cgroup version. The backends (``_v1.py``, ``_v2.py``)
say which directories a job has and which files hold its limits; the
:class:`Backend` base class lists, empties, kills and removes them the same
way for both. File access lives in ``_fs.py``.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from geco import log
from geco._tuple import NamedTuple
from geco.cgroup._counters import Counter, keyed, read_once, whole
from geco.cgroup._fs import (
    cgroup_error,
    poll_until,
    proc_cgroups,
    read_pids,
    remove_tree,
    signal_pid,
    walk_dirs,
)
from geco.errors import CgroupError, JobKeyError
from geco.jobkey import JobKey

__all__ = ["Backend", "Limits", "check_key", "check_name", "is_under", "warn_once"]

_log = log.get("cgroup._base")
_KILL_FREEZE_TIMEOUT = 5.0

# The kernel's list syntax for cpuset.cpus / cpuset.mems: "0-3,8,10-11".
_LIST_RE = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
# kill() repeats its sweep while new pids keep appearing (a forking job); a
# SIGKILLed process cannot fork again, so this bound is never reached in practice.
_KILL_ROUNDS = 100
# identity()'s cache of job -> first cgroup dir: forgotten whole when this full (a node's
# running jobs with room: ended ones pile up in it, and gecod must not grow with them)
_FIRST_DIRS_KEPT = 256

_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: object) -> None:
    """Log a warning about a node-wide condition once per process (not once per job)."""
    if key not in _warned:
        _warned.add(key)
        _log.warning(msg, *args)


def check_key(key: str) -> JobKey:
    """Return ``key`` as a :class:`~geco.jobkey.JobKey` when it names a job cgroup, else raise.

    Every backend method checks its key again, whoever made it: nothing like
    ``..``, ``/`` or a newline ever reaches a path.

    Raises
    ------
    CgroupError
        when the key is anything else (``"../x"``, ``"1/2"``, ``"."``, ``""``).
    """
    try:
        return JobKey.parse(key)
    except JobKeyError as exc:
        raise CgroupError(str(exc)) from None


def check_name(name: str) -> str:
    """Return ``name`` when it can be the GECO parent's directory name, else raise.

    Raises
    ------
    CgroupError
        when the name is empty, ``.``/``..``, or holds ``/`` or a NUL byte.
    """
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise CgroupError(f"the cgroup name must be one directory name (not '.', '..', "
                          f"no '/'), got {name!r}")
    return name


class _LimitValues(NamedTuple):
    """Limits' fields (a NamedTuple cannot check them: Limits does, in __new__)."""

    cpus: str = ""
    mems: str = ""
    memory: int = 0
    memory_swap: int = 0
    pids: int = 0


class Limits(_LimitValues):
    """What the kernel enforces for one job on this node. ``0``/``""`` always mean "no limit".

    Attributes
    ----------
    cpus:
        Kernel list syntax (``"0-1,4"``); ``""`` = all of the GECO parent's cpus.
    mems:
        NUMA nodes in the same syntax; ``""`` = all of the parent's.
    memory:
        RAM limit in bytes (v1 ``memory.limit_in_bytes``, v2 ``memory.max``).
    memory_swap:
        RAM+swap limit in bytes (v1 ``memory.memsw.limit_in_bytes``; v2 expresses
        it as ``memory.max`` plus ``memory.swap.max`` = ``memory_swap - ram``).
    pids:
        Maximum number of tasks (threads count), ``pids.max``.

    Raises
    ------
    CgroupError
        when a list is not in the kernel's syntax or a number is negative.
    """

    __slots__ = ()

    def __new__(cls, cpus: str = "", mems: str = "", memory: int = 0, memory_swap: int = 0,
                pids: int = 0) -> Limits:
        for name, value in (("cpus", cpus), ("mems", mems)):
            if not isinstance(value, str) or (value and _LIST_RE.fullmatch(value) is None):
                raise CgroupError(f"Limits.{name} must be a kernel list such as 0-3,8 "
                                  f"or empty, got {value!r}")
        for name, number in (("memory", memory), ("memory_swap", memory_swap), ("pids", pids)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise CgroupError(f"Limits.{name} must be a whole number >= 0 "
                                  f"(0 = no limit), got {number!r}")
        return super().__new__(cls, cpus, mems, memory, memory_swap, pids)

    def journal_fields(self) -> dict[str, object]:
        """The limits as every journal record that carries them says them."""
        return {"CPUS": self.cpus, "MEMS": self.mems, "MEMORY_LIMIT": self.memory,
                "MEMSW_LIMIT": self.memory_swap, "PIDS_LIMIT": self.pids}

    def as_json(self) -> dict[str, object]:
        """The limits in every JSON document that carries them (a slave host's READY
        reply, its master's ``NODE_LIMITS``): the field names, bytes and counts as numbers;
        :meth:`from_json` reads them back."""
        return dict(self._asdict())

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Limits:
        """The limits :meth:`as_json` wrote (a field it lacks: no limit; others ignored).

        Raises
        ------
        CgroupError
            naming the field whose value is of the wrong kind.
        """
        return cls(**{name: doc[name] for name in cls._fields if name in doc})

    def environment(self, ncpus: int, node: str) -> dict[str, str]:
        """What a process of the job is told about them: the ``GECO_*`` variables (the
        starter's job environment, an adopted ssh session's), ``ncpus`` as it sees them."""
        return {"GECO_CPUS": self.cpus, "GECO_NCPUS": str(ncpus), "GECO_MEMS": self.mems,
                "GECO_MEMORY_LIMIT": str(self.memory), "GECO_VMEM_LIMIT": str(self.memory_swap),
                "GECO_NODE": node}

    @property
    def ram(self) -> int:
        """The RAM limit the kernel gets: the smaller of ``memory`` and ``memory_swap``.

        RAM can never exceed RAM+swap, and cgroup v1 refuses a RAM limit above
        the memsw limit, so a RAM+swap-only request also caps RAM (0 = none).
        """
        given = [v for v in (self.memory, self.memory_swap) if v > 0]
        return min(given) if given else 0


def pids_counters(d: Path) -> list[Counter]:
    """The task figures of one pids cgroup directory (same files on v1 and v2), only those
    this kernel provides: ``pids_current``, ``pids_peak`` (newer kernels) and
    ``pids_max_events`` (forks refused at ``pids.max``, from ``pids.events``)."""
    out = [whole(d / file, name) for name, file in (("pids_current", "pids.current"),
                                                   ("pids_peak", "pids.peak"))
           if (d / file).exists()]
    if (d / "pids.events").exists():
        out.append(keyed(d / "pids.events", {"pids_max_events": "max"}))
    return out


def is_under(cgpath: str, parent: str) -> bool:
    """True when cgroup path ``cgpath`` is ``parent`` or inside it."""
    return cgpath == parent or cgpath.startswith(parent.rstrip("/") + "/")


class Backend(ABC):
    """One cgroup hierarchy layout (v1 or v2) and the GECO parent inside it.

    Job cgroups live in a parent directory named after the configuration's
    cgroup name (``GECO``); a job's key is ``"<job>.<task>"``. Every method
    raises :class:`~geco.errors.CgroupError` (errno and path in its fields,
    the ``OSError`` chained) and never a bare ``OSError``.
    """

    version: int

    def __init__(self, name: str, proc: Path) -> None:
        self.name = check_name(name)
        self.proc = proc
        self._first_dirs: dict[JobKey, str] = {}  # identity()'s: the job's first cgroup dir

    # -- layout (per version) -------------------------------------------------

    @property
    @abstractmethod
    def controllers(self) -> tuple[str, ...]:
        """The controllers geco manages in this layout (``cpuset``, ``memory``, ...)."""

    @abstractmethod
    def parent_paths(self) -> dict[str, Path]:
        """Return controller -> GECO parent directory."""

    @abstractmethod
    def paths(self, key: JobKey) -> dict[str, Path]:
        """Return controller -> the job's directory (for messages and tests).

        Raises
        ------
        CgroupError
            when the key is not ``<job>.<task>``.
        """

    def last_changed(self, key: JobKey) -> float | None:
        """When the job's cgroups were made (epoch seconds; None when they are gone).

        The newest mtime of the job's cgroup dirs: cgroupfs sets a directory's mtime
        when it is made, and again when a cgroup below it comes or goes (and may
        reset it when the kernel re-reads an evicted inode): at worst a cgroup looks
        younger than it is, and is judged later.
        """
        newest: float | None = None
        for path in self.paths(key).values():
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
        return newest

    @abstractmethod
    def cgroup_paths(self, key: JobKey) -> dict[str, str]:
        """Return the job's paths as ``/proc/<pid>/cgroup`` shows them.

        Keyed like :func:`proc_cgroups`: by v1 controller, or ``""`` for cgroup2.
        """

    @abstractmethod
    def ensure_root(self) -> None:
        """Create the GECO parent(s) and make the controllers usable below them.

        Raises
        ------
        CgroupError
            when the parent cannot be created or set up.
        """

    @abstractmethod
    def available_cpus(self) -> str:
        """Return the GECO parent's cpus, in kernel list syntax: what geco may hand out.

        Raises
        ------
        CgroupError
            when the parent does not exist (``ensure_root`` not run) or cannot be read.
        """

    @abstractmethod
    def available_mems(self) -> str:
        """Return the GECO parent's NUMA nodes, in kernel list syntax.

        Raises
        ------
        CgroupError
            when the parent does not exist or cannot be read.
        """

    @abstractmethod
    def set_parent_memory(self, limit: int) -> None:
        """Cap the RAM of all jobs together at ``limit`` bytes (the GECO parent's limit),
        leaving the rest of the node's memory to its own daemons.

        Raises
        ------
        CgroupError
            when the parent does not exist or the kernel refuses the limit (the jobs
            already use more than that and it could not reclaim enough).
        """

    @abstractmethod
    def create(self, key: JobKey, limits: Limits) -> None:
        """Create the job's cgroups with ``limits``, ready for its first process.

        Idempotent: an existing cgroup is kept and only the files whose value
        differs are written, so a repeat (prolog after gecod, a retried hook)
        is harmless and a half-made cgroup from a crash is completed. When the
        kernel refuses a limit, directories this call created are removed
        again, so a failed create leaves nothing behind.

        Raises
        ------
        CgroupError
            when the key is bad or the kernel refuses a directory or a limit.
        """

    @abstractmethod
    def deny_devices(self, key: JobKey,
                     devices: Sequence[tuple[str, int, int | None]]) -> None:
        """Keep the job from opening (and making) ``devices``: ``(type, major, minor)``,
        type ``c`` or ``b``, minor None for every minor of the major; every other device
        stays as the parent allows it. Call it between :meth:`create` and the first
        :meth:`add_pid`. Nothing to deny: no-op.

        Raises
        ------
        CgroupError
            when this node cannot deny devices (no v1 devices controller, no v2 device
            programs) or the kernel refuses: a job must not start with GPUs it was not
            granted.
        """

    @abstractmethod
    def read_limits(self, key: JobKey) -> Limits:
        """Return the limits the kernel has for the job (for ``geco status`` and restarts).

        Raises
        ------
        CgroupError
            when the job's cgroup does not exist or cannot be read.
        """

    @abstractmethod
    def add_pid(self, key: JobKey, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the job's cgroup in every controller.

        Raises
        ------
        CgroupError
            when the process is gone (says so), or the kernel refuses the move.
        """

    @abstractmethod
    def move_targets(self, key: JobKey) -> tuple[str, ...]:
        """The ``cgroup.procs`` files :meth:`add_pid` writes, in its order (gecod's C lane
        moves a job's later tasks with them)."""

    @abstractmethod
    def move_to_cgroups_of(self, pid: int, other_pid: int) -> None:
        """Put process ``pid`` into the cgroups ``other_pid`` is in, in every managed controller.

        The epilog uses it to step itself (and the shepherd) back out to
        sge_execd's cgroups before it kills and removes the job's.

        Raises
        ------
        CgroupError
            when either process is gone or the kernel refuses the move.
        """

    def freeze(self, key: JobKey, timeout: float = 10.0) -> None:
        """Stop every process of the job and wait until the kernel reports it frozen.

        Raises
        ------
        CgroupError
            when there is no freezer, or the job is not frozen within ``timeout`` s.
        """
        self._set_frozen(key, True, timeout)

    def thaw(self, key: JobKey, timeout: float = 10.0) -> None:
        """Let the job's processes run again and wait until the kernel reports it thawed
        (raises as :meth:`freeze` does)."""
        self._set_frozen(key, False, timeout)

    @abstractmethod
    def _set_frozen(self, key: JobKey, frozen: bool, timeout: float) -> None:
        """Set the job's freezer and wait until the kernel reports the state (CgroupError
        when there is no freezer, or the state is not reached within ``timeout`` s)."""

    @abstractmethod
    def kill(self, key: JobKey) -> int:
        """SIGKILL every process of the job, sub-cgroups included; return how many were signalled.

        Does not wait: follow with :meth:`wait_empty`. A missing cgroup is 0.

        Raises
        ------
        CgroupError
            when the calling process is itself in the job (it must step out
            with :meth:`move_to_cgroups_of` first), or the cgroup cannot be
            read or written.
        """

    def usage(self, key: JobKey) -> dict[str, int]:
        """Return the job's resource accounting: only the figures this kernel provides.

        Keys (bytes or counts): ``memory_peak``, ``memory_current``,
        ``memory_max_events`` (times usage hit the limit: v1 memory.failcnt
        plus memory.memsw.failcnt, v2 memory.events ``max``), ``oom_kill``;
        v1 adds ``memsw_peak`` (RAM+swap), v2 adds ``swap_peak`` and
        ``swap_current`` (swap alone). CPU time in microseconds, when the
        kernel accounts it per cgroup: ``cpu_user_usec`` and ``cpu_system_usec``
        (v1 from the cpuacct hierarchy, v2 from ``cpu.stat``). Tasks, when the pids
        controller is there (see :func:`pids_counters`): ``pids_current``, ``pids_peak``,
        ``pids_max_events`` (forks refused at the job's task limit). v2, where the kernel
        has them: ``memory_pressure_usec`` (PSI ``some total``), ``io_read_bytes`` and
        ``io_write_bytes`` (``io.stat``, every device). The counters
        cover every process that ever ran in the job, also those that exited,
        and the job's sub-cgroups.

        Raises
        ------
        CgroupError
            when the job's memory cgroup does not exist or cannot be read.
        """
        return read_once(self.usage_counters(key))

    @abstractmethod
    def usage_counters(self, key: JobKey) -> list[Counter]:
        """The files :meth:`usage` reads (those this kernel has), to read them once or to
        hold them open (:class:`geco.cgroup._counters.Held`).

        Raises
        ------
        CgroupError
            when the job's memory cgroup does not exist.
        """

    # -- shared behaviour -----------------------------------------------------

    def _dirs(self, key: JobKey) -> list[Path]:
        """The job's distinct directories (co-mounted controllers share one)."""
        return list(dict.fromkeys(self.paths(key).values()))

    def exists(self, key: JobKey) -> bool:
        """True when any part of the job's cgroup exists (something to use or clean up).

        Raises
        ------
        CgroupError
            when the key is bad.
        """
        return any(d.is_dir() for d in self._dirs(check_key(key)))

    def identity(self, key: JobKey) -> int | None:
        """The inode number of the job's first cgroup directory; None when it is missing.

        Cgroups made again under the same key get another number, so a caller that
        remembers what it read from a job's cgroups (gecod: their limits) knows by
        one stat whether that still holds.
        """
        first = self._first_dirs.get(key)
        if first is None:  # gecod asks per request: the path is worked out once per job
            if len(self._first_dirs) >= _FIRST_DIRS_KEPT:
                self._first_dirs.clear()
            first = self._first_dirs[key] = str(self._dirs(check_key(key))[0])
        try:
            return os.stat(first).st_ino
        except FileNotFoundError:
            return None

    def job_keys(self) -> list[JobKey]:
        """Return the keys of the job cgroups that exist now (in any controller), sorted."""
        names: set[str] = set()  # a job is in every hierarchy: its name is parsed once
        for parent in dict.fromkeys(self.parent_paths().values()):
            try:
                with os.scandir(parent) as entries:
                    names.update(e.name for e in entries if e.is_dir(follow_symlinks=False))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise cgroup_error("cannot list the job cgroups", exc, path=parent) from exc
        found = []
        for name in names:
            with contextlib.suppress(JobKeyError):  # not a job's: the holder, a sub-cgroup
                found.append(JobKey.parse(name))
        return sorted(found, key=JobKey.order)

    def pids(self, key: JobKey) -> list[int]:
        """Return the pids in the job's cgroup (and any sub-cgroup), in every controller.

        Raises
        ------
        CgroupError
            when the key is bad or a ``cgroup.procs`` cannot be read.
        """
        found: set[int] = set()
        for top in self._dirs(check_key(key)):
            for sub in walk_dirs(top):
                found.update(read_pids(sub))
        return sorted(found)

    def contains(self, key: JobKey, pid: int) -> bool:
        """True when ``pid`` is in the job's cgroup (or below it) in every managed controller.

        Read from ``/proc/<pid>/cgroup``: the kernel's word, not geco's memory.
        A process that is gone is not contained.

        Raises
        ------
        CgroupError
            when the key is bad or ``/proc/<pid>/cgroup`` cannot be read.
        """
        inside = self._inside(key, pid)
        return inside is not None and None not in inside

    def relative_cgroup(self, key: JobKey, pid: int) -> str | None:
        """Return where in the job ``pid`` is: its cgroup relative to the job's own.

        ``""`` is the job's own cgroup, ``"stuck"`` or ``"a/b"`` a sub-cgroup
        made inside it (by an admin tool, systemd-run, or the job). A process
        may sit in different sub-cgroups of different v1 controllers; the
        deepest one is named (a nested freezer cgroup is what explains a
        process that does not die). None when the process is gone or in no
        cgroup of the job.

        Raises
        ------
        CgroupError
            when the key is bad or ``/proc/<pid>/cgroup`` cannot be read.
        """
        found = [rel for rel in self._inside(key, pid) or () if rel is not None]
        if not found:
            return None
        deepest = max(found, key=lambda rel: 0 if rel == "." else rel.count("/") + 1)
        return "" if deepest == "." else deepest

    def _inside(self, key: JobKey, pid: int) -> list[str | None] | None:
        """Per managed controller, ``pid``'s cgroup relative to the job's (``"."``: the
        job's own), None where it is outside the job; None when the process is gone."""
        want = self.cgroup_paths(check_key(key))
        have = proc_cgroups(self.proc, pid)
        if have is None:
            return None
        return [posixpath.relpath(have[k], path) if k in have and is_under(have[k], path)
                else None for k, path in want.items()]

    def _is_member(self, key: JobKey, pid: int) -> bool:
        """True when ``pid`` is in the job's cgroup in at least one managed controller."""
        return self._member_test(key)(pid)

    def _member_test(self, key: JobKey) -> Callable[[int], bool]:
        """Return ``_is_member`` for one job with its cgroup paths worked out once (the
        kill sweep asks for every pid of the job)."""
        want = tuple(self.cgroup_paths(key).items())

        def is_member(pid: int) -> bool:
            have = proc_cgroups(self.proc, pid)
            return have is not None and any(k in have and is_under(have[k], path)
                                            for k, path in want)
        return is_member

    def _refuse_own_job(self, key: JobKey) -> None:
        """Raise when the calling process is itself in the job: kill() would kill the caller."""
        if self._is_member(key, os.getpid()):
            raise CgroupError(f"refusing to kill job {key} from inside its cgroup: move this "
                              f"process out first (move_to_cgroups_of)", key=key,
                              pid=os.getpid())

    def kill_except(self, key: JobKey, spare: Callable[[int], bool]) -> int:
        """SIGKILL every process of the job but those ``spare(pid)`` keeps; return how many.

        For ending a job while Grid Engine's ``sge_shepherd`` (which lives in the job's
        cgroups) survives to report the job's end and run its epilog. The job is frozen
        meanwhile when the kernel can, so nothing forks past the sweep.
        """
        check_key(key)
        if not self.exists(key):
            return 0
        self._refuse_own_job(key)
        return self._kill_frozen(key, self._freezable(key), spare)

    def _freezable(self, key: JobKey) -> bool:
        """True when the job's cgroup can be frozen (v1 freezer / v2 cgroup.freeze)."""
        raise NotImplementedError

    def _kill_frozen(self, key: JobKey, freezable: bool,
                     spare: Callable[[int], bool] | None = None) -> int:
        """Freeze (best effort), SIGKILL every member, thaw; return how many were signalled.

        A forking job cannot outrun the sweep while frozen; a process stuck in the
        kernel may keep the cgroup freezing, so the freeze waits only briefly and a
        failed freeze still lets the SIGKILLs go out.
        """
        if freezable:
            try:
                self.freeze(key, _KILL_FREEZE_TIMEOUT)
            except CgroupError as exc:
                _log.warning("killing job %s without a complete freeze: %s", key, exc)
        try:
            count = self._sigkill_all(key, spare)
        finally:
            if freezable:
                self._thaw_killed(key)
        _log.debug("sent SIGKILL to %d processes of job %s", count, key)
        return count

    def _thaw_killed(self, key: JobKey) -> None:
        """Thaw a job just SIGKILLed. Its members die at once, and whoever ends the job (its
        epilog, gecod on its shepherd's exit) may remove its cgroups before the state is read
        back: a freezer cgroup gone is thawed (one with a member cannot be removed)."""
        try:
            self.thaw(key)
        except CgroupError:
            if self._freezable(key):
                raise

    def _sigkill_all(self, key: JobKey, spare: Callable[[int], bool] | None = None) -> int:
        """SIGKILL every member (but the spared) until a sweep finds no new pid; return how
        many were signalled."""
        seen: set[int] = set()
        signalled = 0
        is_member = self._member_test(key)
        for _ in range(_KILL_ROUNDS):
            new = [p for p in self.pids(key) if p not in seen]
            if not new:
                break
            for pid in new:
                seen.add(pid)
                if spare is not None and spare(pid):
                    continue
                if signal_pid(pid, signal.SIGKILL, is_member):
                    signalled += 1
        return signalled

    def wait_empty(self, key: JobKey, timeout: float, *, kill_late: bool = False) -> bool:
        """Wait until no process is left in the job's cgroup and its sub-cgroups; True if it
        emptied in time.

        ``kill_late``: SIGKILL whatever is in the job at each look (after :meth:`kill`): a
        process moved in after the kill's sweep (an ssh session adopted just then, a task
        started) would otherwise keep the job alive past ``timeout`` and be reported stuck.
        A process that is dying already takes the signal again, harmlessly.

        Raises
        ------
        CgroupError
            when the key is bad or the cgroup cannot be read.
        """
        check_key(key)

        def empty() -> bool:
            if not self.pids(key):
                return True
            if kill_late:
                self._sigkill_all(key)
            return False

        return poll_until(empty, timeout)

    def destroy(self, key: JobKey) -> None:
        """Remove the job's cgroup and its sub-cgroups (deepest first) in every controller.

        A cgroup that is already gone is fine.

        Raises
        ------
        CgroupError
            naming the pids left when the cgroup is not empty (nothing is
            killed here: call :meth:`kill` and :meth:`wait_empty` first), or
            when the kernel refuses for another reason.
        """
        busy: list[Path] = []
        for top in self._dirs(check_key(key)):
            busy.extend(remove_tree(top))
        if busy:
            left = self.pids(key)
            what = (f"processes {' '.join(map(str, left))} are still in it" if left
                    else "the kernel says it is busy although it lists no process")
            raise CgroupError(f"cannot remove the cgroup of job {key}: {what}",
                              key=key, pids=",".join(map(str, left)) or None, path=busy[0])
        _log.debug("removed the cgroups of job %s", key)

    def _require_dirs(self, key: JobKey) -> None:
        """Raise a clear error when the job has no cgroup at all."""
        if not self.exists(key):
            raise CgroupError(f"job {key} has no cgroup", key=key,
                              path=next(iter(self.paths(key).values())))

