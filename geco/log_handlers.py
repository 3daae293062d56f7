"""The standard library's handlers for geco's records: gecod, the CLI, tests.

:mod:`geco.log` decides where records go; in every process but a hook they go
to the standard library's ``geco`` logger, set up here the same way a hook
writes them itself: seed lines on a stream, entries in journald
(:func:`geco.log.seed_line`, :func:`geco.log.journal_fields` and
:class:`geco.log.Journal` are shared). gecod goes further
(:func:`in_background`): its records for a stream are handed to a thread of
their own through a bounded queue, so a stalled stderr or trace file cannot
block its event loop either (journal datagrams never wait, so they are sent
at once).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
from collections.abc import Callable
from typing import IO, TypeAlias

from geco.log import (
    DEBUG,
    ERROR,
    FIELDS_ATTR,
    INFO,
    LEVELS,
    Journal,
    _count_drop,
    journal_fields,
    seed_line,
)

__all__ = ["JournalHandler", "SeedFormatter", "in_background", "setup", "stop_background"]

_Records: TypeAlias = "queue.SimpleQueue[logging.LogRecord]"
# Records gecod's logging thread may have waiting before new ones are dropped.
_BACKGROUND_QUEUE = 10_000


class SeedFormatter(logging.Formatter):
    """``<ISO time with offset> [<pid>|<LEVEL>]: <message>``, as the original printed."""

    def format(self, record: logging.LogRecord) -> str:
        line = seed_line(record.created, record.process or os.getpid(), record.levelno,
                         record.getMessage(), record.filename, record.lineno)
        if record.exc_info and record.levelno <= DEBUG:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JournalHandler(logging.Handler):
    """Send each record to journald with geco's structured fields (one datagram each)."""

    def __init__(self, identifier: str, socket_path: str) -> None:
        super().__init__()
        self.identifier = identifier
        self.journal = Journal(socket_path)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.journal.send(journal_fields(
                record.getMessage(), record.levelno, self.identifier, record.pathname,
                record.lineno, record.funcName, getattr(record, FIELDS_ATTR, {})))
        except OSError:
            # journald gone: the stream handler still has the line
            self.handleError(record)

    def close(self) -> None:
        self.journal.close()
        super().close()


def setup(level: str = "error", *, identifier: str = "geco",
          stream: IO[str] | None = None, journal: bool = True) -> logging.Logger:
    """Configure the ``geco`` logger tree once per process and return it.

    Parameters
    ----------
    level: stderr verbosity: quiet, error, warn, info or debug.
    identifier: ``SYSLOG_IDENTIFIER`` in the journal (``gecod``, ...).
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
    out.setLevel(LEVELS.get(level.lower(), ERROR))
    out.setFormatter(SeedFormatter())
    root.addHandler(out)
    # looked up through geco.log at call time: tests point it elsewhere
    from geco import log

    sock = log.journal_socket() if journal else None
    if sock is not None:
        jh = JournalHandler(identifier, sock)
        jh.setLevel(min(INFO, out.level))
        root.addHandler(jh)
    # a journal hiccup must never print a traceback into a user's job output
    logging.raiseExceptions = False
    return root


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the logging thread; drops (and counts) them when its queue is full."""

    queue: queue.SimpleQueue[logging.LogRecord]

    def __init__(self, records: _Records, behind: list[logging.Handler]) -> None:
        super().__init__(records)
        # a handler that takes only some records at its level (a job's trace router: its
        # traced jobs') says which with wants(record)
        self.behind: list[tuple[logging.Handler, Callable[[logging.LogRecord], bool] | None]] \
            = [(h, getattr(h, "wants", None)) for h in behind]

    def filter(self, record: logging.LogRecord) -> bool:
        # only what a handler behind the queue takes crosses to the thread: each record
        # that does costs the loop a thread hand-over
        return any(record.levelno >= h.level and (wants is None or wants(record))
                   for h, wants in self.behind)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # the message is resolved here (its arguments may change later); the record
        # keeps its fields and exception for the handlers behind the queue
        record.msg = record.getMessage()
        record.args = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        # a SimpleQueue (no lock and condition per record, as Queue has): bounded here
        if self.queue.qsize() >= _BACKGROUND_QUEUE:
            _count_drop()
        else:
            self.queue.put_nowait(record)


_listener: logging.handlers.QueueListener | None = None


def in_background(logger: logging.Logger | None = None) -> None:
    """Move ``logger``'s handlers (default: geco's) behind a bounded queue and a thread;
    a :class:`JournalHandler` stays where it is (it never waits).

    Called again (after :func:`setup` on SIGHUP), it stops the old thread first,
    writing out what it still holds.
    """
    global _listener
    logger = logger or logging.getLogger("geco")
    stop_background()
    # no geco format shows a record's thread or process name: gecod makes a record per
    # request, and these lookups were a good part of its cost
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handlers = [h for h in logger.handlers if not isinstance(h, _DroppingQueueHandler)]
    # the journal's datagrams never wait (a full journald drops them): they stay in the
    # caller's thread, which spares gecod a thread hand-over per record (GIL, futexes)
    queued = [h for h in handlers if not isinstance(h, JournalHandler)]
    for handler in queued:
        logger.removeHandler(handler)
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    logger.addHandler(_DroppingQueueHandler(records, queued))
    _listener = logging.handlers.QueueListener(records, *queued, respect_handler_level=True)
    _listener.start()


def stop_background(wait: float | None = None) -> None:
    """Write out what the logging thread holds and stop it (gecod's exit).

    ``wait``: the most seconds to wait for it (None: until it is done). A thread still
    writing then (a stalled stderr or trace file) is left to die with the process, its
    handlers open: at the node's shutdown gecod does not wait for a journal going down.
    """
    global _listener
    listener, _listener = _listener, None
    if listener is None:
        return
    if wait is None:
        listener.stop()
    else:
        listener.enqueue_sentinel()
        thread = listener._thread  # the standard library offers no bounded stop()
        if thread is not None:
            thread.join(wait)
            if thread.is_alive():
                return
        listener._thread = None
    for handler in listener.handlers:
        handler.close()
