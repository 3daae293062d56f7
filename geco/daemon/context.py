"""gecod's shared state, and what every kind of request it serves is made of.

:class:`GecodContext` is what the work of each request kind (the quarantine of
JOB_STARTED and QUARANTINE_SELF, HOOK and STARTER, ssh's ADOPT, STATUS, the
cluster channel's requests) and a job's end share: settings, the node's cgroups,
its topology, the jobs gecod knows and their locks. :class:`Peer` is the kernel's
word on a request's sender; :class:`Outcome` what gecod answers it with an ACK.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from geco import procfs
from geco.cgroup import Backend, Limits
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.node.topology import Topology
from geco.resourceset import short_hostname
from geco.wire.messages import AckStatus

if TYPE_CHECKING:
    from geco.daemon.fastlane import FastLane
    from geco.sge.lookup import Found

__all__ = ["GecodContext", "Outcome", "Peer", "Shepherd", "WouldWait"]


@dataclass(frozen=True, slots=True)
class Peer:
    """The connecting process as the kernel names it (SO_PEERCRED at connect time)."""

    pid: int
    uid: int
    gid: int



@dataclass(frozen=True, slots=True)
class Shepherd:
    """A job's master ``sge_shepherd`` on this node (its exit ends the job here)."""

    key: JobKey
    pid: int
    # ``<queue>@<host>`` from the job's spooled config (what a stuck teardown disables),
    # None when it does not say
    queue_instance: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a request.

    Attributes
    ----------
    status: the ACK status.
    reason: one sentence for the journal (why refused, or what was done).
    created: True when this request created the job's cgroups.
    limits: the job's limits when the pid was quarantined.
    shepherd: set when the pid is the job's master shepherd (JOB_STARTED in the job's
        own spool dir, not a PE task's): gecod ends the job when it exits.
    first: the first process this gecod put into these cgroups (made now or by a hook):
        it starts watching the job (OOM kills); later tasks of the job need not.
    found: where the job's resources came from and how long that took, when this request
        read them (Grid Engine's own time, qstat's, is part of a job start's).
    """

    status: AckStatus
    reason: str
    created: bool = False
    limits: Limits | None = None
    shepherd: Shepherd | None = None
    first: bool = False
    found: Found | None = None

    @property
    def ok(self) -> bool:
        """True when the pid is in the job's cgroups."""
        return self.status is AckStatus.OK


@dataclass(slots=True)
class GecodContext:
    """gecod's shared state, lent to the work of every request kind (job starts, hooks, the
    starter, ssh logins, STATUS, other hosts' requests) and to a job's end: settings, the
    node's cgroups, its topology, the jobs it knows and their locks.

    Shared by all worker threads. ``config`` may be replaced on SIGHUP (one
    attribute assignment, atomic); the per-job locks keep two tasks of one
    job from both asking qstat and building its cgroups at the same time.
    """

    config: Config
    backend: Backend
    topology: Topology | None = None
    hostname: str = field(default_factory=short_hostname)
    proc: Path = procfs.ROOT
    # called when the node has too few free cores for a job: frees what ended jobs
    # still hold (gecod waits for the teardowns of jobs whose shepherd just exited)
    reclaim: Callable[[], None] | None = None
    # job -> (identity of its cgroups, their limits), learnt when a process first went in:
    # later tasks of the job join with one stat and the moves, nothing read again. A job
    # leaves it when a holder of its lock leaves it without cgroups (:meth:`job_lock`):
    # it holds the jobs running here, never every job the node ran
    ready: dict[JobKey, tuple[int, Limits]] = field(default_factory=dict)
    # the C lane that serves later tasks of the jobs in ``ready`` (None: Python serves all)
    lane: FastLane | None = None
    # jobs whose end has begun (their master shepherd exited, a teardown holds their
    # lock): no ssh session is moved into them any more
    ending: set[JobKey] = field(default_factory=set)
    _locks: dict[str, _KeyLock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def job_lock(self, key: JobKey, *, wait: bool = True, moves: bool = False,
                 timeout: float | None = None) -> Iterator[None]:
        """Hold the lock of job ``key``: created on first use, forgotten when nobody holds
        or waits for it, so the table does not grow with every job the node ever ran.
        ``wait=False``: raise :class:`WouldWait` instead of waiting for it; ``timeout``:
        raise it after waiting that long. Unless the holder only ``moves`` processes in,
        the fast lane stops serving the job first (a teardown must not find a task moved
        in behind it), and a job it leaves without cgroups (however it ended: the shepherd's
        exit, the epilog, the reaper, the master's release) is forgotten before the lock
        goes: nothing can make them again meanwhile."""
        with self._locks_guard:
            entry = self._locks.setdefault(key, _KeyLock())
            entry.users += 1
        try:
            if not entry.lock.acquire(blocking=wait, timeout=-1 if timeout is None or not wait
                                      else timeout):
                raise WouldWait(f"job {key}'s lock is held")
            try:
                if not moves and self.lane is not None:
                    self.lane.withdraw(key)
                yield
            finally:
                if not moves:
                    self._forget_if_gone(key)
                entry.lock.release()
        finally:
            with self._locks_guard:
                entry.users -= 1
                if entry.users == 0:
                    del self._locks[key]

    def _forget_if_gone(self, key: JobKey) -> None:
        """Under the job's lock: forget a job whose cgroups are gone (what ``ready`` knew of
        them no longer holds, and a node's months of jobs must not pile up in it)."""
        if key not in self.ready:
            return
        try:
            gone = not self.backend.exists(key)
        except GecoError:  # cannot tell: kept (its identity is checked before any use)
            return
        if gone:
            self.ready.pop(key, None)


@dataclass(slots=True)
class _KeyLock:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class WouldWait(Exception):
    """A request asked not to wait (gecod's loop) needs a worker: the job's lock is held, or
    its cgroups are new to this gecod (their limits must be read, or made)."""
