"""Grid Engine hooks: prolog, starter_method, epilog.

Every hook runs through :func:`run`, the one place that turns an outcome into
an exit code Grid Engine understands (``sge_shepherd(8)``):

* ``0``   done;
* ``99``  re-queue the job (a transient or node problem: qmaster lost, no
  free cores, a cgroup the kernel refused);
* ``100`` the job's own problem (its request or data cannot be handled);
  Grid Engine keeps it in error state for the user or admin to look at.

Any other code would put the *queue* in error state and stop the node for
everyone, so no hook ever returns one, not even on a bug.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import time
from collections.abc import Callable

from geco import config as _config
from geco import log
from geco.errors import (
    ConfigError,
    GecoError,
    NotContained,
    QstatParseError,
    ResourceFormatError,
)

__all__ = ["Exit", "run"]


class Exit(enum.IntEnum):
    """Hook exit codes with the meaning ``sge_shepherd(8)`` gives them."""

    OK = 0
    REQUEUE = 99
    JOB_ERROR = 100


# Errors that re-queueing cannot fix (the job's data, or a queue without geco's
# prolog): the job waits in error state with the reason instead of looping.
_JOB_ERRORS: tuple[type[GecoError], ...] = (QstatParseError, ResourceFormatError, NotContained)


def process_age() -> float:
    """Seconds since this process was exec'd (interpreter start-up included)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except OSError:
        return 0.0
    start_ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def _outcome(code: Exit, after_the_job: bool) -> str:
    if after_the_job:
        return ""
    return "; re-queueing the job" if code == Exit.REQUEUE else "; the job is put in error state"


def run(name: str, body: Callable[[_config.Config, logging.Logger], Exit], *,
        after_the_job: bool = False) -> int:
    """Run a hook body with configuration and logging set up; return its exit code.

    Parameters
    ----------
    name: the hook's name (``prolog``, ``epilog``, ``starter``); journaled as
        ``SYSLOG_IDENTIFIER=geco-<name>``.
    body: does the work and returns an :class:`Exit`; raises GecoError on failure.
    after_the_job: the job has already run (epilog): a failure is logged and the
        hook exits 0, because re-queueing would run the job a second time.
    """
    started = time.monotonic()
    logger = log.setup(identifier=f"geco-{name}")
    try:
        # never $GECO_CONFIG here: hooks run with the job's environment, which its
        # owner controls (qsub -v), and a root prolog must not read a user's config
        cfg = _config.load(_config.DEFAULT_PATH)
    except ConfigError as exc:
        logger.error("geco %s: %s", name, exc)
        return Exit.OK if after_the_job else Exit.REQUEUE
    logger = log.setup(cfg.log_level, identifier=f"geco-{name}")
    hook_log = log.get(name)
    try:
        code = body(cfg, hook_log)
    except _JOB_ERRORS as exc:
        hook_log.error("geco %s: %s%s", name, exc, _outcome(Exit.JOB_ERROR, after_the_job))
        code = Exit.JOB_ERROR
    except GecoError as exc:
        hook_log.error("geco %s: %s%s", name, exc, _outcome(Exit.REQUEUE, after_the_job))
        code = Exit.REQUEUE
    except Exception as exc:  # a bug must not take the queue down with it
        hook_log.error("geco %s: internal error %s: %s%s", name, type(exc).__name__, exc,
                       _outcome(Exit.REQUEUE, after_the_job), exc_info=True)
        code = Exit.REQUEUE
    if after_the_job and code != Exit.OK:
        code = Exit.OK
    elapsed, since_exec = time.monotonic() - started, process_age()
    job_id, task_id = os.environ.get("JOB_ID"), os.environ.get("SGE_TASK_ID")
    hook_log.info("%s finished with exit %d in %.3f s (%.3f s since exec)", name, code,
                  elapsed, since_exec,
                  extra=log.job_fields(job_id, "1" if task_id == "undefined" else task_id,
                                       f"{name}-done", EXIT_STATUS=int(code),
                                       ELAPSED_SEC=f"{elapsed:.6f}",
                                       SINCE_EXEC_SEC=f"{since_exec:.3f}"))
    logging.shutdown()
    sys.stderr.flush()
    return int(code)
