"""gecod's figures in Prometheus' text format: the sampler's last round and gecod's health.

What :mod:`geco.daemon.metrics` serves on ``GET /metrics``, made with the
``prometheus_client`` library (python3-prometheus-client; imported only by this module,
which gecod imports only when ``[metrics] listen`` is set). Everything comes from memory:
the sampler's :class:`~geco.usage.sampler.Snapshot` (replaced whole each ``[usage]
interval``) and a few of the server's counters, so a scrape reads neither the kernel nor
a file, and costs the same whatever the node's jobs do.

Per job task on this node (labels ``job_id``, ``task_id``, ``owner``, ``queue``,
``node``; never the job's name, which its owner chooses freely; not ``job``, which
Prometheus gives every series of a scrape target): its CPU seconds by mode, memory now,
at its peak and its limit, cores and GPUs granted, tasks, OOM kills, start time, and
seff's CPU and memory efficiency as ratios (0..1: CPU seconds / (cores x wall
seconds), peak / limit). A figure the kernel does not count here
(-1 in the sample) is left out, not exported as a number. A job's series are in every
scrape while its cgroups exist, in none after the sampler's first round without them.

Per node: its cores and memory for jobs and what is free of them, the jobs' memory now,
the job count; gecod's requests answered and refused, requests waiting for or in a
worker, the sampler's rounds and when the last one ended, when this gecod started and
its version.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from geco import __version__
from geco.usage.efficiency import cpu_ratio, memory_ratio
from geco.usage.sampler import Health, JobFigures, NodeFigures, Snapshot

__all__ = ["CONTENT_TYPE", "Renderer", "job_families"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
JOB_LABELS = ("job_id", "task_id", "owner", "queue", "node")


_Kind = type[GaugeMetricFamily] | type[CounterMetricFamily]
_G, _C = GaugeMetricFamily, CounterMetricFamily
# The per-job families: name, help, kind, labels beyond the job's.
_JOB_FAMILIES: tuple[tuple[str, str, _Kind, tuple[str, ...]], ...] = (
    ("geco_job_cpu_seconds", "CPU time of the job's processes, by mode", _C, ("mode",)),
    ("geco_job_memory_bytes", "Memory the job's cgroup holds now", _G, ()),
    ("geco_job_memory_peak_bytes", "The most memory the job's cgroup held", _G, ()),
    ("geco_job_memory_limit_bytes", "The job's memory limit on this node (no series: no "
     "limit)", _G, ()),
    ("geco_job_cores", "Cores (slots) the job was granted on this node", _G, ()),
    ("geco_job_gpus", "GPUs the job was granted on this node", _G, ()),
    ("geco_job_tasks", "Processes and threads in the job's cgroup", _G, ()),
    ("geco_job_oom_kills", "Processes of the job the kernel's OOM killer ended", _C, ()),
    ("geco_job_start_time_seconds", "When the job started (Unix time)", _G, ()),
    ("geco_job_cpu_efficiency_ratio", "CPU seconds / (cores x wall seconds) since the job "
     "started, as seff", _G, ()),
    ("geco_job_memory_efficiency_ratio", "Memory peak / limit, as seff", _G, ()),
)


def job_families(jobs: Iterable[JobFigures]) -> list[Metric]:
    """The per-job families of ``jobs`` (figures the kernel does not count left out)."""
    families = [kind(name, doc, labels=(*JOB_LABELS, *extra))
                for name, doc, kind, extra in _JOB_FAMILIES]
    cpu, memory, peak, limit, cores, gpus, tasks, kills, started, cpu_eff, mem_eff = families
    for header, s in jobs:
        labels = [str(header.job_id), str(header.task_id), header.owner, header.queue,
                  header.host]
        if s.cpu_user_usec >= 0:
            cpu.add_metric([*labels, "user"], s.cpu_user_usec / 1e6)
        if s.cpu_system_usec >= 0:
            cpu.add_metric([*labels, "system"], s.cpu_system_usec / 1e6)
        if s.memory_current >= 0:
            memory.add_metric(labels, s.memory_current)
        if s.memory_peak >= 0:
            peak.add_metric(labels, s.memory_peak)
        if header.memory > 0:
            limit.add_metric(labels, header.memory)
        cores.add_metric(labels, header.cores)
        gpus.add_metric(labels, header.gpus)
        if s.tasks >= 0:
            tasks.add_metric(labels, s.tasks)
        if s.oom_kills >= 0:
            kills.add_metric(labels, s.oom_kills)
        if header.started > 0:
            started.add_metric(labels, header.started)
        if s.cpu_user_usec >= 0 and s.cpu_system_usec >= 0 and header.started > 0:
            ratio = cpu_ratio((s.cpu_user_usec + s.cpu_system_usec) / 1e6, header.cores,
                              s.time - header.started)
            if ratio is not None:
                cpu_eff.add_metric(labels, ratio)
        ratio = memory_ratio(max(s.memory_peak, s.memory_current), header.memory)
        if ratio is not None:
            mem_eff.add_metric(labels, ratio)
    return list(families)


def _node_families(node: NodeFigures, name: str) -> list[Metric]:
    found: list[Metric] = []
    for metric, doc, value in (
            ("geco_node_cores", "Cores (slots) this node hands jobs", node.cores),
            ("geco_node_cores_free", "Cores (slots) no job holds", node.cores_free),
            ("geco_node_memory_bytes", "Memory all jobs together may use", node.memory),
            ("geco_node_memory_free_bytes", "Memory for jobs not granted to any",
             node.memory_free),
            ("geco_node_memory_used_bytes", "Memory the jobs' cgroups hold now",
             node.memory_used),
            ("geco_node_jobs", "Job tasks with cgroups on this node", node.jobs)):
        family = GaugeMetricFamily(metric, doc, labels=("node",))
        family.add_metric([name], value)
        found.append(family)
    return found


class _Snapshot(Collector):
    """The sampler's last round."""

    def __init__(self, snapshot: Snapshot, node: str) -> None:
        self.snapshot, self.node = snapshot, node

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        yield from job_families(snap.jobs)
        if snap.node is not None:
            yield from _node_families(snap.node, self.node)
        rounds = CounterMetricFamily("gecod_sample_rounds", "Rounds of the usage sampler",
                                     labels=("node",))
        rounds.add_metric([self.node], snap.rounds)
        yield rounds
        if snap.at:
            at = GaugeMetricFamily("gecod_last_sample_timestamp_seconds", "When the "
                                   "sampler's last round ended (Unix time)", labels=("node",))
            at.add_metric([self.node], snap.at)
            yield at


class _Health(Collector):
    def __init__(self, health: Callable[[], Health], node: str) -> None:
        self.health, self.node = health, node
        self.started = time.time()  # a restart or a handover shows as a new value

    def collect(self) -> Iterator[Metric]:
        now = self.health()
        for name, kind, doc, value in (
                ("gecod_requests", CounterMetricFamily, "Requests gecod answered",
                 now.requests),
                ("gecod_refused", CounterMetricFamily, "Requests gecod refused (clients "
                 "dropped included)", now.refused),
                ("gecod_queue_depth", GaugeMetricFamily, "Requests waiting for or in a "
                 "worker", now.queue_depth)):
            family = kind(name, doc, labels=("node",))
            family.add_metric([self.node], value)
            yield family
        started = GaugeMetricFamily("gecod_start_time_seconds", "When this gecod started "
                                    "(Unix time)", labels=("node",))
        started.add_metric([self.node], self.started)
        yield started
        info = GaugeMetricFamily("gecod_build_info", "The running gecod's version",
                                 labels=("node", "version"))
        info.add_metric([self.node, __version__], 1)
        yield info


class Renderer:
    """``/metrics``' body: the snapshot's part made once per sampler round, by
    :meth:`prepare` (the sampler calls it after each round, in its own thread: 1,000
    jobs take tens of milliseconds, which no scrape waits for), gecod's health at each
    scrape (a few counters).

    Parameters
    ----------
    snapshot: the sampler's last round (an attribute read: it is replaced whole).
    health: gecod's counters now.
    node: this host's short name (the ``node`` label of node series).
    """

    def __init__(self, snapshot: Callable[[], Snapshot], health: Callable[[], Health],
                 node: str) -> None:
        self._snapshot = snapshot
        self._node = node
        self._made: tuple[Snapshot, bytes] | None = None
        self._health = CollectorRegistry(auto_describe=False)
        self._health.register(_Health(health, node))

    content_type = CONTENT_TYPE

    def prepare(self) -> None:
        """Render the sampler's last round, unless done already."""
        snap = self._snapshot()
        made = self._made
        if made is None or made[0] is not snap:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Snapshot(snap, self._node))
            self._made = (snap, generate_latest(registry))

    def render(self) -> bytes:
        """The whole body: the last round prepared (at most a round old), gecod's health
        now."""
        if self._made is None:  # no round yet: the empty snapshot, rendered here
            self.prepare()
        made = self._made
        assert made is not None
        return made[1] + generate_latest(self._health)
