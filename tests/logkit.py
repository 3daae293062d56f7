"""Log records as tests see them: a handler that keeps every record, one put on a logger
for a block, and a logger restored afterwards."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class RecordingHandler(logging.Handler):
    """Keeps every record it gets, whatever its level, in ``records``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def handler_on(logger_name: str, handler: logging.Handler) -> Iterator[None]:
    """``handler`` on the logger ``logger_name``, set to DEBUG, until exit; then the handler
    is taken off again and the logger's level restored."""
    logger = logging.getLogger(logger_name)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@contextlib.contextmanager
def restored_logger(name: str = "geco") -> Iterator[logging.Logger]:
    """The logger ``name``, restored on exit to what it was on entry: its handlers (those
    added meanwhile closed), level and propagation, and ``logging.raiseExceptions``
    -- geco.log.setup() changes all four."""
    logger = logging.getLogger(name)
    saved = (list(logger.handlers), logger.level, logger.propagate, logging.raiseExceptions)
    try:
        yield logger
    finally:
        for handler in list(logger.handlers):
            if handler not in saved[0]:
                handler.close()
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
        logging.raiseExceptions = saved[3]
