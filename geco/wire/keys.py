"""The quarantine key file: 32 secret bytes shared by gecod and the preload.

``/etc/geco/quarantine.key`` (``[gecod] key_file``) holds exactly 32 raw bytes,
owned by root, mode 0600 or 0400. Whoever can read it can forge quarantine
requests over TCP and, on the Unix socket, any request the kernel's peer
credentials do not contradict; whoever can write it can lock every job out. So
gecod refuses to start with a key file that group or others may read or write,
or that root does not own; each refusal names the file and the command that
fixes it. (The original GECO compiled one static key into a world-readable
library: every user of every GECO site had it.)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nacl.utils

from geco import atomicfile
from geco.errors import KeyFileError
from geco.wire.frame import KEY_BYTES

__all__ = ["KEY_BYTES", "KEY_MODE", "generate_key", "load_key"]

KEY_MODE = 0o600


def load_key(path: Path | str, what: str = "quarantine key") -> bytes:
    """Read the key after checking that only root can read or change it.

    Parameters
    ----------
    path:
        The key file (symlinks are followed; the checks apply to the file itself).
    what:
        Which key, for messages: ``quarantine key`` or ``cluster key``.

    Returns
    -------
    The 32 key bytes.

    Raises
    ------
    KeyFileError
        when the file is missing or unreadable, not a regular file, not owned by
        root, has any permission for group or others, or does not hold exactly
        32 bytes. The message says the fix (``chmod 600``, ``chown root:``,
        ``geco keygen``) and ``path=`` names the file.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError as exc:
        raise KeyFileError(f"the {what} file does not exist; create it with "
                           f"`geco keygen {path}`", path=path) from exc
    except OSError as exc:
        raise KeyFileError.from_oserror(f"cannot open the {what} file", exc,
                                        path=path) from exc
    try:
        # checked on the open file, not the name: no window to swap the file in between
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"the {what} file must be a regular file; replace it "
                               f"with `geco keygen --force {path}`", path=path)
        if st.st_uid != 0:
            raise KeyFileError(f"the {what} file must be owned by root, got uid "
                               f"{st.st_uid}; fix: `chown root: {path}` (and check who "
                               f"could have changed it)", path=path)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise KeyFileError(f"the {what} file must not be accessible to group or "
                               f"others (mode 0600 or 0400), got {mode:04o}; fix: "
                               f"`chmod 600 {path}`, then `geco keygen --force {path}` and "
                               f"restart gecod, sge_execd and sshd, since others may have "
                               f"read it", path=path)
        data = os.read(fd, KEY_BYTES + 1)
    except OSError as exc:
        raise KeyFileError.from_oserror(f"cannot read the {what} file", exc,
                                        path=path) from exc
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        size = f"{len(data)}" if len(data) <= KEY_BYTES else f"more than {KEY_BYTES}"
        raise KeyFileError(f"the {what} file must hold exactly {KEY_BYTES} bytes, got "
                           f"{size}; fix: `geco keygen --force {path}`", path=path)
    return data


def generate_key(path: Path | str, force: bool = False) -> Path:
    """Write a new random key, atomically, mode 0600.

    The bytes come from the kernel's CSPRNG (libsodium ``randombytes_buf``).
    The file appears complete or not at all; the parent directory is created
    (0755) when missing.

    Parameters
    ----------
    path:
        The key file.
    force:
        Replace an existing file. gecod and the processes running the preload
        keep the key they read until they restart.

    Returns
    -------
    The path written.

    Raises
    ------
    KeyFileError
        when the file exists and ``force`` is False (the file is left alone).
    GecoError
        when the file cannot be written.
    """
    path = Path(path)
    try:
        atomicfile.write_atomic(path, nacl.utils.random(KEY_BYTES), mode=KEY_MODE,
                               make_dir=True, overwrite=force, what="quarantine key file")
    except FileExistsError:
        raise KeyFileError(f"the quarantine key file already exists; keep it, or replace it "
                           f"with `geco keygen --force {path}` and restart gecod, sge_execd "
                           f"and sshd", path=path) from None
    return path
