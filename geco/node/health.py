"""A node's health: a node that keeps failing to contain jobs takes itself out (OAR's
NodeChangeState), and a parallel job whose other hosts keep failing is held, not bounced.

Both ledgers are small files under ``<state_dir>/health``, shared by the hooks and gecod
on the node, changed under a lock only root can take (:mod:`geco.rootlock`: users may
read the ledgers, and a lock on them would be theirs to hold) and replaced whole, so a
reader (``geco check``) takes none:

* ``streak``: the times this node failed to contain a job for a cause of its own
  (:attr:`geco.errors.GecoError.node_side`: a cgroup the kernel refused, a topology hwloc
  could not read) since the last job it contained, one line each,
  ``<job> <epoch> <reason>``. When the last ``[health] sick_after`` are in a row and of
  two jobs or more (one job failing again and again may be its own doing: Grid Engine
  brings a re-queued job back first, so counting jobs only once would let two bouncing
  jobs keep a two-slot node busy for ever), the node is sick: ``node-sick`` is journaled
  with each job and reason, and with ``[health] on_sick = "disable"`` the queue instance
  the last one came in by is disabled (``qmod -d``, once per instance), so Grid Engine
  sends jobs elsewhere instead of re-queueing each one that lands here. The next job whose cgroups
  are made here (after the admin's ``qmod -e``) ends the streak: one ``unlink``, the only
  cost a healthy node pays. ``geco check`` shows the streak until then.
* ``requeues/<job>.<task>``: how often this master re-queued a parallel job because one
  of its other hosts could not prepare it; past ``[health] requeue_limit`` the job is
  held in error (exit 100) with that host's reason, instead of bouncing for ever.

Nothing here changes a hook's outcome when it fails itself: the ledger is journaled and
the job goes on as it would without it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from geco import atomicfile, jobfiles, log, rootlock
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import short_hostname
from geco.sge import execd
from geco.sge.execd import JobRef

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["contained", "describe", "failed", "forget_requeues", "requeued"]

_log = log.get("node.health")

_DISABLED = "disabled"  # a streak line naming a queue instance qmod -d took out
_REASON_MAX = 300  # a reason's characters kept in the ledger (the journal has it whole)
_REQUEUES_KEPT = 7 * 86400  # a count this old is of a job that ran elsewhere long since
_LOCK_WAIT = 2.0  # seconds a change waits for another's (root's alone, each a small file)


def _dir(cfg: Config) -> Path:
    return cfg.state_dir / "health"


def _streak(cfg: Config) -> Path:
    return _dir(cfg) / "streak"


@contextlib.contextmanager
def _changed(cfg: Config, path: Path) -> Iterator[list[list[str]]]:
    """The rows of the ledger ``path``, for the with-block to change in place; written
    back whole after it, all under the health writers' lock.

    Raises
    ------
    GecoError
        when the lock is not had or the ledger not written (OSError: not read).
    """
    _dir(cfg).mkdir(mode=0o755, parents=True, exist_ok=True)
    with rootlock.held(_dir(cfg) / ".lock", wait=_LOCK_WAIT, what="node's health ledgers"):
        rows = _read(path)
        yield rows
        data = "".join("\t".join(row) + "\n" for row in rows).encode()
        atomicfile.write_atomic(path, data, mode=0o644, make_dir=True, what="health ledger")


def _read(path: Path) -> list[list[str]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return []
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    return [line.split("\t", 2) for line in text.splitlines() if line.count("\t") == 2]


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_REASON_MAX]


def contained(cfg: Config) -> None:
    """A job's cgroups were made here: the node works, its streak ends."""
    try:
        os.unlink(_streak(cfg))
    except FileNotFoundError:
        pass
    except OSError as exc:
        _log.warning("cannot end this node's failure streak (%s): %s", _streak(cfg), exc)


def failed(cfg: Config, job: JobRef, error: GecoError, hostname: str | None = None,
           qmod: str | None = None, *, node_side: bool | None = None) -> None:
    """This node could not contain ``job`` for ``error``: count it when the cause is the
    node's, and take the node out when the streak reaches ``[health] sick_after``: the
    queue instance the job came in by (its spool says which), else every queue of the host
    (``*@<hostname>``: a slave's PREPARE, before any task of the job is spooled there).

    Parameters
    ----------
    hostname: this node's name as the job's resource set spells it (default: this host's).
    qmod: the qmod command to run instead of the one beside qstat (tests).
    node_side: the caller's word on the cause (default: ``error.node_side``).
    """
    if not (error.node_side if node_side is None else node_side) or cfg.health_sick_after <= 0:
        return
    key = job.key
    instance = (execd.queue_instance(job.spool_dir) if job.spool_dir is not None else None) \
        or f"*@{hostname or short_hostname()}"
    try:
        with _changed(cfg, _streak(cfg)) as rows:
            jobs = [row for row in rows if row[0] != _DISABLED]
            jobs.append([str(key.job), str(int(time.time())), _one_line(str(error))])
            jobs = jobs[-cfg.health_sick_after:]  # the streak's length is all that counts
            disabled = {row[1] for row in rows if row[0] == _DISABLED}
            # two jobs at least: one job failing again and again may be its own doing
            if len(jobs) >= cfg.health_sick_after and len({row[0] for row in jobs}) > 1 \
                    and _sick(cfg, key, jobs, instance, instance in disabled, qmod):
                disabled.add(instance)
            rows[:] = jobs + [[_DISABLED, w, ""] for w in sorted(disabled)]
    except (OSError, GecoError) as exc:
        _log.warning("job %s: cannot count this node's failure in %s: %s", key,
                     _streak(cfg), exc)


def _sick(cfg: Config, key: JobKey, jobs: list[list[str]], instance: str, done: bool,
          qmod: str | None) -> bool:
    """Journal ``node-sick``; disable ``instance`` unless ``done`` already or the site
    only wants it said. True when ``qmod -d`` took it out now."""
    story = "; ".join(f"job {job}: {why}" for job, why in
                      dict((job, why) for job, _at, why in jobs).items())
    fields = {"JOBS": " ".join(dict.fromkeys(job for job, _at, _why in jobs)),
              "REASON": jobs[-1][2], "QUEUE_INSTANCE": instance}
    journal = log.job_fields(key.job, key.task, "node-sick", **fields)
    head = f"this node failed to contain jobs {len(jobs)} times in a row ({story})"
    if cfg.health_on_sick != "disable":
        _log.error("%s; [health] on_sick = \"journal\": its queues stay open", head,
                   extra=journal)
        return False
    if done:
        _log.error("%s; the queue instance %s is disabled already", head, instance,
                   extra=journal)
        return False
    from geco.sge import qmod as qmod_command  # a sick node only

    why = qmod_command.disable(instance, cfg, qmod)
    if why is not None:
        _log.error("%s; cannot disable the queue instance %s: qmod -d failed: %s", head,
                   instance, why, extra=log.job_fields(key.job, key.task, "node-sick",
                                                       **fields, QMOD_ERROR=why))
        return False
    _log.error("%s; disabled the queue instance %s (qmod -d) so that Grid Engine sends jobs "
               "elsewhere; enable it again with qmod -e %s once the node is healthy", head,
               instance, instance, extra=journal)
    return True


def describe(cfg: Config) -> str:
    """``geco check``'s line: the node's failure streak, or that there is none."""
    try:
        rows = _read(_streak(cfg))  # no lock: the ledger is replaced whole
    except OSError as exc:
        return f"cannot read {_streak(cfg)}: {exc.strerror or exc}"
    jobs = [row for row in rows if row[0] != _DISABLED]
    disabled = [row[1] for row in rows if row[0] == _DISABLED]
    if not jobs:
        return "no failure to contain a job since the last one contained"
    last = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(jobs[-1][1] or 0)))
    text = (f"{len(jobs)} failure(s) in a row to contain a job here, the last at {last} (job "
            f"{jobs[-1][0]}: {jobs[-1][2]}); sick after {cfg.health_sick_after} of two jobs "
            "or more")
    if disabled:
        text += (f"; disabled {', '.join(disabled)}: enable with qmod -e once healthy (the "
                 "next job contained ends the streak)")
    return text


def requeued(cfg: Config, key: JobKey) -> int:
    """Count one more re-queue of job ``key`` by this master; return how many so far
    (0 when the count cannot be kept: the job is re-queued as before)."""
    _forget_old_requeues(cfg)
    try:
        with _changed(cfg, jobfiles.requeue_count(cfg.state_dir, key)) as rows:
            count = int(rows[0][1]) + 1 if rows and rows[0][1].isdigit() else 1
            rows[:] = [[str(key), str(count), str(int(time.time()))]]
        return count
    except (OSError, GecoError) as exc:
        _log.warning("job %s: cannot count its re-queues in %s: %s", key,
                     jobfiles.requeue_count(cfg.state_dir, key), exc)
        return 0


def forget_requeues(cfg: Config, key: JobKey) -> None:
    """Job ``key`` started: its re-queues are history."""
    with contextlib.suppress(OSError):
        os.unlink(jobfiles.requeue_count(cfg.state_dir, key))


def _forget_old_requeues(cfg: Config) -> None:
    """Remove the counts of jobs that went on elsewhere (their start here never came)."""
    folder = jobfiles.requeues_dir(cfg.state_dir)
    too_old = time.time() - _REQUEUES_KEPT
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < too_old:
                    os.unlink(entry.path)
