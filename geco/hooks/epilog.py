"""The epilog (root, master node, after the job): leave nothing behind.

Configure it in the queue as ``root@/usr/libexec/geco/epilog $job_id $ja_task_id``.
That path is a small C program (``hook/geco_hook.c``): gecod does this work with this
module's own code when it can (:mod:`geco.daemon.hookserve`), else the program runs this
module as ``/usr/libexec/geco/geco-epilog``.

Steps, in order:

1. Find the job and verify that our parent is its ``sge_shepherd``.
2. Step out (under the job's lock, when gecod runs this): the epilog and the shepherd
   were born inside the job's cgroups; move both back to where ``sge_execd`` lives so
   that killing the job's cgroup cannot kill them.
3. End the job (:func:`geco.job.ending.end_job`, as every way a job ends does): a parallel
   job's other hosts told; freeze, SIGKILL, thaw, wait until the cgroups are empty,
   remove them, and journal the job's end with its accounting. A cgroup that does not
   empty is journaled with its stuck processes and kept for gecod's reaper, and
   (``disable_queue_on_stuck``) the job's queue instance is disabled with ``qmod -d``.
   Its cgroups gone, its files are forgotten and its owner's strays looked for.

The queue instance comes from the spooled ``config`` (``queue=`` and ``host=``),
never from ``$QUEUE``/``$HOSTNAME``: the epilog runs with the job's
environment, which its owner controls.

The epilog always exits 0: the job has already run, and any other code would
re-run it (99) or put the queue in error state.
"""

from __future__ import annotations

import os
import sys

from geco import cgroup, log, procfs
from geco.config import Config
from geco.hooks import Exit, run
from geco.job import ending
from geco.sge import execd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.resourceset import ResourceSet

__all__ = ["end", "main"]


def _body(cfg: Config, logger: log.Logger) -> Exit:
    job = execd.job_from_hook(sys.argv[1:], os.environ)
    return end(job, execd.find_shepherd(job), os.getpid(), cfg, logger)


def end(job: execd.JobRef, shepherd: int, hook: int, cfg: Config, logger: log.Logger,
        backend: cgroup.Backend | None = None, *, gate: ending.Gate | None = None,
        resources: ResourceSet | ending.Unread | None = ending.UNREAD) -> Exit:
    """The epilog's work once its job and the job's verified shepherd are known; ``hook``
    is the epilog's process. gecod runs it too, for an epilog that asked it to
    (:mod:`geco.daemon.hookserve`), with its own cgroup backend, its ``gate`` (job lock,
    ending jobs) and the job's ``resources`` it read."""
    backend = backend or cgroup.for_config(cfg)
    instance = execd.queue_instance(job.spool_dir) if job.spool_dir else None
    if instance is None:
        logger.warning("job %s: no queue instance in the spooled config; a stuck teardown "
                       "would disable every queue on this host", job.key)

    def step_out() -> bool:
        if backend.exists(job.key):
            sge_execd = procfs.ppid(shepherd) or 1
            backend.move_to_cgroups_of(hook, sge_execd)
            backend.move_to_cgroups_of(shepherd, sge_execd)
        return True

    ended = ending.end_job(job, cfg, backend,
                           ending.Ender("epilog", gate, step_out, instance, logger),
                           resources=resources)
    if ended is not None and ended.strays is not None:
        ended.strays()
    return Exit.OK


def main() -> int:
    """Entry point of ``geco-epilog`` / ``python -m geco.hooks.epilog``."""
    return run("epilog", _body, after_the_job=True)


if __name__ == "__main__":
    sys.exit(main())
