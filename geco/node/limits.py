"""The rules that turn a job's grant and the node into the job's limits.

A job's cores are packed by :mod:`geco.node.cores`; everything else it is held to is
decided here, once, from its record for this host and the node's configuration: its task
limit (:class:`PidsLimit`), its memory when it requested none (:class:`MemoryDefault`),
what all jobs together may use (:func:`jobs_memory`, the node's reserve kept for its own
daemons) and its GPUs (:class:`GpuShare`: granted or picked, every other GPU and its MIG
caps denied; on a node where geco knows no GPU, every NVIDIA device).
"""

from __future__ import annotations

import os
from pathlib import Path

from geco import gpushare, log
from geco._tuple import NamedTuple
from geco.cgroup import Backend, Limits
from geco.config import Config
from geco.cpulist import format_cpulist
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.node import gpus
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import gpupicks, resourcefile
from geco.sge.lookup import Found

__all__ = ["GpuShare", "MemoryDefault", "PidsLimit", "Rules", "gpu_share", "jobs_memory",
           "limits_for", "pids_unenforced"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.node.cores import Allocation

_log = log.get("node.limits")
# The most tasks a Linux pid namespace can ever hold (PID_MAX_LIMIT on 64-bit); the
# kernel refuses a larger pids.max (EINVAL), and a limit that large limits nothing.
_PID_MAX_LIMIT = 1 << 22


class PidsLimit(NamedTuple):
    """The node's rule for a job's task limit (``pids.max``: processes and threads).

    A job gets ``per_slot`` x its slots on this node, at least ``minimum``, so a
    fork bomb fills its own cgroup and not the node's pid space (execd, gecod,
    sshd and the other jobs keep forking). ``per_slot == 0`` means no limit.

    Attributes
    ----------
    per_slot: config ``[cgroup] pids_per_slot``.
    minimum: config ``[cgroup] pids_min``, the floor for jobs with few slots.
    """

    per_slot: int = 0
    minimum: int = 0

    @classmethod
    def from_config(cls, cfg: Config) -> PidsLimit:
        """The rule the configuration sets (``[cgroup] pids_per_slot`` and ``pids_min``)."""
        return cls(cfg.pids_per_slot, cfg.pids_min)

    def for_slots(self, slots: int) -> int:
        """Return ``pids.max`` for a job with ``slots`` slots here; 0 = no limit.

        A record with no slots here still gets one slot's worth (never "0 = none"
        by accident), and a limit beyond what any pid namespace can hold is none.
        """
        if self.per_slot <= 0:
            return 0
        limit = max(self.per_slot * max(slots, 1), self.minimum)
        return 0 if limit > _PID_MAX_LIMIT else limit


class MemoryDefault(NamedTuple):
    """The node's memory for a job that requests none (neither ``m_mem_free`` nor
    ``h_vmem``): ``per_slot`` x its slots here of RAM, and ``vmem_per_slot`` x its slots
    of RAM+swap, so no job runs unlimited and pushes the node into swap or a global OOM
    (Slurm's DefMemPerCPU). A job that asked for either keeps exactly what it asked:
    a default beside a request would cap what the request granted. 0 = no default.

    Attributes
    ----------
    per_slot: config ``[cgroup] memory_per_slot``, else Grid Engine's ``m_mem_free``
        default (:mod:`geco.sge.complexes`), bytes.
    vmem_per_slot: config ``[cgroup] vmem_per_slot``, else Grid Engine's ``h_vmem``
        default, bytes.
    """

    per_slot: int = 0
    vmem_per_slot: int = 0

    @classmethod
    def from_config(cls, cfg: Config) -> MemoryDefault:
        """The default the configuration sets."""
        return cls(cfg.memory_per_slot, cfg.vmem_per_slot)

    @classmethod
    def for_job(cls, cfg: Config, found: Found, node: NodeResources) -> MemoryDefault:
        """The default for ``node`` (a job's share of this host, ``found`` its resource
        set): the configuration's, and where it sets none, the complex's default Grid
        Engine booked for the job (asked only for a job that requests no memory). None
        for a job known from the spool alone (the qmaster unreachable): its requests are
        unknown, not absent, and a default could cap what it was granted; the site chose
        to run such jobs without memory limits."""
        if found.source == "spool":
            return cls()
        if node.memory_limit or node.vmem_limit:
            return cls.from_config(cfg)
        return cls.booked(cfg)

    @classmethod
    def booked(cls, cfg: Config) -> MemoryDefault:
        """What a job that requests no memory gets: the configuration's default, and where
        it sets none, the complex's default Grid Engine books (``qconf -sc``, kept a while:
        :func:`geco.sge.complexes.memory_defaults`)."""
        rule = cls.from_config(cfg)
        if rule.per_slot and rule.vmem_per_slot:
            return rule
        from geco.sge import complexes  # only for a job that requests no memory

        booked = complexes.memory_defaults(cfg)
        return cls(rule.per_slot or booked.get("m_mem_free", 0),
                   rule.vmem_per_slot or booked.get("h_vmem", 0))

    def applies(self, node: NodeResources) -> bool:
        """True when ``node`` (a job's share of this host) gets the default."""
        return bool(self.per_slot or self.vmem_per_slot) \
            and not (node.memory_limit or node.vmem_limit)

    def applied(self, node: NodeResources) -> NodeResources:
        """``node`` with the default as its limits when it requested no memory."""
        if not self.applies(node):
            return node
        slots = max(node.slots, 1)
        return node._replace(memory_limit=self.per_slot * slots,
                             vmem_limit=self.vmem_per_slot * slots)


class GpuShare(NamedTuple):
    """What a job's GPUs on this node are decided from (under the node lock).

    Attributes
    ----------
    table: the node's GPUs (:func:`geco.node.gpus.node_table`); empty on a node where geco
        knows none (the job has none, and is denied every NVIDIA device).
    resources: the job's resource set; when geco picks the ids, this node's record
        gets them and is saved (``resources_dir``), so they are known after a restart.
    hostname: this node's name as the resource set spells it (None: this host's).
    resources_dir: where the running jobs' resource files are.
    caps: the node's MIG capability devices (:func:`geco.node.gpus.mig_caps`), None: none.
    names: ``[gpu] names``, what Grid Engine's GPU ids mean here (:func:`geco.node.gpus.map_share`).
    """

    table: tuple[gpus.Gpu, ...]
    resources: ResourceSet
    hostname: str | None
    resources_dir: Path
    caps: gpus.MigCaps | None = None
    names: tuple[tuple[str, int | str], ...] = ()

    def ids(self, key: JobKey, near: frozenset[int],
            backend: Backend) -> tuple[int, ...] | None:
        """The job's GPUs here: those Grid Engine granted (its ids mapped to this node's),
        else as many as it counted, picked among the ones no other running job holds
        (nearest its NUMA nodes ``near``); None on a node without GPUs (where a job granted
        some was refused), and for a grant that names no GPU here (the job is held).

        A grant geco cannot map is the job's own problem: refusing its start would have
        Grid Engine start it again and again. It is contained with no GPU (every one
        denied), journaled, and held by the first hook that tells it its GPUs (prolog or
        starter: :func:`geco.node.gpus.job_environment` raises the same sentence, exit 100).

        Raises
        ------
        GpusUnavailable
            when fewer are free than the job counts.
        """
        if not self.table:
            return None
        try:
            share = gpus.map_share(self._share(), self.table, self.names)
        except gpus.GpuGrantError as exc:
            _log.error("job %s: %s; it is contained with no GPU, and its prolog or starter "
                       "holds it in error state", key, exc,
                       extra=log.job_fields(key.job, key.task, "gpu-grant-unmapped",
                                            REASON=str(exc)))
            return None
        if not share.counted:
            return share.ids
        busy: set[int] = set()
        for other in backend.job_keys():
            if other != key:
                busy.update(self._held_by(other))
        return gpus.pick(self.table, share.amount, busy, near)

    def denied(self, ids: tuple[int, ...] | None) -> list[tuple[str, int, int | None]]:
        """The devices the job may not open, granted ``ids`` (:func:`geco.node.gpus.denied`)."""
        return gpus.denied(self.table, ids or (), self.caps)

    def save(self, ids: tuple[int, ...] | None) -> None:
        """Record picked or mapped ids in this node's resource file, picked ones also in
        their record beside it (:mod:`geco.sge.gpupicks`: a file written anew from qstat
        gets them back), once the job's cgroups deny the other GPUs (ids that never took
        effect are never on record); nothing to record for the ids Grid Engine granted as
        ids, nor on a node without GPUs or for a grant that could not be mapped (``ids``
        None: Grid Engine's words stay on record).

        Raises
        ------
        GecoError
            when the file cannot be written: the job must not run with GPUs no later
            allocation would know it holds.
        """
        node = self.resources.node(self.hostname)
        if ids is None or node is None:
            return
        given = gpushare.parse_share(node.gpus)
        done = gpushare.Share(given.amount, ids, given.counted)
        if done.counted and done.ids:  # beside the file: a rewrite from qstat keeps them
            gpupicks.save(self.resources_dir, self.resources, node.name, done)
        if done == given:
            return
        picked = node._replace(gpus=str(done))
        resourcefile.write(self.resources_dir, self.resources.replace(
            nodes=tuple(picked if n is node else n for n in self.resources.nodes)))

    def _share(self) -> gpushare.Share:
        node = self.resources.node(self.hostname)
        return gpushare.parse_share(node.gpus) if node is not None else gpushare.Share()

    def _held_by(self, key: JobKey) -> tuple[int, ...]:
        """The ids job ``key`` holds here: its resource file's, else (a file unusable or
        missing, or a count without ids) those recorded when they were picked."""
        try:
            rs = resourcefile.read(self.resources_dir, key)
            node = rs.node(self.hostname) if rs is not None else None
            share = gpushare.parse_share(node.gpus) if node is not None else gpushare.Share()
            if share.ids or (rs is not None and not share.counted):
                return share.ids
            why = ""
        except GecoError as exc:
            why = str(exc)
        try:
            picks = gpupicks.load(self.resources_dir, key)
        except GecoError as exc:
            why = f"{why}; {exc}" if why else str(exc)
            picks = None
        if picks is not None and short_hostname(picks.host) == short_hostname(self.hostname):
            return picks.share.ids
        if why:  # its GPUs look free, and it says so
            _log.warning("job %s: cannot tell which GPUs it holds: %s", key, why)
        return ()


def pids_unenforced(backend: Backend, rule: PidsLimit) -> str:
    """Why jobs on this node get no task limit although ``rule`` asks for one; "" when
    they do (for ``geco status --job`` and ``geco check``)."""
    if rule.per_slot <= 0 or "pids" in backend.controllers:
        return ""
    where = "mounted (cgroup v1)" if backend.version == 1 else "available (cgroup v2)"
    return (f"the pids controller is not {where}: the task limit ([cgroup] pids_per_slot) "
            "is not enforced on this node")


def gpu_share(cfg: Config, rs: ResourceSet, node: NodeResources,
               hostname: str | None) -> GpuShare:
    """How the job's GPUs here are decided, and the devices it is denied.

    On a node where geco knows no GPU the table is empty and the job is denied every
    NVIDIA device (:func:`geco.node.gpus.denied`): the driver may load, and nvidia-modprobe
    make the device files, after the job started. That costs every job there one more
    devices write (v1) or device program (v2) at its start.

    Raises
    ------
    GecoError
        when the job was granted GPUs on a node where geco knows of none: it must
        not start believing it has them.
    """
    table = gpus.node_table(cfg.gpu_devices)
    if not table and gpushare.parse_share(node.gpus).amount:
        raise GecoError(f"job {rs.key} was granted GPUs ({node.gpus}) on "
                        f"{hostname or short_hostname()}, which has none geco knows of: is "
                        "the driver loaded, or [gpu] devices set?")
    return GpuShare(table, rs, hostname, cfg.resources_dir, gpus.mig_caps(), cfg.gpu_names)


def jobs_memory(reserve: int) -> int:
    """The RAM all jobs together may use: the node's total less ``reserve`` for its own
    daemons (at least one page: a reserve past the RAM leaves jobs next to nothing,
    never unlimited)."""
    page = os.sysconf("SC_PAGE_SIZE")
    return max((os.sysconf("SC_PHYS_PAGES") * page - reserve) // page * page, page)


class Rules(NamedTuple):
    """The node's rules for a job's limits beyond its cores and its granted memory: one
    value, read from the configuration once per containment (a new rule is a field
    here and a line in :func:`limits_for`).

    Attributes
    ----------
    pids: the task limit (:class:`PidsLimit`).
    """

    pids: PidsLimit = PidsLimit()

    @classmethod
    def from_config(cls, cfg: Config) -> Rules:
        """The rules the configuration sets."""
        return cls(PidsLimit.from_config(cfg))


def limits_for(node: NodeResources, chosen: Allocation, rules: Rules) -> Limits:
    """What the kernel is to enforce for a job's share ``node`` of this host on the cores
    and NUMA nodes ``chosen``: its memory as granted (or the default, applied to ``node``
    before), and by ``rules`` its task limit for its slots here."""
    return Limits(cpus=format_cpulist(chosen.cpus), mems=format_cpulist(chosen.mems),
                  memory=node.memory_limit, memory_swap=node.vmem_limit,
                  pids=rules.pids.for_slots(node.slots))
