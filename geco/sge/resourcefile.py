"""The per-job resource files: ``<state_dir>/resources/<job>.<task>``.

A file holds one ``GECOResourceSet_v1{...}`` text, so qstat is asked once per
job and every later hook (and gecod) reads the answer from here.

Writes are atomic (temporary file, fsync, rename), so a reader never sees half
a file and a crash leaves either the old file or the new one. A truncated or
corrupt file (a disk that filled up under an older writer, a hand edit) is
reported by :func:`read` as a :class:`~geco.errors.ResourceFormatError`; the
caller decides whether to ask qstat again, or goes on with what else it knows
(:func:`read_usable`).

Every set read or written here also tells this process's later journal records of
the job which job of its number it is (:func:`geco.log.job_instance`), for as long
as the file is unchanged.
"""

from __future__ import annotations

from pathlib import Path

from geco import log
from geco.atomicfile import write_atomic
from geco.errors import GecoError
from geco.job.jobkey import JobKey
from geco.job.resourceset import ResourceSet
from geco.sge import v1format

__all__ = ["path_for", "read", "read_usable", "remove", "write", "write_to"]

_log = log.get("resourcefile")

# Job facts (names, owners, paths) are visible to everyone through qstat anyway;
# world-readable lets `geco rsrcinfo -u` work for users. Only root writes.
_FILE_MODE = 0o644


def path_for(resources_dir: Path, key: JobKey) -> Path:
    """Return the file of one job task."""
    return resources_dir / key


def read(resources_dir: Path, key: JobKey) -> ResourceSet | None:
    """Return the saved resource set, or None when there is no file.

    Raises
    ------
    ResourceFormatError
        when the file exists but is not a valid v1 text (names the file).
    GecoError
        when the file cannot be read.
    """
    path = path_for(resources_dir, key)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the resource file", exc, path=path) from exc
    try:
        rs = v1format.parse(data)
    except GecoError as exc:
        exc.fields.setdefault("path", path)
        raise
    _tell_the_log(path, rs)
    return rs


def read_usable(resources_dir: Path, key: JobKey) -> ResourceSet | None:
    """:func:`read` for a caller that goes on with what else it knows (a job's end, who
    owns a job): None also when the file cannot be used, which is said at debug level."""
    try:
        return read(resources_dir, key)
    except GecoError as exc:
        _log.debug("job %s: its resource file cannot be used: %s", key, exc)
        return None


def write(resources_dir: Path, rs: ResourceSet) -> Path:
    """Atomically write ``rs`` to its file under ``resources_dir`` and return the path.

    Raises
    ------
    GecoError
        when the directory or file cannot be written (a full disk, a read-only
        state dir); nothing half-written is left behind.
    """
    path = path_for(resources_dir, rs.key)
    write_to(path, rs, make_dir=True)
    return path


def write_to(path: Path, rs: ResourceSet, *, make_dir: bool = False) -> None:
    """Atomically write ``rs`` to ``path`` (temporary file, fsync, rename).

    Raises
    ------
    GecoError
        when the file cannot be written; nothing half-written is left behind.
    """
    write_atomic(path, v1format.serialize(rs), mode=_FILE_MODE, make_dir=make_dir)
    _tell_the_log(path, rs)


def _tell_the_log(path: Path, rs: ResourceSet) -> None:
    """The job's records from now on say which job of its number it is, while ``path`` is
    unchanged (a set of an older geco, which does not know, forgets what was known)."""
    log.job_instance(rs.job_id, rs.task_id, rs.cluster, rs.submitted, path)


def remove(resources_dir: Path, key: JobKey) -> bool:
    """Remove a job task's file; return False when there was none."""
    path = path_for(resources_dir, key)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise GecoError.from_oserror("cannot remove the resource file", exc, path=path) from exc
    return True

