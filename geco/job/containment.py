"""Make and unmake one job's cgroups on this node.

:func:`contain` turns a job's record for this host into cgroups: it picks
whole cores (packed by :mod:`geco.node.cores` on the hwloc topology), sets the
memory limits (the node's default for a job that requests none:
:class:`MemoryDefault`), the task limit (:class:`PidsLimit`, from the
configuration) and the job's GPUs (:class:`GpuShare`: granted or picked, every other
GPU and its MIG caps denied; on a node where geco knows no GPU, every NVIDIA device),
and creates the cgroups in every managed controller.
:func:`release` is the other half: freeze, kill, thaw, wait until empty,
remove (the epilog and gecod's reaper go through :mod:`geco.job.teardown`, which
adds the journal record and the escalation when a process does not die).

Core and GPU choice need a node-wide lock: two prologs starting at the same moment
would otherwise both see the same cores as free. The allocator's state is
never kept in memory; it is read back from the job cpusets (and the GPU lists of
the running jobs' resource files) under the lock, so it survives any restart.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from geco import log, rootlock
from geco._tuple import NamedTuple
from geco.cgroup import Backend, Limits
from geco.config import Config
from geco.errors import CgroupError, CoresUnavailable, GecoError
from geco.job.jobkey import JobKey
from geco.job.resourceset import NodeResources, ResourceSet, short_hostname
from geco.node import gpupicks, gpus, health
from geco.sge import execd, lookup, resourcefile
from geco.sge.execd import JobRef
from geco.sge.lookup import Found

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.node.cores import Allocation
    from geco.node.topology import Topology

__all__ = ["Contained", "GpuShare", "MemoryDefault", "PidsLimit", "Release", "contain",
           "contain_job", "jobs_memory", "join", "kill_and_remove",
           "last_changed", "pids_unenforced", "read_usage", "release", "task_tmpdir"]

_log = log.get("containment")
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
        their record beside it (:mod:`geco.node.gpupicks`: a file written anew from qstat
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
        given = gpus.parse_share(node.gpus)
        done = gpus.Share(given.amount, ids, given.counted)
        if done.counted and done.ids:  # beside the file: a rewrite from qstat keeps them
            gpupicks.save(self.resources_dir, self.resources, node.name, done)
        if done == given:
            return
        picked = node._replace(gpus=str(done))
        resourcefile.write(self.resources_dir, self.resources.replace(
            nodes=tuple(picked if n is node else n for n in self.resources.nodes)))

    def _share(self) -> gpus.Share:
        node = self.resources.node(self.hostname)
        return gpus.parse_share(node.gpus) if node is not None else gpus.Share()

    def _held_by(self, key: JobKey) -> tuple[int, ...]:
        """The ids job ``key`` holds here: its resource file's, else (a file unusable or
        missing, or a count without ids) those recorded when they were picked."""
        try:
            rs = resourcefile.read(self.resources_dir, key)
            node = rs.node(self.hostname) if rs is not None else None
            share = gpus.parse_share(node.gpus) if node is not None else gpus.Share()
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


# Seconds a job start waits for the node's allocation lock (held by root alone, each time
# for one job's allocation): past it the job is re-queued, saying why.
_NODE_LOCK_WAIT = 60.0


def _node_lock(state_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the node-wide allocation lock (released even if we crash)."""
    try:
        state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or full state dir: the hooks re-queue, saying why
        raise GecoError.from_oserror("cannot open the node's core allocation lock", exc,
                                     path=state_dir / "cores.lock") from exc
    return rootlock.held(state_dir / "cores.lock", wait=_NODE_LOCK_WAIT,
                         what="node's core allocation")


def last_changed(key: JobKey, backend: Backend) -> float | None:
    """When the job's cgroups were made (epoch seconds; None when they are gone).

    The newest mtime of the job's cgroup dirs: cgroupfs sets a directory's mtime
    when it is made, and again when a cgroup below it comes or goes (and may
    reset it when the kernel re-reads an evicted inode): at worst a cgroup looks
    younger than it is, and is judged later.
    """
    newest: float | None = None
    for path in backend.paths(key).values():
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return newest


def _drop_stale(backend: Backend, active_jobs: Path | None, keep: str, *,
                resources_dir: Path, short: bool = False) -> int:
    """Remove empty job cgroups of jobs that ended, so their cores come back.

    Always those whose spool dir is gone. When the node is ``short`` of cores
    for a job Grid Engine just dispatched here, every empty one: nothing of its
    job runs here (a killed epilog left it, or a parallel job is between two
    ``qrsh -inherit`` tasks and gets cores again at its next one: Grid Engine
    counts its slots, so they are free then). A cgroup is never empty while
    made: :func:`contain` moves the job's first process in under the node lock.
    A cgroup with processes left is never touched: its cores stay busy until the
    job's teardown or the reaper has killed them. A job whose spool dir is gone
    loses its resource file too (it ended while no one was there to tear it down:
    gecod down, an epilog killed); gecod's reaper prunes what is left of others.

    Returns
    -------
    How many cgroups were removed.
    """
    removed = 0
    spool = active_jobs if active_jobs is not None and active_jobs.is_dir() else None
    for key in backend.job_keys():
        if key == keep or backend.pids(key):
            continue
        if not short and (spool is None or (spool / key).exists()):
            continue
        job, task = key.job, key.task
        try:
            backend.destroy(key)
            removed += 1
            _log.info("removed the empty cgroups of job %s, which no longer runs here, to "
                      "free its cores", key,
                      extra=log.job_fields(job, task, "stale-cgroup-removed"))
            if spool is not None and not (spool / key).exists():
                resourcefile.remove(resources_dir, key)
        except GecoError as exc:
            _log.warning("cannot remove stale cgroup %s: %s", key, exc)
    return removed


def join(key: JobKey, backend: Backend, pid: int | None, *,
         state_dir: Path) -> Limits | None:
    """Move ``pid`` (when not None) into the job's existing cgroups and return their limits;
    None when the job has no (usable) cgroups on this node yet (then :func:`contain`
    makes them).

    Under the node lock: an allocation short of cores never removes the cgroups
    in between, as it may remove empty ones.
    """
    with _node_lock(state_dir):
        return _join_locked(key, backend, pid)


def _join_locked(key: JobKey, backend: Backend, pid: int | None) -> Limits | None:
    if not backend.exists(key):
        return None
    try:
        limits = backend.read_limits(key)
    except GecoError as exc:
        # half made (a crash between two mkdirs): nothing can run in it yet unless it
        # has pids, so start it over; with pids, let the error stand
        if backend.pids(key):
            raise
        _log.warning("job %s: rebuilding incomplete cgroups (%s)", key, exc)
        backend.destroy(key)
        return None
    if pid is not None:
        backend.add_pid(key, pid)
    return limits


def contain(key: JobKey, node: NodeResources, backend: Backend, *, state_dir: Path,
            pids: PidsLimit, pid: int | None = None, hardware_threads: bool = False,
            reserved_cpus: str = "",
            topology: Topology | None = None, active_jobs: Path | None = None,
            reclaim: Callable[[], None] | None = None) -> Limits:
    """Create the job's cgroups for this node's share, move ``pid`` in, return the limits.

    Idempotent: when the job's cgroups already exist (made by an earlier hook
    or by gecod), their limits are returned unchanged and no cores are taken.

    Parameters
    ----------
    key: ``<job>.<task>``.
    node: the job's record for this host (slots, memory limits).
    backend: the cgroup backend of this host.
    state_dir: where the node lock lives.
    pids: the node's task-limit rule (:meth:`PidsLimit.from_config`); the job gets
        ``pids.for_slots(node.slots)``.
    pid: the job's first process (its shepherd), moved in under the node lock, so
        that no other allocation ever sees the new cgroups empty. When the kernel
        refuses the move, cgroups made here are removed again.
    hardware_threads: one slot = one hardware thread instead of one whole core.
    reserved_cpus: cpus no job gets (``[cgroup] cpus_reserve``: the node's own daemons').
    topology: the host topology (default: loaded through hwloc).
    active_jobs: the execd's ``active_jobs`` dir, to recognise stale cgroups.
    reclaim: called when the node is short of cores, before the empty cgroups of
        ended jobs are removed and the cores counted again (gecod waits there for
        the teardowns of jobs whose shepherd has just exited).

    Raises
    ------
    CoresUnavailable
        when this node has fewer free cores than the job's slots here, even after
        what ended jobs held was reclaimed.
    CgroupError
        when the kernel refuses a cgroup operation.
    """
    return _contain(key, node, backend, state_dir=state_dir, pids=pids, pid=pid,
                    hardware_threads=hardware_threads, reserved_cpus=reserved_cpus,
                    topology=topology,
                    active_jobs=active_jobs, reclaim=reclaim, gpu=None)[0]


def _contain(key: JobKey, node: NodeResources, backend: Backend, *, state_dir: Path,
             pids: PidsLimit, pid: int | None, hardware_threads: bool, reserved_cpus: str,
             topology: Topology | None, active_jobs: Path | None,
             reclaim: Callable[[], None] | None,
             gpu: GpuShare | None, namespace: Callable[[], object] | None = None
             ) -> tuple[Limits, bool, tuple[int, ...] | None]:
    """:func:`contain`; also say whether the cgroups were made here (False: they existed),
    and the job's GPUs (None: not a GPU node, or the cgroups existed). ``gpu`` None denies
    no device (:func:`contain`'s callers, which know no configuration). ``namespace``:
    makes the job's private /tmp with its cgroups, before its first process moves in
    (under the node lock: a task of the job that comes meanwhile finds both)."""
    with _node_lock(state_dir):
        existing = _join_locked(key, backend, pid)
        if existing is not None:
            return existing, False, None
        # here, not at the top: a hook that joins cgroups gecod made needs no hwloc
        from geco.node.topology import Topology, format_cpulist

        resources_dir = state_dir / "resources"  # Config.resources_dir
        _drop_stale(backend, active_jobs, keep=key, resources_dir=resources_dir)
        topo = topology or Topology.load()

        def allocate() -> tuple[Allocation, tuple[int, ...] | None]:
            chosen = _allocate(key, node, backend, topo, hardware_threads, reserved_cpus)
            return chosen, gpu.ids(key, chosen.mems, backend) if gpu is not None else None

        try:
            chosen, gpu_ids = allocate()
        except (CoresUnavailable, gpus.GpusUnavailable):
            # a job that ended moments ago may still hold its cores: gecod's teardown
            # of it is under way, or a killed epilog left its cgroups empty
            if reclaim is not None:
                reclaim()
            if not _drop_stale(backend, active_jobs, keep=key, resources_dir=resources_dir,
                               short=True) and reclaim is None:
                raise
            chosen, gpu_ids = allocate()
        limits = Limits(cpus=format_cpulist(chosen.cpus), mems=format_cpulist(chosen.mems),
                        memory=node.memory_limit, memory_swap=node.vmem_limit,
                        pids=pids.for_slots(node.slots))
        backend.create(key, limits)
        try:
            if gpu is not None:
                _deny_devices(key, backend, gpu, gpu_ids)
                gpu.save(gpu_ids)
            if namespace is not None:
                namespace()
            if pid is not None:
                backend.add_pid(key, pid)
        except GecoError:
            with contextlib.suppress(GecoError):
                backend.destroy(key)
            raise
        return limits, True, gpu_ids


def _deny_devices(key: JobKey, backend: Backend, gpu: GpuShare,
                  ids: tuple[int, ...] | None) -> None:
    """Keep the job off the devices of the GPUs it was not granted (:meth:`GpuShare.denied`).

    Raises
    ------
    CgroupError
        when the kernel refuses on a GPU node: a job must not start with GPUs it was not
        granted. On a node without GPUs, where every NVIDIA device is denied in case a
        driver comes later, a process the kernel refuses device rules (gecod under its
        unit, which has no CAP_SYS_ADMIN) contains the job as before that rule, and says
        so once: refusing every job of every node would be the greater harm.
    """
    global _devices_open_said
    try:
        backend.deny_devices(key, gpu.denied(ids))
    except CgroupError as exc:
        if gpu.table:
            raise
        if not _devices_open_said:
            _devices_open_said = True
            _log.warning("job %s: NVIDIA's devices are not denied to the jobs this process "
                         "contains on this node, which has no GPU geco knows of (a driver "
                         "loaded later would let them open every GPU): %s; gecod needs "
                         "CAP_SYS_ADMIN for it (v2: or CAP_BPF)", key, exc,
                         extra=log.job_fields(key.job, key.task, "nvidia-devices-open",
                                              REASON=str(exc)))


# the warning that this process cannot deny NVIDIA's devices on a node without GPUs: given
_devices_open_said = False


class Contained(NamedTuple):
    """What :func:`contain_job` did.

    Attributes
    ----------
    limits: the job's limits on this node (its cores, memory, tasks).
    created: True when the cgroups were made now; False when the job's existing
        cgroups (made by gecod, an earlier hook or task) were joined.
    found: the job's resource set and where it came from; None when the existing
        cgroups were joined without it.
    gpus: the job's GPU ids here when the cgroups were made now on a GPU node, else None
        (and for a grant that names no GPU here: :func:`geco.node.gpus.job_environment` says why).
    """

    limits: Limits
    created: bool
    found: Found | None
    gpus: tuple[int, ...] | None = None


def contain_job(job: JobRef, cfg: Config, backend: Backend, *, pid: int | None,
                found: Found | None = None, hostname: str | None = None,
                topology: Topology | None = None, reclaim: Callable[[], None] | None = None,
                logger: log.Logger | None = None, prepared_only: bool = False,
                private_tmp: bool = True) -> Contained:
    """Put ``pid`` into its job's cgroups on this node, making them first when needed.

    The one way in, for the prolog and for gecod: the job's cgroups exist ->
    join them (no resources read); else its resource set (``found``, else
    :func:`geco.sge.lookup.find`: the resource file, qstat, the spool) -> this
    node's share -> cores -> cgroups -> move, under the node lock
    (:func:`contain`).

    Parameters
    ----------
    job: the job task, with its execd spool dir (stale cgroups, the pe_hostfile).
    cfg: settings (state dir, task limit, hardware threads, qstat).
    backend: this node's cgroup backend.
    pid: the job's first process here (a shepherd), moved in under the node lock; None
        when it is already inside the job's existing cgroups (nothing to move).
    found: the resource set when the caller already has it (the prolog journals it).
    hostname: this node's name as the resource set spells it (default: this host).
    topology, reclaim: as :func:`contain`.
    logger: where :func:`geco.sge.lookup.find` warns.
    prepared_only: a parallel job's task on a slave host, where ``[cluster] slaves =
        "strict"``: only the resource file the job's master sent (its PREPARE) will do;
        without it the task is refused, never looked up.
    private_tmp: make the job's private /tmp with its cgroups (``[tmp] private``); False
        for the prolog: when it makes the cgroups, the shepherd runs already, where no
        namespace can take it (no preload here), and one nobody joins is not made.

    Raises
    ------
    GecoError
        when the job has no slots on this node (names its hosts), when it was not
        prepared here (``prepared_only``), or as :func:`geco.sge.lookup.find` and
        :func:`contain` raise.
    """
    limits = join(job.key, backend, pid, state_dir=cfg.state_dir)
    if limits is not None:
        return Contained(limits, False, found)
    if found is None:
        found = lookup.find(job, cfg, logger, prepared_only=prepared_only)
    node = found.resources.node(hostname)
    if node is None:
        host = hostname or short_hostname()
        raise GecoError(f"job {job.key} has no slots on this host ({host}); its hosts: "
                        f"{', '.join(n.name for n in found.resources.nodes) or 'none'}")
    try:
        done = _make(job, cfg, backend, pid, found, node, hostname, topology, reclaim,
                     private_tmp)
    except GecoError as exc:  # the node's own failure counts towards taking it out
        health.failed(cfg, job, exc, hostname)
        raise
    if done.created:
        health.contained(cfg)
    return done


def _make(job: JobRef, cfg: Config, backend: Backend, pid: int | None, found: Found,
          node: NodeResources, hostname: str | None, topology: Topology | None,
          reclaim: Callable[[], None] | None, private_tmp: bool) -> Contained:
    """:func:`contain_job`'s making of the cgroups: the node's share of ``found``."""
    # the GECO parents may be gone (an admin's cleanup script, a hierarchy remounted):
    # make them again, as every job start does
    backend.ensure_root()
    if cfg.memory_reserve:
        backend.set_parent_memory(jobs_memory(cfg.memory_reserve))
    node = MemoryDefault.for_job(cfg, found, node).applied(node)
    namespace = None
    if cfg.tmp_private and private_tmp:
        from geco.job import privatetmp  # nodes with private /tmp only

        limit = node.memory_limit

        def namespace() -> privatetmp.Places | None:
            try:
                return privatetmp.make(cfg, job.key, limit, jobs_memory(cfg.memory_reserve))
            except GecoError as exc:
                if cfg.tmp_on_failure != "shared":
                    raise
                _log.warning("job %s runs with the node's /tmp and /dev/shm ([tmp] "
                             "on_failure = \"shared\"): %s", job.key, exc,
                             extra=log.job_fields(job.job_id, job.task_id, "tmp-shared",
                                                  REASON=str(exc)))
                return None
    limits, created, gpu_ids = _contain(
        job.key, node, backend, state_dir=cfg.state_dir, pids=PidsLimit.from_config(cfg),
        pid=pid, hardware_threads=cfg.hardware_threads, reserved_cpus=cfg.cpus_reserve,
        topology=topology,
        active_jobs=job.spool_dir.parent if job.spool_dir else None, reclaim=reclaim,
        gpu=_gpu_share(cfg, found.resources, node, hostname), namespace=namespace)
    return Contained(limits, created, found, gpu_ids)


def task_tmpdir(cfg: Config, key: JobKey, task_dir: Path, owner: str | None) -> None:
    """A shepherd of job ``key``, which has a private /tmp here, joining it (its master's,
    a ``qrsh -inherit`` task's), working in ``task_dir``: the ``$TMPDIR`` sge_execd made
    for it in the node's /tmp (its spooled environment names it) made again in the job's
    private /tmp (on a slave host sge_execd makes it for the first task, after the
    master's PREPARE made the namespace). ``owner``: the job's, None to read it from its
    resource file.

    Raises
    ------
    GecoError
        when it cannot be made.
    """
    from geco.job import privatetmp

    if owner is None:
        with contextlib.suppress(GecoError):
            rs = resourcefile.read(cfg.resources_dir, key)
            owner = rs.owner if rs is not None else None
    tmpdir, uid = _sge_tmpdir(task_dir, owner) if owner else (None, None)
    if tmpdir is not None and uid is not None:
        privatetmp.add_sge_tmpdir(cfg, key, tmpdir, uid)


def _sge_tmpdir(spool_dir: Path, owner: str) -> tuple[Path | None, int | None]:
    """The ``$TMPDIR`` sge_execd made for the shepherd working in ``spool_dir`` (its
    spooled environment's) and the job owner's uid; None for what is not known."""
    import pwd

    try:
        env = execd.parse_key_values((spool_dir / "environment").read_bytes())
        uid = pwd.getpwnam(owner).pw_uid
    except (OSError, KeyError, UnicodeError):
        return None, None
    value = env.get(b"TMPDIR", b"")
    return (Path(os.fsdecode(value)) if value.startswith(b"/") else None), uid


def _gpu_share(cfg: Config, rs: ResourceSet, node: NodeResources,
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
    if not table and gpus.parse_share(node.gpus).amount:
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


def _allocate(key: JobKey, node: NodeResources, backend: Backend, topo: Topology,
              hardware_threads: bool, reserved_cpus: str) -> Allocation:
    """Whole cores for the job among those no other job cgroup holds (under the node lock)."""
    from geco.node import cores
    from geco.node.topology import parse_cpulist

    busy = cores.busy_from_cpusets(_cpus_held(backend, key))
    return cores.allocate(topo, node.slots, busy_pus=busy,
                          allowed_pus=parse_cpulist(backend.available_cpus())
                          - parse_cpulist(reserved_cpus),
                          hardware_threads=hardware_threads)


def _cpus_held(backend: Backend, key: JobKey) -> Iterator[str]:
    """The cpus of every other job's cgroups. A job whose cpuset cgroup is gone holds none:
    its teardown is removing its cgroups right now, one hierarchy after the other (outside
    the node lock), and the others still list it."""
    for other in backend.job_keys():
        if other == key:
            continue
        try:
            yield backend.read_limits(other).cpus
        except GecoError:
            if backend.paths(other)["cpuset"].is_dir():
                raise
            _log.debug("job %s: its cgroups are being removed; its cores are free", other)


class Release(NamedTuple):
    """What the teardown of one job's cgroups found and did."""

    killed: int
    remaining: tuple[int, ...]
    usage: dict[str, int]

    @property
    def clean(self) -> bool:
        """True when the cgroups are gone."""
        return not self.remaining


def read_usage(key: JobKey, backend: Backend) -> dict[str, int]:
    """Return the job's accounting counters (see :meth:`Backend.usage`), ``{}`` when unreadable.

    Read them before :func:`kill_and_remove`: removing the cgroups removes
    the counters with them.
    """
    try:
        return backend.usage(key)
    except GecoError as exc:  # a half-made cgroup has no counters; teardown still runs
        _log.debug("job %s: no usage figures: %s", key, exc)
        return {}


def kill_and_remove(key: JobKey, backend: Backend, *,
                    timeout: float) -> tuple[int, tuple[int, ...]]:
    """SIGKILL everything in the job's cgroups (sub-cgroups included), wait, remove them.

    The backend freezes the cgroup so nothing can fork while it is being
    killed, SIGKILLs every member and thaws so the kills are delivered; then
    we wait for the cgroup to empty within ``timeout`` seconds and remove it.

    Returns
    -------
    (processes signalled, pids left): the cgroups are removed exactly when no
    pid is left; a cgroup that does not empty is kept, never silently leaked.

    Raises
    ------
    CgroupError
        when the kernel refuses a read, a write or the removal.
    """
    # kill() freezes first on its own (best effort: a missing freezer or a process
    # stuck in D must not stop the SIGKILLs), so nothing can fork away meanwhile
    killed = backend.kill(key)
    if not backend.wait_empty(key, timeout, kill_late=True):
        return killed, tuple(backend.pids(key))
    backend.destroy(key)
    return killed, ()


def release(key: JobKey, backend: Backend, *, timeout: float) -> Release:
    """Kill everything left in a job's cgroups and remove them (see :func:`kill_and_remove`).

    The usage counters are read first, while the cgroups still exist. A job
    without cgroups is a clean release of nothing.

    Raises
    ------
    CgroupError
        as :func:`kill_and_remove`.
    """
    if not backend.exists(key):
        return Release(0, (), {})
    usage = read_usage(key, backend)
    killed, remaining = kill_and_remove(key, backend, timeout=timeout)
    return Release(killed, remaining, usage)
