"""The end of a job on this node: kill what is left, account for it, escalate what will not die.

A job's end (:func:`geco.job.ending.end_job`: the epilog, gecod's shepherd watch, a
slave's release, and gecod's reaper for jobs nobody ended, again every round for a
job whose teardown got stuck) calls :func:`tear_down`, which does only what touches the
job's cgroups and processes (OAR's Leon: normal, then exterminate):

1. Read the job's counters (peak memory, CPU time, OOM kills) while its cgroups
   still exist: removing a cgroup removes its counters.
2. Freeze, SIGKILL every process (sub-cgroups included), thaw, wait up to
   ``cfg.kill_timeout`` seconds for the cgroups to empty, remove them deepest
   first (:func:`kill_and_remove`).
3. Clean: return the figures; the job's end journals them (``job-end``).
4. Held by FUSE: a process that outlived the kill waiting for a FUSE daemon's answer
   (a request the daemon has read is waited out through SIGKILL: fs/fuse/dev.c) is
   freed by aborting its owner's FUSE connections that have requests waiting, through
   fusectl (mounted on :data:`FUSECTL` when it is not), never root's or another user's
   (fusectl's files are the uid's that mounted it), at most
   :data:`FUSE_CONNECTIONS_MAX` looked at; each is journaled (``fuse-aborted``), then the
   cgroups are waited for again, ``kill_timeout`` more. Else a user's daemon that never
   answers (run outside the job, or stopped) would get the node's queue disabled at each
   end of their jobs.
5. Stuck: journal ``GECO_EVENT=cleanup-stuck`` (PRIORITY 3) with every process
   left, its state and the kernel function it sleeps in, and keep the cgroups
   for the reaper. When ``cfg.disable_queue_on_stuck``, disable the queue
   instance with ``qmod -d`` so that no new job lands on a node that cannot
   clean up after the last one (``queue-disabled``, or ``queue-disable-failed``
   with the reason).

A sub-cgroup the job's owner cannot make but root can (v1 ``freezer.state``
is root's) is never thawed here: a frozen one is somebody's deliberate act,
so its processes are reported as stuck (cgroup ``"stuck"``, state ``D``)
rather than overruled; once it is thawed, the reaper's next round finishes.

The queue is disabled once per stuck job: the marker ``<state_dir>/stuck/<key>``
remembers it until the job's cgroups are gone (the job's end forgets it, or the
machine reboots), so an
admin who looked and enabled the queue again is not overruled by the reaper's
next round. geco never enables a queue: whether the node is healthy again is
the admin's call (``qmod -e``).

Nothing here raises for a cgroup or qmod problem: it is journaled, and the
result says what happened.
"""

from __future__ import annotations

import errno
import itertools
import os
import pwd
import re
from pathlib import Path

from geco import jobfiles, log, procfs
from geco._tuple import NamedTuple
from geco.accounting import Accounting
from geco.cgroup import Backend, check_key
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet, short_hostname
from geco.sge import qmod as qmod_command
from geco.usage import samples

__all__ = ["Release", "StuckProcess", "Teardown", "found_stuck", "kill_and_remove", "read_usage",
           "release", "tear_down"]

_log = log.get("job.teardown")

# The kernel's list of FUSE connections (fusectl), one directory per connection.
FUSECTL = Path("/sys/fs/fuse/connections")
# The connections looked at per teardown: a user can make many (one per mount).
FUSE_CONNECTIONS_MAX = 1000
# Where /proc/<pid>/wchan or stack shows a task waiting for a FUSE daemon
_FUSE_WAIT = re.compile(rb"request_wait_answer|fuse_")

class StuckProcess(NamedTuple):
    """A process of the job still alive after SIGKILL and ``kill_timeout``.

    Attributes
    ----------
    pid: the process.
    state: its state letter and name from ``/proc/<pid>/status``, e.g.
        ``D (disk sleep)``; ``""`` when it was gone by the time it was read.
    command: its command name (``comm``).
    wchan: the kernel function it sleeps in (``nfs_wait_bit_killable``); ``""``
        when unknown.
    cgroup: where in the job it is: ``""`` the job's own cgroup, ``"stuck"`` a
        sub-cgroup of that name (see :meth:`~geco.cgroup.Backend.relative_cgroup`).
    frozen: that sub-cgroup is frozen (v1 ``freezer.state`` FROZEN): the SIGKILL
        waits until someone thaws it. The kernel shows such a task as ``D``, which an
        admin would otherwise read as waiting on I/O.
    """

    pid: int
    state: str
    command: str
    wchan: str
    cgroup: str
    frozen: bool = False

    @property
    def brief(self) -> str:
        """``pid:letter:wchan`` as the journal's ``STATES`` field lists it (``?`` = unknown)."""
        return f"{self.pid}:{self.state[:1] or '?'}:{self.wchan or '?'}"

    def describe(self) -> str:
        """One phrase for people: ``pid 123 (sleep) D (disk sleep) in do_wait, cgroup stuck``."""
        text = f"pid {self.pid} ({self.command or '?'}) {self.state or 'gone'}"
        if self.wchan:
            text += f" in {self.wchan}"
        if self.cgroup:
            text += f", cgroup {self.cgroup}"
        if self.frozen:
            text += " (frozen: the SIGKILL waits for a thaw)"
        return text


class Teardown(NamedTuple):
    """What :func:`tear_down` did for one job.

    Attributes
    ----------
    key: ``<job>.<task>``.
    killed: processes SIGKILLed.
    stuck: the processes still alive after ``kill_timeout`` (the cgroups are kept).
    accounting: the job's counters, read before the kill.
    queue_disabled: the queue instance ``qmod -d`` disabled in this call, if any.
    error: why the cgroups are kept although no process is listed (the kernel
        refused a read, a write or the removal); ``""`` otherwise.
    had_cgroups: False when the job had no cgroups on this node to tear down.
    """

    key: JobKey
    killed: int
    stuck: tuple[StuckProcess, ...]
    accounting: Accounting
    queue_disabled: str | None
    error: str = ""
    had_cgroups: bool = True

    @property
    def clean(self) -> bool:
        """True when the job's cgroups are gone."""
        return not self.stuck and not self.error


def tear_down(key: JobKey, backend: Backend, cfg: Config, *, queue_instance: str | None,
              cleaned_by: str, qmod: str | None = None,
              journal: log.JobFields | None = None,
              resources: ResourceSet | None = None, owner: str | None = None) -> Teardown:
    """Kill what is left of a job and remove its cgroups; journal and escalate what will not die.

    Parameters
    ----------
    key: ``<job>.<task>``.
    backend: this node's cgroup backend.
    cfg: ``kill_timeout``, ``disable_queue_on_stuck``, ``qstat`` and
        ``qstat_timeout`` (for qmod), ``state_dir`` (the queue marker).
    queue_instance: ``<queue>@<host>`` to disable when the job is stuck (the
        epilog reads it from the job's spooled ``config``); None disables
        every queue on this host, ``*@<short hostname>``.
    cleaned_by: who tears down, journaled as ``CLEANED_BY`` (``epilog``, ``reaper``).
    qmod: the qmod command; default: ``qmod`` next to ``cfg.qstat`` when that
        is a full path, else ``qmod`` from the fixed PATH qstat uses (:mod:`geco.sge.siteenv`).
        It is run argv-only (``qmod -d <instance>``), once, for at most
        ``cfg.qstat_timeout`` seconds.
    journal: the job's journal fields, found once by its end
        (:func:`geco.job.ending.end_job`); default: found here.
    resources: the job's resource set, read once by its end (the grant its last usage
        sample's file names, when that file is new); None: it has none.
    owner: the job owner's user name, whose FUSE connections may be aborted to free a
        process that waits on one (step 4); None (or root): none is.

    Returns
    -------
    What happened; ``clean`` when the cgroups are gone.

    Raises
    ------
    CgroupError
        only when ``key`` is not ``<job>.<task>`` (a caller's bug); cgroup and
        qmod problems are journaled and returned, never raised.
    """
    key = check_key(key)
    if not backend.exists(key):
        return Teardown(key, 0, (), Accounting(), None, had_cgroups=False)
    usage = read_usage(key, backend)
    accounting = Accounting.from_usage(usage)
    samples.keep_last(cfg, key, usage, resources)  # the counters go with the cgroups
    killed, error = 0, ""
    try:
        killed, left = kill_and_remove(key, backend, timeout=cfg.kill_timeout)
        if left and owner:
            if journal is None:
                journal = log.JobFields(key.job, key.task)
            if _abort_fuse(key, backend.proc, left, owner, journal, cleaned_by):
                if backend.wait_empty(key, cfg.kill_timeout, kill_late=True):
                    backend.destroy(key)
                    left = ()
                else:
                    left = tuple(backend.pids(key))
    except GecoError as exc:
        # removed meanwhile by someone else (an admin, a second teardown): nothing is stuck
        error = str(exc) if backend.exists(key) else ""
        left = _pids_left(key, backend) if error else ()
    if not left and not error:
        return Teardown(key, killed, (), accounting, None)
    stuck = tuple(_describe(key, backend, pid) for pid in left)
    if journal is None:
        journal = log.JobFields(key.job, key.task)
    _report_stuck(key, journal, stuck, error, killed, cfg.kill_timeout, cleaned_by)
    disabled = None
    if cfg.disable_queue_on_stuck:
        disabled = _disable_queue(key, journal, queue_instance or f"*@{short_hostname()}",
                                  jobfiles.stuck_marker(cfg.state_dir, key), cfg, qmod, cleaned_by)
    return Teardown(key, killed, stuck, accounting, disabled, error)


def _abort_fuse(key: JobKey, proc: Path, left: tuple[int, ...], owner: str,
                journal: log.JobFields, cleaned_by: str) -> bool:
    """Step 4: abort ``owner``'s FUSE connections with requests waiting when a process
    ``left`` waits for a FUSE daemon's answer; True when one was (journaled)."""
    waiting = [pid for pid in left if _FUSE_WAIT.search(
        procfs.wchan(pid, proc).encode() + b" " + (procfs.read(pid, "stack", proc) or b""))]
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        uid = 0
    if not waiting or uid == 0 or not _fusectl():
        return False
    try:
        with os.scandir(FUSECTL) as entries:
            aborted = [(entry, n) for entry in itertools.islice(entries, FUSE_CONNECTIONS_MAX)
                       if (n := _abort_connection(entry, uid))]
    except OSError as exc:
        _log.warning("job %s: cannot list the FUSE connections: %s", key, exc)
        return False
    pids = " ".join(map(str, waiting))
    for entry, requests in aborted:
        _log.warning("job %s: aborted the FUSE connection %s of %s (%d request(s) waiting): "
                     "process(es) %s of the job outlived SIGKILL waiting for its FUSE "
                     "daemon's answer", key, entry.path, owner, requests, pids,
                     extra=journal.event("fuse-aborted", FUSE_CONNECTION=entry.name,
                                         USER=owner, WAITING=requests, PIDS=pids,
                                         CLEANED_BY=cleaned_by))
    return bool(aborted)


def _abort_connection(entry: os.DirEntry[str], uid: int) -> int:
    """Abort the fusectl connection ``entry`` when ``uid`` mounted it (its files are that
    uid's) and requests wait on it; how many waited (0: not aborted)."""
    try:
        if entry.stat(follow_symlinks=False).st_uid != uid:
            return 0
        requests = int((Path(entry.path) / "waiting").read_bytes())
        if requests <= 0:
            return 0
        fd = os.open(Path(entry.path) / "abort", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_uid != uid:  # the number went to another's connection meanwhile
                return 0
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:  # gone meanwhile
        _log.debug("FUSE connection %s not aborted: %s", entry.path, exc)
        return 0
    return requests


def _fusectl() -> bool:
    """fusectl is mounted on :data:`FUSECTL` (mounted here when it is not); False when it
    cannot be (journaled)."""
    try:
        if os.stat(FUSECTL).st_dev != os.stat(FUSECTL.parent).st_dev:
            return True
    except OSError as exc:  # no FUSE in this kernel
        _log.warning("cannot abort a FUSE connection: %s", exc)
        return False
    import ctypes  # a FUSE-held teardown only: the epilog imports this module

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"fusectl", bytes(FUSECTL), b"fusectl", 0x0E, None) == 0:  # nosuid,nodev,noexec
        _log.info("mounted fusectl on %s", FUSECTL)
        return True
    code = ctypes.get_errno()
    if code == errno.EBUSY:  # mounted meanwhile
        return True
    _log.warning("cannot mount fusectl on %s to abort a FUSE connection: %s", FUSECTL,
                 os.strerror(code))
    return False


def _pids_left(key: JobKey, backend: Backend) -> tuple[int, ...]:
    """The job's pids after a failed teardown step, () when even they cannot be read."""
    try:
        return tuple(backend.pids(key))
    except GecoError as exc:
        _log.debug("job %s: cannot list its processes: %s", key, exc)
        return ()


def _describe(key: JobKey, backend: Backend, pid: int) -> StuckProcess:
    """What /proc and the cgroups say about one process that did not die."""
    try:
        where = backend.relative_cgroup(key, pid) or ""
    except GecoError:
        where = ""
    return StuckProcess(pid, procfs.state(pid, backend.proc), procfs.comm(pid, backend.proc),
                        procfs.wchan(pid, backend.proc), where,
                        _frozen_sub_cgroup(key, backend, where))


def _frozen_sub_cgroup(key: JobKey, backend: Backend, where: str) -> bool:
    """True when the v1 freezer sub-cgroup ``where`` of the job is FROZEN (or freezing).

    Only v1 needs the word: a cgroup v2 freezer lets SIGKILL through, so a frozen
    v2 sub-cgroup never keeps a job alive.
    """
    freezer = backend.paths(key).get("freezer") if backend.version == 1 else None
    if not where or freezer is None:
        return False
    try:
        state = (freezer / where / "freezer.state").read_bytes()
    except OSError:  # not a freezer sub-cgroup (the deepest one was in another controller)
        return False
    return state.startswith((b"FROZEN", b"FREEZING"))


def _report_stuck(key: JobKey, journal: log.JobFields, stuck: tuple[StuckProcess, ...],
                  error: str, killed: int, timeout: float, cleaned_by: str) -> None:
    """Journal ``cleanup-stuck``: the processes left (or the kernel's refusal), cgroups kept."""
    if stuck:
        what = (f"{len(stuck)} process(es) still alive {timeout:g} s after SIGKILL: "
                + "; ".join(p.describe() for p in stuck))
    else:
        what = "no process is left, but the cgroups could not be removed"
    if error:
        what += f" ({error})"
    _log.error("job %s: %s; cgroups kept, gecod's reaper tries again", key, what,
               extra=journal.event("cleanup-stuck", PIDS=" ".join(str(p.pid) for p in stuck),
                                   STATES=" ".join(p.brief for p in stuck), KILLED=killed,
                                   CLEANED_BY=cleaned_by, REASON=error or None))


def _disable_queue(key: JobKey, journal: log.JobFields, instance: str, marker: Path,
                   cfg: Config, qmod: str | None, cleaned_by: str) -> str | None:
    """Run ``qmod -d <instance>`` once per stuck job; return the instance when it worked."""
    earlier = _marked(marker)
    if earlier is not None:
        _log.info("job %s: the queue instance %s was disabled for it already (%s); not again",
                  key, earlier or instance, marker)
        return None
    why = qmod_command.disable(instance, cfg, qmod)
    fields = {"QUEUE_INSTANCE": instance, "CLEANED_BY": cleaned_by}
    if why is None:
        _remember(marker, instance)
        _log.error("job %s: disabled the queue instance %s (qmod -d) so that no new job starts "
                   "on this node while processes of this job cannot be killed; enable it "
                   "again with qmod -e %s once the node is healthy", key, instance, instance,
                   extra=journal.event("queue-disabled", **fields))
        return instance
    _log.error("job %s: cannot disable the queue instance %s: qmod -d failed: %s", key,
               instance, why, extra=journal.event("queue-disable-failed", REASON=why, **fields))
    return None


def found_stuck(cfg: Config, key: JobKey) -> bool:
    """True when a teardown since boot found job ``key`` stuck and disabled its queue: the
    reaper owns it now and tries again every round."""
    return _marked(jobfiles.stuck_marker(cfg.state_dir, key)) is not None


def _marked(marker: Path) -> str | None:
    """The queue instance disabled for this job since boot (marker content), else None."""
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            mtime = os.fstat(fd).st_mtime
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    # a marker from before a reboot belongs to another job that had the same key
    if mtime < procfs.boot_time():
        return None
    return data.strip().decode("utf-8", "replace")


def _remember(marker: Path, instance: str) -> None:
    """Write the marker; if that fails the next round disables the queue again, no worse."""
    try:
        marker.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            os.write(fd, instance.encode("utf-8", "surrogateescape") + b"\n")
        finally:
            os.close(fd)
    except OSError as exc:
        _log.warning("cannot write %s (%s): the queue may be disabled again next round",
                     marker, exc)


# ---------------------------------------------------------------------------
# the cgroups' end: also for a job that never ran (geco.job.undo)
# ---------------------------------------------------------------------------


class Release(NamedTuple):
    """What the teardown of one job's cgroups found and did."""

    killed: int
    remaining: tuple[int, ...]
    usage: dict[str, int]

    @property
    def clean(self) -> bool:
        """True when the cgroups are gone."""
        return not self.remaining


def read_usage(key: JobKey, backend: Backend) -> dict[str, int]:
    """Return the job's accounting counters (see :meth:`Backend.usage`), ``{}`` when unreadable.

    Read them before :func:`kill_and_remove`: removing the cgroups removes
    the counters with them.
    """
    try:
        return backend.usage(key)
    except GecoError as exc:  # a half-made cgroup has no counters; teardown still runs
        _log.debug("job %s: no usage figures: %s", key, exc)
        return {}


def kill_and_remove(key: JobKey, backend: Backend, *,
                    timeout: float) -> tuple[int, tuple[int, ...]]:
    """SIGKILL everything in the job's cgroups (sub-cgroups included), wait, remove them.

    The backend freezes the cgroup so nothing can fork while it is being
    killed, SIGKILLs every member and thaws so the kills are delivered; then
    we wait for the cgroup to empty within ``timeout`` seconds and remove it.

    Returns
    -------
    (processes signalled, pids left): the cgroups are removed exactly when no
    pid is left; a cgroup that does not empty is kept, never silently leaked.

    Raises
    ------
    CgroupError
        when the kernel refuses a read, a write or the removal.
    """
    # kill() freezes first on its own (best effort: a missing freezer or a process
    # stuck in D must not stop the SIGKILLs), so nothing can fork away meanwhile
    killed = backend.kill(key)
    if not backend.wait_empty(key, timeout, kill_late=True):
        return killed, tuple(backend.pids(key))
    backend.destroy(key)
    return killed, ()


def release(key: JobKey, backend: Backend, *, timeout: float) -> Release:
    """Kill everything left in a job's cgroups and remove them (see :func:`kill_and_remove`).

    The usage counters are read first, while the cgroups still exist. A job
    without cgroups is a clean release of nothing.

    Raises
    ------
    CgroupError
        as :func:`kill_and_remove`.
    """
    if not backend.exists(key):
        return Release(0, (), {})
    usage = read_usage(key, backend)
    killed, remaining = kill_and_remove(key, backend, timeout=timeout)
    return Release(killed, remaining, usage)
