"""The third door: undoing a job that was contained on this node but never ran here.

Beside the way in (:func:`geco.job.containment.contain_job`) and the way out
(:func:`geco.job.ending.end_job`): a job is undone when its prolog re-queues it (its other
hosts could not prepare it: Grid Engine may place it elsewhere next time) and when a
slave host's PREPARE is aborted by the job's master (the job will not start here or
anywhere). Nothing of the job ran, so there is no accounting, no ``job-end`` record and
no stray to look for: what goes is its cgroups (anything in them killed,
:func:`geco.job.teardown.release`), its files (:func:`geco.jobfiles.forget`) and, once the
cgroups are gone, its private /tmp.

The caller holds what the job's moment needs: the prolog steps itself and the shepherd
out of the cgroups first (killing them would put the queue in error), gecod holds the
job's lock.
"""

from __future__ import annotations

from geco import jobfiles, log
from geco.cgroup import Backend
from geco.config import Config
from geco.job import teardown
from geco.jobkey import JobKey

__all__ = ["undo_job"]


def undo_job(key: JobKey, cfg: Config, backend: Backend) -> teardown.Release:
    """Leave nothing of job ``key`` on this node; what its cgroups' removal found.

    Raises
    ------
    CgroupError
        when the kernel refuses to kill or remove its cgroups (its files are kept then).
    """
    done = teardown.release(key, backend, timeout=cfg.kill_timeout)
    jobfiles.forget(cfg, key)
    if done.clean:  # the namespace PREPARE made with the cgroups
        from geco.job import privatetmp  # not at load: the prolog's start-up

        privatetmp.free(cfg, key, log.JobFields(key.job, key.task))
    return done
