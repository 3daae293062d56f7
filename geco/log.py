"""Logging in the original GECO's line format, and the same events in journald.

A line on stderr (or a file) looks like the seed's::

    2015-11-19T13:56:46-0500 [28152|WARN ]: text

The five levels are the original's: quiet, error, warn, info, debug (default
error). Hooks write their stderr into the job's ``.e`` file, so the default
keeps users' files clean; the journal gets info and above whatever the stderr
level, so ``journalctl JOB_ID=42`` tells an admin the whole story.

Events about a job carry structured fields; build them with :func:`job_fields`::

    log.info("created %s", path, extra=job_fields(42, 1, "cgroup-created", CGROUP=path))

The journal is used when ``/run/systemd/journal/socket`` exists; without it
the stream alone works. (No environment override: root hooks run with the
job's environment, which its owner controls.)

Logging never waits for journald: a record journald has no room for (it is
stopped, or flooded) is dropped and counted (:func:`dropped`), so a job start
never hangs on the journal. gecod goes further (:func:`in_background`): its
records are handed to a thread of their own through a bounded queue, so a
stalled stderr or trace file cannot block its event loop either.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO

__all__ = ["LEVELS", "JournalHandler", "SeedFormatter", "dropped", "in_background",
           "job_fields", "setup"]

# Grid Engine names levels the original way; map them onto the stdlib's numbers.
LEVELS = {"quiet": logging.CRITICAL + 10, "error": logging.ERROR, "warn": logging.WARNING,
          "info": logging.INFO, "debug": logging.DEBUG}
_LABEL = {logging.CRITICAL: "EMERG", logging.ERROR: "ERROR", logging.WARNING: "WARN ",
          logging.INFO: "INFO ", logging.DEBUG: "DEBUG"}
# syslog priorities for the journal's PRIORITY field
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
             logging.DEBUG: 7}
_JOURNAL_SOCKET = "/run/systemd/journal/socket"
_FIELDS_ATTR = "geco_fields"
# Records gecod's logging thread may have waiting before new ones are dropped.
_BACKGROUND_QUEUE = 10_000


class _Drops:
    """Records dropped because journald or the logging thread had no room (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


_drops = _Drops()


def dropped() -> int:
    """How many records this process has dropped so far (never waited for)."""
    return _drops.count


def job_fields(job_id: int | str | None, task_id: int | str | None = None,
               event: str | None = None, **more: object) -> dict[str, dict[str, str]]:
    """Return the ``extra=`` mapping that tags a log record with a job's journal fields.

    Parameters
    ----------
    job_id, task_id: the Grid Engine job and array task (None = not known).
    event: short kebab-case name of what happened, journaled as ``GECO_EVENT``.
    **more: further journal fields; names are upper-cased (``cgroup=`` -> ``CGROUP``).
    """
    fields: dict[str, object] = {"JOB_ID": job_id, "SGE_TASK_ID": task_id, "GECO_EVENT": event}
    fields.update({k.upper(): v for k, v in more.items()})
    return {_FIELDS_ATTR: {k: str(v) for k, v in fields.items() if v is not None}}


class SeedFormatter(logging.Formatter):
    """``<ISO time with offset> [<pid>|<LEVEL>]: <message>``, as the original printed."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.created))
        label = _LABEL.get(record.levelno, "INFO ")
        text = record.getMessage()
        if record.levelno <= logging.INFO:
            # the original prefixed info/debug lines with their source location
            text = f"({record.filename}:{record.lineno}) {text}"
        if record.exc_info and record.levelno <= logging.DEBUG:
            text += "\n" + self.formatException(record.exc_info)
        return f"{stamp} [{record.process}|{label}]: {text}"


class JournalHandler(logging.Handler):
    """Send each record to journald with geco's structured fields.

    Writes journald's native protocol itself (one datagram per record) so a
    hook does not pay for importing systemd-python on every job start.
    """

    def __init__(self, identifier: str, socket_path: str) -> None:
        super().__init__()
        self.identifier = identifier
        self.socket_path = socket_path
        self._sock: socket.socket | None = None

    def _fields(self, record: logging.LogRecord) -> dict[str, str]:
        fields = {
            "MESSAGE": record.getMessage(),
            "PRIORITY": str(_PRIORITY.get(record.levelno, 6)),
            "SYSLOG_IDENTIFIER": self.identifier,
            "CODE_FILE": record.pathname,
            "CODE_LINE": str(record.lineno),
            "CODE_FUNC": record.funcName,
        }
        fields.update(getattr(record, _FIELDS_ATTR, {}))
        return fields

    def emit(self, record: logging.LogRecord) -> None:
        try:
            payload = _native_entry(self._fields(record))
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            # never wait: a stopped or flooded journald must not hold up a job start
            self._sock.sendto(payload, socket.MSG_DONTWAIT, self.socket_path)
        except BlockingIOError:
            _drops.add()
        except OSError:
            # journald gone: the stream handler still has the line
            self.handleError(record)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        super().close()


def _native_entry(fields: dict[str, str]) -> bytes:
    """Encode fields in journald's native protocol (``KEY=value`` or binary-safe form)."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "surrogateescape")
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def journal_socket() -> str | None:
    """Return the journald socket to use, or None when there is no journal."""
    return _JOURNAL_SOCKET if Path(_JOURNAL_SOCKET).is_socket() else None


def setup(level: str = "error", *, identifier: str = "geco",
          stream: IO[str] | None = None, journal: bool = True) -> logging.Logger:
    """Configure the ``geco`` logger tree once per process and return it.

    Parameters
    ----------
    level: stderr verbosity: quiet, error, warn, info or debug.
    identifier: ``SYSLOG_IDENTIFIER`` in the journal (``geco-prolog``, ``gecod``, ...).
    stream: where lines go (default stderr).
    journal: also send info and above to journald when its socket exists.
    """
    root = logging.getLogger("geco")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.DEBUG)
    root.propagate = False
    out = logging.StreamHandler(stream or sys.stderr)
    out.setLevel(LEVELS.get(level.lower(), logging.ERROR))
    out.setFormatter(SeedFormatter())
    root.addHandler(out)
    sock = journal_socket() if journal else None
    if sock is not None:
        jh = JournalHandler(identifier, sock)
        jh.setLevel(min(logging.INFO, out.level))
        root.addHandler(jh)
    # a journal hiccup must never print a traceback into a user's job output
    logging.raiseExceptions = False
    return root


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the logging thread; drops (and counts) them when its queue is full."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # the message is resolved here (its arguments may change later); the record
        # keeps its fields and exception for the handlers behind the queue
        record.msg = record.getMessage()
        record.args = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            _drops.add()


_listener: logging.handlers.QueueListener | None = None


def in_background(logger: logging.Logger | None = None) -> None:
    """Move ``logger``'s handlers (default: geco's) behind a bounded queue and a thread.

    Called again (after :func:`setup` on SIGHUP), it stops the old thread first,
    writing out what it still holds.
    """
    global _listener
    logger = logger or logging.getLogger("geco")
    stop_background()
    handlers = [h for h in logger.handlers if not isinstance(h, _DroppingQueueHandler)]
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    records: queue.Queue[logging.LogRecord] = queue.Queue(_BACKGROUND_QUEUE)
    logger.addHandler(_DroppingQueueHandler(records))
    _listener = logging.handlers.QueueListener(records, *handlers, respect_handler_level=True)
    _listener.start()


def stop_background() -> None:
    """Write out what the logging thread holds and stop it (gecod's exit)."""
    global _listener
    if _listener is not None:
        _listener.stop()
        for handler in _listener.handlers:
            handler.close()
        _listener = None


def get(name: str) -> logging.Logger:
    """Return the logger ``geco.<name>``."""
    return logging.getLogger(f"geco.{name}")

