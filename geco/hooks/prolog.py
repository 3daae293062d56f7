"""The prolog (root, master node, before the job): contain the job before it exists.

Configure it in the queue as ``root@/usr/libexec/geco/prolog $job_id $ja_task_id``.
That path is a small C program (``hook/geco_hook.c``): gecod does this work with this
module's own code when it can (:mod:`geco.daemon.hookserve`), else the program runs this
module as ``/usr/libexec/geco/geco-prolog``.

Steps, in order:

1. Find the job (arguments, else environment) and verify through /proc that
   our parent is this job's ``sge_shepherd``.
2. Get the job's resources: the resource file when gecod (or an earlier
   hook) wrote it, else one ``qstat -xml -j`` with placement from the
   spooled ``pe_hostfile``; save them for every later hook.
   qstat runs with the site's Grid Engine environment (:mod:`geco.sge.siteenv`),
   never the job's, which this hook inherits. If the qmaster cannot be
   reached, the job is re-queued (99); only a site that sets ``[qstat]
   run_without_memory_limits = true`` has it contained with what the node
   knows (its slots), said loudly: never uncontained without a warning.
3. Create this node's cgroups: whole cores packed by topology, memory limits.
4. Move the shepherd in. The job, the epilog and everything they fork are
   born inside; nothing of the job exists yet, so nothing can escape.
5. A job with other hosts: have every one of them make its cgroups now
   (:func:`geco.wire.cluster.prepare`, all asked at once). Any host that cannot: the
   others undo theirs, this host too, and the job is re-queued (99) with the
   host and the reason journaled (``barrier-failed``); a job never starts with
   a host that cannot contain it.

The journal tells the story (``journalctl JOB_ID=<job>``): ``resources-read``
(what the job was granted here and where that came from), then
``job-contained`` (the cores and limits applied). A job submitted with
``-l geco_trace_level=N`` gets the same lines, and at level 4 every step
(qstat, timings, the cores free and chosen), in its trace file
(:mod:`geco.job.trace`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from geco import cgroup, gpushare, jobfiles, log, procfs
from geco.config import Config
from geco.errors import GecoError
from geco.hooks import Exit, attach_trace, run
from geco.job import containment
from geco.node import gpus, health
from geco.node.limits import MemoryDefault
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import execd, lookup, v1format
from geco.units import format_memory

__all__ = ["contain", "main"]


def _human(limit: int) -> str:
    return format_memory(limit) if limit else "unlimited"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _seconds(value: float) -> str:
    # "%g" would print a week of h_rt as 604800 but two weeks as 1.2096e+06
    return str(int(value)) if value.is_integer() else f"{value:.3f}"


def _resources(job: execd.JobRef, cfg: Config, logger: log.Logger) -> lookup.Found:
    """The job's resource set and where it came from (file, qstat, spool)."""
    path = jobfiles.resource_file(cfg.resources_dir, job.key)
    if path.exists():
        logger.debug("job %s: reading the saved resources %s", job.key, path)
    else:
        logger.debug("job %s: no saved resources at %s; asking qstat (command %s, timeout "
                     "%g s, %d retries, placement from %s)", job.key, path, cfg.qstat,
                     cfg.qstat_timeout, cfg.qstat_retries, job.pe_hostfile or "qstat -g t")
    found = lookup.find(job, cfg, logger)
    if logger.isEnabledFor(log.DEBUG):  # the text is only for someone who reads debug
        logger.debug("job %s: resources from %s in %.3f s: %s", job.key, found.source,
                     found.seconds,
                     v1format.serialize(found.resources).decode("utf-8", "backslashreplace"))
    return found


def _story(job: execd.JobRef, found: lookup.Found, node: NodeResources | None, path: Path,
           logger: log.Logger) -> None:
    """Journal what the job was granted on this node and where geco read it."""
    rs, source, took = found
    here = node.slots if node is not None else 0
    memory, memsw = (node.memory_limit, node.vmem_limit) if node is not None else (0, 0)
    total = sum(n.slots for n in rs.nodes)
    parts = [f"{_plural(here, 'slot')} here of {total} on {_plural(len(rs.nodes), 'node')}"]
    parts.append(f"memory {_human(memory)}" if memory or not memsw else "")
    if memsw:
        parts.append(f"memory+swap {format_memory(memsw)}")
    if rs.runtime_limit > 0:
        parts.append(f"h_rt {_seconds(rs.runtime_limit)} s")
    if rs.trace_level > 0:
        parts.append(f"trace level {rs.trace_level}")
    origin = {"qstat": "read from qstat", "file": f"read from {path}",
              "spool": "from the execd spool only (qmaster unreachable: no memory limits)"}
    extra = {"OWNER": rs.owner, "JOB_NAME": rs.job_name, "SLOTS": here, "TOTAL_SLOTS": total,
             "NODES": len(rs.nodes), "MEMORY_LIMIT": memory, "MEMSW_LIMIT": memsw,
             "TRACE_LEVEL": rs.trace_level, "SOURCE": source,
             "RESOURCES_SEC": f"{took:.3f}"}
    if rs.runtime_limit > 0:
        extra["H_RT"] = _seconds(rs.runtime_limit)
    if rs.per_slot_vmem > 0:
        extra["H_VMEM"] = rs.per_slot_vmem
    logger.info("job %s (owner %s, %r): %s; %s", job.key, rs.owner or "unknown", rs.job_name,
                ", ".join(p for p in parts if p), origin[source],
                extra=log.job_fields(job.job_id, job.task_id, "resources-read", **extra))


def _cores_before(job: execd.JobRef, backend: cgroup.Backend, logger: log.Logger) -> None:
    """Debug: the cores geco may hand out and those other jobs hold, before choosing."""
    try:
        taken = {key: backend.read_limits(key).cpus for key in backend.job_keys()
                 if key != job.key}
        logger.debug("job %s: cores geco may use: %s; taken by other jobs: %s", job.key,
                     backend.available_cpus(),
                     ", ".join(f"{k}={c}" for k, c in taken.items()) or "none")
    except GecoError as exc:  # only a debug line: the allocation itself reports real problems
        logger.debug("job %s: cannot list the cores in use: %s", job.key, exc)


def _body(cfg: Config, logger: log.Logger) -> Exit:
    job = execd.job_from_hook(sys.argv[1:], os.environ)
    if os.geteuid() != 0:
        raise GecoError("the prolog must run as root: configure it as root@<path> in the queue",
                        job=job.key)
    return contain(job, execd.find_shepherd(job), os.getpid(), cfg, logger)


def contain(job: execd.JobRef, shepherd: int, hook: int, cfg: Config, logger: log.Logger,
            backend: cgroup.Backend | None = None, found: lookup.Found | None = None) -> Exit:
    """The prolog's work once its job and the job's verified shepherd are known (``hook``
    is the prolog's process): the resources, the cgroups, the other hosts, the story.
    gecod runs it too, for a prolog that asked it to (:mod:`geco.daemon.hookserve`), with
    its own cgroup backend and, when it asked qstat itself, the resources it ``found``."""
    logger.debug("job %s: parent %d is the job's sge_shepherd (spool dir %s)", job.key,
                 shepherd, job.spool_dir)
    found = found or _resources(job, cfg, logger)
    rs = found.resources
    trace_file = attach_trace(cfg, rs)
    if trace_file is not None:
        logger.debug("job %s: tracing at level %d into %s", job.key, rs.trace_level, trace_file)
    node = rs.node()
    _story(job, found, node, jobfiles.resource_file(cfg.resources_dir, job.key), logger)
    backend = backend or cgroup.for_config(cfg)
    logger.debug("job %s: cgroup %s, controllers %s under %s", job.key,
                 type(backend).__name__, ",".join(backend.controllers),
                 ", ".join(str(p) for p in backend.parent_paths().values()))
    # listing other jobs' cores costs a read per job: only for someone who reads debug
    if rs.trace_level >= 4 or cfg.log_level == "debug":
        _cores_before(job, backend, logger)
    started = time.monotonic()
    # with the preload, gecod moved the shepherd in at its exec. Moving it again is not
    # free: the kernel's cgroup lock makes its first taker after a quiet spell wait for an
    # RCU grace period (milliseconds), even for a process already in place
    inside = backend.contains(job.key, shepherd)
    done = containment.contain_job(job, cfg, backend, pid=None if inside else shepherd,
                                   found=found, logger=logger, private_tmp=False)
    limits = done.limits
    logger.debug("job %s: %s cgroups in %.3f s: %s", job.key,
                 "made" if done.created else "reused the existing", time.monotonic() - started,
                 ", ".join(str(p) for p in backend.paths(job.key).values()))
    logger.debug("job %s: %s", job.key,
                 f"the shepherd {shepherd} was already inside the job's cgroups" if inside
                 else f"moved the shepherd {shepherd} into the job's cgroups")
    here = node.name if node is not None else os.uname().nodename
    slots = node.slots if node is not None else 0
    default = node is not None and \
        MemoryDefault.for_job(cfg, found, node).applies(node)
    # a GPU node's record names the job's GPUs (none: every GPU is kept from it)
    granted = gpushare.format_ids(done.gpus) if done.gpus is not None \
        else gpus.job_environment(cfg, job.key).get("GECO_GPUS")
    logger.info(
        "job %s contained on %s: cores %s, NUMA nodes %s, memory %s, memory+swap %s%s, "
        "tasks %s%s, shepherd %d",
        job.key, here, limits.cpus, limits.mems, _human(limits.memory),
        _human(limits.memory_swap),
        " (this node's default for a job that requests no memory)" if default else "",
        limits.pids or "unlimited",
        "" if granted is None else f", GPUs {granted or 'none'}", shepherd,
        extra=log.job_fields(job.job_id, job.task_id, "job-contained",
                             **limits.journal_fields(),
                             MEMORY_DEFAULT="yes" if default else "no",
                             GPUS=granted, SHEPHERD_PID=shepherd,
                             SLOTS=slots, OWNER=rs.owner))
    if len(rs.nodes) > 1:
        why = _other_hosts_failure(job, rs, cfg, logger)
        if why:
            _undo(job, shepherd, hook, cfg, backend)
            return _requeue_or_hold(job, cfg, why, logger)
        health.forget_requeues(cfg, job.key)
    return Exit.OK


def _other_hosts_failure(job: execd.JobRef, rs: ResourceSet, cfg: Config,
                         logger: log.Logger) -> str:
    """Step 5: "" when every other host of the job prepared it; else why not (they undid
    it, and it is journaled which did not and why)."""
    from geco.wire import cluster  # a parallel job's prolog only

    try:
        failed = cluster.prepare(rs, cfg, logger)
    except GecoError as exc:  # the cluster key or address: nothing was sent
        logger.error("job %s cannot start on its %d hosts: %s; the job is re-queued",
                     job.key, len(rs.nodes), exc,
                     extra=log.job_fields(job.job_id, job.task_id, "barrier-failed",
                                          REASON=str(exc)))
        # this host's own setting: the node is what is sick, not the job
        health.failed(cfg, job, exc, node_side=True)
        return str(exc)
    return "; ".join(f"host {a.host} did not prepare it: {a.reason or a.status}"
                     for a in failed)


def _requeue_or_hold(job: execd.JobRef, cfg: Config, why: str, logger: log.Logger) -> Exit:
    """Re-queue a job whose other hosts did not prepare it, up to ``[health]
    requeue_limit`` times; the failure after that holds it in error (exit 100) with the
    reason."""
    count = health.requeued(cfg, job.key)  # 0: it cannot be counted; re-queued as before
    limit = cfg.health_requeue_limit
    if count <= limit:
        return Exit.REQUEUE
    health.forget_requeues(cfg, job.key)  # cleared by qmod -cj, it starts counting anew
    logger.error("job %s is held in error: re-queued %d times because its other hosts "
                 "could not prepare it, the last time: %s ([health] requeue_limit = %d); "
                 "clear it with qmod -cj %d once they can", job.key, count - 1, why, limit,
                 job.job_id, extra=log.job_fields(job.job_id, job.task_id, "job-held",
                                                  REASON=why, REQUEUES=count - 1))
    return Exit.JOB_ERROR


def _undo(job: execd.JobRef, shepherd: int, hook: int, cfg: Config,
          backend: cgroup.Backend) -> None:
    """Leave nothing of a job that is re-queued (Grid Engine may place it elsewhere next
    time: its next prolog asks again): the prolog and the shepherd step out of its cgroups
    (killing them would put the queue in error), then the job is undone."""
    from geco.job.undo import undo_job  # a re-queue only

    sge_execd = procfs.ppid(shepherd) or 1
    backend.move_to_cgroups_of(hook, sge_execd)
    backend.move_to_cgroups_of(shepherd, sge_execd)
    undo_job(job.key, cfg, backend)


def main() -> int:
    """Entry point of ``geco-prolog`` / ``python -m geco.hooks.prolog``."""
    return run("prolog", _body)


if __name__ == "__main__":
    sys.exit(main())
