"""The environment root gives Grid Engine's commands: the site's, never the caller's.

The hooks run as root with the *job's* environment (Grid Engine passes it on,
and ``qsub -v SGE_QMASTER_PORT=1,SGE_ROOT=/tmp,PATH=/tmp/evil`` puts whatever
the owner likes there). Anything root runs of Grid Engine's (qstat in the
prolog and in gecod, qmod when a teardown is stuck) takes nothing from
``os.environ``: :func:`discover` builds its environment once, from the site,
and every caller passes the resulting :class:`SgeEnv` down.

Where each variable comes from, first found wins:

* ``SGE_ROOT``: ``[qstat] sge_root``; else sge_execd's own environment; else
  ``/etc/default/gridengine`` (Debian's packages); else ``/var/lib/gridengine``
  when it holds the cell (Debian's built-in default).
* ``SGE_CELL``: ``[qstat] sge_cell``; else sge_execd's; else
  ``/etc/default/gridengine``; else ``default`` (Grid Engine's own default).
* ``SGE_QMASTER_PORT``, ``SGE_EXECD_PORT``, ``SGE_CLUSTER_NAME``, ``SGE_ARCH``:
  ``[qstat]`` (``qmaster_port``, ``execd_port``, ``cluster_name``); else the
  cell's ``common/settings.sh`` (literal ``NAME=value`` lines only: it is
  read, never run) and ``common/cluster_name``; else sge_execd's environment;
  else unset (the ports then come from ``/etc/services``, as Grid Engine does).

sge_execd is found through our own parent chain (a hook's parent is the
shepherd, whose parent is execd), else through the ``execd.pid`` files under
``[paths] execd_spool_dir``; a process counts only if it is named
``sge_execd`` and runs with real and effective uid 0 (a user can name a
program ``sge_execd``; only root can start one as root), checked again after
its environment was read (pid reuse). Files are used only when no one but
their owner may write them.

``PATH`` is fixed: ``$SGE_ROOT/bin/<arch>`` (when it exists) and the system's
root-owned directories; a bare command name is looked up there only.
Nothing here raises: what cannot be found is left out, and
:meth:`SgeEnv.describe` says where each value came from.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from geco import log, procfs
from geco.config import Config
from geco.resourceset import short_hostname

__all__ = ["SYSTEM_PATH", "SgeEnv", "discover"]

_log = log.get("sge.siteenv")

#: The system directories of root's Grid Engine commands, after ``$SGE_ROOT/bin/<arch>``
#: (no /usr/local: on Debian it is writable by group staff).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Debian's packages: where their wrapper scripts read SGE_ROOT/SGE_CELL, and their default
_DEBIAN_DEFAULTS = Path("/etc/default/gridengine")
_DEBIAN_ROOT = Path("/var/lib/gridengine")
_EXECD = "sge_execd"
# the variables taken from execd or settings.sh; nothing else of either is used
_NAMES = ("SGE_ROOT", "SGE_CELL", "SGE_ARCH", "SGE_QMASTER_PORT", "SGE_EXECD_PORT",
          "SGE_CLUSTER_NAME")
# how far up our parent chain execd may be (hook -> shepherd -> execd)
_MAX_ANCESTORS = 8
# settings files are a few hundred bytes; execd's environment a few KiB
_MAX_FILE = 64 * 1024
# NAME=value with a literal value: no quotes, $, backquotes or spaces (never evaluated)
_ASSIGNMENT = re.compile(rb"^\s*(?:export\s+)?(SGE_[A-Z_]+)=([A-Za-z0-9_./:+@-]*)\s*(?:;.*)?$")
# uname -m -> Grid Engine's arch name (its util/arch script)
_ARCHES = {"x86_64": "lx-amd64", "aarch64": "lx-arm64", "ppc64le": "lx-ppc64le",
           "s390x": "lx-s390x", "i686": "lx-x86", "armv7l": "lx-arm"}
_VALID = {
    "SGE_ROOT": re.compile(r"/[^\0\n]*"),
    "SGE_CELL": re.compile(r"(?!\.{1,2}$)[A-Za-z0-9_.+-]+"),
    "SGE_ARCH": re.compile(r"[A-Za-z0-9_.+-]+"),
    "SGE_QMASTER_PORT": re.compile(r"[1-9][0-9]{0,4}"),
    "SGE_EXECD_PORT": re.compile(r"[1-9][0-9]{0,4}"),
    "SGE_CLUSTER_NAME": re.compile(r"[A-Za-z0-9_.+-]+"),
}


@dataclass(frozen=True, slots=True)
class SgeEnv:
    """The Grid Engine environment of root's commands.

    Attributes
    ----------
    values: ``SGE_*`` name -> value, only those that were found.
    path: the fixed ``PATH``.
    sources: ``SGE_*`` name -> where its value came from (``geco.toml``,
        ``sge_execd pid 123``, a file name, ``default``).
    """

    values: dict[str, str] = field(default_factory=dict)
    path: str = SYSTEM_PATH
    sources: dict[str, str] = field(default_factory=dict)

    def environ(self) -> dict[str, str]:
        """The whole environment of a Grid Engine command: nothing of the caller's."""
        return {**self.values, "PATH": self.path, "LC_ALL": "C", "HOME": "/"}

    def which(self, name: str) -> str | None:
        """``name`` itself when it holds a ``/``, else its path in :attr:`path` (or None)."""
        return name if "/" in name else shutil.which(name, path=self.path)

    def describe(self) -> str:
        """One line for the journal: ``SGE_ROOT=/x (geco.toml), ..., PATH=...``."""
        parts = [f"{k}={v} ({self.sources.get(k, '?')})" for k, v in self.values.items()]
        return ", ".join([*parts, f"PATH={self.path}"])


def _private_file(path: Path) -> bytes | None:
    """The regular file's bytes when only its owner may write it, else None (a FIFO or
    device is never opened for reading: O_NONBLOCK, then fstat)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_mode & 0o022:
            _log.warning("ignoring %s: writable by group or others (mode %o)", path,
                         st.st_mode & 0o7777)
            return None
        return os.read(fd, _MAX_FILE)
    except OSError:
        return None
    finally:
        os.close(fd)


def _assignments(data: bytes | None) -> dict[str, str]:
    """The literal ``SGE_*=value`` lines of a shell settings file (last one wins)."""
    found: dict[str, str] = {}
    for line in (data or b"").splitlines():
        m = _ASSIGNMENT.match(line)
        if m and m.group(1).decode() in _NAMES and m.group(2):
            found[m.group(1).decode()] = m.group(2).decode()
    return found


def _root_execd(proc: Path, pid: int) -> bytes | None:
    """The start time of ``pid`` when it is ``sge_execd`` with real and effective uid 0."""
    fields = procfs.stat_fields(pid, proc)
    if procfs.comm(pid, proc) != _EXECD or procfs.uids(pid, proc) != (0, 0) \
            or fields is None or len(fields) < 20:
        return None
    return fields[19]


def _execd_pids(cfg: Config, proc: Path, start: int) -> list[int]:
    """Candidates: our ancestors first, then the pids in the execd spool's pid files."""
    pids, pid = [], start
    for _ in range(_MAX_ANCESTORS):
        fields = procfs.stat_fields(pid, proc)
        if fields is None or len(fields) < 2 or int(fields[1]) <= 1:
            break
        pid = int(fields[1])
        pids.append(pid)
    files = [cfg.execd_spool_dir / short_hostname() / "execd.pid"]
    with contextlib.suppress(OSError):
        files += sorted(cfg.execd_spool_dir.glob("*/execd.pid"))
    for name in files:
        try:
            text = name.read_bytes()[:32].strip()
        except OSError:
            continue
        if text.isdigit():
            pids.append(int(text))
    return pids


def _execd_environment(cfg: Config, proc: Path, start: int) -> tuple[dict[str, str], str]:
    """The ``SGE_*`` variables of the running sge_execd, and ``sge_execd pid N``."""
    for pid in dict.fromkeys(_execd_pids(cfg, proc, start)):
        started = _root_execd(proc, pid)
        if started is None:
            continue
        try:
            with (proc / str(pid) / "environ").open("rb") as f:
                data = f.read(_MAX_FILE)
        except OSError:
            continue
        if _root_execd(proc, pid) != started:
            continue  # it exited meanwhile; the pid may be another process's now
        found: dict[str, str] = {}
        for item in data.split(b"\0"):
            name, sep, value = item.partition(b"=")
            if sep and name.decode("ascii", "replace") in _NAMES:
                found[name.decode()] = value.decode("utf-8", "replace")
        return found, f"sge_execd pid {pid}"
    return {}, ""


def _valid(name: str, value: str, source: str) -> bool:
    if _VALID[name].fullmatch(value) and not (name.endswith("_PORT") and int(value) > 65535):
        return True
    _log.warning("ignoring %s=%r from %s: not a valid value", name, value[:80], source)
    return False


def discover(cfg: Config, *, proc: Path = procfs.ROOT, start: int | None = None,
             debian_defaults: Path = _DEBIAN_DEFAULTS,
             debian_root: Path = _DEBIAN_ROOT) -> SgeEnv:
    """Build the environment of root's Grid Engine commands from the site (see the module).

    Parameters
    ----------
    cfg: ``[qstat]`` ``sge_root``, ``sge_cell``, ``qmaster_port``, ``execd_port``,
        ``cluster_name`` ("" or 0 = discover), ``[paths] execd_spool_dir``.
    proc, start, debian_defaults, debian_root: where /proc is, the pid whose
        ancestors are searched for execd (default: this process), Debian's files;
        tests pass fixture trees.

    Returns
    -------
    SgeEnv
        Never raises; what was found where is in :meth:`SgeEnv.describe`.
    """
    execd, execd_source = _execd_environment(cfg, proc, os.getpid() if start is None else start)
    debian = _assignments(_private_file(debian_defaults))
    values: dict[str, str] = {}
    sources: dict[str, str] = {}

    def take(name: str, *candidates: tuple[str | None, str]) -> None:
        for value, source in candidates:
            if value and _valid(name, value, source):
                values[name], sources[name] = value, source
                return

    toml = "geco.toml"
    take("SGE_ROOT", (cfg.sge_root, toml), (execd.get("SGE_ROOT"), execd_source),
         (debian.get("SGE_ROOT"), str(debian_defaults)))
    take("SGE_CELL", (cfg.sge_cell, toml), (execd.get("SGE_CELL"), execd_source),
         (debian.get("SGE_CELL"), str(debian_defaults)), ("default", "default"))
    cell = values["SGE_CELL"]
    if "SGE_ROOT" not in values and (debian_root / cell / "common").is_dir():
        values["SGE_ROOT"], sources["SGE_ROOT"] = str(debian_root), "default"
    settings: dict[str, str] = {}
    settings_file = ""
    if "SGE_ROOT" in values:
        common = Path(values["SGE_ROOT"]) / cell / "common"
        settings_file = str(common / "settings.sh")
        settings = _assignments(_private_file(common / "settings.sh"))
        name_file = (_private_file(common / "cluster_name") or b"").strip().decode(
            "utf-8", "replace")
        if name_file and "SGE_CLUSTER_NAME" not in settings:
            settings["SGE_CLUSTER_NAME"] = name_file
    for name, configured in (("SGE_QMASTER_PORT", cfg.sge_qmaster_port),
                             ("SGE_EXECD_PORT", cfg.sge_execd_port),
                             ("SGE_CLUSTER_NAME", cfg.sge_cluster_name), ("SGE_ARCH", "")):
        take(name, (str(configured or ""), toml), (settings.get(name), settings_file),
             (execd.get(name), execd_source))
    arch = values.get("SGE_ARCH") or _ARCHES.get(platform.machine(), "")
    path = SYSTEM_PATH
    if "SGE_ROOT" in values and arch:
        bin_dir = Path(values["SGE_ROOT"]) / "bin" / arch
        if bin_dir.is_dir():
            path = f"{bin_dir}:{SYSTEM_PATH}"
    env = SgeEnv(values, path, sources)
    _log.debug("Grid Engine environment of root's commands: %s", env.describe())
    return env
