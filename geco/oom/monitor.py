"""gecod's side of OOM kills: watch every job cgroup in the runloop, report, apply the policy.

:class:`OomMonitor` keeps an :class:`geco.oom.OomWatch` per job cgroup in
gecod's runloop and hands each batch of new kills to :func:`handle`, which
writes them to the journal with ``GECO_EVENT=oom``, applies the policy, and
appends the owner's text (:func:`geco.oom.owner_message`) to the job's stderr
file as the owner (:func:`geco.oom.append_to_owner_file`).

Policy (``[gecod] oom``): ``kernel`` reports only; ``kill-job`` also ends the
whole job at its first kill, as Slurm's ``OOMKillStep`` does (it needs CAP_KILL).

Threads: :class:`OomMonitor` belongs to the runloop's thread; :func:`handle`
blocks (a fork per owner message, the cgroup kill) and runs in gecod's pool of
reports, one report of a job at a time: kills that come while one is being
written wait for it and go out together as the next (a job that OOMs every few
hundred milliseconds into a file that takes long costs one worker, never more).
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from geco import jobfiles, log
from geco.cgroup import Backend
from geco.errors import CgroupError, GecoError
from geco.jobkey import JobKey
from geco.oom.asowner import JobNamespace, StderrTarget, stderr_target, tell_owner
from geco.oom.kmsg import KMSG, KernelLog
from geco.oom.message import RequestHint, owner_message, request_hint
from geco.oom.watch import OomEvent, OomWatch, remove_counts
from geco.pools import Busy, Pool
from geco.resourceset import short_hostname
from geco.sge import execd, resourcefile
from geco.wire import cluster

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["POLICIES", "Loop", "OomMonitor", "check_policy", "handle"]

_log = log.get("oom.monitor")

POLICIES = ("kernel", "kill-job")
# A v1 wake-up comes before the kill is counted; look again after these delays.
_RECHECK_AFTER = (0.01, 0.1, 1.0)
# Kills of one report told one by one (journal record, paragraph); the rest are counted.
_ONE_BY_ONE = 20


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
           relay: Callable[[str], None] | None = None, write_timeout: float = 10.0
           ) -> int | None:
    """Report the kills of one job and apply the policy. Blocks: run it in a worker.

    Steps, in order:

    1. one journal record per kill, at warning (``PRIORITY=4``), with
       ``GECO_EVENT=oom``, ``JOB_ID``, ``SGE_TASK_ID``, ``LIMIT``, ``PEAK``,
       ``PID``, ``COMMAND``, ``OOM_KILLS`` (the message is the owner's text
       without "geco: ");
    2. ``kill-job``: end the whole job once (``backend.kill``), journaled as
       ``GECO_EVENT=oom-job-ended``;
    3. the owner's text, one paragraph per kill, appended to the job's stderr
       file as the owner (step 2 first: a hung file must not delay the kill); on
       a slave host of a parallel job, sent to the master host's gecod instead
       (``relay``), which appends it there: the owner reads it once.

    A failure in step 2 or 3 is logged (``oom-job-end-failed``,
    ``oom-report-failed``) and never raised: the other steps still happen.

    Parameters
    ----------
    events: kills of one job, oldest first (what one :meth:`OomWatch.check` returned).
    policy: ``kernel`` or ``kill-job``.
    backend: the cgroup backend (for ``kill-job``).
    target: the job's stderr file (:func:`stderr_target`); None = journal only.
    hint: the job's requests, for the remedy (:func:`request_hint`).
    relay: sends the text to the job's master host (raises GecoError); used when
        there is no ``target``.
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
    more = len(events) - _ONE_BY_ONE
    told = events[:_ONE_BY_ONE] if more > 0 else events
    for event in told:
        text = owner_message(event, hint)
        texts.append(text)
        _log.warning("%s", text.removeprefix("geco: "), extra=log.job_fields(
            event.job_id, event.task_id, "oom", LIMIT=event.limit, PEAK=event.peak,
            PID=event.pid or None, COMMAND=event.command or None,
            OOM_KILLS=event.kill_count, LIMIT_KIND=event.limit_kind,
            OOM_SCOPE="node" if event.node_wide else "job", NODE=event.node,
            GPUS=hint.gpus if hint is not None and hint.gpus else None))
    last = events[-1]
    if more > 0:
        _log.warning("job %s: %d more out-of-memory kills (%d in all so far)", last.key, more,
                     last.kill_count, extra=log.job_fields(
                         last.job_id, last.task_id, "oom-more", OOM_KILLS=last.kill_count,
                         MORE=more, LIMIT=last.limit, NODE=last.node))
        texts.append(f"geco: and {more} more processes of job {last.key} were killed on "
                     f"{last.node} for the same reason ({last.kill_count} in all so far).")
    killed: int | None = None
    if policy == "kill-job":
        try:
            # not the shepherd: it must live to report the job's end and run the epilog
            killed = backend.kill_except(last.key, spare=execd.is_job_shepherd)
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
    report = "".join(t + "\n" for t in texts)
    try:
        if target is not None:
            tell_owner(target, report, timeout=write_timeout)
        elif relay is not None:
            relay(report)
    except GecoError as exc:
        _log.warning("job %s: the out-of-memory report did not reach the owner's file: %s",
                     last.key, exc, extra=log.job_fields(
                         last.job_id, last.task_id, "oom-report-failed",
                         PATH=target.path if target else None,
                         OWNER=target.owner if target else None))
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
    master: str | None = None  # this host is a slave of the job: the owner's file is there
    ended: bool = False
    rechecks: tuple[_Cancellable, ...] = ()
    reports: list[Future[object]] = field(default_factory=list)  # handle() runs in workers
    # kills waiting for the report under way (one at a time per job), with their policy
    queued: list[tuple[list[OomEvent], str]] = field(default_factory=list)
    in_flight: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


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
    executor: where :func:`handle` runs (gecod's pool of reports, keyed by job and
        owner); None = in the loop (tests, the bench).
    node: this host's name in reports.
    kmsg: the kernel log to name victims from; None = do not read it.
    sweep_interval: seconds between sweeps that pick up job cgroups made
        without gecod (the prolog), drop removed ones, and re-read every
        counter (v1 signals no eventfd for a node-wide OOM's kill).
    on_events: called in the loop with each batch (before :func:`handle`);
        for tests and the bench.
    relay: sends a slave job's report to its master host (``relay(master, key, text)``,
        raises GecoError; :func:`geco.wire.cluster.report_oom`); None = journal only there.
    namespace_of: the job's mount namespace, where its stderr path is the job's
        (:func:`geco.job.privatetmp.namespace`); None = the paths are gecod's.

    Raises
    ------
    GecoError
        when the policy is not one of :data:`POLICIES`.
    """

    def __init__(self, loop: Loop, backend: Backend, *, state_dir: Path, policy: str = "kernel",
                 execd_spool_dir: Path | None = None, resources_dir: Path | None = None,
                 executor: Pool | None = None, node: str | None = None,
                 kmsg: Path | None = KMSG, sweep_interval: float = 60.0,
                 on_events: Callable[[list[OomEvent]], None] | None = None,
                 relay: Callable[[str, JobKey, str], None] | None = None,
                 namespace_of: Callable[[JobKey], JobNamespace] | None = None) -> None:
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
        self.relay = relay
        self.namespace_of = namespace_of
        self.kmsg: KernelLog | None = None
        self._jobs: dict[JobKey, _Job] = {}
        self._sweep: _Cancellable | None = None
        self._refused: set[JobKey] = set()
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

    def watch(self, key: JobKey, spool_dir: Path | None = None) -> bool:
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
            self.check(key)  # notices a cgroup re-created under the same name
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

    def unwatch(self, key: JobKey, *, forget: bool = True) -> None:
        """Stop watching job ``key``; ``forget`` also removes its persisted count (job over)."""
        job = self._jobs.pop(key, None)
        if job is None:
            if forget:
                with contextlib.suppress(GecoError):
                    remove_counts(self.state_dir, key)
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
        self._prune_counts(set(keys))

    def check_all(self) -> None:
        """Re-read every watched job's counter and report what is new."""
        for key in list(self._jobs):
            self.check(key)

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
        job.rechecks = tuple(self.loop.add_timer(delay, functools.partial(self.check, key))
                             for delay in _RECHECK_AFTER)

    def check(self, key: JobKey) -> None:
        """Re-read job ``key``'s counter now and report what is new (before its teardown:
        the kills that ended the job are reported while its cgroup still exists)."""
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
        key = job.watch.key
        if job.target is None:
            self._resolve(key, job)
        if self.executor is None:
            handle(found, policy, self.backend, target=job.target, hint=job.hint,
                   relay=self._relay_of(job))
            return
        with job.lock:
            job.queued.append((found, policy))
            if job.in_flight:
                return  # the report under way takes these next
            job.in_flight = True
        owner = job.target.owner if job.target is not None else job.master
        try:
            future: Future[object] = self.executor.submit_for(
                {"job": key, "owner": owner}, functools.partial(self._report, job))
        except (Busy, RuntimeError) as exc:  # the pool is full, or gecod is stopping
            with job.lock:
                dropped, job.queued, job.in_flight = job.queued, [], False
            _log.warning("job %s: %d out-of-memory kill(s) not reported: %s", key,
                         sum(len(batch) for batch, _ in dropped), exc,
                         extra=log.job_fields(key.job, key.task, "oom-report-failed",
                                              REASON=str(exc)))
            return
        job.reports = [f for f in job.reports if not f.done()]
        job.reports.append(future)

    def _relay_of(self, job: _Job) -> Callable[[str], None] | None:
        if job.master is None or self.relay is None:
            return None
        return functools.partial(self.relay, job.master, job.watch.key)

    def _report(self, job: _Job) -> None:
        """Worker: report the job's queued kills, and those that come meanwhile, until none
        is left (one report of a job at a time)."""
        while True:
            with job.lock:
                batches, job.queued = job.queued, []
                if not batches:
                    job.in_flight = False
                    return
            events = [event for batch, _ in batches for event in batch]
            policy = "kill-job" if any(p == "kill-job" for _, p in batches) else "kernel"
            handle(events, policy, self.backend, target=job.target, hint=job.hint,
                   relay=self._relay_of(job))

    def reporting(self, key: JobKey) -> list[Future[object]]:
        """The reports of job ``key``'s kills still under way (a slave's RELEASE waits for
        them: the master's stderr file is there only while the job is)."""
        job = self._jobs.get(key)
        return [f for f in job.reports if not f.done()] if job is not None else []

    # -- helpers --------------------------------------------------------------------

    def _resolve(self, key: JobKey, job: _Job) -> None:
        """Find the job's requests, master host and stderr file (small local files, read
        once per job)."""
        if job.hint is None and self.resources_dir is not None:
            try:
                rs = resourcefile.read(self.resources_dir, key)
            except GecoError as exc:
                _log.debug("job %s: no resource file for OOM remedies: %s", key, exc)
            else:
                job.hint = request_hint(rs, self.node)
                job.master = cluster.master(rs, self.node) if rs is not None else None
        if job.master is not None:
            return  # a slave of the job: its stderr file is the master's
        if job.target is None and self.execd_spool_dir is not None:
            spool = job.spool_dir or execd.find_spool_dir(self.execd_spool_dir, key, self.node)
            if spool is not None:
                try:
                    ns = self.namespace_of(key) if self.namespace_of is not None else None
                    job.target = stderr_target(spool, ns)
                except GecoError as exc:
                    _log.debug("job %s: no stderr file for OOM reports: %s", key, exc)

    def _prune_counts(self, live: Iterable[str]) -> None:
        """Remove count files of jobs whose cgroup is gone (ended while gecod was down)."""
        live = set(live)
        try:
            names = os.listdir(jobfiles.oom_dir(self.state_dir))
        except FileNotFoundError:
            return
        except OSError as exc:
            _log.warning("cannot list %s: %s", jobfiles.oom_dir(self.state_dir), exc)
            return
        for name in names:
            if name.startswith(".") or name in live:
                continue
            with contextlib.suppress(GecoError):
                remove_counts(self.state_dir, JobKey.parse(name))
