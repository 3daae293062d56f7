"""cgroup v1: one hierarchy per controller, each with its own ``GECO/<job>.<task>`` directory.

Layout: ``<hierarchy mount point>/<name>/<job>.<task>`` for cpuset and memory
(required), and freezer, pids, cpuacct (CPU time accounting) and devices (the GPUs a
job was not granted) when they are mounted. Where each controller is mounted comes
from ``/proc/self/mountinfo``, never from a guess: ``/sys/fs/cgroup/<ctrl>`` today,
``/cgroup/<ctrl>`` on RHEL6, co-mounted ``cpuset,memory`` or ``cpu,cpuacct``
elsewhere. The
configured mount only says which mount wins when a controller is mounted twice.

Kernel rules this module is shaped by (all checked on a real kernel by
``tests/system/test_cgroup_v1.py``):

* A cpuset with empty ``cpuset.cpus`` or ``cpuset.mems`` refuses tasks
  (ENOSPC), so both are written before anything joins.
* ``cpuset.cpu_exclusive=1`` makes the kernel refuse a sibling whose cpus
  overlap (EINVAL), but a cpuset may only be exclusive when its parent is
  (EACCES otherwise). So job cpusets are exclusive only when the GECO parent
  is, and geco makes GECO exclusive only when geco created it: an admin's
  pre-made GECO (fewer cpus, to reserve cores) is never touched.
* ``memory.limit_in_bytes`` may never exceed ``memory.memsw.limit_in_bytes``
  (EINVAL), so the two writes are ordered to keep that true at every step.
* A SIGKILLed task in a FROZEN freezer cgroup stays (state D) until thawed.
  Thawing a cgroup does not thaw a sub-cgroup that was frozen itself
  (``freezer.self_freezing``): its tasks stay, and teardown reports them.
* cpuacct counts in nanoseconds (``cpuacct.usage_user``/``usage_sys``, Linux
  >= 4.7) or in USER_HZ ticks (``cpuacct.stat``), and keeps counting what
  exited processes used until the cgroup is removed.

Under systemd (legacy or hybrid layout) job processes also go into systemd's own
hierarchies, ``name=systemd`` and, in hybrid mode, the cgroup2 systemd tracks units in,
at ``<systemd base>/<job>.<task>``, a subtree of a unit systemd delegates
(geco-jobs.service; ``[cgroup] v1_systemd_base``). Left in the unit they came from (the
execd's service, an ssh session's scope), they would be moved out of their job by
systemd: re-realizing a unit whose controllers changed (a daemon-reload can do it)
migrates every process it tracks there, in each v1 controller it manages, to the unit's
own cgroups. systemd never does that in a delegated unit, so :meth:`V1Backend.ensure_root`
refuses a base in a unit that is not running, or that systemd (251 and later mark their
units' cgroups with ``user.invocation_id``, and delegated ones with ``user.delegate``)
does not delegate, naming the fix; a base in no unit at all is left to the caller to
warn about (systemd tracks no process there).
"""

from __future__ import annotations

import errno
import math
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from geco import log, procfs
from geco._tuple import NamedTuple
from geco.cgroup._base import Backend, Limits, check_key, is_under, pids_counters, warn_once
from geco.cgroup._counters import Counter, keyed, whole
from geco.cgroup._fs import (
    Mount,
    make_dir,
    poll_until,
    proc_cgroups,
    read_int,
    read_str,
    read_xattr,
    rmdir_quietly,
    set_value,
    unique,
    write_bytes,
    write_each,
)
from geco.errors import CgroupError
from geco.jobkey import JobKey

__all__ = ["OPTIONAL", "REQUIRED", "SYSTEMD_HIERARCHIES", "Hierarchy", "V1Backend",
           "find_hierarchies", "find_systemd_hierarchies"]

_log = log.get("cgroup._v1")

REQUIRED = ("cpuset", "memory")
# Jobs whose directories a backend remembers (a bound, not a working set): a node's
# running jobs, with room; ended ones pile up until it is full, then all go (2 KiB a job:
# 4,096 kept gecod 8 MiB larger after a few thousand jobs than after the first; rebuilt,
# a job's paths cost microseconds).
_PATHS_KEPT = 256
OPTIONAL = ("freezer", "pids", "cpuacct", "devices")
# systemd's own hierarchies as /proc/<pid>/cgroup names them: its named v1 hierarchy,
# and (hybrid layout) the cgroup2 it tracks units in
SYSTEMD_HIERARCHIES = ("name=systemd", "")
# The kernel shows "no limit" as PAGE_COUNTER_MAX pages in bytes
# (9223372036854771712 with 4 KiB pages); anything this large is "none".
_UNLIMITED_FROM = 1 << 62
_USEC = 1_000_000


class Hierarchy(NamedTuple):
    """Where one v1 controller is mounted.

    Attributes
    ----------
    controller: ``cpuset``, ``memory``, ``freezer``, ``pids``, ``cpuacct`` or ``devices``.
    mount_point: the directory the hierarchy is mounted on.
    root: the cgroup path shown at the mount point (``/`` unless only a
        subtree is visible); ``/proc/<pid>/cgroup`` paths start with it.
    """

    controller: str
    mount_point: Path
    root: str


def find_hierarchies(mounts: Iterable[Mount], prefer: Path) -> dict[str, Hierarchy]:
    """Return controller -> hierarchy for the v1 controllers geco uses that are mounted.

    Parameters
    ----------
    mounts: from :func:`~geco.cgroup.parse_mountinfo`.
    prefer: the configured cgroup mount; a controller mounted several times
        is taken from below it first, then from the mount showing the whole
        hierarchy (root ``/``).
    """
    found: dict[str, list[Mount]] = {}
    for mount in mounts:
        if mount.fstype != "cgroup":
            continue
        for ctrl in REQUIRED + OPTIONAL:
            if ctrl in mount.super_options:
                found.setdefault(ctrl, []).append(mount)
    return _preferred(found, prefer)


def _preferred(found: Mapping[str, list[Mount]], prefer: Path) -> dict[str, Hierarchy]:
    """One mount per hierarchy: below ``prefer`` first, then one showing the whole tree."""
    def rank(m: Mount) -> tuple[bool, bool]:
        under = m.mount_point == prefer or prefer in m.mount_point.parents
        return (not under, m.root != "/")

    return {key: Hierarchy(key, best.mount_point, best.root)
            for key, cands in found.items()
            for best in [min(cands, key=rank)]}


def find_systemd_hierarchies(mounts: Iterable[Mount], prefer: Path) -> dict[str, Hierarchy]:
    """Return systemd's hierarchies that are mounted, keyed like ``/proc/<pid>/cgroup``:
    ``name=systemd`` (a v1 hierarchy with no controller) and ``""`` (a cgroup2, the
    hybrid layout's ``unified``), each taken as :func:`find_hierarchies` takes a mount."""
    found: dict[str, list[Mount]] = {}
    for mount in mounts:
        if mount.fstype == "cgroup" and "name=systemd" in mount.super_options:
            found.setdefault("name=systemd", []).append(mount)
        elif mount.fstype == "cgroup2":
            found.setdefault("", []).append(mount)
    return _preferred(found, prefer)


def _limit_text(value: float) -> bytes:
    """A memory limit as v1 takes it: bytes, or -1 for none."""
    return b"-1" if math.isinf(value) else str(int(value)).encode("ascii")


def _read_limit(path: Path) -> int:
    """A v1 memory limit in bytes, 0 when unlimited."""
    value = read_int(path)
    return 0 if value >= _UNLIMITED_FROM else value


class V1Backend(Backend):
    """Job cgroups on cgroup v1 hierarchies.

    Parameters
    ----------
    hierarchies: controller -> :class:`Hierarchy`; cpuset and memory are
        required, freezer, pids, cpuacct and devices are used when present.
    name: the GECO parent's directory name in every hierarchy.
    exclusive_cpus: make a geco-created GECO cpuset and the job cpusets
        ``cpu_exclusive`` so the kernel refuses overlapping job cpus. An
        exclusive GECO also stops any *other* cpuset on the node (docker, ...)
        from using GECO's cpus: turn this off on nodes that need that.
    proc: the /proc to read (tests point it elsewhere).
    systemd: systemd's hierarchies (:func:`find_systemd_hierarchies`) job processes
        also go into, at ``systemd_base``; none when systemd does not run the node.
    systemd_base: the cgroup path (``/system.slice/geco-jobs.service/jobs``) below
        which job cgroups are made in ``systemd``'s hierarchies.

    Raises
    ------
    CgroupError
        when cpuset or memory is missing, the name is not one directory name, or
        ``systemd_base`` is not an absolute cgroup path inside those hierarchies.
    """

    version = 1

    def __init__(self, hierarchies: Mapping[str, Hierarchy], name: str = "GECO", *,
                 exclusive_cpus: bool = True, proc: Path = procfs.ROOT,
                 systemd: Mapping[str, Hierarchy] | None = None, systemd_base: str = "") -> None:
        super().__init__(name, proc)
        missing = [c for c in REQUIRED if c not in hierarchies]
        if missing:
            raise CgroupError(f"cgroup v1 needs the {' and '.join(missing)} controller "
                              "mounted; /proc/self/mountinfo lists no such hierarchy")
        self._hier = {c: hierarchies[c] for c in REQUIRED + OPTIONAL if c in hierarchies}
        self._systemd = {k: h for k, h in (systemd or {}).items() if k in SYSTEMD_HIERARCHIES}
        self.exclusive_cpus = exclusive_cpus
        # per hierarchy: the directory job cgroups are made in, and its cgroup path
        self._parents = {c: (h.mount_point / self.name, posixpath.join(h.root, self.name))
                         for c, h in self._hier.items()}
        self._parents.update({k: _systemd_parent(h, systemd_base)
                              for k, h in self._systemd.items()})
        # one controller per distinct directory (co-mounted ones share it), cpuset first,
        # and those of them an older geco may not have made (see add_pid)
        mounts: dict[Path, str] = {}
        for c, h in self._hier.items():
            mounts.setdefault(h.mount_point, c)
        self._movers = (*mounts.values(), *self._systemd)
        required = {self._hier[c].mount_point for c in REQUIRED}
        self._optional = frozenset(c for c in self._movers
                                   if c in self._systemd
                                   or self._hier[c].mount_point not in required)
        self._paths: dict[JobKey, dict[str, Path]] = {}

    @classmethod
    def from_mounts(cls, mounts: Iterable[Mount], mount: Path = Path("/sys/fs/cgroup"),
                    name: str = "GECO", *, exclusive_cpus: bool = True,
                    proc: Path = procfs.ROOT) -> V1Backend:
        """Build the backend from mountinfo entries (see :func:`find_hierarchies`).

        Raises
        ------
        CgroupError
            when cpuset or memory is not mounted.
        """
        return cls(find_hierarchies(mounts, mount), name, exclusive_cpus=exclusive_cpus,
                   proc=proc)

    def __repr__(self) -> str:
        where = ", ".join([*(f"{c}={h.mount_point}" for c, h in self._hier.items()),
                           *(f"{k or 'cgroup2'}={d}" for k in self._systemd
                             for d, _ in [self._parents[k]])])
        return f"V1Backend(name={self.name!r}, {where})"

    # -- layout ---------------------------------------------------------------

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(self._hier)

    @property
    def hierarchies(self) -> dict[str, Hierarchy]:
        """controller -> where it is mounted."""
        return dict(self._hier)

    def parent_paths(self) -> dict[str, Path]:
        return {k: d for k, (d, _) in self._parents.items()}

    def paths(self, key: JobKey) -> dict[str, Path]:
        return dict(self._paths_of(key))

    def _paths_of(self, key: JobKey) -> dict[str, Path]:
        # gecod asks for the same jobs' paths on every request: built once per job
        found = self._paths.get(key)
        if found is None:
            check_key(key)
            if len(self._paths) >= _PATHS_KEPT:
                self._paths.clear()
            found = {k: d / key for k, (d, _) in self._parents.items()}
            self._paths[key] = found
        return found

    def cgroup_paths(self, key: JobKey) -> dict[str, str]:
        check_key(key)
        return {k: posixpath.join(cg, key) for k, (_, cg) in self._parents.items()}

    def _dir(self, ctrl: str, key: JobKey) -> Path:
        return self._paths_of(key)[ctrl]

    def _parent(self, ctrl: str) -> Path:
        return self._parents[ctrl][0]

    # -- the GECO parent ------------------------------------------------------

    def ensure_root(self) -> None:
        self._check_systemd_unit()
        parents = self.parent_paths()
        for d in unique(parents.values()):
            created = self._make_parent(d)
            if created:
                _log.info("created the cgroup parent %s", d)
            if d == parents["cpuset"]:
                try:
                    self._setup_parent_cpuset(d, created)
                except CgroupError:
                    if created:
                        # an empty GECO cpuset would later look like an admin's broken one
                        rmdir_quietly(d)
                    raise

    @property
    def systemd_units(self) -> dict[str, Path | None]:
        """Per systemd hierarchy (``name=systemd``, ``""``): the cgroup directory of the
        unit (service or scope) the job cgroups' base lies in, or None when in none."""
        from geco.cgroup._v2 import unit_cgroup

        return {k: unit_cgroup(h.mount_point, self._parents[k][0])
                for k, h in self._systemd.items()}

    def _check_systemd_unit(self) -> None:
        """Refuse ``[cgroup] v1_systemd_base`` in a unit that is not running or that systemd
        does not delegate: a daemon-reload would move job processes out of their cgroups.

        Raises
        ------
        CgroupError
            naming the unit and the fix (start it; ``Delegate=yes``).
        """
        for key, unit in self.systemd_units.items():
            if unit is None:
                continue
            base = self._parents[key][1]
            where = f"[cgroup] v1_systemd_base {base} lies in the cgroup of {unit.name}"
            if not unit.is_dir():
                raise CgroupError(f"{where}, which is not running: v1_systemd_base must lie "
                                  f"in a running unit systemd delegates (systemctl start "
                                  f"{unit.name})", path=unit)
            # systemd marks the hierarchy it tracks units in: name=systemd (legacy) or the
            # cgroup2 (hybrid); the other one carries no marks, and tells nothing
            if read_xattr(unit, "user.invocation_id") is not None \
                    and read_xattr(unit, "user.delegate") != b"1":
                raise CgroupError(f"{where}, which systemd does not delegate: a daemon-reload "
                                  f"would move job processes out of their cgroups there; set "
                                  f"Delegate=yes in {unit.name} (conf/geco-jobs.service has it)",
                                  path=unit)

    def _make_parent(self, d: Path) -> bool:
        try:
            return make_dir(d)
        except CgroupError as exc:
            if exc.fields.get("errno") != "ENOENT" \
                    or d not in (self._parents[k][0] for k in self._systemd):
                raise
            raise CgroupError(f"cannot make {d}: {d.parent} does not exist; [cgroup] "
                              "v1_systemd_base must lie in a running unit systemd delegates "
                              "(systemctl start geco-jobs.service)", path=d) from exc

    def _setup_parent_cpuset(self, parent: Path, created: bool) -> None:
        """Give a geco-made GECO cpuset the root's cpus and mems; check an admin-made one."""
        if not created:
            for name in ("cpuset.cpus", "cpuset.mems"):
                if not read_str(parent / name):
                    raise CgroupError(f"the cpuset {parent} has an empty {name}, so no job "
                                      f"could run in it; write what geco may use into it",
                                      path=parent / name)
            return
        top = self._hier["cpuset"].mount_point
        for name in ("cpuset.cpus", "cpuset.mems"):
            set_value(parent / name, read_str(top / name), hints={errno.EINVAL: (
                f"another cpuset in {top} is cpu_exclusive over some of them; create "
                f"{parent} yourself with the cpus geco may use")})
        if not self.exclusive_cpus:
            return
        try:
            write_bytes(parent / "cpuset.cpu_exclusive", b"1")
        except CgroupError as exc:
            # another cpuset beside GECO shares its cpus: geco still works, the
            # kernel just will not double-check the allocator
            warn_once("v1-parent-exclusive",
                      "cannot make %s cpu_exclusive (%s); job cpusets will not be "
                      "exclusive, so only geco's allocator keeps their cpus apart",
                      parent, exc)

    def available_cpus(self) -> str:
        return self._parent_value("cpuset.cpus")

    def available_mems(self) -> str:
        return self._parent_value("cpuset.mems")

    def _parent_value(self, name: str) -> str:
        parent = self._parent("cpuset")
        try:
            return read_str(parent / name)
        except CgroupError as exc:
            if exc.fields.get("errno") == "ENOENT":
                raise CgroupError(f"the cpuset {parent} does not exist; gecod or the prolog "
                                  "creates it (ensure_root)", path=parent) from exc
            raise

    def _parent_exclusive(self) -> bool:
        if not self.exclusive_cpus:
            return False
        parent = self._parent("cpuset")
        if read_str(parent / "cpuset.cpu_exclusive") == "1":
            return True
        warn_once("v1-parent-not-exclusive",
                  "the cpuset %s is not cpu_exclusive, so job cpusets cannot be and the "
                  "kernel will not refuse overlapping job cpus (geco's allocator still keeps "
                  "them apart); write 1 to %s/cpuset.cpu_exclusive to get the kernel's check",
                  parent, parent)
        return False

    def set_parent_memory(self, limit: int) -> None:
        parent = self._parent("memory")
        # the parent's limit covers the jobs only with use_hierarchy (always on since
        # Linux 6.x; older kernels take it only while the parent has no child cgroup)
        hierarchy = parent / "memory.use_hierarchy"
        if hierarchy.exists():
            set_value(hierarchy, "1", hints={errno.EBUSY: (
                "job cgroups exist below it already; the reserve takes effect once it is "
                "set while no job runs")})
        set_value(parent / "memory.limit_in_bytes", str(limit),
                  hints={errno.EBUSY: "the jobs already use more than that"})

    # -- one job --------------------------------------------------------------

    def create(self, key: JobKey, limits: Limits) -> None:
        check_key(key)
        created: list[Path] = []
        try:
            for d in self._dirs(key):
                if make_dir(d):
                    created.append(d)
            self._apply(key, limits)
        except CgroupError:
            for d in reversed(created):
                rmdir_quietly(d)
            raise
        _log.debug("job %s cgroups ready (%s) with %s", key,
                   "created" if created else "existing", limits)

    def _apply(self, key: JobKey, limits: Limits) -> None:
        cs = self._dir("cpuset", key)
        overlap = ("the cpus must lie within the GECO cpuset's and must not overlap "
                   "another job's exclusive cpuset")
        set_value(cs / "cpuset.cpus", limits.cpus or self.available_cpus(),
                  hints={errno.EINVAL: overlap}, key=key)
        set_value(cs / "cpuset.mems", limits.mems or self.available_mems(),
                  hints={errno.EINVAL: "the NUMA nodes must lie within the GECO cpuset's"},
                  key=key)
        # "" means "all of GECO's cpus": exclusive would collide with every other job
        if limits.cpus and self._parent_exclusive():
            set_value(cs / "cpuset.cpu_exclusive", "1",
                      hints={errno.EINVAL: "its cpus overlap another job's cpuset"}, key=key)
        self._apply_memory(self._dir("memory", key), key, limits)
        if "pids" in self._hier:
            set_value(self._dir("pids", key) / "pids.max",
                      str(limits.pids) if limits.pids else "max", key=key)
        elif limits.pids:
            warn_once("v1-no-pids", "the pids controller is not mounted: task limits "
                      "(pids.max, [cgroup] pids_per_slot) are not enforced on this node; "
                      "mount it (cgroup v1 pids hierarchy) to have them")

    def _apply_memory(self, md: Path, key: JobKey, limits: Limits) -> None:
        ram = limits.ram or math.inf
        ram_file = md / "memory.limit_in_bytes"
        memsw_file = md / "memory.memsw.limit_in_bytes"
        hints = {errno.EBUSY: "the job already uses more than that and the kernel could "
                              "not reclaim enough"}
        if not memsw_file.exists():
            if limits.memory_swap:
                warn_once("v1-no-memsw",
                          "swap accounting is off on this node (no %s; boot with "
                          "swapaccount=1): RAM+swap limits are not enforced, only RAM",
                          memsw_file.name)
            write_bytes(ram_file, _limit_text(ram), hints=hints, key=key)
            return
        memsw = limits.memory_swap or math.inf
        current_memsw = _read_limit(memsw_file) or math.inf
        # RAM <= RAM+swap must hold after each write: raise the bigger one
        # first when growing, lower the smaller one first when shrinking
        order = [(ram_file, ram), (memsw_file, memsw)]
        if ram > current_memsw:
            order.reverse()
        for path, value in order:
            write_bytes(path, _limit_text(value), hints=hints, key=key)

    def deny_devices(self, key: JobKey,
                     devices: Sequence[tuple[str, int, int | None]]) -> None:
        if not devices:
            return
        if "devices" not in self._hier:
            raise CgroupError("the devices controller is not mounted (cgroup v1), so the "
                              "GPUs a job was not granted cannot be kept from it; mount it",
                              key=key)
        # one rule per write(2) (the kernel parses one), all through one open file: a job
        # granted GPUs on a MIG node is denied some 135 caps per other GPU
        write_each(self._dir("devices", key) / "devices.deny",
                   [f"{kind} {major}:{'*' if minor is None else minor} rwm".encode("ascii")
                    for kind, major, minor in devices], key=key)

    def read_limits(self, key: JobKey) -> Limits:
        self._require_dirs(key)
        cs, md = self._dir("cpuset", key), self._dir("memory", key)
        memsw = md / "memory.memsw.limit_in_bytes"
        pids = 0
        if "pids" in self._hier:
            text = read_str(self._dir("pids", key) / "pids.max")
            pids = 0 if text == "max" else read_int(self._dir("pids", key) / "pids.max")
        return Limits(cpus=read_str(cs / "cpuset.cpus"), mems=read_str(cs / "cpuset.mems"),
                      memory=_read_limit(md / "memory.limit_in_bytes"),
                      memory_swap=_read_limit(memsw) if memsw.exists() else 0, pids=pids)

    def move_targets(self, key: JobKey) -> tuple[str, ...]:
        paths = self._paths_of(key)
        return tuple(f"{paths[ctrl]}/cgroup.procs" for ctrl in self._movers)

    def add_pid(self, key: JobKey, pid: int) -> None:
        paths = self._paths_of(key)
        hints = {errno.ESRCH: f"process {pid} is gone (it exited before it could be moved)",
                 errno.ENOENT: f"job {key} has no cgroup here (create it first)",
                 errno.ENOSPC: "the job's cpuset has no cpus or no NUMA nodes"}
        data = str(pid).encode("ascii")
        # cpuset first: it is the one that can refuse (ENOSPC), before memory is touched
        for ctrl in self._movers:
            d = paths[ctrl]
            try:
                write_bytes(f"{d}/cgroup.procs", data, hints=hints, key=key, pid=pid)
            except CgroupError as exc:
                # the job exists (cpuset and memory took the pid), but an older geco, or
                # one from before this controller was mounted, made no directory here:
                # make it, so a job that runs across a geco upgrade still takes processes
                if ctrl not in self._optional or exc.fields.get("errno") != "ENOENT" \
                        or not make_dir(d):
                    raise
                _log.info("job %s had no %s; created it", key, d)
                write_bytes(d / "cgroup.procs", data, hints=hints, key=key, pid=pid)

    def move_to_cgroups_of(self, pid: int, other_pid: int) -> None:
        have = proc_cgroups(self.proc, other_pid)
        if have is None:
            raise CgroupError(f"cannot move process {pid} to the cgroups of process "
                              f"{other_pid}: process {other_pid} is gone", pid=pid)
        targets = []
        for ctrl, h in {**self._hier, **self._systemd}.items():
            cgpath = have.get(ctrl)
            if cgpath is None or not is_under(cgpath, h.root):
                raise CgroupError(f"process {other_pid} is in no {ctrl or 'cgroup2'} cgroup "
                                  f"visible under {h.mount_point}", pid=other_pid)
            targets.append(h.mount_point / posixpath.relpath(cgpath, h.root))
        hints = {errno.ESRCH: f"process {pid} is gone"}
        for d in unique(targets):
            write_bytes(d / "cgroup.procs", str(pid).encode("ascii"), hints=hints, pid=pid)

    # -- freezing and killing -------------------------------------------------

    def _freezer_state(self, key: JobKey) -> Path:
        check_key(key)
        if "freezer" not in self._hier:
            raise CgroupError(f"cannot freeze or thaw job {key}: the freezer controller is "
                              "not mounted (cgroup v1)", key=key)
        return self._dir("freezer", key) / "freezer.state"

    def _set_frozen(self, key: JobKey, frozen: bool, timeout: float) -> None:
        state = "FROZEN" if frozen else "THAWED"
        path = self._freezer_state(key)
        write_bytes(path, state.encode("ascii"),
                    hints={errno.ENOENT: f"job {key} has no freezer cgroup"}, key=key)
        # FREEZING turns into FROZEN only when the state is read again
        if not poll_until(lambda: read_str(path) == state, timeout):
            raise CgroupError(f"job {key} is not {state} after {timeout:g} s (freezer.state "
                              f"says {read_str(path)}); a process may be stuck in the kernel",
                              key=key, path=path)

    def kill(self, key: JobKey) -> int:
        """SIGKILL every process of the job (freezing first when the freezer is mounted).

        The job is left thawed: a SIGKILLed task in a frozen v1 cgroup would
        never exit. Returns the number of processes signalled.
        """
        check_key(key)
        if not self.exists(key):
            return 0
        self._refuse_own_job(key)
        return self._kill_frozen(key, self._freezable(key))

    def _freezable(self, key: JobKey) -> bool:
        return "freezer" in self._hier and self._dir("freezer", key).is_dir()

    def usage_counters(self, key: JobKey) -> list[Counter]:
        check_key(key)
        md = self._dir("memory", key)
        if not md.is_dir():
            raise CgroupError(f"job {key} has no memory cgroup", key=key, path=md)
        # a charge that fails is counted once, by whichever counter refused it:
        # memsw is tried first, so a RAM+swap limit shows only in memsw.failcnt (the sum)
        out = [whole(md / file, name) for name, file in (
            ("memory_peak", "memory.max_usage_in_bytes"),
            ("memory_current", "memory.usage_in_bytes"),
            ("memory_max_events", "memory.failcnt"),
            ("memory_max_events", "memory.memsw.failcnt"),
            ("memsw_peak", "memory.memsw.max_usage_in_bytes")) if (md / file).exists()]
        if (md / "memory.oom_control").exists():  # oom_kill: Linux >= 4.13
            out.append(keyed(md / "memory.oom_control", {"oom_kill": "oom_kill"}))
        out += self._cpu_counters(key)
        # a job cgroup made before pids was mounted (or by an older geco) has none
        if "pids" in self._hier and self._dir("pids", key).is_dir():
            out += pids_counters(self._dir("pids", key))
        return out

    def _cpu_counters(self, key: JobKey) -> list[Counter]:
        """CPU time of the job in microseconds, when a cpuacct cgroup counts it."""
        if "cpuacct" not in self._hier:
            return []
        d = self._dir("cpuacct", key)
        # a job cgroup made before cpuacct was mounted (or by an older geco) has none
        if not d.is_dir():
            return []
        user, system = d / "cpuacct.usage_user", d / "cpuacct.usage_sys"
        if user.exists() and system.exists():  # nanoseconds, Linux >= 4.7
            return [whole(user, "cpu_user_usec", 1000), whole(system, "cpu_system_usec", 1000)]
        stat = d / "cpuacct.stat"
        if not stat.exists():
            return []
        # USER_HZ ticks
        return [keyed(stat, {"cpu_user_usec": "user", "cpu_system_usec": "system"},
                      (_USEC, os.sysconf("SC_CLK_TCK")))]



def _systemd_parent(h: Hierarchy, base: str) -> tuple[Path, str]:
    """Where job cgroups go in one of systemd's hierarchies: directory and cgroup path."""
    if not base.startswith("/") or ".." in base.split("/") or not is_under(base, h.root):
        raise CgroupError(f"[cgroup] v1_systemd_base must be an absolute cgroup path without "
                          f"'..' inside {h.mount_point} (cgroup {h.root}), got {base!r}")
    return h.mount_point / posixpath.relpath(base, h.root), posixpath.normpath(base)
