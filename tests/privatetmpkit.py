"""Jobs' private /tmp in the tests: namespaces made under a test's own state directory and
dropped after it, and a file another user planted in the node's /tmp.

:func:`config` is a configuration whose namespaces (``geco-mntns make``) live under a
fresh state directory, dropped and unmounted afterwards, also after a test that failed
halfway. :func:`planted` is what an attacker leaves in the node's /tmp at the path a
victim's job uses in its own: an empty file of theirs, mode 0666, removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from geco.config import Config
from geco.job import privatetmp

__all__ = ["config", "planted"]


@contextlib.contextmanager
def config(tmp_path: Path) -> Iterator[Config]:
    """A configuration with its state (and the jobs' namespaces) under ``tmp_path``."""
    tmp_path.chmod(0o755)
    cfg = Config(state_dir=tmp_path / "state", tmp_shm_size="50%")
    try:
        yield cfg
    finally:
        for pin in (cfg.state_dir / "mntns").glob("*"):  # a test that failed halfway
            subprocess.run([str(privatetmp.HELPER), "drop", str(pin)], check=False,
                           capture_output=True)
        subprocess.run(["umount", "-l", str(cfg.state_dir / "mntns")], check=False,
                       capture_output=True)


@contextlib.contextmanager
def planted(prefix: str, uid: int, gid: int) -> Iterator[Path]:
    """``/tmp/<prefix>-<random>`` in the node's /tmp: ``uid``'s, empty, mode 0666."""
    path = Path("/tmp", f"{prefix}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o666)
    os.close(fd)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
