"""A job's granted resources: the in-memory form of ``GECOResourceSet_v1``.

A :class:`ResourceSet` is what geco knows about one task of one Grid Engine
job: its global facts (owner, limits, flags) and one :class:`NodeResources`
record per execution host. It is built once per job from qstat
(:mod:`geco.sge.qstat`), written to ``<state_dir>/resources/<job>.<task>`` in the
v1 text format (:mod:`geco.sge.v1format`, by :mod:`geco.sge.resourcefile`), and
read back by every later hook and by gecod, so the qmaster is asked once per job.

Units: memory in bytes (``0`` = no limit), times in seconds (``0`` = none).
Strings are ``str``; bytes that are not UTF-8 survive as surrogate escapes,
so any byte of a job name round-trips through the file.
"""

from __future__ import annotations

import os

from geco._tuple import NamedTuple
from geco.jobkey import JobKey

__all__ = ["NodeResources", "ResourceSet", "short_hostname"]


def short_hostname(name: str | None = None) -> str:
    """Return the host name without its domain (this host's when ``name`` is None).

    Grid Engine may print ``n001`` or ``n001.cluster``; geco compares short names.
    """
    return (name if name is not None else os.uname().nodename).split(".", 1)[0]


class NodeResources(NamedTuple):
    """What one execution host grants the job.

    Attributes
    ----------
    name: host name as Grid Engine prints it.
    is_slave: True on every host but the master (where the job script runs).
    slots: slots granted on this host (= whole cores geco binds).
    memory_limit: RAM limit in bytes on this host (granted ``m_mem_free``), 0 = none.
    vmem_limit: RAM+swap limit in bytes on this host (``h_vmem`` x slots), 0 = none.
    gpus: granted GPU list as Grid Engine prints it (e.g. ``"0,1"``), "" = none.
    phis: granted Xeon Phi list, "" = none.
    """

    name: str
    is_slave: bool = False
    slots: int = 1
    memory_limit: int = 0
    vmem_limit: int = 0
    gpus: str = ""
    phis: str = ""


class ResourceSet(NamedTuple):
    """One task of one job, as granted by Grid Engine.

    The field order is the v1 format's global field order (the node count is
    implied by ``nodes``), then its optional instance section.

    ``cluster`` and ``submitted`` say which job of its number this is (Grid Engine
    reuses numbers; :mod:`geco.sge.jobinstance`): the cluster and the job's submission
    time in seconds since the epoch, ``""`` and ``0`` when not known (a file an older
    geco wrote).
    """

    job_id: int
    task_id: int = 1
    runtime_limit: float = 0.0
    is_standby: bool = False
    per_slot_vmem: int = 0
    trace_level: int = 0
    is_array: bool = False
    phi_for_user: bool = False
    job_name: str = ""
    owner: str = ""
    group: str = ""
    cwd: str = ""
    nodes: tuple[NodeResources, ...] = ()
    cluster: str = ""
    submitted: float = 0.0

    @property
    def key(self) -> JobKey:
        """``<job>.<task>``: the name of the job's cgroups and resource file."""
        return JobKey(self.job_id, self.task_id)

    def node(self, hostname: str | None = None) -> NodeResources | None:
        """Return the record of ``hostname`` (default: this host), compared by short name."""
        want = short_hostname(hostname)
        for node in self.nodes:
            if short_hostname(node.name) == want:
                return node
        return None

    def replace(self, **changes: object) -> ResourceSet:
        """Return a copy with ``changes`` applied (a resource set never changes in place)."""
        return self._replace(**changes)  # type: ignore[arg-type]
