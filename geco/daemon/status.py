"""What gecod knows about the node's jobs: read from the cgroup tree, never kept in memory.

A restart (crash, upgrade, ``systemctl restart``) must lose nothing, so gecod
holds no job table of its own. The kernel already has the facts: which job
cgroups exist, their cpus, NUMA nodes and memory limits, and the processes in
them. :func:`scan` reads them back; core allocation does the same under the
node lock (:func:`geco.job.containment.contain_job`), and the resource files under
``<state_dir>/resources`` hold everything Grid Engine said about each job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from geco import log
from geco.cgroup import Backend
from geco.cpulist import format_cpulist, parse_cpulist
from geco.errors import GecoError
from geco.jobkey import JobKey

__all__ = ["JobCgroup", "NodeJobs", "scan", "status_document"]

_log = log.get("daemon.status")

# A STATUS_REPLY payload is at most 4096 bytes (docs/wire-format.md); the job
# list is cut to fit and says so, rather than the reply being refused.
_MAX_REPLY = 4096


@dataclass(frozen=True, slots=True)
class JobCgroup:
    """One job cgroup as the kernel has it.

    Attributes
    ----------
    key: ``<job>.<task>``.
    cpus, mems: kernel lists (``"0-1"``); ``""`` when unreadable.
    memory, memory_swap: limits in bytes, 0 = none.
    pids: how many processes are in it.
    error: why the limits could not be read ("" when they could): a half-made
        cgroup, or one removed while we looked.
    """

    key: JobKey
    cpus: str = ""
    mems: str = ""
    memory: int = 0
    memory_swap: int = 0
    pids: int = 0
    error: str = ""

    def as_json(self) -> dict[str, object]:
        """The job's entry in a STATUS reply."""
        doc: dict[str, object] = {"key": self.key, "cpus": self.cpus, "mems": self.mems,
                                  "memory": self.memory, "memory_swap": self.memory_swap,
                                  "pids": self.pids}
        if self.error:
            doc["error"] = self.error
        return doc


@dataclass(frozen=True, slots=True)
class NodeJobs:
    """All job cgroups of this node, and the cpus geco may hand out."""

    jobs: tuple[JobCgroup, ...]
    available_cpus: str

    @property
    def cpus_in_use(self) -> str:
        """The union of the jobs' cpus, as a kernel list."""
        busy: set[int] = set()
        for job in self.jobs:
            if job.cpus:
                busy.update(parse_cpulist(job.cpus))
        return format_cpulist(busy)


def scan(backend: Backend) -> NodeJobs:
    """Read every job cgroup of the node back from the kernel.

    A job whose limits cannot be read is listed with its ``error``: one broken
    cgroup must not hide the others.

    Raises
    ------
    CgroupError
        when the GECO parent cannot be listed or read.
    """
    jobs = []
    for key in backend.job_keys():
        try:
            limits = backend.read_limits(key)
            pids = len(backend.pids(key))
        except GecoError as exc:
            _log.debug("job %s: cannot read its cgroup: %s", key, exc)
            jobs.append(JobCgroup(key, error=str(exc)))
            continue
        jobs.append(JobCgroup(key, limits.cpus, limits.mems, limits.memory, limits.memory_swap,
                             pids))
    return NodeJobs(tuple(jobs), backend.available_cpus())


def status_document(node: NodeJobs, **extra: object) -> bytes:
    """Return the STATUS_REPLY payload: UTF-8 JSON of at most 4096 bytes.

    Shape: ``{"version": 1, "jobs": [{key, cpus, mems, memory, memory_swap,
    pids}], "job_count": n, "cpus_in_use": "0-1", "available_cpus": "0-3",
    "truncated": false, ...extra}``. When the jobs do not fit, the list is cut
    (``truncated`` true; ``job_count`` is still the full count).

    Parameters
    ----------
    node: from :func:`scan`.
    **extra: more top-level fields (``pid``, ``uptime``, ...).
    """
    base: dict[str, object] = {"version": 1, "job_count": len(node.jobs),
                               "cpus_in_use": node.cpus_in_use,
                               "available_cpus": node.available_cpus, **extra}
    entries = [j.as_json() for j in node.jobs]
    data = _dumps(dict(base, jobs=entries, truncated=False))
    if len(data) <= _MAX_REPLY:
        return data
    # keep the jobs that fit (in key order), counting each entry's bytes and its comma
    room = _MAX_REPLY - len(_dumps(dict(base, jobs=[], truncated=True)))
    kept: list[dict[str, object]] = []
    for entry in entries:
        room -= len(_dumps(entry)) + (1 if kept else 0)
        if room < 0:
            break
        kept.append(entry)
    return _dumps(dict(base, jobs=kept, truncated=True))


def _dumps(doc: dict[str, object]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
