"""The per-job resource files: ``<state_dir>/resources/<job>.<task>``.

A file holds one ``GECOResourceSet_v1{...}`` text, so qstat is asked once per
job and every later hook (and gecod) reads the answer from here.

Writes are atomic (temporary file, fsync, rename), so a reader never sees half
a file and a crash leaves either the old file or the new one. A truncated or
corrupt file (a disk that filled up under an older writer, a hand edit) is
reported by :func:`read` as a :class:`~geco.errors.ResourceFormatError`; the
caller decides whether to ask qstat again, or goes on with what else it knows
(:func:`read_usable`).

A set Grid Engine gives anew in place of a file that is missing or unusable is written by
:func:`rewrite`, the one way to do it: it keeps the GPU ids geco picked for the job on this
node (:mod:`geco.sge.gpupicks`), which Grid Engine does not know. :func:`remove` removes
their record with the file.

Every set read or written here also tells this process's later journal records of
the job which job of its number it is (:func:`geco.log.job_instance`), for as long
as the file is unchanged.
"""

from __future__ import annotations

from pathlib import Path

from geco import jobfiles, log
from geco.atomicfile import write_atomic
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet
from geco.sge import gpupicks, v1format

__all__ = ["read", "read_usable", "remove", "rewrite", "write", "write_to"]

_log = log.get("sge.resourcefile")

# Job facts (names, owners, paths) are visible to everyone through qstat anyway;
# world-readable lets `geco rsrcinfo -u` work for users. Only root writes.
_FILE_MODE = 0o644


def read(resources_dir: Path, key: JobKey) -> ResourceSet | None:
    """Return the saved resource set, or None when there is no file.

    Raises
    ------
    ResourceFormatError
        when the file exists but is not a valid v1 text (names the file).
    GecoError
        when the file cannot be read.
    """
    path = jobfiles.resource_file(resources_dir, key)
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
    path = jobfiles.resource_file(resources_dir, rs.key)
    write_to(path, rs, make_dir=True)
    return path


def rewrite(resources_dir: Path, rs: ResourceSet, hostname: str | None = None, *,
            contained: bool = False) -> ResourceSet:
    """Write ``rs``, read anew from Grid Engine (qstat, the spool) because the job's file is
    missing or unusable, with the GPU ids geco picked for it on this node put back
    (:func:`geco.sge.gpupicks.kept`); return what was written.

    Picks that cannot be put back are never made up: the count stays without ids, the job
    keeps the GPUs its cgroup lets it open, and a warning says which job and why
    (``gpu-picks-unknown``).

    Parameters
    ----------
    hostname: this node's name as ``rs`` spells it (None: this host's).
    contained: the job's cgroups exist here (it holds its GPUs already).

    Raises
    ------
    GecoError
        as :func:`write`.
    """
    kept, lost = gpupicks.kept(resources_dir, rs, hostname, contained=contained)
    path = write(resources_dir, kept)
    key = rs.key
    if lost:
        node = kept.node(hostname)
        _log.warning("job %s: its resource file %s was written anew from Grid Engine, which "
                     "counts its GPUs here (%s) but does not know which ones geco picked, and "
                     "they cannot be put back: %s; the job keeps the GPUs its cgroup lets it "
                     "open, but its later tasks, geco status and the next job's pick do not "
                     "know them", key, path, node.gpus if node else "", lost,
                     extra=log.job_fields(key.job, key.task, "gpu-picks-unknown", PATH=path,
                                          GPUS=node.gpus if node else None, REASON=lost))
    elif kept is not rs:
        node = kept.node(hostname)
        _log.info("job %s: its resource file %s was written anew from Grid Engine, with the "
                  "GPUs geco picked here (%s) put back", key, path, node.gpus if node else "",
                  extra=log.job_fields(key.job, key.task, "gpu-picks-kept", PATH=path,
                                       GPUS=node.gpus if node else None))
    return kept


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
    """Remove a job task's file, and the record of the GPUs picked for it; return False
    when there was no file.

    Raises
    ------
    GecoError
        when either exists and cannot be removed.
    """
    path = jobfiles.resource_file(resources_dir, key)
    gpupicks.remove(resources_dir, key)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise GecoError.from_oserror("cannot remove the resource file", exc, path=path) from exc
    return True

