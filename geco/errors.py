"""The one error tree of geco.

Every error geco raises on purpose is a :class:`GecoError`. Each carries the
facts that locate the problem (job, task, path, node, ...) as keyword fields
and prints them as ``key=value`` after the message, so a log line or a hook's
stderr names the subject without a traceback.

Parse errors also subclass :class:`ValueError`, so callers that only care
that "the input was bad" can catch that.

``OSError`` from the kernel is translated at one boundary per module
(:func:`GecoError.from_oserror`) with the cause chained.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
    "CgroupError",
    "ConfigError",
    "CoresUnavailable",
    "GecoError",
    "JobKeyError",
    "JobNotFound",
    "KeyFileError",
    "NotContained",
    "ProtocolError",
    "QstatError",
    "QstatParseError",
    "ResourceFormatError",
    "TaskNotRunning",
    "TopologyError",
]


class GecoError(Exception):
    """Base of every error geco raises on purpose.

    Parameters
    ----------
    msg:
        One sentence saying what went wrong, in words an admin understands.
    **fields:
        Facts locating the problem (``job``, ``task``, ``path``, ``node``, ...).
        ``None`` values are dropped.
    """

    #: the node's own failure, not the job's nor the cluster's: counted towards the node
    #: taking itself out (:mod:`geco.node.health`)
    node_side = False

    def __init__(self, msg: str, **fields: object) -> None:
        self.msg = msg
        self.fields = {k: v for k, v in fields.items() if v is not None}
        super().__init__(str(self))

    def __str__(self) -> str:
        if not self.fields:
            return self.msg
        details = " ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"{self.msg} ({details})"

    @classmethod
    def from_oserror(cls, what: str, exc: OSError, **fields: object) -> GecoError:
        """Translate a kernel error into this class, naming the syscall's target.

        The caller raises the result ``from exc`` so the cause stays chained.
        """
        name = _errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return cls(f"{what}: {exc.strerror or exc}", errno=name, **fields)


class ConfigError(GecoError, ValueError):
    """The configuration file is unreadable or a value is of the wrong kind."""


class ResourceFormatError(GecoError, ValueError):
    """A ``GECOResourceSet_v1{...}`` text is malformed.

    Attributes
    ----------
    offset:
        Byte offset of the first bad byte in the input.
    expected:
        What the parser expected at that offset.
    source:
        The input (bytes), kept so :meth:`caret` can show where it went wrong.
    """

    def __init__(self, msg: str, *, offset: int, expected: str, source: bytes = b"",
                 **fields: object) -> None:
        self.offset = offset
        self.expected = expected
        self.source = source
        super().__init__(msg, offset=offset, expected=expected, **fields)

    def caret(self, width: int = 60) -> str:
        """Return two lines: a window of the input and a ``~~~^`` marker under the bad byte."""
        start = max(0, self.offset - width // 2)
        window = self.source[start:start + width]
        shown = window.decode("ascii", "backslashreplace").replace("\n", "\\n")
        # the marker has to line up with the escaped text, so measure the escaped prefix
        prefix = self.source[start:self.offset].decode("ascii", "backslashreplace")
        prefix = prefix.replace("\n", "\\n")
        return f"{shown}\n{'~' * len(prefix)}^"


class QstatError(GecoError):
    """qstat could not be run, timed out, or failed every retry (a transient problem)."""


class QstatParseError(GecoError, ValueError):
    """qstat answered, but its XML is not what Grid Engine prints."""


class TaskNotRunning(QstatError):
    """Grid Engine knows the job, but this task is not running in its view.

    A pending job (no ``JB_ja_tasks``), a task number the job does not have,
    a task not yet dispatched, or a task missing from ``qstat -g t``. Usually
    a race at the start or end of the task; the prolog re-queues (exit 99).
    """


class JobNotFound(GecoError):
    """Grid Engine does not know the job (finished, deleted, or never existed)."""


class JobKeyError(GecoError, ValueError):
    """A job key is not ``<job>.<task>`` in decimal digits (see :mod:`geco.jobkey`)."""


class CgroupError(GecoError):
    """A cgroup could not be created, written, emptied or removed."""

    node_side = True


class CoresUnavailable(GecoError):
    """Not enough free whole cores on this node; geco never over-commits."""


class TopologyError(GecoError):
    """hwloc could not load the node's (or a synthetic) topology."""

    node_side = True


class NotContained(GecoError):
    """A process that must be inside its job's cgroups is not."""


class ProtocolError(GecoError, ValueError):
    """A frame was refused (see ``docs/wire-format.md``).

    Attributes
    ----------
    reason:
        Why, as a short code equal to the C decoder's ``enum geco_err`` name
        without its ``GECO_E_`` prefix, lower case: ``short``, ``magic``,
        ``version``, ``flags``, ``length``, ``mac``, ``type``, ``payload``,
        ``stale``, ``nonce``; plus the transport's ``timeout`` and ``closed``.
    """

    def __init__(self, msg: str, *, reason: str, **fields: object) -> None:
        self.reason = reason
        super().__init__(msg, reason=reason, **fields)


class KeyFileError(GecoError):
    """The quarantine key file is missing, unsafe (owner, mode) or not 32 bytes."""
