"""A job's resource use over time: samples of its cgroups, one bounded file per job task.

gecod samples each running job every ``[usage] interval`` seconds
(:mod:`geco.usage.sampler`), and the job's end adds a last sample. The file,
``<state_dir>/usage/<job>.<task>``, is root's and readable by the job's owner
(:mod:`geco.ownerread`); it survives a gecod restart and is kept ``[usage]
keep_days`` after the job. A parallel job's master keeps a copy of each other host's
file, ``<job>.<task>@<host>``, sent with that host's answer to the job's end (at most
:data:`GATHERED` samples: the cluster channel's frames are bounded).

Layout: one header line, ``GECO_SAMPLES_v1 `` and a JSON object (:class:`Header`: what
the job was granted here, whose it is), then fixed-size little-endian records
(:class:`Sample`), -1 where the kernel does not count a figure. At ``max_samples``
records the file is thinned to every other one (the first and the last always): a long
job keeps its whole span at half the resolution, and no file ever holds more than
``max_samples`` records.

Writers (gecod's sampler, the teardown of gecod or the epilog) serialize on a lock only
root can take (:mod:`geco.rootlock`, ``.lock`` in the directory), never on the file: its
owner can open the file, and an ``flock`` they held on it would stall root. Readers take
no lock: a file is only appended to, or replaced whole (renamed into place) when it is
thinned or begun again, so a reader sees an older file or a newer one, never half of one
(a record cut short at its end is dropped).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from geco import jobfiles, log, ownerread, rootlock
from geco._tuple import NamedTuple
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet, short_hostname
from geco.sge import execd

_log = log.get("usage.samples")

__all__ = ["GATHERED", "MAGIC", "RECORD", "USAGE_NAMES", "Header", "Sample", "Series",
           "Writer", "append", "export", "header_of", "is_file_name", "keep_copy", "keep_last",
           "level_of", "load", "read", "read_job"]

MAGIC = b"GECO_SAMPLES_v1 "
RECORD = struct.Struct("<d9q")
_MAX_HEADER = 4096
_MAX_NAME = 256  # characters of the job's name kept in the header
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK  # a FIFO planted fails, never hangs
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# The writers' lock in the directory (root's, 0600: no file name of a job's).
_LOCK_NAME = ".lock"
# The name a file's replacement is written under before it is renamed into place.
_NEW = ".{}.new"
# What a full or read-only file system says (errno names).
_DISK_TROUBLE = frozenset({"ENOSPC", "EDQUOT", "EROFS"})
# Seconds a file's time may lag the job's start and still be the job's own.
_CLOCK_SLACK = 1.0
# Seconds a writer waits for another's write to end (only root's writers hold the lock,
# each for one file's write).
_LAST_WAIT = 1.0
# Samples a slave host sends its master at the job's end (80 bytes each: 20 KiB).
GATHERED = 256
# A short host name: the <host> of a copy gathered from another host, <job>.<task>@<host>.
_HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")


class Header(NamedTuple):
    """What the job was granted on this host, and whose it is."""

    job_id: int
    task_id: int
    owner: str = ""
    job_name: str = ""
    queue: str = ""
    host: str = ""
    cores: int = 0
    memory: int = 0  # bytes, 0 = no limit
    gpus: int = 0
    started: float = 0.0


class Sample(NamedTuple):
    """The job's cgroups at one moment (cumulative counters where the kernel keeps them)."""

    time: float
    cpu_user_usec: int = -1
    cpu_system_usec: int = -1
    memory_current: int = -1
    memory_peak: int = -1
    tasks: int = -1
    oom_kills: int = -1
    memory_pressure_usec: int = -1  # cgroup v2 PSI: total time some task stalled on memory
    io_read_bytes: int = -1
    io_write_bytes: int = -1

    @classmethod
    def from_usage(cls, at: float, usage: Mapping[str, int]) -> Sample:
        """A sample from a backend's ``usage()`` mapping (what it lacks stays -1)."""
        return cls(at, *map(usage.get, USAGE_NAMES, _NOT_COUNTED))


# The backend's usage() figures a sample keeps, in its fields' order (after the time).
USAGE_NAMES = ("cpu_user_usec", "cpu_system_usec", "memory_current", "memory_peak",
               "pids_current", "oom_kill", "memory_pressure_usec", "io_read_bytes",
               "io_write_bytes")
_NOT_COUNTED = (-1,) * len(USAGE_NAMES)


class Series(NamedTuple):
    """A job task's file read back."""

    header: Header
    samples: tuple[Sample, ...]


def _header_bytes(header: Header) -> bytes:
    data = MAGIC + json.dumps(header._asdict(), sort_keys=True,
                              separators=(",", ":")).encode() + b"\n"
    if len(data) > _MAX_HEADER:
        raise GecoError(f"job {header.job_id}.{header.task_id}: its usage header is over "
                        f"{_MAX_HEADER} bytes (a job name that long?)")
    return data


def _parse(data: bytes, display: Path) -> Series:
    line, newline, body = data.partition(b"\n")
    if not line.startswith(MAGIC) or not newline or len(line) > _MAX_HEADER:
        raise GecoError(f"{display} is not a geco usage file")
    try:
        fields = json.loads(line[len(MAGIC):])
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        header = Header(**{k: _checked(k, v) for k, v in fields.items() if k in Header._fields})
    except (ValueError, TypeError, RecursionError) as exc:
        raise GecoError(f"{display}: its header cannot be read: {exc}") from None
    whole = len(body) - len(body) % RECORD.size  # a record cut short by a crash is dropped
    samples = tuple(Sample(*RECORD.unpack_from(body, i)) for i in range(0, whole, RECORD.size))
    return Series(header, samples)


def _checked(name: str, value: object) -> Any:
    """A header field's value, of its field's type (a slave host's file is read here)."""
    kind = type(Header._field_defaults.get(name, 0))
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        raise ValueError(f"{name} is not a {kind.__name__}")
    return value


def _open(directory: Path, name: str, owner: str, readers: tuple[str, ...],
          flags: int = _OPEN_FLAGS) -> int:
    """The file ``name`` in ``directory``, opened for writing: root's, readable by
    ``owner``'s private group and the groups ``readers`` (``[usage] readers``); refused when
    it is no such file."""
    dfd = ownerread.open_dir(directory)
    try:
        return ownerread.open_in(dfd, name, ownerread.readers_of(owner, readers),
                                 directory / name, flags)
    finally:
        os.close(dfd)


def _writing(directory: Path, wait: float) -> contextlib.AbstractContextManager[None]:
    """The writers' lock of ``directory`` (raises GecoError when not had within ``wait``)."""
    return rootlock.held(directory / _LOCK_NAME, wait=wait, what="usage samples' writers")


def _replace(directory: Path, name: str, owner: str, readers: tuple[str, ...],
             data: bytes) -> int:
    """``name`` replaced whole by ``data`` (written beside it, then renamed into place: a
    reader opens the old file or the new one); return the new file, open for writing.
    Called with the writers' lock held."""
    new = _NEW.format(name)
    fd = _open(directory, new, owner, readers, _OPEN_FLAGS | os.O_TRUNC)
    try:
        os.pwrite(fd, data, 0)
        os.rename(directory / new, directory / name)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _failures(key: JobKey, display: Path) -> Iterator[None]:
    """A file that cannot be used, as one :class:`GecoError` naming it."""
    try:
        yield
    except ownerread.Refused as exc:
        cause = exc.__cause__
        code = errno.errorcode.get(cause.errno or 0) if isinstance(cause, OSError) else None
        raise GecoError(f"cannot keep job {key}'s usage samples: {exc}", errno=code) from None
    except OSError as exc:
        raise GecoError.from_oserror("cannot write the usage samples", exc,
                                     path=display) from exc


class Writer:
    """A job task's file, open for its samples (gecod's sampler holds one per running
    job: the file is opened and checked once, not every interval).

    Raises
    ------
    GecoError
        (from the constructor) when the directory or the file cannot be used (a link, a
        FIFO, not root's...).
    """

    def __init__(self, directory: Path, header: Header, readers: tuple[str, ...] = ()
                 ) -> None:
        self.header = header
        self._key = JobKey(header.job_id, header.task_id)
        self._directory = directory
        self._readers = readers
        self._display = jobfiles.samples(directory, self._key)
        self._start = 0  # where the records begin; 0: the header is not checked yet
        with _failures(self._key, self._display):
            self._fd = _open(directory, str(self._key), header.owner, readers)

    def add(self, sample: Sample, *, max_samples: int, wait: float = 0.0) -> None:
        """Add ``sample``, the file thinned to half first when it holds ``max_samples``
        records; ``wait``: how long to try for the writers' lock (gecod's sampler: not at
        all; a job's last sample: a little, for the sampler's write to end).

        Raises
        ------
        GecoError
            when the lock is not had within ``wait`` or the file cannot be written.
        """
        with _failures(self._key, self._display), _writing(self._directory, wait):
            self._follow()
            if not self._start:
                self._start = self._begin()
            count = (os.fstat(self._fd).st_size - self._start) // RECORD.size
            if count >= max_samples:
                count = self._thin()
            os.pwrite(self._fd, RECORD.pack(*sample), self._start + count * RECORD.size)

    def _follow(self) -> None:
        """Open the file anew when another writer replaced it since (a job's last sample
        written by the epilog while gecod samples it): never add to a file gone."""
        try:
            now = os.stat(self._display, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        held = os.fstat(self._fd)
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            fd = _open(self._directory, str(self._key), self.header.owner, self._readers)
            os.close(self._fd)
            self._fd, self._start = fd, 0

    def _begin(self) -> int:
        """Check the file's header (under the lock): a new file, not ours, or an earlier
        job's of the same number (Grid Engine reuses them: last written before this job
        started) is begun again with this job's; return where its records begin."""
        head = os.pread(self._fd, _MAX_HEADER + 1, 0)
        if not head.startswith(MAGIC) or b"\n" not in head \
                or os.fstat(self._fd).st_mtime < self.header.started - _CLOCK_SLACK:
            head = _header_bytes(self.header)
            self._swap(head)
        return head.index(b"\n") + 1

    def _thin(self) -> int:
        """Keep every other record (the first and the last always: the job's whole span);
        return how many are left."""
        series = _parse(os.pread(self._fd, os.fstat(self._fd).st_size, 0), self._display)
        kept = series.samples[::2]
        if len(series.samples) % 2 == 0:
            kept += series.samples[-1:]
        head = os.pread(self._fd, self._start, 0)
        self._swap(head + b"".join(RECORD.pack(*s) for s in kept))
        return len(kept)

    def _swap(self, data: bytes) -> None:
        fd = _replace(self._directory, str(self._key), self.header.owner, self._readers, data)
        os.close(self._fd)
        self._fd = fd

    def close(self) -> None:
        os.close(self._fd)


def append(directory: Path, header: Header, sample: Sample, *, max_samples: int,
           wait: float = 0.0, readers: tuple[str, ...] = ()) -> None:
    """Add ``sample`` to the job's file once (:class:`Writer`, opened and closed).

    Raises
    ------
    GecoError
        when the directory or the file cannot be used (a link, a FIFO, not root's...).
    """
    writer = Writer(directory, header, readers)
    try:
        writer.add(sample, max_samples=max_samples, wait=wait)
    finally:
        writer.close()


def export(series: Series, most: int) -> bytes:
    """``series`` as its file holds it, with at most ``most`` samples spread evenly over
    its span (the first and the last always): what a slave host sends its master."""
    kept = series.samples
    if len(kept) > most:
        step = (len(kept) - 1) / (most - 1)
        kept = tuple(kept[round(i * step)] for i in range(most))
    return _header_bytes(series.header) + b"".join(RECORD.pack(*s) for s in kept)


def load(data: bytes, origin: str) -> Series:
    """What :func:`export` made, read back (``origin`` names where it came from in an
    error)."""
    return _parse(data, Path(origin))


def keep_copy(directory: Path, series: Series, readers: tuple[str, ...] = ()) -> None:
    """Keep another host's samples of a job (gathered by its master at the job's end) as
    ``<job>.<task>@<host>`` beside this host's own, readable as they are.

    Raises
    ------
    GecoError
        as :func:`append`, or when the header names no usable host.
    """
    h = series.header
    key = JobKey(h.job_id, h.task_id)
    if not _HOST_RE.fullmatch(h.host):
        raise GecoError(f"job {key}: {h.host!r} is not a host name to keep samples under")
    data = _header_bytes(h) + b"".join(RECORD.pack(*s) for s in series.samples)
    display = directory / f"{key}@{h.host}"
    with _failures(key, display), _writing(directory, _LAST_WAIT):
        os.close(_replace(directory, display.name, h.owner, readers, data))


def is_file_name(name: str) -> bool:
    """True for a usage file's name: ``<job>.<task>``, or ``<job>.<task>@<host>`` (a copy
    of another host's); and for a replacement of one a crash left half made (pruned with
    them)."""
    if name.startswith(".") and name.endswith(".new"):
        name = name[1:-4]
    key, at, host = name.partition("@")
    return JobKey.is_key_text(key) and (not at or _HOST_RE.fullmatch(host) is not None)


def read(directory: Path, key: JobKey, host: str | None = None) -> Series | None:
    """The job task's file read back (``host``: the copy of that host's, gathered by the
    job's master); None when there is none.

    Raises
    ------
    GecoError
        when it cannot be read (not the caller's to read, not a geco usage file).
    """
    display = directory / (str(key) if host is None else f"{key}@{host}")
    try:
        fd = os.open(display, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise GecoError(f"job {key}'s usage is not yours to read ({display})") from None
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the usage samples", exc,
                                     path=display) from exc
    try:  # no lock: a thinning writer replaces the file whole (a user may hold its flock)
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    finally:
        os.close(fd)
    if not data:  # made this moment, its first sample not yet in
        return None
    return _parse(data, display)


def read_job(directory: Path, key: JobKey) -> list[Series]:
    """Every host's samples of job task ``key`` kept here: this host's first, then the
    copies its master gathered from the job's other hosts (by host name).

    Raises
    ------
    GecoError
        as :func:`read`.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise GecoError.from_oserror("cannot list the usage samples", exc,
                                     path=directory) from exc
    hosts = sorted(n.partition("@")[2] for n in names
                   if n.startswith(f"{key}@") and is_file_name(n))
    found = [read(directory, key), *(read(directory, key, h) for h in hosts)]
    return [s for s in found if s is not None]


def header_of(cfg: Config, key: JobKey, host: str, rs: ResourceSet | None) -> Header:
    """What job ``key`` was granted on this host and whose it is (its resource set ``rs``,
    and its spool dir); the key and its start alone when neither says more."""
    spool = execd.find_spool_dir(cfg.execd_spool_dir, key, host)
    started = execd.job_started(spool, cfg.resources_dir / key) or 0.0  # 0: not known
    queue = ""
    if spool is not None:
        with contextlib.suppress(GecoError):
            queue = execd.read_config(spool).get("queue", "")
    if rs is None:
        return Header(key.job, key.task, queue=queue, host=host, started=started)
    here = next((n for n in rs.nodes if short_hostname(n.name) == host),
                rs.nodes[0] if rs.nodes else None)
    name = rs.job_name[:_MAX_NAME]  # the user's choice: never too long for the header
    if here is None:
        return Header(key.job, key.task, owner=rs.owner, job_name=name, queue=queue,
                      host=host, started=started)
    return Header(key.job, key.task, owner=rs.owner, job_name=name, queue=queue,
                  host=host, cores=here.slots, memory=here.memory_limit,
                  gpus=len([g for g in here.gpus.split(",") if g]), started=started)


def keep_last(cfg: Config, key: JobKey, usage: Mapping[str, int],
              rs: ResourceSet | None) -> None:
    """Append job ``key``'s last sample (``usage``: its counters read just before its
    cgroups go, by the teardown; ``rs``: its resource set); a failure is journaled, never
    raised: the job ends all the same."""
    if not usage:
        return
    try:
        append(cfg.usage_dir, header_of(cfg, key, short_hostname(), rs),
               Sample.from_usage(time.time(), usage), max_samples=cfg.usage_max_samples,
               wait=_LAST_WAIT, readers=cfg.usage_readers)
    except GecoError as exc:
        _log.log(level_of(exc), "job %s: its last usage sample is not kept: %s", key, exc,
                 extra=log.job_fields(key.job, key.task, "usage-sample-failed"))


def level_of(exc: GecoError) -> int:
    """How loudly a sample that could not be kept is journaled: a full or read-only state
    directory is every hook's error already (said once, where the job's start met it), so
    the samples it costs are information; anything else is a warning."""
    return log.INFO if exc.fields.get("errno") in _DISK_TROUBLE else log.WARNING
