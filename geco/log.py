"""Logging in the original GECO's line format, and the same events in journald.

A line on stderr (or a file) looks like the seed's::

    2015-11-19T13:56:46-0500 [28152|WARN ]: text

The five levels are the original's: quiet, error, warn, info, debug (default
error). Hooks write their stderr into the job's ``.e`` file, so the default
keeps users' files clean; the journal gets info and above whatever the stderr
level, so ``journalctl JOB_ID=42`` tells an admin the whole story.

Events about a job carry structured fields; build them with :func:`job_fields`::

    log.get("cgroup").info("created %s", path,
                           extra=job_fields(42, 1, "cgroup-created", CGROUP=path))

Grid Engine reuses job numbers, so a job's records also say which job of its number
they are about: ``SGE_CLUSTER`` and ``JOB_SUBMITTED`` (:mod:`geco.sge.jobinstance`),
added by :func:`job_fields` for every job task this process has read or written the
resource file of (:func:`job_instance`), for as long as that file is unchanged.

Every module logs through :func:`get`, whose loggers have the standard
library's calling conventions. Where a record goes depends on the process:

* a hook (:func:`setup_hook`) writes its lines and journal datagrams itself,
  without importing :mod:`logging` at all: the standard library's logging
  costs a hook more start-up time than its whole job (``bench/bench_hooks.py``);
* every other process (gecod, the CLI, tests) hands records to the standard
  library's ``geco.*`` loggers, configured by :func:`setup`
  (:mod:`geco.log_handlers`), so its handlers, queues and ``caplog`` work.

In a hook, records also reach the standard library's ``geco`` logger when
something listens there (a job's trace file, :mod:`geco.job.trace`, imports it
only then). The journal is used when ``/run/systemd/journal/socket`` exists;
without it the stream alone works (no environment override: root hooks run
with the job's environment, which its owner controls). Logging never waits for
journald: a record journald has no room for is dropped and counted
(:func:`dropped`), so a job start never hangs on the journal.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from collections.abc import Mapping
    from types import TracebackType
    from typing import IO, Protocol, TypeAlias

    ExcInfo: TypeAlias = tuple[type[BaseException], BaseException, TracebackType | None]

    class LevelCall(Protocol):
        """``logger.info(msg, *args, exc_info=..., extra=..., stacklevel=...)``, as logging."""

        def __call__(self, msg: object, *args: object, exc_info: object = ...,
                     extra: Mapping[str, object] | None = ..., stacklevel: int = ...) -> None: ...


__all__ = ["CLUSTER_FIELD", "DEBUG", "ERROR", "INFO", "LEVELS", "SUBMITTED_FIELD", "WARNING",
           "Backlog", "JobFields", "Logger", "Record", "close", "collect", "dropped", "get",
           "in_background", "job_fields", "job_instance", "seed_line", "setup", "setup_hook",
           "speaking_as", "stop_background", "submitted_text"]

# The standard library's level numbers, so both kinds of record compare alike.
DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50
# Grid Engine names levels the original way; map them onto those numbers.
LEVELS = {"quiet": CRITICAL + 10, "error": ERROR, "warn": WARNING, "info": INFO,
          "debug": DEBUG}
_LABEL = {CRITICAL: "EMERG", ERROR: "ERROR", WARNING: "WARN ", INFO: "INFO ", DEBUG: "DEBUG"}
# syslog priorities for the journal's PRIORITY field
_PRIORITY = {CRITICAL: 2, ERROR: 3, WARNING: 4, INFO: 6, DEBUG: 7}
_JOURNAL_SOCKET = "/run/systemd/journal/socket"
FIELDS_ATTR = "geco_fields"  # the extra= key (and stdlib record attribute) of job fields
_BACKLOG_RECORDS = 2000


# ---------------------------------------------------------------------------
# records and their two renderings


class Record:
    """One log record: what was said, where, and the job fields it carries."""

    __slots__ = ("args", "created", "exc_info", "extra", "func", "levelno", "lineno", "msg",
                 "name", "pathname")

    def __init__(self, name: str, levelno: int, msg: object, args: tuple[object, ...],
                 exc_info: ExcInfo | None, extra: Mapping[str, object] | None,
                 pathname: str, lineno: int, func: str) -> None:
        self.name, self.levelno, self.msg, self.args = name, levelno, msg, args
        self.exc_info, self.extra = exc_info, extra
        self.pathname, self.lineno, self.func = pathname, lineno, func
        self.created = time.time()

    @property
    def fields(self) -> dict[str, str]:
        """The journal fields :func:`job_fields` attached ({} when none)."""
        found = self.extra.get(FIELDS_ATTR) if self.extra else None
        return found if isinstance(found, dict) else {}

    def message(self) -> str:
        """The message with its arguments, as ``LogRecord.getMessage`` makes it."""
        text = str(self.msg)
        if not self.args:
            return text
        args: object = self.args
        if len(self.args) == 1 and isinstance(self.args[0], dict) and self.args[0]:
            args = self.args[0]  # "%(name)s" style, as the standard library allows
        return text % args

    def to_stdlib(self) -> logging.LogRecord:
        """The same record for the standard library's handlers."""
        import logging

        record = logging.LogRecord(self.name, self.levelno, self.pathname, self.lineno,
                                   self.msg, self.args or None, self.exc_info, self.func)
        record.created = self.created
        for key, value in (self.extra or {}).items():
            setattr(record, key, value)
        return record


def seed_line(created: float, pid: int, levelno: int, text: str, filename: str,
              lineno: int | None) -> str:
    """``<ISO time with offset> [<pid>|<LEVEL>]: <text>``, as the original printed.

    Info and debug lines start with their source location, as the original's did.
    """
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(created))
    if levelno <= INFO:
        text = f"({filename}:{lineno}) {text}"
    return f"{stamp} [{pid}|{_LABEL.get(levelno, 'INFO ')}]: {text}"


def journal_fields(message: str, levelno: int, identifier: str, pathname: str,
                   lineno: int | None, func: str | None,
                   fields: Mapping[str, str]) -> dict[str, str]:
    """A record's journald entry: the message, priority, source and job fields."""
    entry = {"MESSAGE": message, "PRIORITY": str(_PRIORITY.get(levelno, 6)),
             "SYSLOG_IDENTIFIER": identifier, "CODE_FILE": pathname,
             "CODE_LINE": str(lineno), "CODE_FUNC": func or ""}
    entry.update(fields)
    return entry


def _native_entry(fields: Mapping[str, str]) -> bytes:
    """Encode fields in journald's native protocol (``KEY=value`` or binary-safe form)."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "surrogateescape")
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class Journal:
    """Datagrams to journald that never wait: a full journald drops (and counts) them.

    Built on ``_socket``, the C module under :mod:`socket`, which a hook would
    otherwise import only for this.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: object | None = None

    def send(self, fields: Mapping[str, str]) -> None:
        """Send one entry; raises OSError when journald is gone (not when it is full)."""
        import _socket

        if self._sock is None:
            self._sock = _socket.socket(_socket.AF_UNIX,
                                        _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto(  # type: ignore[attr-defined]
                _native_entry(fields), _socket.MSG_DONTWAIT, self.path)
        except BlockingIOError:
            _count_drop()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # type: ignore[attr-defined]
            self._sock = None


def journal_socket() -> str | None:
    """Return the journald socket to use, or None when there is no journal."""
    try:
        return _JOURNAL_SOCKET if stat.S_ISSOCK(os.stat(_JOURNAL_SOCKET).st_mode) else None
    except OSError:
        return None


_dropped = [0]


def _count_drop() -> None:
    # one list item, changed under the GIL: a rare lost count is fine for a diagnostic
    _dropped[0] += 1


def dropped() -> int:
    """How many records this process has dropped so far (never waited for)."""
    return _dropped[0]


def job_fields(job_id: int | str | None, task_id: int | str | None = None,
               event: str | None = None, **more: object) -> dict[str, dict[str, str]]:
    """Return the ``extra=`` mapping that tags a log record with a job's journal fields.

    Parameters
    ----------
    job_id, task_id: the Grid Engine job and array task (None = not known).
    event: short kebab-case name of what happened, journaled as ``GECO_EVENT``.
    **more: further journal fields; names are upper-cased (``cgroup=`` -> ``CGROUP``).

    Returns
    -------
    ``{FIELDS_ATTR: fields}``: ``JOB_ID``, ``SGE_TASK_ID``, ``GECO_EVENT``, then which
    job of that number it is (``SGE_CLUSTER``, ``JOB_SUBMITTED``) when this process
    knows it (:func:`job_instance`; with no task, any task's of the job), then ``more``.
    """
    return _tagged(job_id, task_id, event, _instance_fields(job_id, task_id), more)


class JobFields:
    """One job task's journal fields, found once for a run of records about it: a job's
    end (:func:`geco.job.ending.end_job`) finds them once and hands them to each step
    that journals, where :func:`job_fields` would find them again at every record.

    ``job_id``, ``task_id``: as :func:`job_fields` takes them; which job of that number it
    is, as this process knows it when they are found (:func:`job_instance`).
    """

    __slots__ = ("_instance", "job_id", "task_id")

    def __init__(self, job_id: int | str | None, task_id: int | str | None = None) -> None:
        self.job_id, self.task_id = job_id, task_id
        self._instance = _instance_fields(job_id, task_id)

    def event(self, event: str | None, **more: object) -> dict[str, dict[str, str]]:
        """:func:`job_fields`'s ``extra=`` mapping for a record of ``event`` with ``more``."""
        return _tagged(self.job_id, self.task_id, event, self._instance, more)


def _instance_fields(job_id: int | str | None, task_id: int | str | None) -> dict[str, str]:
    """Which job of its number job task ``job_id.task_id`` is, when this process knows it."""
    if job_id is None or not _instances:
        return {}
    return _instance_of(str(job_id), None if task_id is None else str(task_id))


def _tagged(job_id: int | str | None, task_id: int | str | None, event: str | None,
            instance: Mapping[str, str], more: Mapping[str, object]
            ) -> dict[str, dict[str, str]]:
    """The ``extra=`` mapping: the job's fields, ``GECO_EVENT``, its instance's, ``more``."""
    fields: dict[str, object] = {"JOB_ID": job_id, "SGE_TASK_ID": task_id, "GECO_EVENT": event,
                                 **instance}
    fields.update({k.upper(): v for k, v in more.items()})
    return {FIELDS_ATTR: {k: str(v) for k, v in fields.items() if v is not None}}


# ---------------------------------------------------------------------------
# which job of its number a record is about

#: The journal fields that tell two jobs of one number apart (:mod:`geco.sge.jobinstance`).
CLUSTER_FIELD, SUBMITTED_FIELD = "SGE_CLUSTER", "JOB_SUBMITTED"
# gecod reads the resource files of every job it meets; the oldest are dropped past this
_MAX_INSTANCES = 4096
# (job, task) -> (the instance's fields, the file they came from, that file's identity)
_instances: dict[tuple[str, str], tuple[dict[str, str], str, tuple[int, ...]]] = {}
_instances_lock = _thread.allocate_lock()  # gecod's threads log; dicts are not iterated safely


def submitted_text(seconds: float) -> str:
    """``JOB_SUBMITTED``'s text: seconds since the epoch to the microsecond, no trailing zeros
    (``1795303085``, ``1795303085.311469``), the same whichever float rounding got there."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def _identity(path: str) -> tuple[int, ...] | None:
    """What changes when the file is replaced (an atomic rewrite is a new inode), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def job_instance(job_id: int | str, task_id: int | str, cluster: str, submitted: float,
                 source: str | os.PathLike[str]) -> None:
    """Tag this process's later records of a job task with which job of its number it is.

    Parameters
    ----------
    job_id, task_id: the job task.
    cluster: ``SGE_CLUSTER`` ("" = not known).
    submitted: ``JOB_SUBMITTED``, seconds since the epoch (0 = not known); both unknown
        forgets what was known of the task.
    source: the file this was read from (the job's resource file, its spooled config).
        Records carry the fields only while that file is unchanged: once it is gone or
        replaced, the number may already be another job's, and a record that names no
        instance is better than one that names the wrong job.
    """
    key = (str(job_id), str(task_id))
    path = os.fspath(source)
    fields = {CLUSTER_FIELD: cluster} if cluster else {}
    if submitted:
        fields[SUBMITTED_FIELD] = submitted_text(submitted)
    identity = _identity(path) if fields else None
    with _instances_lock:
        _instances.pop(key, None)  # a known one moves to the end: the oldest go first
        if identity is None:
            return
        _instances[key] = (fields, path, identity)
        while len(_instances) > _MAX_INSTANCES:
            del _instances[next(iter(_instances))]


def _instance_of(job: str, task: str | None) -> dict[str, str]:
    """The instance fields of job task ``job.task`` (any task of the job when None), or {}."""
    with _instances_lock:
        if task is None:  # the same for every task: cluster and submission are the job's
            task = next((t for j, t in reversed(_instances) if j == job), "")
        key = (job, task)
        found = _instances.get(key)
    if found is None:
        return {}
    fields, path, identity = found
    if _identity(path) != identity:
        with _instances_lock:
            if _instances.get(key) is found:
                del _instances[key]
        return {}
    return fields


# ---------------------------------------------------------------------------
# where records go


class Backlog:
    """Keeps the records logged before a job's trace level is known, to replay them.

    The prolog learns the level only from the job's resources, after it ran
    qstat; with a backlog the trace still shows how those resources were found.
    Holds the last ``maxlen`` records (2,000), whatever their level.
    """

    def __init__(self, maxlen: int = _BACKLOG_RECORDS) -> None:
        self.maxlen = maxlen
        self.records: list[Record] = []

    def add(self, record: Record) -> None:
        self.records.append(record)
        if len(self.records) > 2 * self.maxlen:  # trimmed now and then, not per record
            del self.records[:-self.maxlen]

    def replay(self, handler: logging.Handler) -> None:
        """Pass every kept record ``handler`` accepts to it, then forget them all."""
        for record in self.records[-self.maxlen:]:
            if record.levelno >= handler.level:
                handler.handle(record.to_stdlib())
        self.records.clear()


class _Hook:
    """A hook's own output: seed lines on stderr, datagrams to journald."""

    def __init__(self, level: int, identifier: str, journal: str | None) -> None:
        self.stream_level = level
        self.identifier = identifier
        self.journal = Journal(journal) if journal else None
        self.journal_level = min(INFO, level) if journal else LEVELS["quiet"]

    def emit(self, record: Record) -> None:
        # never raises: a broken stderr or journal must not change a hook's outcome
        text: str | None = None
        if record.levelno >= self.stream_level:
            text = record.message()
            line = seed_line(record.created, os.getpid(), record.levelno, text,
                             os.path.basename(record.pathname), record.lineno)
            if record.exc_info and record.levelno <= DEBUG:
                import traceback

                line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(line + "\n")
        if self.journal is not None and record.levelno >= self.journal_level:
            # journald gone (OSError): the stream has the line if its level wants it
            with contextlib.suppress(OSError):
                self.journal.send(journal_fields(
                    text if text is not None else record.message(), record.levelno,
                    self.identifier, record.pathname, record.lineno, record.func,
                    record.fields))

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


_hook: _Hook | None = None
_backlog: Backlog | None = None


def _stdlib_listening(name: str) -> bool:
    """In a hook: has something (a job's trace, a test) attached to the standard library's
    logger ``name`` or one of its parents in the ``geco`` tree?"""
    logging = sys.modules.get("logging")
    if logging is None:
        return False
    loggers = logging.Logger.manager.loggerDict
    while name:
        if getattr(loggers.get(name), "handlers", None):
            return True
        name = name.rpartition(".")[0]
    return False


class Logger:
    """``geco.<name>``: the standard library's logging calls, routed as the module says.

    ``identifier``: the records' ``SYSLOG_IDENTIFIER`` when it is not the process's own
    (gecod doing a hook's work journals it under the hook's name).
    """

    __slots__ = ("debug", "error", "exception", "identifier", "info", "name", "warning")

    debug: LevelCall
    info: LevelCall
    warning: LevelCall
    error: LevelCall
    exception: LevelCall

    def __init__(self, name: str, identifier: str | None = None) -> None:
        self.name = name
        self.identifier = identifier
        # the standard library's calls, made once a logger: a method each would be the same
        # five lines five times, a partialmethod a bound partial at every call (twice the
        # cost of a disabled debug())
        self.debug, self.info, self.warning, self.error = (
            self._at(level) for level in (DEBUG, INFO, WARNING, ERROR))
        self.exception = self._at(ERROR, exc_default=True)

    def _at(self, level: int, *, exc_default: object = None) -> LevelCall:
        def call(msg: object, *args: object, exc_info: object = exc_default,
                 extra: Mapping[str, object] | None = None, stacklevel: int = 1) -> None:
            self._log(level, msg, args, exc_info, extra, stacklevel)
        return call

    def isEnabledFor(self, level: int) -> bool:
        if _backlog is not None:
            return True
        if _hook is not None:
            return (level >= _hook.stream_level or level >= _hook.journal_level
                    or _stdlib_listening(self.name))
        import logging

        return logging.getLogger(self.name).isEnabledFor(level)

    def log(self, level: int, msg: object, *args: object, exc_info: object = None,
            extra: Mapping[str, object] | None = None, stacklevel: int = 1) -> None:
        self._log(level, msg, args, exc_info, extra, stacklevel)

    def _log(self, level: int, msg: object, args: tuple[object, ...], exc_info: object,
             extra: Mapping[str, object] | None, stacklevel: int) -> None:
        if not self.isEnabledFor(level):
            return
        caller = sys._getframe(1 + stacklevel)  # past _log and debug()/info()/...
        code = caller.f_code
        if self.identifier is not None:
            fields = extra.get(FIELDS_ATTR) if extra else None
            extra = {**(extra or {}), FIELDS_ATTR: {
                **(fields if isinstance(fields, dict) else {}),
                "SYSLOG_IDENTIFIER": self.identifier}}
        record = Record(self.name, level, msg, args, _exc_info(exc_info), extra,
                        code.co_filename, caller.f_lineno, code.co_name)
        if _backlog is not None:
            _backlog.add(record)
        if _hook is not None:
            _hook.emit(record)
            if not _stdlib_listening(self.name):
                return
        import logging

        stdlib = logging.getLogger(self.name)
        if stdlib.isEnabledFor(level) and not stdlib.disabled:
            stdlib.handle(record.to_stdlib())


def _exc_info(value: object) -> ExcInfo | None:
    if not value:
        return None
    if isinstance(value, BaseException):
        return type(value), value, value.__traceback__
    if isinstance(value, tuple):
        return value
    got = sys.exc_info()
    return None if got[0] is None else got


# made once each: a logger holds its level calls, which hold it (gecod asks for a hook's
# logger at every request it serves)
_loggers: dict[tuple[str, str | None], Logger] = {}


def get(name: str, identifier: str | None = None) -> Logger:
    """Return the logger ``geco.<name>`` (``geco`` itself for "")."""
    full = f"geco.{name}" if name else "geco"
    found = _loggers.get((full, identifier))
    if found is None:
        found = _loggers[full, identifier] = Logger(full, identifier)
    return found


def speaking_as(name: str, identifier: str) -> Logger:
    """A logger ``geco.<name>`` whose journal records say ``SYSLOG_IDENTIFIER=identifier``."""
    return get(name, identifier)


def collect(backlog: Backlog | None) -> None:
    """Keep every record from now on in ``backlog`` (None: stop keeping)."""
    global _backlog
    _backlog = backlog


# ---------------------------------------------------------------------------
# set-up


def setup_hook(level: str = "error", *, identifier: str = "geco") -> Logger:
    """Set up a hook's logging (no standard library logging) and return the ``geco`` logger.

    Parameters
    ----------
    level: stderr verbosity: quiet, error, warn, info or debug.
    identifier: ``SYSLOG_IDENTIFIER`` in the journal (``geco-prolog``, ...).
    """
    global _hook
    close()
    _hook = _Hook(LEVELS.get(level.lower(), ERROR), identifier, journal_socket())
    return get("")


def close() -> None:
    """End a hook's logging: close the journal socket, flush stderr; back to the stdlib."""
    global _hook
    if _hook is not None:
        _hook.close()
        _hook = None


def setup(level: str = "error", *, identifier: str = "geco",
          stream: IO[str] | None = None, journal: bool = True) -> logging.Logger:
    """Configure the standard library's ``geco`` logger tree (gecod, the CLI); see
    :func:`geco.log_handlers.setup`."""
    from geco import log_handlers

    close()
    return log_handlers.setup(level, identifier=identifier, stream=stream, journal=journal)


def in_background(logger: logging.Logger | None = None) -> None:
    """gecod: hand records to a thread of their own (:func:`geco.log_handlers.in_background`)."""
    from geco import log_handlers

    log_handlers.in_background(logger)


def stop_background(wait: float | None = None) -> None:
    """gecod's exit: write out what the logging thread holds and stop it (waiting at most
    ``wait`` s; None: until it is done)."""
    from geco import log_handlers

    log_handlers.stop_background(wait)
