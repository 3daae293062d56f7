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

:func:`run` also writes the job's trace (``-l geco_trace_level=N``, see
:mod:`geco.job.trace`): the epilog and the starter read the job's level from the
resource file the prolog saved, before their body runs; the prolog learns it
only from the resources it fetches, so it calls :func:`attach_trace` then, and
what it logged before is replayed into the file. The outcome and the
"finished" line are traced too. A trace problem is journaled and never
changes the exit code.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import time

from geco import config as _config
from geco import log, procfs
from geco.errors import (
    ConfigError,
    GecoError,
    JobKeyError,
    NotContained,
    QstatParseError,
    ResourceFormatError,
)
from geco.jobkey import JobKey
from geco.node.gpus import GpuGrantError
from geco.sge import execd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from geco.resourceset import ResourceSet

__all__ = ["Exit", "attach_trace", "journal_done", "run"]


class Exit(enum.IntEnum):
    """Hook exit codes with the meaning ``sge_shepherd(8)`` gives them."""

    OK = 0
    REQUEUE = 99
    JOB_ERROR = 100


# Errors that re-queueing cannot fix (the job's data, a GPU grant that names no GPU of
# the node, or a queue without geco's prolog): the job waits in error state with the
# reason instead of looping.
_JOB_ERRORS: tuple[type[GecoError], ...] = (QstatParseError, ResourceFormatError, NotContained,
                                            GpuGrantError)


# Hooks that run after the prolog saved the job's resource file, and whether the
# job is named on their command line (epilog: $job_id $ja_task_id) or only in
# their environment (starter: its arguments are the job's command).
_AFTER_PROLOG = {"epilog": True, "starter": False}


class _Trace:
    """The job's trace during one hook run: at most one file, attached once."""

    def __init__(self, program: str) -> None:
        self.program = program
        self.stack = contextlib.ExitStack()
        self.backlog: log.Backlog | None = None
        self.attached = False
        self.path: Path | None = None

    def collect(self) -> None:
        """Keep what is logged from now on, for a trace attached later."""
        self.backlog = log.Backlog()
        log.collect(self.backlog)

    def _drop_backlog(self) -> None:
        if self.backlog is not None:
            log.collect(None)
            self.backlog = None

    def attach(self, cfg: _config.Config, rs: ResourceSet | None) -> Path | None:
        if not self.attached:
            self.attached = True
            if rs is None or rs.trace_level <= 0:  # the common case: nothing to import
                self._drop_backlog()
                return None
            try:
                from geco.job import trace

                self.path = self.stack.enter_context(
                    trace.for_job(cfg, rs, program=self.program, backlog=self.backlog))
            except Exception as exc:  # never raised by for_job on purpose; a bug is reported
                log.get("job.trace").warning("no trace for this hook: internal error %s: %s",
                                         type(exc).__name__, exc)
            finally:
                self._drop_backlog()
        return self.path

    def close(self) -> None:
        self._drop_backlog()
        with contextlib.suppress(Exception):
            self.stack.close()


_current: _Trace | None = None


def attach_trace(cfg: _config.Config, rs: ResourceSet | None) -> Path | None:
    """Trace the rest of this hook run into ``rs``'s trace file, at its level.

    For a hook body that learns the job's resources itself (the prolog): what
    was logged since the body started is written first. Does nothing outside
    :func:`run`, when the job's level is 0, or when a trace is already attached.
    Never raises.

    Returns
    -------
    The trace file's path, or None when not tracing.
    """
    return _current.attach(cfg, rs) if _current is not None else None


def _saved_resources(cfg: _config.Config, name: str,
                     logger: log.Logger) -> ResourceSet | None:
    """The resource file of the job this hook runs for (None when none or unusable)."""
    try:
        argv = sys.argv[1:] if _AFTER_PROLOG[name] else []
        job = execd.job_from_hook(argv, os.environ)
        # only root writes trace files (geco.job.trace): a hook running as the owner (the
        # starter, on every job's critical path) traces nothing, decided before
        # anything else is imported or read
        if os.geteuid() != 0:
            return None
        from geco.sge import resourcefile

        return resourcefile.read(cfg.resources_dir, job.key)
    except Exception as exc:  # the body meets the same problem and reports it
        logger.debug("%s: no trace: %s", name, exc)
        return None


def _outcome(code: Exit, after_the_job: bool) -> str:
    if after_the_job:
        return ""
    return "; re-queueing the job" if code == Exit.REQUEUE else "; the job is put in error state"


def run(name: str, body: Callable[[_config.Config, log.Logger], Exit], *,
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
    try:
        return _run(name, body, after_the_job, started)
    finally:
        log.close()


def _run(name: str, body: Callable[[_config.Config, log.Logger], Exit],
         after_the_job: bool, started: float) -> int:
    logger = log.setup_hook(identifier=f"geco-{name}")
    try:
        # never $GECO_CONFIG here: hooks run with the job's environment, which its
        # owner controls (qsub -v), and a root prolog must not read a user's config
        cfg = _config.load(_config.DEFAULT_PATH)
    except ConfigError as exc:
        logger.error("geco %s: %s", name, exc)
        return Exit.OK if after_the_job else Exit.REQUEUE
    log.setup_hook(cfg.log_level, identifier=f"geco-{name}")
    hook_log = log.get(f"hooks.{name}")
    global _current
    _current = job_trace = _Trace(f"geco-{name}")
    try:
        if name in _AFTER_PROLOG:
            job_trace.attach(cfg, _saved_resources(cfg, name, hook_log))
        else:
            job_trace.collect()
        code = _run_body(name, body, cfg, hook_log, after_the_job)
        journal_done(hook_log, name, code, time.monotonic() - started,
                     procfs.seconds_since_start(), *_job_ids())
    finally:
        _current = None
        job_trace.close()
    return int(code)


def journal_done(logger: log.Logger, name: str, code: int, elapsed: float, since_exec: float,
                 job_id: int | str | None, task_id: int | str | None) -> None:
    """Journal a hook's end (``<name>-done``): its exit, its time in geco's code and since
    its exec (what ``bench/bench_hooks.py`` reads)."""
    logger.info("%s finished with exit %d in %.3f s (%.3f s since exec)", name, code,
                elapsed, since_exec,
                extra=log.job_fields(job_id, task_id, f"{name}-done", EXIT_STATUS=int(code),
                                     ELAPSED_SEC=f"{elapsed:.6f}",
                                     SINCE_EXEC_SEC=f"{since_exec:.3f}"))


def _job_ids() -> tuple[int | None, int | None]:
    """The job and task this hook runs for, from the environment Grid Engine gave it
    (journal fields only: none when it names no job)."""
    try:
        key = JobKey.from_sge(os.environ.get("JOB_ID"), os.environ.get("SGE_TASK_ID"))
    except JobKeyError:
        return None, None
    return key.job, key.task


def _run_body(name: str, body: Callable[[_config.Config, log.Logger], Exit],
              cfg: _config.Config, hook_log: log.Logger, after_the_job: bool) -> Exit:
    """Run the body; turn whatever it raises into an exit code, logged with the reason
    (tagged with the job, so that ``journalctl JOB_ID=<job>`` says why it was re-queued)."""
    fields = log.job_fields(*_job_ids(), f"{name}-failed")
    try:
        code = body(cfg, hook_log)
    except _JOB_ERRORS as exc:
        hook_log.error("geco %s: %s%s", name, exc, _outcome(Exit.JOB_ERROR, after_the_job),
                       extra=fields)
        code = Exit.JOB_ERROR
    except GecoError as exc:
        hook_log.error("geco %s: %s%s", name, exc, _outcome(Exit.REQUEUE, after_the_job),
                       extra=fields)
        code = Exit.REQUEUE
    except Exception as exc:  # a bug must not take the queue down with it
        hook_log.error("geco %s: internal error %s: %s%s", name, type(exc).__name__, exc,
                       _outcome(Exit.REQUEUE, after_the_job), exc_info=True, extra=fields)
        code = Exit.REQUEUE
    if after_the_job and code != Exit.OK:
        code = Exit.OK
    return code
