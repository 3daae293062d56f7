"""gecod's usage sampler: every running job's cgroups, every ``[usage] interval`` seconds.

A round, in a thread of its own (one round at a time: a tick that finds the last round
still running is skipped, never queued), reads each job cgroup's counters
(:meth:`geco.cgroup.Backend.usage`) and appends them to the job's samples file
(:mod:`geco.job.samples`). What a job was granted here and whose it is (the file's
header) is read once per job from its resource file and spool dir. The cost of a round
grows with the jobs on the node (at most one per core), not with anything a job does:
a job's processes, files or a reader holding its file's lock cost it its own samples,
never another job's or gecod's time (the lock is not waited for).

The job's end appends the last sample (:func:`geco.job.samples.keep_last`, from the
teardown); the reaper deletes ended jobs' files after ``[usage] keep_days``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from geco import log
from geco.cgroup import Backend
from geco.config import Config
from geco.daemon.reaper import Loop
from geco.errors import GecoError
from geco.job import samples
from geco.job.jobkey import JobKey
from geco.job.resourceset import ResourceSet, short_hostname
from geco.sge import resourcefile

__all__ = ["Sampler"]

_log = log.get("gecod.sampler")


@dataclass(eq=False)
class Sampler:
    """The sampling timer of gecod (see the module docstring).

    Parameters
    ----------
    loop: gecod's runloop (the timer).
    backend: the node's cgroup backend.
    cfg: the configuration (:meth:`reconfigure` replaces it on SIGHUP).
    node: this host's short name.
    """

    loop: Loop
    backend: Backend
    cfg: Config
    node: str = field(default_factory=short_hostname)
    rounds: int = field(default=0, init=False)
    _executor: ThreadPoolExecutor = field(init=False)
    _timer: Any = field(default=None, init=False)  # the loop's timer handle
    _round: Future[None] | None = field(default=None, init=False)
    _closing: threading.Event = field(default_factory=threading.Event, init=False)
    # the round's thread only: each job's header, read once; jobs already warned about
    _headers: dict[JobKey, samples.Header] = field(default_factory=dict, init=False)
    _warned: set[JobKey] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gecod-sampler")

    def start(self) -> None:
        interval = self.cfg.usage_interval
        self._timer = self.loop.add_timer(interval, self._tick, repeat=interval)

    def reconfigure(self, cfg: Config) -> None:
        """Use ``cfg`` from the next round on; a new interval re-arms the timer (SIGHUP)."""
        old, self.cfg = self.cfg.usage_interval, cfg
        if cfg.usage_interval != old and self._timer is not None:
            self._timer.cancel()
            self.start()

    def close(self) -> None:
        """Stop the timer and wait for a round under way (it stops after its job)."""
        self._closing.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _tick(self) -> None:
        if self._round is not None and not self._round.done():
            return  # the last round is still at it: this one is skipped, not queued
        self._round = self._executor.submit(self.sample_all)

    def _resources(self, key: JobKey) -> ResourceSet | None:
        try:
            return resourcefile.read(self.cfg.resources_dir, key)
        except GecoError:  # unreadable: the samples go on, with what the spool says
            return None

    def sample_all(self) -> None:
        """One round: a sample of every job cgroup on the node."""
        cfg = self.cfg
        try:
            keys = self.backend.job_keys()
        except GecoError as exc:
            _log.warning("usage sampler: cannot list the job cgroups: %s", exc)
            return
        now = time.time()
        for key in keys:
            if self._closing.is_set():
                return
            try:
                header = self._headers.get(key) or self._headers.setdefault(
                    key, samples.header_of(cfg, key, self.node, self._resources(key)))
                samples.append(cfg.usage_dir, header,
                               samples.Sample.from_usage(now, self.backend.usage(key)),
                               max_samples=cfg.usage_max_samples)
            except GecoError as exc:  # removed meanwhile, or its file refused
                if key not in self._warned and self.backend.exists(key):
                    self._warned.add(key)
                    _log.log(samples.level_of(exc), "job %s: no usage sample: %s", key, exc,
                             extra=log.job_fields(key.job, key.task, "usage-sample-failed"))
        for gone in set(self._headers) - set(keys):
            del self._headers[gone]
        self._warned &= set(keys)
        self.rounds += 1
