"""The per-job resource files: ``<state_dir>/resources/<job>.<task>``.

A file holds one ``GECOResourceSet_v1{...}`` text, so qstat is asked once per
job and every later hook (and gecod) reads the answer from here.

Writes are atomic (temporary file, fsync, rename), so a reader never sees half
a file and a crash leaves either the old file or the new one. A truncated or
corrupt file (a disk that filled up under an older writer, a hand edit) is
reported by :func:`read` as a :class:`~geco.errors.ResourceFormatError`; the
caller decides whether to ask qstat again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from geco.errors import GecoError
from geco.resource import ResourceSet

__all__ = ["path_for", "read", "remove", "write", "write_atomic", "write_to"]

# Job facts (names, owners, paths) are visible to everyone through qstat anyway;
# world-readable lets `geco rsrcinfo -u` work for users. Only root writes.
_FILE_MODE = 0o644
_DIR_MODE = 0o755


def path_for(resources_dir: Path, job_id: int, task_id: int) -> Path:
    """Return the file of one job task."""
    return resources_dir / f"{job_id}.{task_id}"


def read(resources_dir: Path, job_id: int, task_id: int) -> ResourceSet | None:
    """Return the saved resource set, or None when there is no file.

    Raises
    ------
    ResourceFormatError
        when the file exists but is not a valid v1 text (names the file).
    GecoError
        when the file cannot be read.
    """
    path = path_for(resources_dir, job_id, task_id)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the resource file", exc, path=path) from exc
    try:
        return ResourceSet.from_v1(data)
    except GecoError as exc:
        exc.fields.setdefault("path", path)
        raise


def write(resources_dir: Path, rs: ResourceSet) -> Path:
    """Atomically write ``rs`` to its file under ``resources_dir`` and return the path.

    Raises
    ------
    GecoError
        when the directory or file cannot be written (a full disk, a read-only
        state dir); nothing half-written is left behind.
    """
    path = path_for(resources_dir, rs.job_id, rs.task_id)
    write_to(path, rs, make_dir=True)
    return path


def write_to(path: Path, rs: ResourceSet, *, make_dir: bool = False) -> None:
    """Atomically write ``rs`` to ``path`` (temporary file, fsync, rename).

    Raises
    ------
    GecoError
        when the file cannot be written; nothing half-written is left behind.
    """
    write_atomic(path, rs.to_v1(), mode=_FILE_MODE, make_dir=make_dir)


def write_atomic(path: Path, data: bytes, *, mode: int, make_dir: bool = False,
                 overwrite: bool = True, what: str = "resource file") -> None:
    """Atomically write ``data`` to ``path``: temporary file, fsync, chmod, rename.

    A reader sees the old file or the new one, never half of one; a crash
    leaves at most a ``.<name>.*`` temporary beside it.

    Parameters
    ----------
    path:
        The file.
    data:
        Its whole content.
    mode:
        Its permission bits. The temporary is created 0600 (mkstemp), so the
        content is never readable by more users than ``mode`` allows.
    make_dir:
        Create the parent directories (0755) when missing.
    overwrite:
        False: refuse an existing ``path`` without touching it (the final
        step is then ``link``, which fails atomically if the name exists).
    what:
        Names the file in the error message ("cannot write the <what>").

    Raises
    ------
    FileExistsError
        when ``overwrite`` is False and ``path`` exists.
    GecoError
        when the file cannot be written; nothing half-written is left behind.
    """
    tmp = None
    taken = False
    try:
        if make_dir:
            path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if overwrite:
            os.replace(tmp, path)
            tmp = None
        else:
            try:
                os.link(tmp, path)  # the temporary is unlinked below either way
            except FileExistsError:
                taken = True
    except OSError as exc:
        raise GecoError.from_oserror(f"cannot write the {what}", exc, path=path) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    if taken:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))


def remove(resources_dir: Path, job_id: int, task_id: int) -> bool:
    """Remove a job task's file; return False when there was none."""
    path = path_for(resources_dir, job_id, task_id)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise GecoError.from_oserror("cannot remove the resource file", exc, path=path) from exc
    return True

