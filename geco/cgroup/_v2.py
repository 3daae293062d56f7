"""cgroup v2: one unified hierarchy; job cgroups are leaves under one base directory.

Layout: ``<base>/<job>.<task>``, where the base is ``<mount>/<name>`` by
default. Under systemd the base must be inside a delegated subtree
(``Delegate=yes``), because systemd rewrites ``cgroup.subtree_control`` of
cgroups it considers its own (it may drop ``+cpuset`` on a daemon-reload):
``conf/geco-jobs.service`` exists for that, and the base is then
``/sys/fs/cgroup/system.slice/geco-jobs.service/jobs``.

Under a delegated unit (the base's nearest ancestor named ``*.service`` or
``*.scope``, the only unit types systemd delegates), :meth:`V2Backend.ensure_root`
writes nothing above the unit's cgroup, refuses a unit that is not delegated
(naming the ``Delegate=yes`` fix), moves the unit's placeholder process (a
unit without a live process loses its cgroup) into the leaf ``holder``, and
refuses to run from the unit's cgroup itself: a restart would then put the
new process into a cgroup that passes controllers down, which cgroup v2
forbids while jobs run below it (systemd 252 fails such a start with status
219/CGROUP and leaves the service dead; ``tests/vm_systemd`` shows the working
layout).

Kernel rules this module is shaped by (checked in the QEMU machine by
``tests/vm/test_cgroup_v2.py``):

* "No internal processes": a cgroup that hands controllers to its children
  (``cgroup.subtree_control``) may not hold processes itself (EBUSY), the
  root excepted. Job cgroups are leaves; the base and its ancestors only
  pass controllers down.
* An empty ``cpuset.cpus`` means "inherit the parent's"; it is written as a
  lone newline (a zero-length write is ignored).
* Memory: ``memory.max`` caps RAM and ``memory.swap.max`` caps swap alone.
  geco's ``memory_swap`` is RAM+swap, so ``memory.max`` = ``Limits.ram``
  (the smaller of the two requests) and ``memory.swap.max`` =
  ``memory_swap - ram``: RAM+swap never exceeds ``memory_swap``, the same
  bound cgroup v1's memsw gives. With only ``memory_swap`` requested that
  is ``memory.max = memory_swap`` and no swap at all (v1 would let swap take
  part of the same total; v2 cannot express a shared total). Without a
  ``memory_swap`` request, swap is unlimited, as on v1.
* A frozen process still dies of SIGKILL, and ``cgroup.kill`` (Linux 5.14)
  kills the whole subtree atomically, forks included.
* ``cpu.stat`` (``user_usec``, ``system_usec``) exists in every cgroup, cpu
  controller enabled or not, and covers the subtree and exited processes.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

from geco import log, procfs
from geco.cgroup._base import Backend, Limits, check_key, is_under, pids_counters, warn_once
from geco.cgroup._counters import Counter, io_bytes, keyed, pressure, whole
from geco.cgroup._fs import (
    make_dir,
    poll_until,
    proc_cgroups,
    read_int,
    read_keyed,
    read_pids,
    read_str,
    read_xattr,
    rmdir_quietly,
    set_value,
    write_bytes,
)
from geco.errors import CgroupError
from geco.jobkey import JobKey

__all__ = ["HOLDER", "OPTIONAL", "REQUIRED", "V2Backend", "unit_cgroup"]

_log = log.get("cgroup._v2")

REQUIRED = ("cpuset", "memory")
OPTIONAL = ("pids",)
# The leaf a delegated unit's own processes (its placeholder) are moved into.
HOLDER = "holder"
# systemd names each unit's cgroup after the unit; only these types can be delegated.
_DELEGATABLE = (".service", ".scope")


def unit_cgroup(mount_point: Path, base: Path) -> Path | None:
    """Return the systemd unit cgroup that holds ``base``, or None when no unit does.

    That is ``base`` or its nearest ancestor below ``mount_point`` whose name
    ends in ``.service`` or ``.scope``. Slices end in ``.slice`` and are never
    delegated, so a base below ``system.slice`` alone is in no unit.
    """
    for d in (base, *base.parents):
        if d == mount_point or mount_point not in d.parents:
            return None
        if d.name.endswith(_DELEGATABLE):
            return d
    return None


def _max_value(path: Path) -> int:
    """A v2 limit file (``max`` or bytes/count) as an int, 0 for ``max``."""
    return 0 if read_str(path) == "max" else read_int(path)


class V2Backend(Backend):
    """Job cgroups on a cgroup2 (unified) hierarchy.

    Parameters
    ----------
    mount_point: where cgroup2 is mounted (``/sys/fs/cgroup``).
    name: the GECO parent's name; the base is ``<mount_point>/<name>`` unless
        ``base`` is given.
    base: the directory job cgroups are created in (must lie below
        ``mount_point``), e.g. a subtree delegated to gecod by systemd.
    mount_root: the cgroup path shown at ``mount_point`` (from mountinfo; ``/``
        unless only a subtree is visible).
    proc: the /proc to read.

    Attributes
    ----------
    delegated_root: the cgroup of the systemd unit (service or scope) the base
        lies in, or None (see :func:`unit_cgroup`); geco writes nothing above it.

    Raises
    ------
    CgroupError
        when the base is not below the mount, or cpuset or memory is not
        available in ``<mount_point>/cgroup.controllers``.
    """

    version = 2

    def __init__(self, mount_point: Path = Path("/sys/fs/cgroup"), name: str = "GECO", *,
                 base: Path | None = None, mount_root: str = "/",
                 proc: Path = procfs.ROOT) -> None:
        super().__init__(name, proc)
        self.mount_point = Path(os.path.normpath(mount_point))
        self.base = Path(os.path.normpath(base)) if base is not None \
            else self.mount_point / self.name
        if self.mount_point not in self.base.parents:
            raise CgroupError(f"the cgroup base must be a directory below {self.mount_point}, "
                              f"got {str(self.base)!r}", path=self.base)
        self.mount_root = mount_root
        available = read_str(self.mount_point / "cgroup.controllers").split()
        missing = [c for c in REQUIRED if c not in available]
        if missing:
            raise CgroupError(f"cgroup v2 at {self.mount_point} lacks the "
                              f"{' and '.join(missing)} controller (cgroup.controllers has: "
                              f"{' '.join(available) or 'nothing'})",
                              path=self.mount_point / "cgroup.controllers")
        self._controllers = REQUIRED + tuple(c for c in OPTIONAL if c in available)
        self.delegated_root = unit_cgroup(self.mount_point, self.base)

    def __repr__(self) -> str:
        return f"V2Backend(base={str(self.base)!r}, controllers={self._controllers})"

    # -- layout ---------------------------------------------------------------

    @property
    def controllers(self) -> tuple[str, ...]:
        return self._controllers

    def parent_paths(self) -> dict[str, Path]:
        return dict.fromkeys(self._controllers, self.base)

    def paths(self, key: JobKey) -> dict[str, Path]:
        return dict.fromkeys(self._controllers, self.base / check_key(key))

    def cgroup_paths(self, key: JobKey) -> dict[str, str]:
        rel = self.base.relative_to(self.mount_point).as_posix()
        return {"": posixpath.join(self.mount_root, rel, check_key(key))}

    def _dir(self, key: JobKey) -> Path:
        return self.base / check_key(key)

    # -- the base -------------------------------------------------------------

    def ensure_root(self) -> None:
        """Create the base and pass the controllers down to it.

        Without a delegated unit, every level from the mount down gets them.
        Inside one, only the unit's cgroup and below are written (the levels
        above are systemd's), after :meth:`_claim_unit` made it usable.
        """
        top = self.mount_point
        if self.delegated_root is not None:
            self._claim_unit(self.delegated_root)
            top = self.delegated_root
        d = top
        for part in self.base.relative_to(top).parts:
            self._enable_controllers(d)
            d = d / part
            if make_dir(d):
                _log.info("created the cgroup parent %s", d)
        self._enable_controllers(self.base)

    def _claim_unit(self, root: Path) -> None:
        """Check that systemd delegated ``root`` and empty it of processes, or raise.

        Raises
        ------
        CgroupError
            when the unit is not running, the calling process runs in ``root``
            itself, or the unit is not delegated (``user.invocation_id`` without
            ``user.delegate``, or cpuset/memory missing from its ``cgroup.controllers``).
        """
        unit = root.name
        where = f"[cgroup] v2_base {self.base} lies in the cgroup of {unit}"
        if not root.is_dir():
            raise CgroupError(f"{where}, which does not exist: start that unit first "
                              f"(systemctl start {unit})", path=root)
        if self._own_cgroup() == root:
            raise CgroupError(
                f"{where}, and this process (pid {os.getpid()}) runs in that cgroup itself: "
                f"{root} must pass controllers down, so it may hold no process, and systemd "
                f"could not start {unit} again while jobs run below it (status 219/CGROUP); "
                "keep job cgroups in a unit of their own (geco-jobs.service), or have "
                f"systemd start {unit} in a sub-cgroup (DelegateSubgroup=, systemd 254 or "
                "later)", path=root)
        # systemd 251 and later mark every unit's cgroup with user.invocation_id and a
        # delegated one with user.delegate too; older ones mark neither, and only the
        # controllers below can tell
        if read_xattr(root, "user.invocation_id") is not None \
                and read_xattr(root, "user.delegate") != b"1":
            raise CgroupError(f"{where}, which systemd does not delegate (it would undo geco's "
                              f"settings there): set Delegate=yes in {unit}", path=root)
        have = read_str(root / "cgroup.controllers").split()
        missing = [c for c in REQUIRED if c not in have]
        if missing:
            raise CgroupError(f"{where}, which lacks the {' and '.join(missing)} controller "
                              f"(cgroup.controllers has: {' '.join(have) or 'nothing'}): set "
                              f"Delegate=yes in {unit} (cpuset needs systemd 244 or later)",
                              path=root / "cgroup.controllers")
        pids = read_pids(root)
        if pids:
            # the unit's placeholder (geco-jobs.service's sleep): keeps the unit, and
            # so its cgroup, alive; it may stay anywhere inside, so a leaf it is
            holder = root / HOLDER
            make_dir(holder)
            for pid in pids:
                try:
                    write_bytes(holder / "cgroup.procs", str(pid).encode("ascii"), pid=pid)
                except CgroupError as exc:
                    if exc.fields.get("errno") != "ESRCH":
                        raise
            _log.info("moved the processes %s of %s into %s (cgroup v2 lets only a cgroup "
                      "without processes pass controllers down)",
                      " ".join(map(str, pids)), unit, holder)

    def _own_cgroup(self) -> Path | None:
        """The directory of the calling process's cgroup2 cgroup, or None if not visible here."""
        have = proc_cgroups(self.proc, os.getpid()) or {}
        cgpath = have.get("")
        if cgpath is None or not is_under(cgpath, self.mount_root):
            return None
        return self.mount_point / posixpath.relpath(cgpath, self.mount_root)

    def _enable_controllers(self, d: Path) -> None:
        """Add the managed controllers missing from ``d``'s ``cgroup.subtree_control``."""
        path = d / "cgroup.subtree_control"
        enabled = read_str(path).split()
        missing = [c for c in self._controllers if c not in enabled]
        if not missing:
            return
        write_bytes(path, " ".join(f"+{c}" for c in missing).encode("ascii"), hints={
            errno.EBUSY: f"{d} holds processes itself, and cgroup v2 passes controllers "
                         "only through cgroups without processes ('no internal processes'): "
                         "move them into a leaf cgroup, or choose another base",
            errno.ENOENT: f"a controller is not available in {d}/cgroup.controllers: "
                          "enable it in the parent, or have systemd delegate it "
                          "(Delegate=yes)"})
        _log.info("enabled %s in %s", " ".join(missing), path)

    def available_cpus(self) -> str:
        return self._base_value("cpuset.cpus.effective")

    def available_mems(self) -> str:
        return self._base_value("cpuset.mems.effective")

    def _base_value(self, name: str) -> str:
        try:
            return read_str(self.base / name)
        except CgroupError as exc:
            if exc.fields.get("errno") == "ENOENT":
                raise CgroupError(f"{self.base}/{name} does not exist; the base must be "
                                  "created with cpuset enabled (ensure_root)",
                                  path=self.base / name) from exc
            raise

    def set_parent_memory(self, limit: int) -> None:
        set_value(self.base / "memory.max", str(limit),
                  hints={errno.EBUSY: "the jobs already use more than that"})

    # -- one job --------------------------------------------------------------

    def create(self, key: JobKey, limits: Limits) -> None:
        d = self._dir(key)
        created = make_dir(d)
        try:
            self._apply(d, key, limits)
        except CgroupError:
            if created:
                rmdir_quietly(d)
            raise
        _log.debug("job %s cgroup ready (%s) with %s", key,
                   "created" if created else "existing", limits)

    def _apply(self, d: Path, key: JobKey, limits: Limits) -> None:
        off = (f"the controller is not enabled for the children of {self.base} "
               "(ensure_root enables it)")
        set_value(d / "cpuset.cpus", limits.cpus, missing_hint=off, key=key,
                  hints={errno.EINVAL: "the cpus must lie within the base's"})
        set_value(d / "cpuset.mems", limits.mems, missing_hint=off, key=key,
                  hints={errno.EINVAL: "the NUMA nodes must lie within the base's"})
        ram = limits.ram
        set_value(d / "memory.max", str(ram) if ram else "max", missing_hint=off, key=key,
                  hints={errno.EBUSY: "the job already uses more than that"})
        swap = d / "memory.swap.max"
        if swap.exists():
            set_value(swap, str(limits.memory_swap - ram) if limits.memory_swap else "max",
                      key=key)
        elif limits.memory_swap:
            warn_once("v2-no-swap", "swap accounting is off on this node (no "
                      "memory.swap.max): RAM+swap limits are enforced as RAM limits only")
        if "pids" in self._controllers:
            set_value(d / "pids.max", str(limits.pids) if limits.pids else "max", key=key)
        elif limits.pids:
            warn_once("v2-no-pids", "the pids controller is not available: task limits "
                      "(pids.max, [cgroup] pids_per_slot) are not enforced on this node")

    def deny_devices(self, key: JobKey,
                     devices: Sequence[tuple[str, int, int | None]]) -> None:
        if devices:
            from geco.cgroup._bpfdev import deny_devices  # ctypes: only when a job starts

            deny_devices(self._dir(key), devices)

    def read_limits(self, key: JobKey) -> Limits:
        d = self._dir(key)
        self._require_dirs(key)
        memory = _max_value(d / "memory.max")
        memory_swap = 0
        if (d / "memory.swap.max").exists() and memory:
            swap_text = read_str(d / "memory.swap.max")
            if swap_text != "max":
                memory_swap = memory + read_int(d / "memory.swap.max")
        pids = _max_value(d / "pids.max") if "pids" in self._controllers else 0
        return Limits(cpus=read_str(d / "cpuset.cpus"), mems=read_str(d / "cpuset.mems"),
                      memory=memory, memory_swap=memory_swap, pids=pids)

    def move_targets(self, key: JobKey) -> tuple[str, ...]:
        return (f"{self._dir(key)}/cgroup.procs",)

    def add_pid(self, key: JobKey, pid: int) -> None:
        d = self._dir(key)
        write_bytes(d / "cgroup.procs", str(pid).encode("ascii"), key=key, pid=pid, hints={
            errno.ESRCH: f"process {pid} is gone (it exited before it could be moved)",
            errno.ENOENT: f"job {key} has no cgroup here (create it first)"})

    def move_to_cgroups_of(self, pid: int, other_pid: int) -> None:
        have = proc_cgroups(self.proc, other_pid)
        if have is None:
            raise CgroupError(f"cannot move process {pid} to the cgroup of process "
                              f"{other_pid}: process {other_pid} is gone", pid=pid)
        cgpath = have.get("")
        if cgpath is None or not is_under(cgpath, self.mount_root):
            raise CgroupError(f"process {other_pid} is in no cgroup2 cgroup visible under "
                              f"{self.mount_point}", pid=other_pid)
        target = self.mount_point / posixpath.relpath(cgpath, self.mount_root)
        write_bytes(target / "cgroup.procs", str(pid).encode("ascii"), pid=pid,
                    hints={errno.ESRCH: f"process {pid} is gone"})

    # -- freezing and killing -------------------------------------------------

    def _set_frozen(self, key: JobKey, frozen: bool, timeout: float) -> None:
        d = self._dir(key)
        path = d / "cgroup.freeze"
        if not path.exists():
            self._require_dirs(key)
            raise CgroupError(f"cannot freeze or thaw job {key}: this kernel has no "
                              "cgroup.freeze (the v2 freezer needs Linux 5.2)", key=key)
        want = int(frozen)
        write_bytes(path, str(want).encode("ascii"), key=key)
        if not poll_until(lambda: read_keyed(d / "cgroup.events").get("frozen") == want,
                          timeout):
            raise CgroupError(f"job {key} is not {'frozen' if frozen else 'thawed'} after "
                              f"{timeout:g} s (cgroup.events still says frozen "
                              f"{1 - want})", key=key, path=d / "cgroup.events")

    def kill(self, key: JobKey) -> int:
        """SIGKILL every process of the job and its sub-cgroups.

        Uses ``cgroup.kill`` when the kernel has it (it cannot miss a fork);
        the count returned is then the processes present just before.
        Otherwise freezes, signals every pid and thaws.
        """
        d = self._dir(key)
        if not d.is_dir():
            return 0
        self._refuse_own_job(key)
        if not (d / "cgroup.kill").exists():  # kernels before 5.14
            return self._kill_frozen(key, self._freezable(key))
        count = len(self.pids(key))
        write_bytes(d / "cgroup.kill", b"1", key=key)
        _log.debug("cgroup.kill for %d processes of job %s", count, key)
        return count

    def _freezable(self, key: JobKey) -> bool:
        return (self._dir(key) / "cgroup.freeze").exists()

    def usage_counters(self, key: JobKey) -> list[Counter]:
        d = self._dir(key)
        if not d.is_dir():
            raise CgroupError(f"job {key} has no cgroup", key=key, path=d)
        out = [whole(d / file, name) for name, file in (
            ("memory_peak", "memory.peak"),  # Linux >= 5.19
            ("memory_current", "memory.current"),
            ("swap_peak", "memory.swap.peak"),  # Linux >= 6.5
            ("swap_current", "memory.swap.current")) if (d / file).exists()]
        if (d / "memory.events").exists():
            out.append(keyed(d / "memory.events",
                             {"memory_max_events": "max", "oom_kill": "oom_kill"}))
        # cpu.stat is in every cgroup, with or without the cpu controller (Linux >= 4.15)
        if (d / "cpu.stat").exists():
            out.append(keyed(d / "cpu.stat", {"cpu_user_usec": "user_usec",
                                              "cpu_system_usec": "system_usec"}))
        if "pids" in self._controllers:
            out += pids_counters(d)
        # where the kernel has them: PSI (off at boot: listed, not served), the io controller
        if (d / "memory.pressure").exists():
            out.append(pressure(d / "memory.pressure", "memory_pressure_usec"))
        if (d / "io.stat").exists():
            out.append(io_bytes(d / "io.stat"))
        return out
