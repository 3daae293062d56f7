"""gecod's shepherd watch: the moment a job's ``sge_shepherd`` exits, the job ends here.

With the exec() preload, gecod puts each job's shepherd into the job's cgroups
at its exec (:mod:`geco.daemon.quarantine`), and the pidfd it opened for that
request tells it when the shepherd exits: the job is over on this node (Grid
Engine ran it, and its epilog if one is configured, under that shepherd). The
watch decides that, and ends the job as every end does
(:func:`geco.job.ending.end_job`: the job's accounting in the journal, leftovers
killed, cgroups removed, a stuck job escalated, its files forgotten, its owner's
strays looked for ``[strays] delay`` s later), so a queue with the preload needs
no prolog or epilog of geco's, and a core is free again as soon as the job's
processes are gone.

Only the job's master shepherd ends it: a ``qrsh -inherit`` task's shepherd
(working in a PE task dir below the job's) ends one task, and the job's
cgroups on a node stay until the job's own end (reaper). When the epilog also
runs, it has removed the cgroups already and this finds nothing to do; a job
the epilog found stuck (its queue disabled) is left to the reaper, which tries
again every round.

At start gecod finds the shepherds of the jobs already contained (by their
working directory) and watches them again, so a restart loses no job end.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from geco import log
from geco.cgroup import Backend
from geco.daemon.context import GecodContext, Shepherd
from geco.daemon.quarantine import spool_root
from geco.daemon.runloop import RunLoop
from geco.errors import GecoError
from geco.job import ending, teardown
from geco.jobkey import JobKey
from geco.pools import Busy, Pool
from geco.sge import execd

__all__ = ["ShepherdWatch"]

_log = log.get("daemon.shepherdwatch")


@dataclass(eq=False, slots=True)
class _Watch:
    shepherd: Shepherd
    pidfd: int


@dataclass(slots=True)
class _Pending:
    """Teardowns submitted and not finished: an allocation short of cores waits for them."""

    count: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)


class ShepherdWatch:
    """Watch master shepherds; end their job in a worker when one exits.

    Parameters
    ----------
    loop: gecod's runloop (a pidfd is readable once its process has exited).
    ctx: the quarantine context (its configuration, backend and per-job locks).
    executor: where teardowns run (gecod's pool of job ends: one job's at a time, and a
        user's strays after it).
    before_end: called in the loop with the key before its teardown is started (gecod
        reads the job's OOM counter one last time, while the cgroup exists).
    on_ended: called in the loop with each key whose cgroups are gone.
    """

    def __init__(self, loop: RunLoop, ctx: GecodContext, executor: Pool, *,
                 before_end: Callable[[JobKey], None] | None = None,
                 on_ended: Callable[[JobKey], None] | None = None) -> None:
        self.loop = loop
        self.ctx = ctx
        self.executor = executor
        self.before_end = before_end
        self.on_ended = on_ended
        self._watches: set[_Watch] = set()
        self._pending = _Pending()

    def watch(self, shepherd: Shepherd, pidfd: int) -> None:
        """Tear ``shepherd.key`` down when the process of ``pidfd`` exits (takes the fd)."""
        entry = _Watch(shepherd, pidfd)
        self._watches.add(entry)
        self.loop.add_source(pidfd, selectors.EVENT_READ, lambda fd, ev: self._exited(entry))

    def rewatch(self, backend: Backend, spool: Path) -> int:
        """Watch the master shepherds of the jobs already contained (gecod's start);
        ``spool`` is the execd spool dir as /proc names it.

        Returns
        -------
        How many shepherds are watched.
        """
        found = 0
        for key in backend.job_keys():
            for pid in backend.pids(key):
                try:
                    pidfd = os.pidfd_open(pid)  # first: what is checked next is this process
                except OSError:
                    continue  # gone meanwhile: the reaper ends its job
                job_dir = execd.job_start_dir(key, pid, spool)
                if job_dir is None:
                    os.close(pidfd)
                    continue
                self.watch(Shepherd(key, pid, execd.queue_instance(job_dir)), pidfd)
                found += 1
        return found

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no teardown is pending (at most ``timeout`` s); True when none is."""
        with self._pending.changed:
            return self._pending.changed.wait_for(lambda: self._pending.count == 0, timeout)

    def close(self) -> None:
        """Stop watching (gecod stopping): jobs still running are ended by the next gecod."""
        for entry in list(self._watches):
            self._drop(entry)

    def _drop(self, entry: _Watch) -> None:
        self._watches.discard(entry)
        self.loop.remove_source(entry.pidfd)
        with contextlib.suppress(OSError):
            os.close(entry.pidfd)

    def _exited(self, entry: _Watch) -> None:
        self._drop(entry)
        # the job is over here: from now on no ssh session goes into it (see geco.ssh.policy)
        self.ctx.ending.add(entry.shepherd.key)
        if self.before_end is not None:
            self.before_end(entry.shepherd.key)
        with self._pending.changed:
            self._pending.count += 1
        shepherd = entry.shepherd
        try:
            future = self.executor.submit_for({"job": shepherd.key},
                                              lambda: self._end(shepherd))
        except RuntimeError:  # the pool is shut down: gecod is stopping, the next one ends it
            self._finished(shepherd.key)
            return
        except Busy as exc:
            _log.warning("job %s: its shepherd exited, but its teardown cannot be started "
                         "(%s); the reaper ends it", shepherd.key, exc)
            self._finished(shepherd.key)
            return
        future.add_done_callback(lambda f: self._finished(shepherd.key))

    def _finished(self, key: JobKey | None = None) -> None:
        if key is not None:
            self.ctx.ending.discard(key)
        with self._pending.changed:
            self._pending.count -= 1
            self._pending.changed.notify_all()

    def _end(self, shepherd: Shepherd) -> None:
        """Worker: the job's shepherd is gone; end the job unless it started again."""
        key = shepherd.key
        try:
            ended = ending.end_job(
                execd.JobRef(key.job, key.task), self.ctx.config, self.ctx.backend,
                ending.Ender("gecod", self.ctx, lambda: self._over(shepherd),
                             shepherd.queue_instance))
        except (GecoError, OSError) as exc:  # the reaper retries what is left
            _log.warning("job %s: its shepherd exited but its teardown failed: %s", key, exc,
                         extra=log.job_fields(key.job, key.task, "teardown-failed",
                                              REASON=str(exc)))
            return
        if ended is not None and ended.strays is not None:
            self._strays_later(ended.owner, ended.strays)
        if ended is not None and ended.clean and self.on_ended is not None:
            self.loop.call_soon_threadsafe(functools.partial(self.on_ended, key))

    def _over(self, shepherd: Shepherd) -> bool:
        """Under the job's lock: True when the job is over here and still to be ended."""
        key, cfg, backend = shepherd.key, self.ctx.config, self.ctx.backend
        if not backend.exists(key):
            return False  # the epilog did it
        if teardown.found_stuck(cfg, key):
            _log.info("job %s: its shepherd exited; its teardown was found stuck "
                      "before, and the reaper tries again every round", key)
            return False
        spool = spool_root(cfg)
        restarted = [p for p in backend.pids(key)
                     if execd.job_start_dir(key, p, spool, or_forking=True)]
        if restarted:
            _log.info("job %s: its shepherd %d exited, but the job started again on "
                      "this node (pid %d); its cgroups stay", key, shepherd.pid, restarted[0])
            return False
        return True

    def _strays_later(self, owner: str | None, look: Callable[[], object]) -> None:
        """From a worker: look for the owner's strays ``[strays] delay`` s from now, when a
        client of the job on this node (qrsh, qsub -sync) has seen its end and exited."""
        def submit() -> None:
            # the pool is shut down (gecod stops) or full: the owner's next job end looks
            with contextlib.suppress(RuntimeError, Busy):
                self.executor.submit_for({"owner": owner}, look)
        self.loop.call_soon_threadsafe(
            functools.partial(self._later, self.ctx.config.strays_delay, submit))

    def _later(self, delay: float, work: Callable[[], None]) -> None:
        """In the loop: ``work`` in ``delay`` s."""
        self.loop.add_timer(delay, work)
