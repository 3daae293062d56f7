"""The quarantine: may this process go into this job before it runs anything, and if so,
put it there.

One function, :func:`quarantine`, decides and acts for JOB_STARTED and
QUARANTINE_SELF requests whose frame already passed the protocol checks
(MAC, clock, replay). It blocks (qstat, cgroup writes, hwloc), so gecod runs it
in a worker thread, never in its loop.

Steps, in order (the contract's "Quarantine semantics"; the kernel's word,
SO_PEERCRED and /proc, is trusted over the message's):

JOB_STARTED (the preload inside sge_execd's child, about to exec sge_shepherd)

1. Credentials: the peer (SO_PEERCRED) runs as root or one of
   ``[gecod] execd_uids``, and the pid in the message is the peer's own pid:
   a process may only ask for itself. Over TCP the kernel names no peer, so
   the pid's own effective uid (``/proc/<pid>/status``) must pass instead.
2. Place: the pid's working directory is the job's execd spool dir
   ``<execd_spool_dir>/<host>/active_jobs/<job>.<task>`` (or a PE task dir
   below it), and the ``environment`` file there names the same job and task.
   Only the execd user can create those directories, and execd runs the
   shepherd in exactly that one.
3. Cgroups: reuse the job's when they exist (several tasks of a job on a
   node share them); else get its resources (resource file, else qstat, else
   the spool: :mod:`geco.sge.lookup`) and build this node's share
   (:func:`geco.job.containment.contain_job`).
4. Move the pid in. A pidfd taken when the peer connected proves afterwards
   that the pid still named the same process (pid reuse).

QUARANTINE_SELF (the starter, as the job owner, finds itself uncontained)

1. Credentials: a Unix socket peer whose pid is the message's pid, running as
   the job's owner (``job_owner`` in the spooled ``config``) or root.
2. Place: an ancestor of the pid (by the /proc ppid chain) is an
   ``sge_shepherd`` with real uid 0 (as sge_execd, started by root, forks it:
   a user can name a program ``sge_shepherd`` but cannot give it real uid 0)
   whose working directory is this job's spool dir on *this* host
   (``<execd_spool_dir>/<this host>/active_jobs/<job>.<task>``), with the same
   ``environment`` check.
3. and 4. as above.

Both: a Unix socket peer must come with a pidfd (taken at accept). Without
one (``pidfd_open`` failed) nothing proves that the pid moved in is still the
peer, so the request is refused, never served unpinned.

Outcomes are :class:`~geco.wire.messages.AckStatus` values; every refusal carries a
sentence saying which rule refused and why.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import signal
from dataclasses import dataclass
from pathlib import Path

from geco import log, procfs
from geco.cgroup import Limits
from geco.config import Config
from geco.daemon.context import GecodContext, Outcome, Peer, Shepherd, WouldWait
from geco.errors import GecoError, JobKeyError, JobNotFound, TaskNotRunning
from geco.job import containment, privatetmp
from geco.jobkey import JobKey
from geco.resourceset import short_hostname
from geco.sge import execd
from geco.sge.lookup import Found
from geco.wire.messages import AckStatus, MsgType

__all__ = ["Request", "pid_reused", "quarantine", "spool_root"]

_log = log.get("daemon.quarantine")

# How far up the ppid chain QUARANTINE_SELF looks for the job's shepherd
# (shepherd -> starter -> shell -> ... ; a deeper chain is not a job start).
_MAX_ANCESTORS = 32


@dataclass(frozen=True, slots=True)
class Request:
    """A verified JOB_STARTED or QUARANTINE_SELF request."""

    type: MsgType  # JOB_STARTED or QUARANTINE_SELF
    # the message's claims, until checked
    job_id: int
    task_id: int
    pid: int
    peer: Peer | None = None  # the kernel's word on the sender; None over TCP
    pidfd: int = -1  # a pidfd of ``peer.pid`` opened at accept time, or -1


class _Refused(Exception):
    """A request fails a rule; carries the ACK status and the sentence for the journal."""

    def __init__(self, status: AckStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _refuse(reason: str) -> _Refused:
    return _Refused(AckStatus.REFUSED, reason)


# -- /proc ---------------------------------------------------------------------


def _proc_cwd(proc: Path, pid: int) -> str:
    try:
        return procfs.cwd(pid, proc)
    except FileNotFoundError:
        raise _refuse(f"process {pid} is gone") from None
    except OSError as exc:
        raise _refuse(f"cannot read the working directory of process {pid}: "
                      f"{exc.strerror}") from None


def _proc_uids(proc: Path, pid: int) -> tuple[int, int]:
    """(real, effective) uid of ``pid``; refused when it is gone."""
    both = procfs.uids(pid, proc)
    if both is None:
        raise _refuse(f"process {pid} is gone")
    return both


def _may_start_jobs(proc: Path, pid: int, uid: int, allowed: tuple[int, ...]) -> bool:
    """True for root, the configured execd uids, and processes whose *real* uid is root.

    sge_execd forks the shepherd with real uid 0 and effective uid sgeadmin (and
    SO_PEERCRED reports the effective one); such a process can become root again
    at will, so it is as trusted as root.
    """
    return uid in allowed or _proc_uids(proc, pid)[0] == 0


def _alive(pidfd: int) -> bool:
    """True while the process the pidfd was opened for exists (a reused pid does not count)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, and we may not signal it (never for root, but harmless)
    return True


# -- the spool -----------------------------------------------------------------


def _read_environment(directory: str | Path) -> bytes:
    path = f"{directory}/environment"
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _refuse(f"cannot read {path}: {exc.strerror}") from None


def _check_environment(directory: str | Path, key: JobKey) -> None:
    """The ``environment`` file in ``directory`` must name the same job and task."""
    try:
        named = execd.key_of_environment(_read_environment(directory))
    except JobKeyError as exc:
        raise _refuse(f"{directory}/environment names no job: {exc}") from None
    if named != key:
        raise _refuse(f"{directory}/environment names job {named}, not {key}")


def spool_root(cfg: Config) -> Path:
    """The execd spool dir as the kernel names it (what ``/proc/<pid>/cwd`` shows)."""
    return _real_path(cfg.execd_spool_dir)


@functools.lru_cache(maxsize=8)
def _real_path(path: Path) -> Path:
    # every request asks; symlinks on the spool's path change only with the site's layout
    return Path(os.path.realpath(path))


# -- the rules -------------------------------------------------------------------


def _check_job_started(req: Request, key: JobKey, ctx: GecodContext) -> tuple[str, str]:
    """Steps 1 and 2 for JOB_STARTED; return the job's spool dir and the dir the pid works
    in: the same for the job's master shepherd, a PE task's dir below it for a task."""
    cfg = ctx.config
    allowed = (0, *cfg.gecod_execd_uids)
    if req.peer is not None:
        if req.pid != req.peer.pid:
            raise _refuse(f"the message names pid {req.pid} but was sent by pid "
                          f"{req.peer.pid}: a process may only ask for itself")
        if not _may_start_jobs(ctx.proc, req.pid, req.peer.uid, allowed):
            raise _refuse(f"uid {req.peer.uid} may not send JOB_STARTED: only root "
                          f"(real or effective) and [gecod] execd_uids "
                          f"({', '.join(map(str, allowed))})")
    else:
        euid = _proc_uids(ctx.proc, req.pid)[1]
        if not _may_start_jobs(ctx.proc, req.pid, euid, allowed):
            raise _refuse(f"process {req.pid} runs as uid {euid}: only root (real or "
                          f"effective) and [gecod] execd_uids "
                          f"({', '.join(map(str, allowed))}) start jobs")
    cwd = _proc_cwd(ctx.proc, req.pid)
    job_dir = execd.job_dir_in(cwd, str(spool_root(cfg)), key)
    if job_dir is None:
        raise _refuse(f"process {req.pid} works in {cwd}, not in the spool dir of job "
                      f"{key} ({cfg.execd_spool_dir}/<host>/active_jobs/{key})")
    _check_environment(cwd, key)
    return job_dir, cwd


def _owner_uid(job_dir: Path) -> int:
    try:
        owner = execd.read_config(job_dir).get("job_owner", "")
    except GecoError as exc:
        raise _refuse(f"cannot tell the job's owner: {exc}") from None
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise _refuse(f"the job's owner {owner!r} (spooled config) is not a known "
                      "user") from None


def _check_quarantine_self(req: Request, key: JobKey, ctx: GecodContext) -> Path:
    """Steps 1 and 2 for QUARANTINE_SELF; return the job's spool dir."""
    if req.peer is None:
        raise _refuse("QUARANTINE_SELF needs the Unix socket: over TCP the kernel cannot "
                      "name the sender")
    if req.pid != req.peer.pid:
        raise _refuse(f"the message names pid {req.pid} but was sent by pid "
                      f"{req.peer.pid}: a process may only ask for itself")
    job_dir = _shepherd_job_dir(req, key, ctx)
    owner = _owner_uid(job_dir)
    if req.peer.uid not in (0, owner):
        raise _refuse(f"uid {req.peer.uid} is not the owner (uid {owner}) of job {key}")
    return job_dir


def _on_this_host(job_dir: Path, root: Path, hostname: str) -> bool:
    """True when ``job_dir`` is below ``<root>/<this host>``: the host part's first label
    is this host's short name (Grid Engine spools under the short or the full name)."""
    return short_hostname(job_dir.relative_to(root).parts[0]) == short_hostname(hostname)


def _shepherd_job_dir(req: Request, key: JobKey, ctx: GecodContext) -> Path:
    """The job's spool dir, found as the cwd of an ``sge_shepherd`` ancestor of the pid
    that runs with real uid 0 and works in this host's spool."""
    root = spool_root(ctx.config)
    pid = req.pid
    why = ""  # the first impostor seen: named in the refusal
    for _ in range(_MAX_ANCESTORS):
        pid = procfs.ppid(pid, ctx.proc)
        if pid <= 1:
            break
        if not procfs.comm(pid, ctx.proc).startswith("sge_shepherd"):
            continue
        # a shepherd of another job, or one gone meanwhile: keep looking upwards
        with contextlib.suppress(_Refused):
            cwd = _proc_cwd(ctx.proc, pid)
            job_dir = execd.job_dir_of(Path(cwd), root, key)
            if job_dir is None:
                continue
            # anyone can call a program sge_shepherd and chdir into a readable spool
            # dir; only sge_execd (root) starts one with real uid 0
            real_uid = _proc_uids(ctx.proc, pid)[0]
            if real_uid != 0:
                why = why or (f"; process {pid} named sge_shepherd in its spool dir runs "
                              f"with real uid {real_uid}, not 0")
                continue
            if not _on_this_host(job_dir, root, ctx.hostname):
                why = why or (f"; the sge_shepherd {pid} works in {job_dir}, which is not "
                              f"this host's ({ctx.hostname}) spool")
                continue
            _check_environment(cwd, key)
            return job_dir
    raise _refuse(f"process {req.pid} does not descend from the sge_shepherd of job "
                  f"{key}{why}")


def _contain(key: JobKey, req: Request, job_dir: str | Path, ctx: GecodContext,
             wait: bool, task_dir: str | None) -> tuple[Limits, bool, bool, Found | None]:
    """Steps 3 and 4 under the job's lock: the job's cgroups, reused or built, and the pid
    moved in; return their limits, whether we built them, whether they are new to
    this gecod, and the resources read for them. ``wait=False``: raise
    :class:`WouldWait` unless that takes no waiting (the lock is free, and the cgroups are
    ones this gecod has seen). ``task_dir``: where a shepherd works (JOB_STARTED: its
    spooled environment names its $TMPDIR); None for QUARANTINE_SELF (a starter, which
    cannot enter a namespace: none is made for it).

    Holding the lock until the pid is in keeps gecod's end of the job's previous
    run (:mod:`geco.daemon.shepherdwatch`) from removing the cgroups in between.
    """
    cfg = ctx.config
    master = task_dir == str(job_dir)
    # a job with a private /tmp: each task's $TMPDIR is made in it (reading the task's
    # spooled environment: a worker's work), and the lane, which cannot, serves none
    private_tmp = cfg.tmp_private and privatetmp.exists(cfg, key)
    with ctx.job_lock(key, wait=wait, moves=True):
        known = ctx.ready.get(key)
        if known is not None and known[0] == ctx.backend.identity(key):
            # a later task of a job whose cgroups this gecod has seen: the same
            # cgroups (same identity), so their limits still hold
            if private_tmp and not wait:
                raise WouldWait(f"job {key}'s task needs its $TMPDIR in its private /tmp")
            if private_tmp and task_dir is not None:
                containment.task_tmpdir(cfg, key, Path(task_dir), None)
            ctx.backend.add_pid(key, req.pid)
            if ctx.lane is not None and not private_tmp:  # the next ones are the lane's
                ctx.lane.publish(key, known[0], known[1], ctx.backend)
            return known[1], False, False, None
        if not wait:
            raise WouldWait(f"job {key}'s cgroups are new to gecod")
        done = containment.contain_job(
            execd.JobRef(req.job_id, req.task_id, Path(job_dir)), cfg, ctx.backend,
            pid=req.pid, hostname=ctx.hostname, topology=ctx.topology, reclaim=ctx.reclaim,
            # a PE task of a job whose master did not prepare it here ([cluster] slaves)
            prepared_only=(task_dir is not None and not master
                           and cfg.cluster_slaves == "strict"),
            private_tmp=task_dir is not None)
        private_tmp = cfg.tmp_private and privatetmp.exists(cfg, key)
        if private_tmp and task_dir is not None:
            containment.task_tmpdir(cfg, key, Path(task_dir),
                                    done.found.resources.owner if done.found else None)
        identity = ctx.backend.identity(key)
        if identity is not None:
            ctx.ready[key] = (identity, done.limits)
            if ctx.lane is not None and not private_tmp:
                ctx.lane.publish(key, identity, done.limits, ctx.backend)
    return done.limits, done.created, True, done.found


def pid_reused(req: Request) -> Outcome:
    """The pid was moved, and then its process was found gone: say so, and fail."""
    _log.warning("process %d exited while being quarantined; its pid may have been "
                 "reused by the process now moved into job %s.%s", req.pid, req.job_id,
                 req.task_id, extra=log.job_fields(req.job_id, req.task_id, "pid-reused",
                                                   PID=req.pid))
    return Outcome(AckStatus.FAILED, f"process {req.pid} exited while being moved")


def quarantine(req: Request, ctx: GecodContext, *, wait: bool = True) -> Outcome:
    """Decide on a request and, when it passes, put the pid into its job's cgroups.

    Parameters
    ----------
    req: the request (its frame already verified by the protocol layer).
    ctx: settings, cgroup backend, topology.
    wait: False in gecod's loop: raise :class:`WouldWait` when the request needs a
        worker (nothing was changed then; the worker runs it again from the start).

    Returns
    -------
    Outcome
        ``OK`` (quarantined), ``REFUSED`` (a rule failed), ``NO_SUCH_JOB``
        (Grid Engine does not run this task), ``FAILED`` (qstat, cgroup or
        cores), ``BAD_REQUEST`` (ids out of range); never raises for a bad
        request or a system failure.
    """
    try:
        if req.job_id < 1 or req.task_id < 1:
            raise _Refused(AckStatus.BAD_REQUEST, f"job and task ids must be >= 1, got "
                                                 f"{req.job_id}.{req.task_id}")
        key = JobKey(req.job_id, req.task_id)
        if req.peer is not None and req.pidfd < 0:
            # fail closed: without a pidfd, "still alive after the move" proves nothing
            raise _refuse(f"gecod could not pin process {req.pid} (pidfd_open failed "
                          "when it connected), so it cannot tell it from a process that "
                          "reuses its pid; refused")
        task_dir: str | None = None
        job_dir: str | Path
        if req.type is MsgType.QUARANTINE_SELF:
            job_dir = _check_quarantine_self(req, key, ctx)
        else:
            job_dir, task_dir = _check_job_started(req, key, ctx)
        if req.pidfd >= 0 and not _alive(req.pidfd):
            raise _refuse(f"process {req.pid} exited before it could be quarantined")
        limits, created, first, found = _contain(key, req, job_dir, ctx, wait, task_dir)
        master = task_dir == str(job_dir)
        # the pidfd pins the peer: alive now means the pid we wrote was still the peer's
        if req.pidfd >= 0 and not _alive(req.pidfd):
            return pid_reused(req)
    except _Refused as exc:
        return Outcome(exc.status, exc.reason)
    except (TaskNotRunning, JobNotFound) as exc:
        return Outcome(AckStatus.NO_SUCH_JOB, f"Grid Engine does not run this task: {exc}")
    except GecoError as exc:  # qstat, a resource file, cores, the kernel refusing a cgroup
        return Outcome(AckStatus.FAILED, str(exc))
    shepherd = Shepherd(key, req.pid, execd.queue_instance(Path(job_dir))) if master else None
    return Outcome(AckStatus.OK, f"process {req.pid} is in job {key}'s cgroups",
                   created=created, limits=limits, shepherd=shepherd, first=first,
                   found=found)
