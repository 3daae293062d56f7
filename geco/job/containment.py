"""Make and unmake one job's cgroups on this node.

:func:`contain` turns a job's record for this host into cgroups: it picks
whole cores (packed by :mod:`geco.node.cores` on the hwloc topology), sets the
memory limits (the node's default for a job that requests none:
:class:`~geco.node.limits.MemoryDefault`), the task limit and the job's GPUs (the rules
of :mod:`geco.node.limits`), and creates the cgroups in every managed controller.
The other half, freeze, kill, thaw, wait until empty and remove, is
:mod:`geco.job.teardown`'s.

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
from geco.jobkey import JobKey
from geco.node import gpus, health
from geco.node.limits import GpuShare, MemoryDefault, Rules, gpu_share, jobs_memory, limits_for
from geco.resourceset import NodeResources, short_hostname
from geco.sge import execd, lookup, resourcefile
from geco.sge.execd import JobRef
from geco.sge.lookup import Found

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.node.cores import Allocation
    from geco.node.topology import Topology

__all__ = ["Contained", "contain", "contain_job", "join", "task_tmpdir"]

_log = log.get("job.containment")


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
            rules: Rules, pid: int | None = None, hardware_threads: bool = False,
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
    rules: the node's rules for the job's limits (:meth:`geco.node.limits.Rules.from_config`;
        :func:`geco.node.limits.limits_for` applies them).
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
    return _contain(key, node, backend, state_dir=state_dir, rules=rules, pid=pid,
                    hardware_threads=hardware_threads, reserved_cpus=reserved_cpus,
                    topology=topology,
                    active_jobs=active_jobs, reclaim=reclaim, gpu=None)[0]


def _contain(key: JobKey, node: NodeResources, backend: Backend, *, state_dir: Path,
             rules: Rules, pid: int | None, hardware_threads: bool, reserved_cpus: str,
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
        from geco.node.topology import Topology

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
        limits = limits_for(node, chosen, rules)
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
        job.key, node, backend, state_dir=cfg.state_dir, rules=Rules.from_config(cfg),
        pid=pid, hardware_threads=cfg.hardware_threads, reserved_cpus=cfg.cpus_reserve,
        topology=topology,
        active_jobs=job.spool_dir.parent if job.spool_dir else None, reclaim=reclaim,
        gpu=gpu_share(cfg, found.resources, node, hostname), namespace=namespace)
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


def _allocate(key: JobKey, node: NodeResources, backend: Backend, topo: Topology,
              hardware_threads: bool, reserved_cpus: str) -> Allocation:
    """Whole cores for the job among those no other job cgroup holds (under the node lock)."""
    from geco.cpulist import parse_cpulist
    from geco.node import cores

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
