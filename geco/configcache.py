"""The configuration file's parsed TOML, kept by root so hooks need not parse it per job.

Every hook reads ``geco.toml`` at every job start; importing :mod:`tomllib`
and parsing the commented file costs it a few milliseconds, more than the rest
of its configuration work. Root (the prolog, epilog, gecod) keeps the parsed
document in ``/run/geco/config<path>.marshal`` (``/`` written ``%``), stamped
with the file's device, inode, size, mtime and ctime; the next read of an
unchanged file takes it from there. Values are checked after either read the
same way (:func:`geco.config.load`), so the cache saves parsing, nothing else.

Only a regular file owned by root that nobody else may write is used (a user
cannot make one), only root writes one, and anything unexpected in it reads as
"no cache": a hook then parses the file as before.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import stat
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DIR", "read", "write"]

DIR = Path("/run/geco")
_FORMAT = 1  # bumped when what is kept changes
_MAX_BYTES = 1 << 20


def _cache_file(path: Path) -> str:
    return f"{DIR}/config{str(path).replace('/', '%')}.marshal"


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (_FORMAT, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read(path: Path, st: os.stat_result) -> dict[str, Any] | None:
    """The parsed document of ``path`` (whose stat is ``st``) when root kept it for this very
    version of the file; None otherwise."""
    try:
        fd = os.open(_cache_file(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        own = os.fstat(fd)
        if not stat.S_ISREG(own.st_mode) or own.st_uid != 0 or own.st_mode & 0o022 \
                or own.st_size > _MAX_BYTES:
            return None
        data = os.read(fd, _MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        stamp, doc = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return None
    return doc if stamp == _stamp(st) and isinstance(doc, dict) else None


def write(path: Path, st: os.stat_result, doc: dict[str, Any]) -> None:
    """Keep ``doc``, parsed from ``path`` as it was at ``st`` (root only; never raises)."""
    if os.geteuid() != 0:
        return
    try:
        data = marshal.dumps((_stamp(st), doc))
    except ValueError:
        return  # a TOML date or time: not marshal's (no geco setting is one)
    target = _cache_file(path)
    part = f"{target}.{os.getpid()}"
    try:
        DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: hooks running as the owner read it
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(part, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)
