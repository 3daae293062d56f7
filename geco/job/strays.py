"""What a job leaves running through other doors dies with its owner's last job on the node.

A job's processes are born in its cgroups and die with them, but a job can
ask a root daemon to start a process for its owner: ``at``/``batch`` (atd),
``crontab`` (cron), ``systemd-run --user`` (the user's systemd manager, alive
after logout with linger), an ssh login. Such a process is born outside every
job cgroup, without the job's limits, and outlives the job. Like Slurm's
``slurm.epilog.clean`` (``pkill -KILL -U $SLURM_UID`` when the user has no
other job on the node), :func:`after_job` kills them when the owner's last
job on this node ends. Its ordered steps:

1. ``[strays] kill`` off: nothing.
2. The owner of the ending job (:func:`owner_of`): its resource file, else the
   execd spool. Unknown: journaled, nothing killed.
3. Service accounts and root (uid below ``min_uid``): nothing, not even looked at.
4. The owner's processes outside every job cgroup (:func:`find`): none, nothing.
5. An exempt user (``exempt_users``, admins): kept (``strays-kept``).
6. Another job of the owner on this node (a job cgroup, or a job in the execd
   spool not contained yet): kept. A job whose owner cannot be read keeps them
   too: never kill what may belong to a running job.
7. SIGTERM, ``grace`` seconds, then SIGKILL in passes until none is left (a
   process that forks meanwhile loses its children in the next pass);
   journaled ``strays-killed`` with the user, the pids and their commands.

Who owns a job: the resource file (``<state_dir>/resources/<job>.<task>``) is
root's, written from qmaster's ``JB_owner`` before the job's first process
runs, on every node where the job has cgroups, and kept until they are gone.
The execd spool's ``config`` (``job_owner=``, written by sge_execd) covers a
job that is being dispatched and has no cgroups yet, and a node whose prolog
could not ask qstat. The uids of a cgroup's processes are no owner: a job's
cgroup may hold only root's shepherd, and a job may run setuid programs.

Which processes: real uid = the owner's (what ``pkill -U`` matches; a door's
child runs as the user), not a zombie, and in no cgroup below geco's parent in
any controller. Spared as well: what an admin started as the user, i.e. whose
nearest ancestor that is not the user's is root's ``runuser``, ``su`` or
``sudo`` (a user cannot get such a parent without an admin's grant: their own
``su`` runs with their real uid). Each process is pinned by a pidfd before it
is looked at, and every signal goes through that pidfd: a pid reused meanwhile
is never signalled.
"""

from __future__ import annotations

import enum
import errno
import os
import posixpath
import pwd
import select
import signal
import time
from pathlib import Path

from geco import log, procfs
from geco._tuple import NamedTuple
from geco.cgroup import Backend, check_key
from geco.cgroup._base import is_under
from geco.cgroup._fs import proc_cgroups
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet, short_hostname
from geco.sge import execd, resourcefile

__all__ = ["Outcome", "Result", "Stray", "after_job", "find", "is_exempt", "owner_in",
           "owner_of"]

_log = log.get("job.strays")

# A root parent of these names means an admin started the process as the user.
_ADMIN_TOOLS = frozenset({"runuser", "su", "sudo"})
# SIGKILL passes: each finds what the last one's victims forked before they died.
_PASSES = 20
# Seconds (for all passes together) to wait for SIGKILLed processes to be gone before
# they are reported left (stuck in the kernel).
_KILL_WAIT = 5.0
# PF_KTHREAD (include/linux/sched.h) in the flags of /proc/<pid>/stat: a kernel thread,
# never anyone's stray. Most of a node's pids are kernel threads (a few per CPU), and
# knowing it from stat spares their /proc/<pid>/status, the scan's dearest read.
_PF_KTHREAD = 0x00200000
# PF_EXITING: the task is in do_exit(). The kernel takes it out of its cgroups (to the
# root) before it is a zombie, so a job's process ending at the scan's moment (a shell
# loop's `sleep`) would look, for that moment, like one outside every job.
_PF_EXITING = 0x00000004


class Outcome(enum.Enum):
    """What :func:`after_job` decided."""

    OFF = "off"                      # [strays] kill = false
    UNKNOWN_OWNER = "unknown-owner"  # the ending job's owner cannot be read
    SERVICE = "service"              # root or uid < min_uid: not looked at
    NONE = "none"                    # nothing of the owner runs outside a job
    EXEMPT = "exempt"                # exempt_users: kept
    OTHER_JOB = "other-job"          # the owner has another job here (or one is unknown)
    KILLED = "killed"
    FAILED = "failed"                # /proc or the cgroups could not be read: journaled


class Stray(NamedTuple):
    """A process of the owner outside every job cgroup."""

    pid: int
    command: str

    def __str__(self) -> str:
        return f"{self.pid}:{self.command or '?'}"


class Result(NamedTuple):
    """What :func:`after_job` did.

    Attributes
    ----------
    outcome: the decision.
    user: the owner's name ("" when unknown).
    strays: the processes found (killed when ``outcome`` is KILLED, else kept).
    left: pids still alive after SIGKILL and a wait (stuck in the kernel).
    reason: why, in words.
    uid: the owner's uid, None when it is not known.
    """

    outcome: Outcome
    user: str = ""
    strays: tuple[Stray, ...] = ()
    left: tuple[int, ...] = ()
    reason: str = ""
    uid: int | None = None


# ---------------------------------------------------------------------------
# whose job
# ---------------------------------------------------------------------------


def _spool_owner(spool_dir: Path) -> str | None:
    """``job_owner`` of a spool dir's ``config``, else of a PE task's below it (a slave node)."""
    for config in (spool_dir / "config", *sorted(spool_dir.glob("*/config"))):
        try:
            owner = execd.parse_key_values(config.read_bytes()).get(b"job_owner", b"")
        except OSError:
            continue
        if owner:
            return owner.decode("utf-8", "surrogateescape")
    return None


def owner_of(cfg: Config, key: JobKey, spool_dir: Path | None = None) -> str | None:
    """Return the user name that owns job ``key`` on this node, None when nothing says.

    From its resource file, else ``job_owner`` in its execd spool dir
    (``spool_dir``, default: looked up below ``[paths] execd_spool_dir``).
    Never raises: an unreadable file is just no answer.
    """
    return owner_in(resourcefile.read_usable(cfg.resources_dir, key), cfg, key, spool_dir)


def owner_in(rs: ResourceSet | None, cfg: Config, key: JobKey,
             spool_dir: Path | None = None) -> str | None:
    """:func:`owner_of` from the job's resource set already read (``rs``; None: none)."""
    if rs is not None and rs.owner:
        return rs.owner
    spool = spool_dir or execd.find_spool_dir(cfg.execd_spool_dir, key, short_hostname())
    return _spool_owner(spool) if spool is not None else None


def _spool_keys(cfg: Config) -> set[JobKey]:
    """The jobs in this node's execd spool (``<spool>/<host>/active_jobs/<job>.<task>``)."""
    mine = cfg.execd_spool_dir / short_hostname() / "active_jobs"
    dirs = [mine] if mine.is_dir() else list(cfg.execd_spool_dir.glob("*/active_jobs"))
    keys: set[JobKey] = set()
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            try:
                keys.add(check_key(name))
            except GecoError:
                continue
    return keys


def _other_job(cfg: Config, backend: Backend, ended: JobKey, user: str) -> str | None:
    """Why the user's strays must stay: another job of theirs here than ``ended``, or one
    of nobody known."""
    try:
        keys = set(backend.job_keys())
    except GecoError as exc:
        return f"the job cgroups cannot be listed ({exc})"
    for other in sorted(keys | _spool_keys(cfg), key=JobKey.order):
        if other == ended:
            continue
        owner = owner_of(cfg, other)
        if owner == user:
            return f"job {other} of {user} still runs on this node"
        if owner is None:
            return f"the owner of job {other} on this node cannot be read"
    return None


def is_exempt(cfg: Config, uid: int, name: str) -> bool:
    """True for root, service accounts (uid < ``min_uid``) and ``exempt_users``."""
    return uid == 0 or uid < cfg.strays_min_uid or name in cfg.strays_exempt_users


# ---------------------------------------------------------------------------
# which processes
# ---------------------------------------------------------------------------


class _Pinned(NamedTuple):
    """A process held by its pidfd, and what /proc said about it while it was held."""

    pid: int
    pidfd: int
    command: str


def _status(pid: int, proc: Path) -> tuple[int, int, str] | None:
    """(real uid, parent pid, state letter) of ``pid``; None when gone or a kernel thread.
    A task in do_exit() has the state letter ``X`` here, as a dead one."""
    fields = procfs.stat_fields(pid, proc)
    if fields is None or len(fields) < 7:
        return None
    flags = int(fields[6])
    if flags & _PF_KTHREAD:
        return None
    uid = procfs.real_uid(pid, proc)
    if uid is None:
        return None
    letter = "X" if flags & _PF_EXITING else fields[0].decode("ascii", "replace")
    return uid, int(fields[1]), letter


def _geco_parents(backend: Backend) -> dict[str, str]:
    """geco's cgroup parent per controller, as ``/proc/<pid>/cgroup`` names it."""
    return {c: posixpath.dirname(p) for c, p in backend.cgroup_paths(JobKey(1, 1)).items()}


def _in_a_job(pid: int, parents: dict[str, str], proc: Path) -> bool:
    """True when ``pid`` is below geco's parent in any controller (or cannot be placed)."""
    try:
        have = proc_cgroups(proc, pid)
    except GecoError:
        return True  # never kill what cannot be placed
    if have is None:
        return True  # gone
    return any(c in have and is_under(have[c], p) for c, p in parents.items())


def _started_by_admin(uid: int, ppid: int, proc: Path) -> bool:
    """True when the nearest ancestor not of ``uid`` is root's runuser, su or sudo."""
    seen = 0
    while ppid > 0 and seen < 64:
        status = _status(ppid, proc)
        if status is None:
            return False
        if status[0] != uid:
            return status[0] == 0 and procfs.comm(ppid, proc) in _ADMIN_TOOLS
        ppid, seen = status[1], seen + 1
    return False


def _alive(pidfd: int) -> bool:
    """True while the pidfd's process has not exited (a zombie has)."""
    return not select.select([pidfd], [], [], 0)[0]


def _pin(uid: int, parents: dict[str, str], proc: Path) -> list[_Pinned]:
    """Open a pidfd for each process of ``uid`` outside every job, then check it."""
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        pid = int(entry)
        first = _status(pid, proc)
        if first is None or first[0] != uid:
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        # read again with the process pinned: if it is still alive afterwards, what was
        # read is its own, not that of a process that got its pid meanwhile
        status = _status(pid, proc)
        keep = (status is not None and status[0] == uid and status[2] not in ("Z", "X")
                and not _in_a_job(pid, parents, proc)
                and not _started_by_admin(uid, status[1], proc))
        command = procfs.comm(pid, proc)
        if keep and _alive(pidfd):
            found.append(_Pinned(pid, pidfd, command))
        else:
            os.close(pidfd)
    return found


def _close(pinned: list[_Pinned]) -> None:
    for p in pinned:
        os.close(p.pidfd)


def find(backend: Backend, uid: int, proc: Path = procfs.ROOT) -> list[Stray]:
    """Return the processes of ``uid`` outside every job cgroup (not started by an admin)."""
    pinned = _pin(uid, _geco_parents(backend), proc)
    _close(pinned)
    return [Stray(p.pid, p.command) for p in pinned]


def _signal(pinned: list[_Pinned], sig: int) -> None:
    for p in pinned:
        try:
            signal.pidfd_send_signal(p.pidfd, sig)
        except ProcessLookupError:
            continue  # exited meanwhile
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                _log.warning("cannot signal stray process %d (%s): %s", p.pid, p.command, exc)


def _wait_gone(pinned: list[_Pinned], timeout: float) -> list[_Pinned]:
    """Wait until every pinned process has exited (at most ``timeout`` s); return the rest."""
    deadline = time.monotonic() + timeout
    left = [p for p in pinned if _alive(p.pidfd)]
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        select.select([p.pidfd for p in left], [], [], remaining)
        left = [p for p in left if _alive(p.pidfd)]
    return left


def _kill(uid: int, parents: dict[str, str], grace: float,
          proc: Path) -> tuple[list[Stray], list[int]]:
    """SIGTERM, grace, SIGKILL in passes; return what was signalled and what is left."""
    signalled: dict[int, Stray] = {}
    killed: dict[int, _Pinned] = {}  # pid -> the process SIGKILLed under it
    held: list[_Pinned] = []
    try:
        first = _pin(uid, parents, proc)
        held += first
        signalled.update((p.pid, Stray(p.pid, p.command)) for p in first)
        _signal(first, signal.SIGTERM)
        _wait_gone(first, grace)
        deadline = time.monotonic() + _KILL_WAIT
        for _ in range(_PASSES):
            found = _pin(uid, parents, proc)
            held += found
            # new: not SIGKILLed yet, or its pid now names another process (the old one died)
            fresh = [p for p in found if p.pid not in killed or not _alive(killed[p.pid].pidfd)]
            if not fresh:
                break
            _signal(fresh, signal.SIGKILL)
            for p in fresh:
                killed[p.pid] = p
                signalled.setdefault(p.pid, Stray(p.pid, p.command))
            _wait_gone(fresh, max(0.0, deadline - time.monotonic()))
        left = [p for p in killed.values() if _alive(p.pidfd)]
        return list(signalled.values()), sorted(p.pid for p in left)
    finally:
        _close(held)


# ---------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def after_job(cfg: Config, backend: Backend, key: JobKey, owner: str | None, *,
              cleaned_by: str, proc: Path = procfs.ROOT) -> Result:
    """Job ``key`` of ``owner`` ended on this node: kill the owner's strays if it was their last.

    Call it after the job's cgroups are gone (see the module docstring for the steps).

    Parameters
    ----------
    cfg: ``[strays]`` and where resource files and the execd spool are.
    backend: this node's cgroups (geco's parent: what "in a job" means).
    key: ``<job>.<task>`` of the job that ended.
    owner: its owner's user name (:func:`owner_of`, read before its files went).
    cleaned_by: who ended the job (``epilog``, ``gecod``, ``reaper``), journaled.

    Returns
    -------
    What was decided and done. Never raises: failures are journaled.
    """
    result = _decide(cfg, backend, key, owner, proc)
    _journal(key, result, cleaned_by)
    return result


def _decide(cfg: Config, backend: Backend, key: JobKey, owner: str | None,
            proc: Path) -> Result:
    """The module docstring's steps, in its order: what was decided, and done."""
    if not cfg.strays_kill:
        return Result(Outcome.OFF)
    entry = _user(owner) if owner else None
    if owner is None or entry is None:
        why = "its owner is unknown" if owner is None else f"its owner {owner!r} is no user here"
        return Result(Outcome.UNKNOWN_OWNER, owner or "", reason=why)
    uid, user = entry.pw_uid, entry.pw_name
    if uid == 0 or uid < cfg.strays_min_uid:
        return Result(Outcome.SERVICE, user, reason=f"uid {uid} < [strays] min_uid", uid=uid)
    try:
        parents = _geco_parents(backend)
        found = tuple(find(backend, uid, proc))
        if not found:
            _log.debug("job %s ended; %s has no process outside a job here", key, user)
            return Result(Outcome.NONE, user, uid=uid)
        if user in cfg.strays_exempt_users:
            return Result(Outcome.EXEMPT, user, found,
                          reason=f"{user} is exempt ([strays] exempt_users)", uid=uid)
        other = _other_job(cfg, backend, key, user)
        if other:
            return Result(Outcome.OTHER_JOB, user, found, reason=other, uid=uid)
        killed, left = _kill(uid, parents, cfg.strays_grace, proc)
    except (GecoError, OSError) as exc:
        return Result(Outcome.FAILED, user, reason=str(exc), uid=uid)
    if not killed:
        return Result(Outcome.NONE, user, uid=uid)
    return Result(Outcome.KILLED, user, tuple(killed), tuple(left), uid=uid)


def _journal(key: JobKey, result: Result, cleaned_by: str) -> None:
    """The decision's one record: ``strays-kept`` (an unknown owner, an exempt user,
    another job), ``strays-failed`` or ``strays-killed``; the others need none."""
    job, task, user, outcome = key.job, key.task, result.user, result.outcome
    fields = {"CLEANED_BY": cleaned_by}
    pids = " ".join(str(s.pid) for s in result.strays)
    commands = " ".join(map(str, result.strays))
    if outcome is Outcome.UNKNOWN_OWNER:
        _log.warning("job %s ended, but %s: processes it may have left outside its cgroups "
                     "are not looked for", key, result.reason,
                     extra=log.job_fields(job, task, "strays-kept", REASON=result.reason,
                                          **fields))
    elif outcome in (Outcome.EXEMPT, Outcome.OTHER_JOB):
        _log.info("job %s ended; %d process(es) of %s outside every job kept: %s (%s)",
                  key, len(result.strays), user, result.reason, commands,
                  extra=log.job_fields(job, task, "strays-kept", USER=user, USER_ID=result.uid,
                                       PIDS=pids, COMMANDS=commands, REASON=result.reason,
                                       **fields))
    elif outcome is Outcome.FAILED:
        _log.error("job %s ended, but the processes %s left outside every job cannot be "
                   "killed: %s", key, user, result.reason,
                   extra=log.job_fields(job, task, "strays-failed", USER=user,
                                        REASON=result.reason, **fields))
    elif outcome is Outcome.KILLED:
        left = " ".join(map(str, result.left))
        stuck = f"; still alive after SIGKILL: {left}" if left else ""
        _log.warning("job %s was the last job of %s on this node: killed %d process(es) of %s "
                     "outside every job (at, cron, systemd --user, ssh): %s%s", key, user,
                     len(result.strays), user, commands, stuck,
                     extra=log.job_fields(job, task, "strays-killed", USER=user,
                                          USER_ID=result.uid, KILLED=len(result.strays),
                                          PIDS=pids, COMMANDS=commands, LEFT=left or None,
                                          **fields))
