"""Per-job cgroups behind one interface, on cgroup v1 or v2, chosen at runtime.

Use::

    from geco import cgroup

    backend = cgroup.detect(cfg.cgroup_mount, cfg.cgroup_name, cfg.cgroup_version)
    backend.ensure_root()
    key = JobKey(42, 1)                               # "42.1"
    backend.create(key, cgroup.Limits(cpus="2-3", memory=8 << 30))
    backend.add_pid(key, pid)
    ...
    backend.freeze(key); backend.kill(key)            # epilog
    if backend.wait_empty(key, cfg.kill_timeout):
        backend.destroy(key)

:func:`detect` picks the layout: v2 when the configured mount itself is a
cgroup2 with cpuset and memory available, else v1 when cpuset and memory v1
hierarchies are mounted (hybrid hosts, whose ``/sys/fs/cgroup/unified``
cgroup2 has no controllers, get v1), else a :class:`~geco.errors.CgroupError`
saying what is missing. Only the standard library is imported, so this
package also runs in a minimal machine (the QEMU test VM).
"""

from __future__ import annotations

from pathlib import Path

from geco import procfs
from geco.cgroup._base import Backend, Limits, check_key
from geco.cgroup._fs import Mount, favors_dynmods, parse_mountinfo, read_bytes, read_str
from geco.cgroup._v1 import Hierarchy, V1Backend, find_hierarchies, find_systemd_hierarchies
from geco.cgroup._v2 import HOLDER, V2Backend, unit_cgroup
from geco.config import Config
from geco.errors import CgroupError

__all__ = [
    "HOLDER",
    "SYSTEMD_RUN",
    "Backend",
    "Hierarchy",
    "Limits",
    "Mount",
    "V1Backend",
    "V2Backend",
    "check_key",
    "detect",
    "favors_dynmods",
    "find_hierarchies",
    "for_config",
    "parse_mountinfo",
    "unit_cgroup",
]

_VERSIONS = ("auto", "1", "2")
#: Exists when systemd is the init system (sd_booted(3)), whose units own cgroups geco
#: must keep its jobs out of.
SYSTEMD_RUN = Path("/run/systemd/system")


def _cgroup2_at(mounts: list[Mount], mount: Path) -> tuple[Mount | None, str]:
    """Return the usable cgroup2 mount at ``mount``, or None and why it is not usable."""
    here = [m for m in mounts if m.mount_point == mount]
    if not here:
        return None, f"{mount} is not a mount point"
    top = here[-1]  # a later mount on the same point hides the earlier ones
    if top.fstype != "cgroup2":
        return None, f"{mount} is a {top.fstype} mount, not cgroup2"
    have = read_str(mount / "cgroup.controllers").split()
    missing = [c for c in ("cpuset", "memory") if c not in have]
    if missing:
        return None, (f"{mount}/cgroup.controllers lacks {' and '.join(missing)} (it has: "
                      f"{' '.join(have) or 'nothing'}; cgroup v1 may hold them)")
    return top, ""


def detect(mount: Path = Path("/sys/fs/cgroup"), name: str = "GECO", version: str = "auto",
           *, base: Path | None = None, exclusive_cpus: bool = False,
           systemd_base: str = "", proc: Path = procfs.ROOT) -> Backend:
    """Return the backend for this node's cgroup layout.

    Parameters
    ----------
    mount: where cgroups are mounted (config ``[cgroup] mount``); for v1 it
        only decides which mount wins when a controller is mounted twice,
        the controllers themselves are found in ``/proc/self/mountinfo``.
    name: the GECO parent's directory name (config ``[cgroup] name``).
    version: ``"auto"``, ``"1"`` or ``"2"`` (config ``[cgroup] version``).
    base: v2 only: where job cgroups live (a subtree delegated to gecod);
        default ``<mount>/<name>``. Ignored on v1.
    exclusive_cpus: v1 only: make cpusets ``cpu_exclusive`` (see
        :class:`V1Backend`).
    systemd_base: v1 only: the cgroup path in systemd's own hierarchies (config
        ``[cgroup] v1_systemd_base``) job processes also go to; "" for none.
    proc: the /proc to read.

    Raises
    ------
    CgroupError
        when the configured version is not usable here, or neither is, with
        the reason for each.
    """
    version = str(version).strip().lower()
    if version not in _VERSIONS:
        raise CgroupError(f"the cgroup version must be auto, 1 or 2, got {version!r}")
    mount = Path(mount)
    mounts = parse_mountinfo(read_bytes(proc / "self" / "mountinfo"))
    if version in ("auto", "2"):
        v2, why_not_v2 = _cgroup2_at(mounts, mount)
        if v2 is not None:
            return V2Backend(mount, name, base=base, mount_root=v2.root, proc=proc)
        if version == "2":
            raise CgroupError(f"cgroup version 2 is configured, but {why_not_v2}", path=mount)
    hierarchies = find_hierarchies(mounts, mount)
    missing = [c for c in ("cpuset", "memory") if c not in hierarchies]
    if not missing:
        systemd = find_systemd_hierarchies(mounts, mount) if systemd_base else {}
        if systemd_base and not systemd:
            raise CgroupError("[cgroup] v1_systemd_base is set, but neither systemd's "
                              "name=systemd hierarchy nor a cgroup2 is mounted "
                              f"({proc}/self/mountinfo)")
        return V1Backend(hierarchies, name, exclusive_cpus=exclusive_cpus, proc=proc,
                         systemd=systemd, systemd_base=systemd_base)
    why_not_v1 = (f"no cgroup v1 hierarchy has {' or '.join(missing)} mounted "
                  f"({proc}/self/mountinfo)")
    if version == "1":
        raise CgroupError(f"cgroup version 1 is configured, but {why_not_v1}")
    raise CgroupError(f"no usable cgroup hierarchy: {why_not_v2}, and {why_not_v1}",
                      path=mount)


def for_config(cfg: Config) -> Backend:
    """Return the backend the configuration asks for (see :func:`detect`).

    ``[cgroup] v2_base`` (``cfg.cgroup_v2_base``) is the v2 base when set;
    ``""`` keeps the default ``<mount>/<name>``; ``[cgroup] v1_systemd_base`` is
    the v1 backend's systemd base.

    Raises
    ------
    CgroupError
        as :func:`detect`.
    """
    base = Path(cfg.cgroup_v2_base) if cfg.cgroup_v2_base else None
    return detect(cfg.cgroup_mount, cfg.cgroup_name, cfg.cgroup_version, base=base,
                  exclusive_cpus=cfg.exclusive_cpus, systemd_base=cfg.cgroup_v1_systemd_base)
