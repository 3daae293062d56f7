"""gecod's usage sampler: every running job's cgroups, every ``[usage] interval`` seconds.

A round, in a thread of its own (one round at a time: a tick that finds the last round
still running is skipped, never queued), reads each job cgroup's counters and appends
them to the job's samples file (:mod:`geco.usage.samples`). Both are opened at a job's
first round and held (:class:`geco.cgroup._counters.Held`,
:class:`~geco.usage.samples.Writer`): a round is then a ``pread`` per counter and a
``pwrite`` per job (under the writers' lock, taken for each), within a quarter of
gecod's open-file limit (beyond it a job's files are opened each round). What a job was
granted here and whose it is (the file's header) is read once per job from its resource
file and spool dir. The cost of a round
grows with the jobs on the node (at most one per core), not with anything a job does:
a job's processes or files cost it its own samples, never another job's or gecod's
time, and a lock its owner takes on its file costs nothing (the writers' lock is root's
own, :mod:`geco.rootlock`, and not waited for).

The job's end appends the last sample (:func:`geco.usage.samples.keep_last`, from the
teardown); the reaper deletes ended jobs' files after ``[usage] keep_days``.

Each round also leaves its figures in memory, :attr:`Sampler.latest` (a
:class:`Snapshot`, replaced whole at the round's end: a reader never sees half a
round): every job's header and last sample (a job whose cgroups are gone is in no
later snapshot) and the node's cores and memory free for jobs. gecod's Prometheus
endpoint (:mod:`geco.daemon.metrics`) reads only that, so a scrape never touches the
kernel or a file.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from geco import log
from geco._tuple import NamedTuple
from geco.cgroup import Backend
from geco.cgroup._counters import Counter, Held, read_once
from geco.config import Config
from geco.cpulist import parse_cpulist
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.node.limits import jobs_memory
from geco.node.topology import Topology
from geco.resourceset import ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.usage import samples

__all__ = ["Health", "JobFigures", "Loop", "NodeFigures", "Sampler", "Snapshot"]

_log = log.get("usage.sampler")


class Loop(Protocol):
    """What the sampler and the reaper need of gecod's runloop
    (:class:`geco.daemon.runloop.RunLoop`)."""

    def add_timer(self, delay: float, callback: Callable[[], None],
                  repeat: float | None = None) -> Any: ...

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None: ...

# The figures a sample keeps: only their counter files are read.
_SAMPLED = frozenset(samples.USAGE_NAMES)
# The share of gecod's open-file limit the sampler's held files may take (the rest is
# the server's: connections, journald, cgroup reads).
_FD_SHARE = 4


class Health(NamedTuple):
    """gecod's own counters at a scrape (memory reads only), served beside the
    :class:`Snapshot` (:mod:`geco.usage.exposition`)."""

    requests: int
    refused: int
    queue_depth: int


class JobFigures(NamedTuple):
    """One job task at the last round: what it was granted, what it used."""

    header: samples.Header
    sample: samples.Sample


class NodeFigures(NamedTuple):
    """The node at the last round, as jobs see it.

    ``cores``: the units a job's slot gets (whole cores, or hardware threads with
    ``[cores] hardware_threads``) among the cpus geco hands out less ``[cgroup]
    cpus_reserve``; ``cores_free``: those no job holds a cpu of. ``memory``: what all
    jobs together may use (the RAM less ``[cgroup] memory_reserve``); ``memory_free``:
    that less every job's limit (0 at least); ``memory_used``: the jobs' memory now.
    """

    cores: int
    cores_free: int
    memory: int
    memory_free: int
    memory_used: int
    jobs: int


class Snapshot(NamedTuple):
    """A sampler round's figures (``rounds``: rounds done so far; ``node`` None when the
    GECO parent could not be read)."""

    at: float = 0.0
    jobs: tuple[JobFigures, ...] = ()
    node: NodeFigures | None = None
    rounds: int = 0


@dataclass(eq=False)
class _Known:
    """What the round's thread opens and reads once per job: its header, its cpus, its
    counter files (held open while the node's share of file descriptors allows, else
    opened each round), its samples file (opened at its first sample)."""

    header: samples.Header
    cpus: frozenset[int]
    counters: list[Counter]
    held: Held | None = None
    writer: samples.Writer | None = None

    @property
    def fds(self) -> int:
        return (self.held.fds if self.held else 0) + (1 if self.writer else 0)

    def usage(self) -> dict[str, int]:
        return self.held.read() if self.held is not None else read_once(self.counters)

    def close(self) -> None:
        if self.held is not None:
            self.held.close()
        if self.writer is not None:
            self.writer.close()


@dataclass(eq=False)
class Sampler:
    """The sampling timer of gecod (see the module docstring).

    Parameters
    ----------
    loop: gecod's runloop (the timer).
    backend: the node's cgroup backend.
    cfg: the configuration (:meth:`reconfigure` replaces it on SIGHUP).
    node: this host's short name.
    topology: the node's cores (None: every cpu counts as a core of its own).
    on_round: called in the round's thread after each round (the metrics' rendering).
    """

    loop: Loop
    backend: Backend
    cfg: Config
    node: str = field(default_factory=short_hostname)
    topology: Topology | None = None
    on_round: Callable[[], None] | None = None
    rounds: int = field(default=0, init=False)
    # the last round's figures, replaced whole (read from any thread)
    latest: Snapshot = field(default_factory=Snapshot, init=False)
    _executor: ThreadPoolExecutor = field(init=False)
    _timer: Any = field(default=None, init=False)  # the loop's timer handle
    _round: Future[None] | None = field(default=None, init=False)
    _closing: threading.Event = field(default_factory=threading.Event, init=False)
    # the round's thread only: each job's header and cpus, read once; jobs warned about
    _known: dict[JobKey, _Known] = field(default_factory=dict, init=False)
    _warned: set[JobKey] = field(default_factory=set, init=False)
    _fd_budget: int = field(default=0, init=False)  # files the round may hold open

    def __post_init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gecod-sampler")
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._fd_budget = (soft if soft != resource.RLIM_INFINITY else 1 << 20) // _FD_SHARE

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
        for key in list(self._known):
            self._forget(key)

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
        figures: list[JobFigures] = []
        for key in keys:
            if self._closing.is_set():
                return
            try:
                known = self._known.get(key) or self._known.setdefault(key, self._read(key))
                if not known.cpus:  # a cgroup still being made has none yet: read again
                    known.cpus = self._cpus(key)
                try:
                    sample = samples.Sample.from_usage(now, known.usage())
                except GecoError:  # removed (ENODEV), or made again under the same key
                    self._forget(key)
                    raise
                figures.append(JobFigures(known.header, sample))
                if known.writer is None:
                    known.writer = samples.Writer(cfg.usage_dir, known.header,
                                                  cfg.usage_readers)
                known.writer.add(sample, max_samples=cfg.usage_max_samples)
            except GecoError as exc:  # removed meanwhile, or its file refused
                if key not in self._warned and self.backend.exists(key):
                    self._warned.add(key)
                    _log.log(samples.level_of(exc), "job %s: no usage sample: %s", key, exc,
                             extra=log.job_fields(key.job, key.task, "usage-sample-failed"))
        for gone in set(self._known) - set(keys):
            self._forget(gone)
        self._warned &= set(keys)
        self.rounds += 1
        self.latest = Snapshot(now, tuple(figures), self._node(figures), self.rounds)
        if self.on_round is not None:
            try:
                self.on_round()
            except Exception:  # a bug there must not end the samples
                _log.exception("usage sampler: the round's figures were not rendered")

    def _read(self, key: JobKey) -> _Known:
        """The job's header, cpus and counter files (they do not change while it runs);
        the files held open within the sampler's share of file descriptors."""
        counters = [c for c in self.backend.usage_counters(key)
                    if not _SAMPLED.isdisjoint(c.names)]
        known = _Known(samples.header_of(self.cfg, key, self.node, self._resources(key)),
                       self._cpus(key), counters)
        if sum(k.fds for k in self._known.values()) + len(counters) + 1 <= self._fd_budget:
            known.held = Held(counters)
        return known

    def _forget(self, key: JobKey) -> None:
        known = self._known.pop(key, None)
        if known is not None:
            known.close()

    def _cpus(self, key: JobKey) -> frozenset[int]:
        try:
            return parse_cpulist(self.backend.read_limits(key).cpus)
        except GecoError:  # its cores count as free meanwhile: a figure, no job's harm
            return frozenset()

    def _node(self, figures: list[JobFigures]) -> NodeFigures | None:
        """The node's cores and memory as jobs see them, at this round."""
        cfg = self.cfg
        try:
            cpus = parse_cpulist(self.backend.available_cpus()) - parse_cpulist(cfg.cpus_reserve)
        except GecoError as exc:
            _log.debug("usage sampler: cannot read the cpus for jobs: %s", exc)
            return None
        held: set[int] = set()
        for known in self._known.values():
            held |= known.cpus
        units = self._units(cpus)
        memory = jobs_memory(cfg.memory_reserve)
        granted = sum(known.header.memory for known in self._known.values())
        return NodeFigures(
            cores=len(units), cores_free=sum(1 for unit in units if not unit & held),
            memory=memory, memory_free=max(0, memory - granted),
            memory_used=sum(max(0, f.sample.memory_current) for f in figures),
            jobs=len(self._known))

    def _units(self, cpus: frozenset[int]) -> list[frozenset[int]]:
        """``cpus`` grouped as a job's slots get them: whole cores, or single cpus."""
        if self.cfg.hardware_threads or self.topology is None:
            return [frozenset([cpu]) for cpu in cpus]
        return [whole for core in self.topology.cores
                if (whole := frozenset(core.pus) & cpus)]
