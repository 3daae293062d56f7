"""A job's usage counters: which cgroup files hold them, read once or from files held open.

Each backend lists a job's counter files (:class:`Counter`: a path, the figures it
gives, how to parse it); :func:`read_once` opens, reads and closes them
(:meth:`geco.cgroup.Backend.usage`), :class:`Held` keeps them open and reads each with
one ``pread`` (gecod's sampler, every job every interval: a file open is most of a
counter read's cost). A figure two files give (v1's ``memory.failcnt`` and
``memory.memsw.failcnt``) is their sum.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from geco._tuple import NamedTuple
from geco.cgroup._fs import cgroup_error, read_bytes
from geco.errors import CgroupError

__all__ = ["Counter", "Held", "io_bytes", "keyed", "pressure", "read_once", "whole"]

# The most a counter file holds that is read (io.stat: a line per device).
_MOST = 1 << 16

Parse = Callable[[bytes], dict[str, int]]


class Counter(NamedTuple):
    """One cgroup file and the figures it gives (``names``, for a reader that needs only
    some). ``optional``: a file the kernel may list but not serve (PSI off at boot:
    EOPNOTSUPP) gives no figure rather than an error."""

    path: Path
    names: tuple[str, ...]
    parse: Parse
    optional: bool = False


def whole(path: Path, name: str, divide: int = 1) -> Counter:
    """A file holding one number (``divide``: nanoseconds to microseconds, say)."""
    def parse(data: bytes) -> dict[str, int]:
        return {name: int(data) // divide}

    return Counter(path, (name,), parse)


def keyed(path: Path, fields: Mapping[str, str], scale: tuple[int, int] = (1, 1)) -> Counter:
    """A flat-keyed file (``oom_kill 3`` a line): figure name -> the file's key; the values
    times ``scale[0]`` over ``scale[1]`` (cpuacct.stat's ticks to microseconds)."""
    times, over = scale

    def parse(data: bytes) -> dict[str, int]:
        found = {}
        for line in data.splitlines():
            key, _, value = line.partition(b" ")
            if value.strip().isdigit():
                found[key.decode("ascii", "replace")] = int(value)
        return {name: found[key] * times // over for name, key in fields.items()
                if key in found}

    return Counter(path, tuple(fields), parse)


def pressure(path: Path, name: str) -> Counter:
    """A PSI file: microseconds some task stalled (``some ... total=``)."""
    def parse(data: bytes) -> dict[str, int]:
        for line in data.splitlines():
            kind, *fields = line.split()
            if kind == b"some":
                return {name: int(dict(f.split(b"=", 1) for f in fields)[b"total"])}
        return {}

    return Counter(path, (name,), parse, optional=True)


def io_bytes(path: Path) -> Counter:
    """``io.stat``: bytes read and written, every device."""
    def parse(data: bytes) -> dict[str, int]:
        read = written = 0
        for line in data.splitlines():
            stats = dict(f.split(b"=", 1) for f in line.split()[1:])
            read += int(stats.get(b"rbytes", 0))
            written += int(stats.get(b"wbytes", 0))
        return {"io_read_bytes": read, "io_write_bytes": written}

    return Counter(path, ("io_read_bytes", "io_write_bytes"), parse, optional=True)


def _parsed(counter: Counter, data: bytes, out: dict[str, int]) -> None:
    try:
        got = counter.parse(data)
    except (ValueError, KeyError):
        if counter.optional:
            return
        raise CgroupError(f"{counter.path.name} does not hold what the kernel writes there: "
                          f"{data[:80]!r}", path=counter.path) from None
    for name, value in got.items():
        out[name] = out.get(name, 0) + value


def read_once(counters: Iterable[Counter]) -> dict[str, int]:
    """Every figure of ``counters``, each file opened, read and closed.

    Raises
    ------
    CgroupError
        when a file cannot be read or does not hold what the kernel writes there.
    """
    out: dict[str, int] = {}
    for counter in counters:
        try:
            data = read_bytes(counter.path)
        except CgroupError:
            if counter.optional:
                continue
            raise
        _parsed(counter, data, out)
    return out


class Held:
    """``counters`` open, each read with one ``pread``; :meth:`close` when done.

    Raises
    ------
    CgroupError
        (from the constructor) when a file cannot be opened.
    """

    def __init__(self, counters: Iterable[Counter]) -> None:
        self._open: list[tuple[Counter, int]] = []
        try:
            for counter in counters:
                try:
                    fd = os.open(counter.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    raise cgroup_error(f"cannot open {counter.path.name}", exc,
                                       path=counter.path) from exc
                self._open.append((counter, fd))
        except BaseException:
            self.close()
            raise

    @property
    def fds(self) -> int:
        """How many files are held open."""
        return len(self._open)

    def read(self) -> dict[str, int]:
        """Every figure now.

        Raises
        ------
        CgroupError
            when a file cannot be read (the cgroup was removed: ENODEV) or holds
            something else.
        """
        out: dict[str, int] = {}
        for counter, fd in self._open:
            try:
                data = os.pread(fd, _MOST, 0)
            except OSError as exc:
                if counter.optional and exc.errno != errno.ENODEV:  # ENODEV: cgroup gone
                    continue
                raise cgroup_error(f"cannot read {counter.path.name}", exc,
                                   path=counter.path) from exc
            _parsed(counter, data, out)
        return out

    def close(self) -> None:
        for _, fd in self._open:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._open = []
