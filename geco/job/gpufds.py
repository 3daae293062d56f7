"""A GPU fd a job handed to its owner's other jobs dies with the job.

The kernel's devices cgroup checks a device at open(2) only. A job of user U can open
its GPU, hand the fd (SCM_RIGHTS) to a process of U's later job on this node, whose
cgroup denies that GPU, and go on using the GPU after it went to another job.
:func:`revoke` closes that when a job ends here (:func:`geco.job.ending.end_job`,
once the job's cgroups are gone). Its ordered steps:

1. The ended job's GPUs here (its ``GECO_GPUS``) and their device numbers (the node's
   table). None: nothing.
2. Its owner (its resource file, else the execd spool: :func:`geco.job.strays.owner_in`,
   read once by the job's end, :func:`geco.job.ending.end_job`).
   Unknown: journaled ``gpu-fds-unchecked``, nothing killed (whose jobs to look in is
   not known).
3. The owner's other jobs here: each job cgroup whose resource file (else spool) names
   the owner. A job's own GPUs are not looked for in it: an fd on them may be its own
   (a GPU that came free here may already be its).
4. Each process of those jobs, listed again until a listing shows none not looked at
   yet (a child inherits its parent's fds): the character devices it holds open
   (:func:`geco.procfs.char_devices_open`). One that holds a GPU of the ended job is
   SIGKILLed through a pidfd, once that pinned process is seen still in its job and
   still holding the GPU (:func:`geco.cgroup._fs.signal_pid`), and journaled
   ``gpu-fd-revoked`` (JOB_ID of the ended job, PID, HOLDER_JOB, GPU).
5. The look has a time budget (:data:`BUDGET`): how many processes and fds it meets
   is the user's to decide. When it runs out, ``gpu-fds-unchecked`` (warning) names the
   job and its GPUs, and every process of the owner (its real uid, never root) in those
   jobs that the look did not reach is SIGKILLed: any of them may hold the GPU, and only
   the owner, whose processes and fds used up the time, loses by it. Other users'
   processes there (Grid Engine's root shepherd) are spared: the owner cannot have
   made them take an fd.

Not looked at: processes outside every job (:mod:`geco.job.strays` ends those when the
owner's last job here ends), jobs of other users (an fd handed to another user's
process), a GPU mapped into memory whose fd was closed (a mapping keeps the device
open without an fd), and the driver's state behind an ``nvidiactl`` fd.
"""

from __future__ import annotations

import os
import pwd
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from geco import gpushare, log, procfs
from geco._tuple import NamedTuple
from geco.cgroup import Backend
from geco.cgroup._fs import signal_pid
from geco.config import Config
from geco.errors import GecoError
from geco.job import strays
from geco.jobkey import JobKey
from geco.node import gpus
from geco.sge import resourcefile

__all__ = ["BUDGET", "Holder", "Revoked", "revoke"]

_log = log.get("job.gpufds")

# Seconds the look through the owner's other jobs may take. It runs in every teardown of
# a GPU job (the epilog, which Grid Engine waits for before the job's slots are free
# again; gecod's teardown pool; the reaper), and its cost is the user's to decide
# (processes x fds), so it is bounded: 0.5 s is some 70,000 fds on a slow machine
# (7 us each) and far more than jobs hold; past it the look fails closed (step 5).
BUDGET = 0.5
# Listings of a job's processes: each finds what the last one's processes forked.
_PASSES = 20


class Holder(NamedTuple):
    """A process that held a GPU of the ended job open, and was killed."""

    pid: int
    job: JobKey  # the owner's other job it was in
    gpus: tuple[int, ...]  # the ended job's GPU ids it held


class Revoked(NamedTuple):
    """What :func:`revoke` found and did.

    Attributes
    ----------
    holders: the processes killed for holding a GPU of the ended job.
    unreached: the owner's processes killed because the look ran out of time first.
    complete: True when every process of the owner's other jobs was looked at.
    """

    holders: tuple[Holder, ...] = ()
    unreached: tuple[int, ...] = ()
    complete: bool = True


class _EndedJob(NamedTuple):
    """The ended job, as the look and its records name it."""

    key: JobKey
    ids: tuple[int, ...]  # its GPU ids here
    owner: str  # its owner's user name
    journal: log.JobFields  # its journal fields


class _Job(NamedTuple):
    """One of the owner's other jobs here, and the ended job's GPUs to look for in it."""

    key: JobKey
    wanted: Mapping[int, int]  # device number -> GPU id


def revoke(cfg: Config, backend: Backend, key: JobKey, ids: tuple[int, ...],
           owner: str | None, *, journal: log.JobFields | None = None) -> Revoked:
    """Job ``key`` held GPUs ``ids`` here and its cgroups are gone: kill what of its owner's
    other jobs here still holds one open (the module docstring lists the steps).

    Parameters
    ----------
    cfg: ``[gpu] devices`` (the node's table), where resource files and the spool are.
    backend: this node's cgroups (the jobs and their processes, its /proc).
    key: ``<job>.<task>`` of the job that ended.
    ids: its GPU ids here (its ``GECO_GPUS``).
    owner: its owner's user name (:func:`geco.job.strays.owner_in`, read at its end); None:
        unknown, so whose other jobs to look in is not known.
    journal: its journal fields, found once by its end; default: found here.

    Returns
    -------
    What was killed, and whether the look was complete. Never raises: a failure is
    journaled (``gpu-fds-unchecked``).
    """
    if not ids:
        return Revoked()
    if journal is None:
        journal = log.JobFields(key.job, key.task)
    try:
        if owner is None:
            raise GecoError("its owner is unknown")
        devices = {os.makedev(g.major, g.minor): g.id
                   for g in gpus.node_table(cfg.gpu_devices) if g.id in ids}
        jobs = [job for job in _owners_jobs(cfg, backend, key, owner, devices) if job.wanted]
        return _look(_EndedJob(key, ids, owner, journal), backend, jobs,
                     time.monotonic() + BUDGET)
    except (GecoError, OSError) as exc:
        _log.error("job %s ended, but whether processes of its owner's other jobs here hold "
                   "its GPU %s open is not known: %s", key, gpushare.format_ids(ids), exc,
                   extra=journal.event("gpu-fds-unchecked", GPUS=gpushare.format_ids(ids),
                                       USER=owner, REASON=str(exc)))
        return Revoked(complete=False)


def _owners_jobs(cfg: Config, backend: Backend, key: JobKey, owner: str,
                 devices: Mapping[int, int]) -> list[_Job]:
    """The owner's other jobs with cgroups here, each with the GPUs to look for in it: the
    ended job's but those it holds itself."""
    jobs = []
    for other in backend.job_keys():
        if other == key:
            continue
        whose, own = _facts(cfg, other)
        if whose == owner:
            jobs.append(_Job(other, {rdev: gpu for rdev, gpu in devices.items()
                                     if gpu not in own}))
    return jobs


def _facts(cfg: Config, key: JobKey) -> tuple[str | None, frozenset[int]]:
    """A job's owner (None: unknown) and its GPU ids here, from one read of its resource file
    (the spool, for an owner the file does not name)."""
    try:
        rs = resourcefile.read(cfg.resources_dir, key)
        node = rs.node() if rs is not None else None
        own = frozenset(gpushare.parse_share(node.gpus).ids) if node is not None else frozenset()
    except GecoError as exc:  # unreadable: what it holds is not known, so look for all
        _log.debug("job %s: its resource file cannot be read: %s", key, exc)
        rs, own = None, frozenset()
    return strays.owner_in(rs, cfg, key), own


def _holds(pid: int, wanted: Mapping[int, int], deadline: float, proc: Path, *,
           first: bool = False) -> set[int] | None:
    """The GPU ids of ``wanted`` (device number -> id) that ``pid`` holds open, only the
    first found when ``first``; None when the deadline came before its last fd."""
    found: set[int] = set()
    for n, rdev in enumerate(procfs.char_devices_open(pid, proc)):
        if n % 64 == 63 and time.monotonic() >= deadline:
            return None
        gpu = wanted.get(rdev)
        if gpu is not None:
            found.add(gpu)
            if first:
                break
    return found


def _look(ended: _EndedJob, backend: Backend, jobs: list[_Job], deadline: float) -> Revoked:
    """Steps 4 and 5: look through every process of ``jobs``, kill the holders."""
    looked: set[tuple[JobKey, int]] = set()
    holders: list[Holder] = []
    for _ in range(_PASSES):
        fresh = [(job, pid) for job in jobs for pid in backend.pids(job.key)
                 if (job.key, pid) not in looked]
        if not fresh:
            return Revoked(tuple(holders))
        for job, pid in fresh:
            if time.monotonic() >= deadline:
                return _out_of_time(ended, backend, jobs, looked, tuple(holders))
            held = _holds(pid, job.wanted, deadline, backend.proc)
            if held is None:
                return _out_of_time(ended, backend, jobs, looked, tuple(holders))
            looked.add((job.key, pid))
            if held and _kill_holder(ended, backend, job, pid, held):
                holders.append(Holder(pid, job.key, tuple(sorted(held))))
    return _out_of_time(ended, backend, jobs, looked, tuple(holders))


def _kill_holder(ended: _EndedJob, backend: Backend, job: _Job, pid: int, held: set[int]) -> bool:
    """SIGKILL ``pid`` if, pinned, it is still in ``job`` and holds a GPU of ``held`` (its fds
    are looked at again until one is found, for at most :data:`BUDGET`: past it, the
    process that held one a moment ago is killed); journal it. True when killed."""
    wanted = {rdev: gpu for rdev, gpu in job.wanted.items() if gpu in held}

    def still_holder(p: int) -> bool:
        if not backend.contains(job.key, p):
            return False
        again = _holds(p, wanted, time.monotonic() + BUDGET, backend.proc, first=True)
        return again is None or bool(again)
    try:
        if not signal_pid(pid, signal.SIGKILL, still_holder):
            return False
    except GecoError as exc:
        _log.error("job %s ended: cannot kill process %d of job %s, which holds its GPU %s "
                   "open: %s", ended.key, pid, job.key, gpushare.format_ids(held), exc)
        return False
    text = gpushare.format_ids(held)
    _log.warning("job %s ended: killed process %d of %s's job %s, which held the job's GPU "
                 "%s open (an fd handed over from the job: the kernel checks a device at "
                 "open only)", ended.key, pid, ended.owner, job.key, text,
                 extra=ended.journal.event("gpu-fd-revoked", PID=pid, HOLDER_JOB=job.key,
                                           GPU=text, USER=ended.owner))
    return True


def _out_of_time(ended: _EndedJob, backend: Backend, jobs: list[_Job],
                 looked: set[tuple[JobKey, int]], holders: tuple[Holder, ...]) -> Revoked:
    """Step 5: kill the owner's processes in ``jobs`` that were not looked at; journal it."""
    owner = ended.owner
    uid = _uid(owner)
    unreached = _kill_unlooked(ended.key, backend, jobs, looked, uid) if uid is not None else []
    text, pids = gpushare.format_ids(ended.ids), " ".join(map(str, unreached))
    _log.warning("job %s ended, but the look for its GPU %s among the processes of %s's other "
                 "jobs here ran out of its %g s: killed the %d process(es) of %s it did not "
                 "reach (%s), as any may hold the GPU", ended.key, text, owner, BUDGET,
                 len(unreached), owner, pids or "none",
                 extra=ended.journal.event("gpu-fds-unchecked", GPUS=text, USER=owner,
                                           PIDS=pids or None, KILLED=len(unreached)))
    return Revoked(holders, tuple(unreached), complete=False)


def _kill_unlooked(key: JobKey, backend: Backend, jobs: list[_Job],
                   looked: set[tuple[JobKey, int]], uid: int) -> list[int]:
    """SIGKILL the processes of ``uid`` in ``jobs`` that were not ``looked`` at, each pinned
    and still in its job, listing them again until a listing shows none new (one may have
    forked meanwhile); return their pids, sorted."""
    tried = set(looked)
    killed: list[int] = []
    for _ in range(_PASSES):
        fresh = [(job.key, pid) for job in jobs for pid in backend.pids(job.key)
                 if (job.key, pid) not in tried]
        if not fresh:
            break
        for job_key, pid in fresh:
            tried.add((job_key, pid))
            try:
                if signal_pid(pid, signal.SIGKILL, _owned_in(backend, job_key, uid)):
                    killed.append(pid)
            except GecoError as exc:
                _log.error("job %s ended: cannot kill process %d of job %s: %s", key, pid,
                           job_key, exc)
    return sorted(killed)


def _owned_in(backend: Backend, key: JobKey, uid: int) -> Callable[[int], bool]:
    """A test of a pid: a process of ``uid`` (its real uid) in job ``key``."""
    def owned(pid: int) -> bool:
        return procfs.real_uid(pid, backend.proc) == uid and backend.contains(key, pid)
    return owned


def _uid(owner: str) -> int | None:
    """The owner's uid, None for root or a name that is no user here (nothing to kill)."""
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        return None
    return uid or None
