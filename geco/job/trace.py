"""Per-job trace files: what geco did for one job, at the level the job asked for.

A job submitted with ``-l geco_trace_level=N`` gets every geco log line about
it at that level or more severe in ``<trace_dir>/<job>.<task>.trace``:

=====  ========  =====================================================
level  logging   lines written
=====  ========  =====================================================
0      -         none (the default: no file)
1      ERROR     errors
2      WARNING   errors and warnings
3      INFO      ... and the steps an owner cares about
4      DEBUG     ... and every step (qstat runs, timings, core choice)
=====  ========  =====================================================

A line is the original's seed format with the program that wrote it after
the time stamp, so the lines of the prolog, gecod and the epilog interleave
readably in one file::

    2015-11-19T13:56:46-0500 geco-prolog [28152|INFO ]: (prolog.py:88) job 42.1 ...

Only root writes a trace file, and it stays root's: the owner can read it but
not write it, so nobody can grow a file in /var/log beyond what geco says
about their job (:mod:`geco.ownerread`: ``root:<owner's private group>`` 0640, or
root's alone, with a warning, ``GECO_EVENT=trace-root-only``, when the owner has no
private group). The starter, which runs as the owner, writes no lines here; they are
in the journal like every hook's. A refused or failing trace (a symlink or FIFO
planted, a directory others can write) is journaled as a warning
(``GECO_EVENT=trace-refused``) and never fails the job.

Two ways in:

* :func:`for_job`: a hook (one job per process) traces a block of code.
* :class:`TraceRouter`: gecod (many jobs per process) routes each record that
  carries a job's fields (:func:`geco.log.job_fields`) to that job's file,
  reading the job's level from its resource file (cached by mtime).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from geco import jobfiles, log, ownerread
from geco.config import Config
from geco.errors import JobKeyError
from geco.jobkey import JobKey
from geco.log_handlers import SeedFormatter
from geco.resourceset import ResourceSet

__all__ = ["LEVELS", "TraceFormatter", "TraceRouter", "for_job", "logging_level"]

_log = log.get("job.trace")

# geco_trace_level -> the least severe logging level written
LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}
_FIELDS_ATTR = "geco_fields"  # where geco.log.job_fields puts a record's journal fields
# O_NONBLOCK: opening a FIFO planted in the directory fails (ENXIO) instead of
# hanging the hook until someone reads it; it changes nothing for a regular file.
_OPEN_FLAGS = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
               | os.O_NONBLOCK)
_RETRY_REFUSED = 60.0   # seconds gecod leaves a refused trace file alone before trying again


def logging_level(trace_level: int) -> int | None:
    """Return the least severe logging level a job's trace keeps, None when tracing is off.

    Parameters
    ----------
    trace_level: the job's ``geco_trace_level`` (0 or less = off; above 4 = debug).
    """
    if trace_level <= 0:
        return None
    return LEVELS.get(trace_level, logging.DEBUG)


class TraceFormatter(SeedFormatter):
    """The seed format with the writing program after the time stamp."""

    def __init__(self, program: str) -> None:
        super().__init__()
        self.program = program

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        # the seed line starts "<stamp> [": the stamp has no blank in it
        stamp, _, rest = line.partition(" ")
        return f"{stamp} {self.program} {rest}"


# ---------------------------------------------------------------------------
# opening a trace file safely


def _open_trace(cfg: Config, job_id: int, task_id: int, owner: ownerread.Readers) -> int:
    """Return a write-only append descriptor of the job's trace file, or raise ownerread.Refused."""
    path = jobfiles.trace(cfg.trace_dir, JobKey(job_id, task_id))
    try:
        dfd = ownerread.open_dir(cfg.trace_dir)
    except OSError as exc:  # mkdir refused (read-only /var/log, ...)
        raise ownerread.Refused(f"cannot make {cfg.trace_dir}: {exc.strerror}") from exc
    try:
        return ownerread.open_in(dfd, path.name, owner, path, _OPEN_FLAGS)
    except OSError as exc:  # fstat/fchown/unlink refused
        raise ownerread.Refused(f"cannot set up {path}: {exc.strerror}") from exc
    finally:
        os.close(dfd)


def _refused(job_id: int, task_id: int, why: str) -> None:
    _log.warning("job %s.%s: no trace file written: %s", job_id, task_id, why,
                 extra=log.job_fields(job_id, task_id, "trace-refused", REASON=why))


def _root_only(job_id: int, task_id: int, owner: str, why: str) -> None:
    _log.warning("job %s.%s: %s; its trace file is readable by root only", job_id, task_id,
                 why, extra=log.job_fields(job_id, task_id, "trace-root-only", OWNER=owner,
                                           REASON=why))


def _encode(line: str) -> bytes:
    return (line + "\n").encode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------
# hooks: one job per process


class _TraceFile(logging.Handler):
    """Appends each record to one open trace file; stops (with a warning) on a write error."""

    def __init__(self, fd: int, path: Path, level: int, program: str, job: tuple[int, int]):
        super().__init__(level)
        self.fd: int | None = fd
        self.path = path
        self.job = job
        self.setFormatter(TraceFormatter(program))

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, _encode(self.format(record)))
        except OSError as exc:
            # closed first, so the warning below does not come back here
            os.close(self.fd)
            self.fd = None
            _refused(*self.job, f"cannot write {self.path}: {exc.strerror}")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        super().close()


@contextlib.contextmanager
def _for_job(cfg: Config, rs: ResourceSet | None, program: str,
             backlog: log.Backlog | None) -> Iterator[Path | None]:
    level = logging_level(rs.trace_level) if rs is not None else None
    # only root writes trace files (see the top of this module): the starter, as the
    # job's owner, leaves its lines in the journal only
    if rs is None or level is None or os.geteuid() != 0:
        yield None
        return
    handler: _TraceFile | None = None
    try:
        owner = ownerread.readers_of(rs.owner)
        if owner.root_only:
            _root_only(rs.job_id, rs.task_id, rs.owner, owner.root_only)
        fd = _open_trace(cfg, rs.job_id, rs.task_id, owner)
        handler = _TraceFile(fd, jobfiles.trace(cfg.trace_dir, rs.key), level, program,
                             (rs.job_id, rs.task_id))
    except ownerread.Refused as exc:
        _refused(rs.job_id, rs.task_id, str(exc))
    except Exception as exc:  # a trace must never fail the job: a bug here is reported only
        _refused(rs.job_id, rs.task_id, f"internal error {type(exc).__name__}: {exc}")
    if handler is None:
        yield None
        return
    geco = logging.getLogger("geco")
    saved = geco.level
    if geco.getEffectiveLevel() > level:
        geco.setLevel(level)
    geco.addHandler(handler)
    try:
        if backlog is not None:
            backlog.replay(handler)
        yield handler.path
    finally:
        geco.removeHandler(handler)
        geco.setLevel(saved)
        handler.close()


def for_job(cfg: Config, rs: ResourceSet | None, *, program: str = "geco",
            backlog: log.Backlog | None = None,
            ) -> contextlib.AbstractContextManager[Path | None]:
    """Trace what the ``geco`` loggers say during a block into the job's trace file.

    Adds a handler at the job's level to the ``geco`` logger for the block (and
    lowers that logger's level for it when needed; both restored after). Does
    nothing when ``rs`` is None, the job's trace level is 0, or this process is
    not root (only root writes trace files). A file that
    cannot or must not be written is journaled as a warning and the block runs
    untraced: nothing here raises into the caller.

    Parameters
    ----------
    cfg: settings (``trace_dir``).
    rs: the job's resources (level, owner, ids), or None.
    program: names the writer on each line (``geco-prolog``, ...).
    backlog: earlier records to write first (those at the job's level or above).

    Returns
    -------
    A context manager yielding the trace file's path, or None when not tracing.
    """
    return _for_job(cfg, rs, program, backlog)


# ---------------------------------------------------------------------------
# gecod: many jobs per process


@dataclass(slots=True)
class _Job:
    """What the router knows of one job's resource file."""

    job_id: int
    task_id: int
    mtime_ns: int                # st_mtime_ns and st_ino of the resource file read
    ino: int
    level: int | None            # least severe logging level traced; None = off
    owner_name: str
    owner: ownerread.Readers | None = None  # looked up when the first line is written
    refused_until: float = 0.0   # monotonic time before which no open is retried


class _Busy(threading.local):
    """Per thread: True while the router writes (its own warnings must not come back)."""

    busy = False


class TraceRouter(logging.Handler):
    """Route job records of a multi-job process (gecod) to their jobs' trace files.

    A record is written when it carries ``JOB_ID`` and ``SGE_TASK_ID`` (see
    :func:`geco.log.job_fields`) and that job's resource file asks for a trace
    level that admits the record's level. The resource file is read once and
    kept while its mtime and inode stay the same; a missing, unreadable or
    garbage file means "not traced" and never raises. For the common job
    without tracing a record costs one ``stat``.

    Parameters
    ----------
    cfg: settings (``resources_dir``, ``trace_dir``).
    program: names the writer on each line.
    max_jobs: jobs remembered at most (the oldest are forgotten first).
    """

    # max_jobs: a node's running jobs with room (ended ones stay until pushed out: gecod
    # must not grow with the jobs it saw; a job pushed out is read again, one stat and read)
    def __init__(self, cfg: Config, *, program: str = "gecod", max_jobs: int = 256) -> None:
        super().__init__(logging.DEBUG)
        self.cfg = cfg
        self.max_jobs = max_jobs
        self.setFormatter(TraceFormatter(program))
        self._resources = f"{cfg.resources_dir}/"
        self._jobs: dict[str, _Job] = {}
        self._jobs_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._local = _Busy()

    def _traced(self, record: logging.LogRecord) -> _Job | None:
        """The job whose trace file wants ``record``, if any."""
        fields = getattr(record, _FIELDS_ATTR, None)
        if not fields:
            return None
        job_text, task_text = fields.get("JOB_ID"), fields.get("SGE_TASK_ID")
        if not (job_text and task_text):
            return None
        # they name files: a key's grammar, so a record cannot point outside the directories
        try:
            key = JobKey.parse(f"{job_text}.{task_text}")
        except JobKeyError:  # no job has such ids: nothing to trace into
            return None
        entry = self._lookup(key)
        if entry is None or entry.level is None or record.levelno < entry.level:
            return None
        return entry

    def wants(self, record: logging.LogRecord) -> bool:
        """True when ``record`` goes to a trace file (gecod asks before handing a record
        to its logging thread: most records go to no trace)."""
        return self._traced(record) is not None

    def handle(self, record: logging.LogRecord) -> bool:
        # the common case (no job fields, or a job without tracing) is decided here,
        # without a lock; only a record that is written takes one
        if self._local.busy:
            return False
        entry = self._traced(record)
        if entry is None:
            return False
        if not self.filter(record):
            return False
        # busy: the warning of a refused file carries the job's fields too; it must
        # reach the journal, not come back here
        self._local.busy = True
        try:
            with self._write_lock:
                self._write(entry, record)
        finally:
            self._local.busy = False
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def _lookup(self, key: JobKey) -> _Job | None:
        """The job's entry, re-read when its resource file changed; None without a file."""
        path = self._resources + key
        entry = self._jobs.get(key)
        # access() answers "no file" without raising: the cheapest test for a job
        # gecod logs about before (or without) its resource file
        if entry is None and not os.access(path, os.F_OK):
            return None
        try:
            st = os.stat(path)
        except OSError:
            if entry is not None:
                with self._jobs_lock:
                    self._jobs.pop(key, None)
            return None
        if entry is not None and entry.mtime_ns == st.st_mtime_ns and entry.ino == st.st_ino:
            return entry
        entry = self._read(key, st.st_mtime_ns, st.st_ino)
        with self._jobs_lock:
            if key not in self._jobs and len(self._jobs) >= self.max_jobs:
                # dicts keep insertion order: forget the job seen first
                del self._jobs[next(iter(self._jobs))]
            self._jobs[key] = entry
        return entry

    def _read(self, key: JobKey, mtime_ns: int, ino: int) -> _Job:
        from geco.sge import resourcefile  # only when a resource file is new or has changed

        job_id, task_id = key.job, key.task
        try:
            rs = resourcefile.read(self.cfg.resources_dir, key)
        except Exception:  # garbage or unreadable: not traced; the hooks report the file
            rs = None
        level = logging_level(rs.trace_level) if rs is not None else None
        return _Job(job_id, task_id, mtime_ns, ino, level, rs.owner if rs is not None else "")

    def _write(self, entry: _Job, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if now < entry.refused_until:
            return
        job = (entry.job_id, entry.task_id)
        try:
            if entry.owner is None:
                entry.owner = ownerread.readers_of(entry.owner_name)
                if entry.owner.root_only:
                    _root_only(*job, entry.owner_name, entry.owner.root_only)
            data = _encode(self.format(record))
            fd = _open_trace(self.cfg, *job, entry.owner)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except ownerread.Refused as exc:
            entry.refused_until = now + _RETRY_REFUSED
            _refused(*job, str(exc))
        except OSError as exc:
            entry.refused_until = now + _RETRY_REFUSED
            path = jobfiles.trace(self.cfg.trace_dir, JobKey(*job))
            _refused(*job, f"cannot write {path}: {exc.strerror}")
        except Exception as exc:  # a trace must never take gecod down
            entry.refused_until = now + _RETRY_REFUSED
            _refused(*job, f"internal error {type(exc).__name__}: {exc}")
