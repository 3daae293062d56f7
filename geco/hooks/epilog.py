"""The epilog (root, master node, after the job): leave nothing behind.

Configure it in the queue as ``root@/opt/geco/libexec/epilog $job_id $ja_task_id``.
That path is a small C program (``preload/geco_hook.c``): gecod does this work with this
module's own code when it can (:mod:`geco.daemon.hookserve`), else the program runs this
module as ``/opt/geco/libexec/geco-epilog``.

Steps, in order:

1. Find the job and verify that our parent is its ``sge_shepherd``.
2. Step out: the epilog and the shepherd were born inside the job's cgroups;
   move both back to where ``sge_execd`` lives so that killing the job's
   cgroup cannot kill them.
3. Tear the job down (:func:`geco.teardown.tear_down`): freeze, SIGKILL, thaw,
   wait until the cgroups are empty, remove them, and journal the job's end
   with its accounting. A cgroup that does not empty is journaled with its
   stuck processes and kept for gecod's reaper, and (``disable_queue_on_stuck``)
   the job's queue instance is disabled with ``qmod -d``.
4. Remove the job's resource file once its cgroups are gone.

The queue instance comes from the spooled ``config`` (``queue=`` and ``host=``),
never from ``$QUEUE``/``$HOSTNAME``: the epilog runs with the job's
environment, which its owner controls.

The epilog always exits 0: the job has already run, and any other code would
re-run it (99) or put the queue in error state.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from geco import cgroup, log, procfs, strays, teardown
from geco.accounting import Accounting
from geco.config import Config
from geco.errors import GecoError
from geco.hooks import Exit, run
from geco.sge import execd, resourcefile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.cluster import WholeJob

__all__ = ["end", "main"]


def _body(cfg: Config, logger: log.Logger) -> Exit:
    job = execd.job_from_hook(sys.argv[1:], os.environ)
    return end(job, execd.find_shepherd(job), os.getpid(), cfg, logger)


def end(job: execd.JobRef, shepherd: int, hook: int, cfg: Config, logger: log.Logger,
        backend: cgroup.Backend | None = None) -> Exit:
    """The epilog's work once its job and the job's verified shepherd are known; ``hook``
    is the epilog's process. gecod runs it too, for an epilog that asked it to
    (:mod:`geco.daemon.hookserve`), with its own cgroup backend."""
    backend = backend or cgroup.for_config(cfg)
    if backend.exists(job.key):
        sge_execd = procfs.ppid(shepherd) or 1
        backend.move_to_cgroups_of(hook, sge_execd)
        backend.move_to_cgroups_of(shepherd, sge_execd)
    instance = execd.queue_instance(job.spool_dir) if job.spool_dir else None
    if instance is None:
        logger.warning("job %s: no queue instance in the spooled config; a stuck teardown "
                       "would disable every queue on this host", job.key)
    result = teardown.tear_down(job.key, backend, cfg, queue_instance=instance,
                                cleaned_by="epilog",
                                other_hosts=_other_hosts(job, cfg, logger))
    # a stuck job keeps its resource file: the reaper's retry may need it
    if result.clean:
        owner = strays.owner_of(cfg, job.key, job.spool_dir)
        resourcefile.remove(cfg.resources_dir, job.key)
        # processes the job left through at, cron, ssh...: killed if this was the owner's last
        strays.after_job(cfg, backend, job.key, owner, cleaned_by="epilog")
    return Exit.OK


def _other_hosts(job: execd.JobRef, cfg: Config, logger: log.Logger
                 ) -> Callable[[Accounting], WholeJob] | None:
    """A parallel job's other hosts, told to end it (all at once) and asked for their figures:
    what joins this host's to make the job's one ``job-end`` record; None for a job of one
    host (or whose resource file is gone: then the slaves' reapers end it there)."""
    try:
        rs = resourcefile.read(cfg.resources_dir, job.key)
    except GecoError:
        return None
    if rs is None or len(rs.nodes) < 2:
        return None
    from geco import cluster  # a parallel job's epilog only

    answers = cluster.release(rs, cfg, logger)
    node = rs.node()
    here = node.name if node is not None else os.uname().nodename
    return lambda figures: cluster.whole_job(here, figures, answers)


def main() -> int:
    """Entry point of ``geco-epilog`` / ``python -m geco.hooks.epilog``."""
    return run("epilog", _body, after_the_job=True)


if __name__ == "__main__":
    sys.exit(main())
