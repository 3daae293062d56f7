"""Write a whole file atomically: a reader sees the old file or the new one, never half.

geco's files that others read while geco may be writing them (resource files,
OOM counts, the preload's config, the quarantine key) are all written here, and those
that go with their job removed (:func:`remove`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from geco.errors import GecoError

__all__ = ["remove", "write_atomic"]

_DIR_MODE = 0o755


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
        import tempfile  # only when writing: a hook that reads files needs none of it

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


def remove(path: Path, what: str) -> None:
    """Remove ``path`` (none is fine).

    Raises
    ------
    GecoError
        when it exists and cannot be removed ("cannot remove the <what>").
    """
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise GecoError.from_oserror(f"cannot remove the {what}", exc, path=path) from exc
