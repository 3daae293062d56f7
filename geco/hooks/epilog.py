"""The epilog (root, master node, after the job): leave nothing behind.

Configure it in the queue as ``root@/opt/geco/libexec/epilog $job_id $ja_task_id``.

Steps, in order:

1. Find the job and verify that our parent is its ``sge_shepherd``.
2. Step out: the epilog and the shepherd were born inside the job's cgroups;
   move both back to where ``sge_execd`` lives so that killing the job's
   cgroup cannot kill them.
3. Freeze, SIGKILL, thaw, wait until the cgroups are empty, remove them.
   A cgroup that does not empty is reported with its pids and kept, never
   silently leaked.
4. Remove the job's resource file and journal the job's end.

The epilog always exits 0: the job has already run, and any other code would
re-run it (99) or put the queue in error state.
"""

from __future__ import annotations

import logging
import os
import sys

from geco import cgroup, containment, log, sgejob, statefile
from geco.config import Config
from geco.hooks import Exit, run
from geco.units import format_memory

__all__ = ["main"]


def _body(cfg: Config, logger: logging.Logger) -> Exit:
    job = sgejob.job_from_hook(sys.argv[1:], os.environ)
    shepherd = sgejob.find_shepherd(job)
    backend = cgroup.for_config(cfg)
    if backend.exists(job.key):
        execd = sgejob.proc_ppid(shepherd) or 1
        backend.move_to_cgroups_of(os.getpid(), execd)
        backend.move_to_cgroups_of(shepherd, execd)
        outcome = containment.release(job.key, backend, timeout=cfg.kill_timeout)
        if not outcome.clean:
            logger.error("job %s: %d process(es) survived SIGKILL for %.0f s; "
                         "cgroups kept: pids %s",
                         job.key, len(outcome.remaining), cfg.kill_timeout,
                         " ".join(map(str, outcome.remaining)),
                         extra=log.job_fields(job.job_id, job.task_id, "cleanup-stuck",
                                              PIDS=" ".join(map(str, outcome.remaining))))
            return Exit.OK
        peak = outcome.usage.get("memory_peak", 0)
        logger.info("job %s ended: cgroups removed, %d leftover process(es) killed, "
                    "peak memory %s", job.key, outcome.killed, format_memory(peak),
                    extra=log.job_fields(job.job_id, job.task_id, "job-end",
                                         KILLED=outcome.killed,
                                         MEMORY_PEAK=peak))
    else:
        logger.info("job %s has no cgroups on this node", job.key,
                    extra=log.job_fields(job.job_id, job.task_id, "job-end"))
    statefile.remove(cfg.resources_dir, job.job_id, job.task_id)
    return Exit.OK


def main() -> int:
    """Entry point of ``geco-epilog`` / ``python -m geco.hooks.epilog``."""
    return run("epilog", _body, after_the_job=True)


if __name__ == "__main__":
    sys.exit(main())
