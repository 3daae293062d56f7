"""gecod's reaper: remove what jobs leave behind, kill what outlives its walltime.

The epilog, or gecod's shepherd watch, ends each job as it finishes
(:func:`geco.job.ending.end_job`). The reaper is the backstop for what they miss --
an epilog that never ran (execd killed, node rebooted mid-job, a hook
misconfigured), a cgroup the epilog could not empty -- and for processes Grid
Engine does not track (OAR's Sarko): every ``[gecod] reaper_interval`` seconds,
and once a few seconds after gecod starts, a round runs in a worker thread. One
round, in order:

1. list the job cgroups (``backend.job_keys()``);
2. per job, decide (:class:`Verdict`):

   a. its execd spool dir ``<execd_spool_dir>/<host>/active_jobs/<key>``
      exists -> ALIVE (sge_execd removes it only after the epilog ran);
   b. its cgroups are younger than :func:`min_age` -> YOUNG, judged next round
      (qmaster's view lags behind a job that is being dispatched);
   c. qstat: the task runs on this host -> ALIVE; Grid Engine does not know
      the job, the task is not running, or it runs elsewhere -> GONE; qstat
      fails -> UNKNOWN: kept (never kill what may run), warned about once per
      round, and qstat is not asked again in that round;

3. GONE: end it (:func:`geco.job.ending.end_job`, as every way a job ends does): under
   its lock, look at the spool once more (the job may just have been re-dispatched
   here), then tear it down (freeze, SIGKILL, thaw, wait, remove) and forget its
   resource file and OOM count file; journal ``GECO_EVENT=reaped``, then look for
   its owner's strays. Cgroups that cannot be emptied stay and are tried again
   every round (one ``reaped`` record per round); tear_down disables the
   host's queues for such a job once (``[epilog] disable_queue_on_stuck``), so
   a queue an admin enabled again is not disabled every round;
4. ALIVE, with ``[gecod] walltime_backstop``: a job whose resource file has an
   ``h_rt`` (``runtime_limit``) and whose start (the mtime of its spool
   ``config``, which sge_execd writes just before the shepherd starts, else of
   its resource file) + h_rt + ``walltime_grace`` has passed loses every
   process but its ``sge_shepherd`` (SIGKILL; the shepherd sees its child die,
   runs the epilog and reports the job's end), journaled
   ``GECO_EVENT=walltime-kill`` -- every round while such processes remain;
5. trace files (``<trace_dir>/*.trace``) older than ``[log] trace_keep_days``
   are deleted (0 = keep them).

A round never raises: a job that fails is logged and the next one is looked
at, a round that fails is logged and the timer goes on. All of it runs in the
executor given (gecod gives the reaper a thread of its own, so a 30 s
teardown never delays a quarantine request); the runloop's callback only
submits the round, and skips a tick while the previous round still runs.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Protocol

from geco import jobfiles, log
from geco.cgroup import Backend
from geco.config import Config
from geco.errors import GecoError, JobNotFound, TaskNotRunning
from geco.job import ending, teardown
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet, short_hostname
from geco.sge import execd, qstat, resourcefile
from geco.usage import samples
from geco.usage.sampler import Loop

__all__ = ["FIRST_ROUND_DELAY", "Reaper", "RoundReport", "Verdict", "min_age", "prune_old",
           "prune_traces"]

_log = log.get("daemon.reaper")

# The first round comes this soon after start (or after one interval, if shorter):
# a node that rebooted mid-job has its leftovers removed at once, not minutes later.
FIRST_ROUND_DELAY = 5.0
# A cgroup younger than this is never judged: qmaster may not list a task as
# running yet while it is being dispatched (qstat.fetch's TaskNotRunning "race at
# start"). Rounds closer together than 30 s (tests) shorten it to two intervals.
_MIN_AGE = 60.0
_DAY = 86400.0


def min_age(interval: float) -> float:
    """Seconds a job's cgroups must exist before the reaper judges them.

    ``min(60, 2 x interval)``: a minute in production, two rounds when the
    rounds are closer together (a test's ``reaper_interval = 1``), so a
    just-dispatched job is never asked about while qmaster still lags.
    """
    return min(_MIN_AGE, 2.0 * interval)


class Verdict(enum.Enum):
    """What a round decided about one job cgroup."""

    ALIVE = "alive"      # in the execd spool, or running on this host per qstat
    GONE = "gone"        # no spool dir, and qstat says it does not run here
    YOUNG = "young"      # too new to judge (or vanished while looked at)
    UNKNOWN = "unknown"  # no spool dir and qstat failed: kept


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What one round did (for tests, the bench, and the round's debug line).

    Attributes
    ----------
    verdicts: key -> the verdict, for every job cgroup the round looked at.
    reaped: jobs torn down whose cgroups are gone now.
    stuck: jobs torn down whose cgroups could not be emptied (kept, retried).
    walltime_killed: (key, processes killed) per job past h_rt + grace.
    traces_removed: trace files deleted.
    qstat_error: why qstat failed this round ("" when it did not, or was not asked).
    """

    verdicts: dict[str, Verdict]
    reaped: tuple[str, ...] = ()
    stuck: tuple[str, ...] = ()
    walltime_killed: tuple[tuple[str, int], ...] = ()
    traces_removed: int = 0
    qstat_error: str = ""

    def keys(self, verdict: Verdict) -> list[str]:
        """The jobs that got ``verdict``, in key order."""
        return [k for k, v in self.verdicts.items() if v is verdict]


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


# ---------------------------------------------------------------------------
# small facts read from the system
# ---------------------------------------------------------------------------


def prune_traces(trace_dir: Path, keep_days: int, now: float | None = None) -> int:
    """Delete trace files (``*.trace``) older than ``keep_days`` days (:func:`prune_old`)."""
    return prune_old(trace_dir, keep_days, jobfiles.is_trace,
                     "trace", now)


def prune_old(directory: Path, keep_days: int, is_ours: Callable[[str], bool], what: str,
              now: float | None = None) -> int:
    """Delete ``what`` files older than ``keep_days`` days; return how many were deleted.

    Only regular files directly in ``directory`` whose name ``is_ours`` are
    candidates: a misconfigured directory (``/var/log``) loses nothing else.
    Nothing is followed: ``directory`` itself must not be a symbolic link,
    entries are judged by ``lstat``, and each is unlinked relative to the
    opened directory, so a link put in place of a file is removed, never its
    target.

    Parameters
    ----------
    directory: ``[log] trace_dir``, the usage samples' directory; a missing one is
        nothing to do.
    keep_days: ``[log] trace_keep_days``, ``[usage] keep_days``; 0 keeps every file.
    now: epoch seconds (default: the current time).

    Raises
    ------
    GecoError
        when the directory cannot be opened or listed (a symbolic link, no
        permission).
    """
    if keep_days <= 0:
        return 0
    cutoff = (time.time() if now is None else now) - keep_days * _DAY
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and directory.is_symlink():
            raise GecoError(f"the {what} directory must not be a symbolic link (geco follows "
                            f"none), got one to {os.readlink(directory)}",
                            path=directory) from exc
        raise GecoError.from_oserror(f"cannot open the {what} directory", exc,
                                     path=directory) from exc
    removed = 0
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if not is_ours(entry.name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff:
                        continue
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    continue  # removed meanwhile
                except OSError as exc:
                    _log.warning("cannot remove the old %s file %s: %s", what,
                                 directory / entry.name, exc)
                    continue
                removed += 1
    except OSError as exc:
        raise GecoError.from_oserror(f"cannot list the {what} directory", exc,
                                     path=directory) from exc
    finally:
        os.close(fd)
    return removed


# ---------------------------------------------------------------------------
# the reaper
# ---------------------------------------------------------------------------


@dataclass(eq=False)
class Reaper:
    """The reaper timer of gecod (see the module docstring for what a round does).

    Parameters
    ----------
    loop: gecod's runloop (the timer, and handing ``on_reaped`` back).
    backend: the node's cgroup backend.
    cfg: the configuration; :meth:`reconfigure` replaces it (SIGHUP).
    executor: where rounds run (one at a time).
    node: this host's short name (default: from ``uname``), as the spool dir and
        qstat's host lists name it.
    clock: epoch seconds (tests move time).
    fetch: :func:`geco.sge.qstat.fetch` (tests pass a stand-in).
    on_reaped: called in the loop's thread with each key whose cgroups the
        reaper removed (gecod stops watching it for OOM kills).
    gate: gecod's per-job lock and its set of ending jobs (:func:`geco.job.ending.end_job`:
        the job's end through its shepherd, :mod:`geco.daemon.shepherdwatch`, then finds
        it done, and no ssh session goes into it meanwhile).
    """

    loop: Loop
    backend: Backend
    cfg: Config
    executor: Executor
    _: KW_ONLY
    node: str = field(default_factory=short_hostname)
    clock: Callable[[], float] = time.time
    fetch: Callable[..., ResourceSet] = qstat.fetch
    on_reaped: Callable[[JobKey], None] | None = None
    gate: ending.Gate | None = None
    rounds: int = field(default=0, init=False)
    _timer: _Cancellable | None = field(default=None, init=False)
    _first: _Cancellable | None = field(default=None, init=False)
    _round: Future[RoundReport] | None = field(default=None, init=False)
    _said_busy: bool = field(default=False, init=False)
    _closing: threading.Event = field(default_factory=threading.Event, init=False)
    # touched by the round's thread only (one round at a time):
    # jobs found stuck by an earlier round (journaled as RETRY=1)
    _stuck: set[str] = field(default_factory=set, init=False)
    # resource files already warned about, by (key, mtime_ns, size): warn again on change
    _bad_files: set[tuple[str, int, int]] = field(default_factory=set, init=False)
    # warned that the spool root is missing (until it is back)
    _said_no_spool: bool = field(default=False, init=False)

    # -- life cycle -------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between rounds (``[gecod] reaper_interval``)."""
        return self.cfg.gecod_reaper_interval

    def start(self) -> None:
        """Arm the timer: a first round soon, then one every interval."""
        interval = self.interval
        if interval > FIRST_ROUND_DELAY:
            self._first = self.loop.add_timer(FIRST_ROUND_DELAY, self._tick)
        self._timer = self.loop.add_timer(interval, self._tick, repeat=interval)
        _log.info("reaper: a round every %g s (cgroups judged after %g s; walltime backstop "
                  "%s)", interval, min_age(interval),
                  f"h_rt + {self.cfg.gecod_walltime_grace:g} s"
                  if self.cfg.gecod_walltime_backstop else "off")

    def reconfigure(self, cfg: Config) -> None:
        """Use ``cfg`` from the next round on; a new interval re-arms the timer (SIGHUP)."""
        old = self.interval
        self.cfg = cfg
        if cfg.gecod_reaper_interval != old and self._timer is not None:
            self._timer.cancel()
            interval = cfg.gecod_reaper_interval
            self._timer = self.loop.add_timer(interval, self._tick, repeat=interval)
            _log.info("reaper: a round every %g s now (was %g s)", interval, old)

    def close(self) -> None:
        """Stop the timer; a running round stops after the job it is at (call it in the loop).

        The caller then shuts the executor down waiting: a teardown cut short
        could leave a job frozen.
        """
        self._closing.set()
        for timer in (self._first, self._timer):
            if timer is not None:
                timer.cancel()
        self._first = self._timer = None

    # -- the loop side ------------------------------------------------------------

    def _tick(self) -> None:
        if self._closing.is_set():
            return
        if self._round is not None and not self._round.done():
            # said once per slow round (stuck teardowns, a hanging qstat), not every tick
            if not self._said_busy:
                self._said_busy = True
                _log.info("reaper: the previous round is still running; ticks are skipped "
                          "until it ends")
            return
        try:
            self._round = self.executor.submit(self.run_round)
        except RuntimeError:  # the executor is shut down: gecod is stopping
            return
        self._said_busy = False

    def _reaped(self, key: JobKey) -> None:
        if self.on_reaped is not None:
            self.loop.call_soon_threadsafe(functools.partial(self.on_reaped, key))

    # -- a round (in a worker) ------------------------------------------------------

    def run_round(self) -> RoundReport:
        """Run one round now, in the calling thread (a worker); never raises.

        Returns
        -------
        What the round did; a round that failed as a whole returns an empty report.
        """
        try:
            return self._run_round(self.cfg)
        except Exception:
            _log.error("reaper round failed; the next one comes in %g s", self.interval,
                       exc_info=True, extra=log.job_fields(None, None, "reaper-round-failed"))
            return RoundReport({})
        finally:
            self.rounds += 1

    def _run_round(self, cfg: Config) -> RoundReport:
        verdicts: dict[str, Verdict] = {}
        reaped: list[str] = []
        stuck: list[str] = []
        killed: list[tuple[str, int]] = []
        qstat_error = ""
        try:
            keys = self.backend.job_keys()
        except GecoError as exc:
            _log.error("reaper: cannot list the job cgroups: %s", exc,
                       extra=log.job_fields(None, None, "reaper-round-failed"))
            keys = []
        self._stuck &= set(keys)
        self._bad_files = {v for v in self._bad_files if v[0] in keys}
        spool_missing = bool(keys) and not cfg.execd_spool_dir.is_dir()
        if spool_missing and not self._said_no_spool:
            _log.warning("reaper: the execd spool dir %s does not exist ([paths] "
                         "execd_spool_dir); every job is judged by qstat alone",
                         cfg.execd_spool_dir,
                         extra=log.job_fields(None, None, "reaper-no-spool",
                                              PATH=cfg.execd_spool_dir))
        self._said_no_spool = spool_missing
        for key in keys:
            if self._closing.is_set():
                break
            try:
                spool = execd.find_spool_dir(cfg.execd_spool_dir, key, self.node)
                verdict, why = self._decide(cfg, key, spool, qstat_error)
                if verdict is Verdict.UNKNOWN:
                    qstat_error = why
                verdicts[key] = verdict
                if verdict is Verdict.GONE:
                    result = self._reap(cfg, key, why)
                    if result is not None:
                        (reaped if result.clean else stuck).append(key)
                elif verdict is Verdict.ALIVE and cfg.gecod_walltime_backstop:
                    count = self._walltime(cfg, key, spool)
                    if count:
                        killed.append((key, count))
            except (GecoError, OSError) as exc:
                # a cgroup removed while we looked (the epilog), an unreadable file
                _log.warning("reaper: job %s skipped this round: %s", key, exc,
                             extra=log.job_fields(key.job, key.task, "reaper-job-failed"))
        unknown = [k for k, v in verdicts.items() if v is Verdict.UNKNOWN]
        if unknown:
            _log.warning("reaper: qstat failed (%s); keeping the cgroups of %d job(s) without "
                         "a spool dir until qstat answers: %s", qstat_error, len(unknown),
                         " ".join(unknown),
                         extra=log.job_fields(None, None, "reaper-qstat-failed",
                                              REASON=qstat_error, JOBS=" ".join(unknown)))
        removed = self._prune(cfg)
        self._forget_orphans(cfg, set(keys))
        report = RoundReport(verdicts, tuple(reaped), tuple(stuck), tuple(killed), removed,
                             qstat_error)
        _log.debug("reaper round: %d job(s): %s; %d trace file(s) removed", len(verdicts),
                   ", ".join(f"{k} {v.value}" for k, v in verdicts.items()) or "none", removed)
        return report

    def _decide(self, cfg: Config, key: JobKey, spool: Path | None,
                qstat_error: str) -> tuple[Verdict, str]:
        """The verdict on one job and why (see steps 2a-2c of the module docstring)."""
        if spool is not None:
            return Verdict.ALIVE, f"in the execd spool ({spool})"
        changed = self.backend.last_changed(key)
        if changed is None:
            return Verdict.YOUNG, "its cgroups vanished"
        if self.clock() - changed < min_age(cfg.gecod_reaper_interval):
            return Verdict.YOUNG, "its cgroups are too new to judge"
        if qstat_error:
            return Verdict.UNKNOWN, qstat_error  # asked once per round, and it failed
        job, task = key.job, key.task
        try:
            rs = self.fetch(job, task, cfg, None)
        except JobNotFound:
            return Verdict.GONE, "not in the execd spool, and Grid Engine does not know the job"
        except TaskNotRunning:
            return Verdict.GONE, "not in the execd spool, and qstat says the task is not running"
        except GecoError as exc:  # QstatError: it failed; QstatParseError: nonsense
            return Verdict.UNKNOWN, str(exc)
        if rs.node(self.node) is None:
            hosts = ", ".join(n.name for n in rs.nodes) or "no host"
            return Verdict.GONE, (f"not in the execd spool, and qstat says the task runs on "
                                  f"{hosts}, not on {self.node}")
        return Verdict.ALIVE, "running on this host according to qstat"

    def _reap(self, cfg: Config, key: JobKey, why: str) -> teardown.Teardown | None:
        """End a gone job (:func:`geco.job.ending.end_job`) and journal it (``reaped``); its
        owner's strays are looked for after that record."""
        # the spool (and the queue instance in its config) is gone: None = every queue
        # of this host; tear_down disables it once per stuck job, not every round
        ended = ending.end_job(execd.JobRef(key.job, key.task), cfg, self.backend, ending.Ender(
            "reaper", self.gate, lambda: self._still_gone(cfg, key)))
        if ended is None:
            return None
        self._journal(cfg, key, why, ended.teardown)
        if ended.strays is not None:
            ended.strays()
        return ended.teardown

    def _still_gone(self, cfg: Config, key: JobKey) -> bool:
        """Under the job's lock: the qstat call took time; the job may have been
        re-dispatched here, or the epilog (late, not gone) may have removed the cgroups."""
        if execd.find_spool_dir(cfg.execd_spool_dir, key, self.node) is not None:
            _log.info("reaper: job %s is back in the execd spool; left alone", key)
            return False
        if not self.backend.exists(key):
            _log.debug("reaper: job %s was removed meanwhile", key)
            return False
        return True

    def _journal(self, cfg: Config, key: JobKey, why: str, result: teardown.Teardown) -> None:
        """``reaped``: the cgroups removed, or kept and tried again next round."""
        job, task = key.job, key.task
        retry = key in self._stuck
        fields: dict[str, object] = {"KILLED": result.killed, "REASON": why,
                                     "CGROUPS_REMOVED": int(result.clean),
                                     "CLEANED_BY": "reaper",
                                     "QUEUE_DISABLED": result.queue_disabled}
        if result.clean:
            self._stuck.discard(key)
            _log.info("job %s no longer runs on this node (%s): its cgroups were removed, "
                      "%d leftover process(es) killed", key, why, result.killed,
                      extra=log.job_fields(job, task, "reaped", **fields))
            self._reaped(key)
            return
        self._stuck.add(key)
        pids = " ".join(str(p.pid) for p in result.stuck)
        what = f"process(es) {pids} cannot be killed" if pids else \
            f"its cgroups cannot be removed ({result.error})"
        _log.warning("job %s no longer runs on this node (%s), but %s; its cgroups are "
                     "kept and tried again in %g s", key, why, what,
                     cfg.gecod_reaper_interval,
                     extra=log.job_fields(job, task, "reaped", PIDS=pids or None,
                                          STATES=" ".join(p.brief for p in result.stuck)
                                          or None, RETRY=int(retry), **fields))

    def _walltime(self, cfg: Config, key: JobKey, spool: Path | None) -> int:
        """Kill a running job's processes past h_rt + grace, sparing its shepherd.

        Returns
        -------
        How many processes were signalled (0 when the job is within its walltime).
        """
        job, task = key.job, key.task
        rs = self._resources(cfg, key)
        if rs is None or rs.runtime_limit <= 0:
            return 0
        path = jobfiles.resource_file(cfg.resources_dir, key)
        start = execd.job_started(spool, path)
        if start is None:
            return 0
        now = self.clock()
        running = now - start
        if running <= rs.runtime_limit + cfg.gecod_walltime_grace:
            return 0
        victims = [p for p in self.backend.pids(key) if not execd.is_job_shepherd(p)]
        if not victims:
            return 0  # only the shepherd is left: Grid Engine is ending the job
        count = self.backend.kill_except(key, spare=execd.is_job_shepherd)
        if count:
            _log.warning("job %s has run %d s, past its h_rt of %g s plus the %g s grace: "
                         "killed %d process(es) Grid Engine did not end (its sge_shepherd is "
                         "spared to end the job)", key, running, rs.runtime_limit,
                         cfg.gecod_walltime_grace, count,
                         extra=log.job_fields(job, task, "walltime-kill", KILLED=count,
                                              H_RT=f"{rs.runtime_limit:g}",
                                              RUNNING_FOR=int(running),
                                              WALLTIME_GRACE=f"{cfg.gecod_walltime_grace:g}"))
        return count

    def _resources(self, cfg: Config, key: JobKey) -> ResourceSet | None:
        """The job's resource file, or None (missing; unusable and qstat cannot help:
        warned once per version). An unusable one is read again from qstat and written
        anew (a job runs on, and its later tasks and OOM reports need it), with the GPUs geco
        picked for it here put back (:func:`geco.sge.resourcefile.rewrite`)."""
        job, task = key.job, key.task
        path = jobfiles.resource_file(cfg.resources_dir, key)
        try:
            return resourcefile.read(cfg.resources_dir, key)
        except GecoError as exc:
            with contextlib.suppress(GecoError):
                rs = resourcefile.rewrite(cfg.resources_dir, self.fetch(job, task, cfg, None),
                                          self.node, contained=True)
                _log.warning("job %s: its resource file %s was unusable (%s); read again "
                             "from qstat and written anew", key, path, exc,
                             extra=log.job_fields(job, task, "resource-file-rewritten",
                                                  PATH=path))
                return rs
            try:
                st = os.stat(path)
                version = (key, st.st_mtime_ns, st.st_size)
            except OSError:
                version = (key, 0, 0)
            if version not in self._bad_files:
                self._bad_files = {v for v in self._bad_files if v[0] != key} | {version}
                _log.warning("job %s: the walltime backstop cannot use the resource file %s: "
                             "%s; write it again from qstat with: geco rsrcinfo -j %s -s %s",
                             key, path, exc, key, path,
                             extra=log.job_fields(job, task, "resource-file-unusable",
                                                  PATH=path))
            return None

    def _forget_orphans(self, cfg: Config, keys: set[JobKey]) -> None:
        """Forget the jobs whose files (:data:`geco.jobfiles.ENDED`) outlived them here:
        without cgroups, their files older than a round, and no spool dir here (their
        cgroups were removed to free cores, with no one to end the job: gecod down), or no
        resource file (what rode with it, left by a geco that did not know it)."""
        old = self.clock() - min_age(cfg.gecod_reaper_interval)
        for key, changed in jobfiles.kept(cfg).items():
            try:
                if key in keys or changed > old or (
                        jobfiles.resource_file(cfg.resources_dir, key).exists()
                        and execd.find_spool_dir(cfg.execd_spool_dir, key, self.node)):
                    continue
            except (GecoError, OSError) as exc:  # tried again next round
                _log.debug("reaper: job %s: its files are kept: %s", key, exc)
                continue
            jobfiles.forget(cfg, key)
            _log.info("reaper: job %s has no cgroups here and its files outlived it; "
                      "removed them", key,
                      extra=log.job_fields(key.job, key.task, "resource-file-pruned"))
        self._remove_orphan_namespaces(cfg, keys)

    def _remove_orphan_namespaces(self, cfg: Config, keys: set[JobKey]) -> None:
        """Remove the private /tmp of jobs without cgroups here (a job's end that could not
        remove it, or gecod stopped between a job's cgroups and its namespace): a job's
        namespace is made after its cgroups and goes after them."""
        try:
            names = os.listdir(jobfiles.pins_dir(cfg.state_dir))
        except OSError:
            return
        for name in names:
            if not JobKey.is_key_text(name) or (key := JobKey.parse(name)) in keys:
                continue
            try:  # a job contained since the round listed the cgroups has them by now
                if self.backend.exists(key):
                    continue
            except GecoError:
                continue
            from geco.job import privatetmp  # nodes with private /tmp only

            journal = log.JobFields(key.job, key.task)
            freed = privatetmp.free(cfg, key, journal)
            if freed is not None:
                _log.info("reaper: job %s has no cgroups here; removed its private /tmp "
                          "(%d bytes) and /dev/shm (%d bytes)", key, freed.tmp, freed.shm,
                          extra=journal.event("private-tmp-pruned", TMP_FREED=freed.tmp,
                                              SHM_FREED=freed.shm))

    def _prune(self, cfg: Config) -> int:
        """Old trace files and ended jobs' usage samples go; return the traces removed."""
        self._prune_old(cfg.usage_dir, cfg.usage_keep_days, samples.is_file_name, "usage")
        return self._prune_old(cfg.trace_dir, cfg.trace_keep_days,
                               jobfiles.is_trace, "trace")

    def _prune_old(self, directory: Path, keep_days: int, is_ours: Callable[[str], bool],
                   what: str) -> int:
        try:
            removed = prune_old(directory, keep_days, is_ours, what, self.clock())
        except GecoError as exc:
            _log.warning("reaper: old %s files are not removed: %s", what, exc,
                         extra=log.job_fields(None, None, f"{what}-prune-failed"))
            return 0
        if removed:
            _log.info("reaper: removed %d %s file(s) older than %d day(s) from %s",
                      removed, what, keep_days, directory,
                      extra=log.job_fields(None, None, f"{what}s-pruned" if what == "trace"
                                           else f"{what}-pruned", COUNT=removed))
        return removed

