"""The prolog (root, master node, before the job): contain the job before it exists.

Configure it in the queue as ``root@/opt/geco/libexec/prolog $job_id $ja_task_id``.

Steps, in order:

1. Find the job (arguments, else environment) and verify through /proc that
   our parent is this job's ``sge_shepherd``.
2. Get the job's resources: the resource file when gecod (or an earlier
   hook) wrote it, else one ``qstat -xml -j`` with placement from the
   spooled ``pe_hostfile``; save them for every later hook.
   If the qmaster cannot be reached, contain the job with what the node
   knows (its slots) and say so loudly: a job runs bound to its cores
   rather than not at all, and never uncontained without a warning.
3. Create this node's cgroups: whole cores packed by topology, memory limits.
4. Move the shepherd in. The job, the epilog and everything they fork are
   born inside; nothing of the job exists yet, so nothing can escape.
"""

from __future__ import annotations

import logging
import os
import sys

from geco import cgroup, containment, jobresources, log, sgejob
from geco.config import Config
from geco.errors import GecoError
from geco.hooks import Exit, run
from geco.units import format_memory

__all__ = ["main"]


def _human(limit: int) -> str:
    return format_memory(limit) if limit else "unlimited"


def _body(cfg: Config, logger: logging.Logger) -> Exit:
    job = sgejob.job_from_hook(sys.argv[1:], os.environ)
    if os.geteuid() != 0:
        raise GecoError("the prolog must run as root: configure it as root@<path> in the queue",
                        job=job.key)
    shepherd = sgejob.find_shepherd(job)
    rs = jobresources.resources_for(job, cfg, logger)
    node = rs.node()
    if node is None:
        raise GecoError("the job has no slots on this host", job=job.key,
                        host=os.uname().nodename, hosts=",".join(n.name for n in rs.nodes))
    backend = cgroup.for_config(cfg)
    backend.ensure_root()
    limits = containment.contain(
        job.key, node, backend, state_dir=cfg.state_dir, hardware_threads=cfg.hardware_threads,
        active_jobs=job.spool_dir.parent if job.spool_dir else None)
    try:
        backend.add_pid(job.key, shepherd)
    except GecoError:
        containment.release(job.key, backend, timeout=cfg.kill_timeout)
        raise
    logger.info(
        "job %s contained on %s: cores %s, NUMA nodes %s, memory %s, memory+swap %s, shepherd %d",
        job.key, node.name, limits.cpus, limits.mems, _human(limits.memory),
        _human(limits.memory_swap), shepherd,
        extra=log.job_fields(job.job_id, job.task_id, "job-contained", CPUS=limits.cpus,
                             MEMS=limits.mems, MEMORY_LIMIT=limits.memory,
                             MEMSW_LIMIT=limits.memory_swap, SHEPHERD_PID=shepherd,
                             SLOTS=node.slots, OWNER=rs.owner))
    return Exit.OK


def main() -> int:
    """Entry point of ``geco-prolog`` / ``python -m geco.hooks.prolog``."""
    return run("prolog", _body)


if __name__ == "__main__":
    sys.exit(main())
