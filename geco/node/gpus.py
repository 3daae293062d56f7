"""A node's GPUs and each job's share of them.

A GPU's **id** on a node is its index in PCI bus order: the number ``nvidia-smi`` shows,
and the one CUDA uses under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Its device is
``/dev/nvidia<minor>``, and the minor is *not* the id: the driver numbers devices as it
probes them. The node's :class:`Gpu` table maps one to the other; it comes from the
driver (``/proc/driver/nvidia/gpus/<bus>/information``, "Device Minor"), else from
``[gpu] devices`` (device files in id order), else from the ``/dev/nvidia<N>`` files
present (in minor order: without the driver's table nothing better is known).

Grid Engine's ids are the admin's words: an RSMAP's ids are free strings
(``gpu=2(0 1)``, ``gpu=2(nvidia0 nvidia1)``). :func:`map_share` reads each as the first
rule that applies says: a name in ``[gpu] names`` (set to an id or a device file), else
``nvidia<N>`` as the GPU whose device is ``/dev/nvidia<N>`` (device minor N), else a
number N as the GPU of id N. A granted id that names no GPU of the node, or two that name
one GPU, is the job's own problem (:class:`GpuGrantError`: the hooks hold the job, exit
100), never a reason to refuse its start again and again.

A job's share is written in the grammar of :mod:`geco.gpushare`; mapped here once, where
the node's table is known, and saved as ids.

The kernel keeps a job off every GPU of the node it was not granted (cgroup v1
``devices.deny``, a v2 device program): only those minors are denied, so ordinary
devices and the shared control devices (``nvidiactl``, ``nvidia-uvm``) stay open. With
MIG, a GPU instance is reached through its GPU's device and its capability devices
(``/dev/nvidia-caps/nvidia-cap<minor>``, :func:`mig_caps`): a job is denied those of the
GPUs it was not granted, and the node-wide ``config`` and ``monitor`` always. A node
where geco knows no GPU fails closed (:func:`denied`): NVIDIA makes ``/dev/nvidia<N>``
on first use (nvidia-modprobe) and its driver may load after a job started, so a job
there is denied every minor of NVIDIA's major and every capability device.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from geco._tuple import NamedTuple
from geco.errors import GecoError
from geco.gpushare import Share, format_ids, parse_share

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.config import Config
    from geco.jobkey import JobKey
    from geco.resourceset import ResourceSet

__all__ = ["Gpu", "GpuGrantError", "GpusMissing", "GpusUnavailable", "MigCaps", "denied",
           "environment", "held", "job_environment", "map_share", "mig_caps", "node_table",
           "pick"]

# NVIDIA's character major for /dev/nvidia<N> and nvidiactl (fixed by the driver)
_NVIDIA_MAJOR = 195
# The MIG capability devices' driver in /proc/devices (its major is handed out at load),
# and their table below /proc: "<name> <minor>" per line (NVIDIA's MIG user guide, "Device
# Nodes and Capabilities")
_CAPS_DRIVER = b"nvidia-caps"
_CAPS_TABLE = "driver/nvidia-caps/mig-minors"
_DEV_NAME = re.compile(r"nvidia([0-9]+)")
_NUMBER = re.compile(r"[0-9]+")


class GpusUnavailable(GecoError):
    """Fewer GPUs are free on this node than the job was granted here."""


class GpusMissing(GpusUnavailable):
    """Grid Engine granted more GPUs here than the node has at all: its complex_values
    count GPUs that geco does not find (a driver not loaded, ``[gpu] devices`` short), the
    node's own failure (:mod:`geco.node.health`)."""

    node_side = True


class GpuGrantError(GecoError, ValueError):
    """A GPU id Grid Engine granted names no GPU of this node by geco's rule, or two name
    one GPU: the job's own grant, which no re-queue mends, so the hooks hold the job
    (exit 100, :mod:`geco.hooks`)."""


class Gpu(NamedTuple):
    """One GPU of this node.

    Attributes
    ----------
    id: its index in PCI bus order (what Grid Engine, nvidia-smi and CUDA call it).
    path: its device file (``/dev/nvidia3``).
    major, minor: the device numbers the kernel checks.
    numa: the NUMA node of its PCI slot, -1 when unknown.
    """

    id: int
    path: str
    major: int
    minor: int
    numa: int = -1


def node_table(devices: Sequence[str] = (), *, proc: Path = Path("/proc"),
               sys: Path = Path("/sys"), dev: Path = Path("/dev")) -> tuple[Gpu, ...]:
    """This node's GPUs in id order; empty on a node without any.

    Parameters
    ----------
    devices: ``[gpu] devices``: device files in id order; empty = ask the driver, else
        the ``/dev/nvidia<N>`` files present.

    Raises
    ------
    GecoError
        when a configured device is missing or not a character device.
    """
    if devices:
        return tuple(_from_file(i, path) for i, path in enumerate(devices))
    driver = _from_driver(proc / "driver/nvidia/gpus", sys, dev)
    if driver:
        return driver
    try:
        names = [m for n in os.listdir(dev) if (m := _DEV_NAME.fullmatch(n))]
    except OSError:
        return ()
    names.sort(key=lambda m: int(m[1]))
    return tuple(_from_file(i, str(dev / m[0])) for i, m in enumerate(names))


def _from_file(gpu_id: int, path: str) -> Gpu:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise GecoError.from_oserror("cannot use the GPU device in [gpu] devices", exc,
                                     path=path) from exc
    if not stat.S_ISCHR(st.st_mode):
        raise GecoError("a GPU in [gpu] devices must be a character device", path=path)
    return Gpu(gpu_id, path, os.major(st.st_rdev), os.minor(st.st_rdev))


def _from_driver(gpus_dir: Path, sys: Path, dev: Path) -> tuple[Gpu, ...]:
    """The driver's table: one ``<pci bus id>/information`` per GPU, with its minor."""
    try:
        buses = sorted(os.listdir(gpus_dir))
    except OSError:
        return ()
    table: list[Gpu] = []
    for bus in buses:
        try:
            info = (gpus_dir / bus / "information").read_text(errors="replace")
        except OSError:
            continue
        found = re.search(r"^Device Minor:\s*(\d+)", info, re.MULTILINE)
        if found is None:
            continue
        minor = int(found[1])
        try:
            numa = int((sys / "bus/pci/devices" / bus.lower() / "numa_node").read_text())
        except (OSError, ValueError):
            numa = -1
        path = dev / f"nvidia{minor}"
        try:  # the device file's own numbers where it exists (a driver may move the major)
            rdev = os.stat(path).st_rdev
            major, minor = os.major(rdev), os.minor(rdev)
        except OSError:
            major = _NVIDIA_MAJOR
        table.append(Gpu(len(table), str(path), major, minor, numa))
    return tuple(table)


def map_share(share: Share, table: Sequence[Gpu],
              names: Iterable[tuple[str, int | str]] = ()) -> Share:
    """``share`` as ids of this node's GPUs (a count, whose ids geco picks, is returned as
    it is).

    Each id Grid Engine granted names a GPU of ``table`` by the first rule that applies:

    1. a name in ``names`` (``[gpu] names``): the GPU it is set to, by id or device file;
    2. ``nvidia<N>``: the GPU whose device is ``/dev/nvidia<N>`` (device minor N);
    3. a number N: the GPU of id N (its index in PCI bus order).

    Raises
    ------
    GpuGrantError
        when an id names no GPU of ``table``, or two ids name the same one (one sentence
        naming the ids and the rule).
    """
    if share.counted:
        return share
    rules = dict(names)
    mapped: dict[int, str] = {}
    for word in share.names or tuple(str(i) for i in share.ids):
        gpu = _named(word, table, rules)
        if gpu is None:
            what = f"[gpu] names sets it to {rules[word]!r}, no GPU here" if word in rules \
                else "it names no GPU here"
            raise GpuGrantError(
                f"Grid Engine granted GPU {word!r}, but {what}: geco reads a granted id as a "
                "name in [gpu] names, else nvidia<N> as /dev/nvidia<N>, else a number N as "
                f"the GPU of index N in PCI bus order, and this node's GPUs are "
                f"{_listing(table)}")
        first = mapped.setdefault(gpu.id, word)
        if first != word:
            raise GpuGrantError(
                f"Grid Engine granted GPUs {first!r} and {word!r}, which are one GPU here "
                f"({gpu.path}, id {gpu.id}), so the job would get fewer GPUs than it was "
                "granted: name each GPU once in the host's complex_values or [gpu] names")
    return Share(len(mapped), tuple(sorted(mapped)))


def _named(word: str, table: Sequence[Gpu], rules: dict[str, int | str]) -> Gpu | None:
    """The GPU of ``table`` that Grid Engine's id ``word`` names (:func:`map_share`)."""
    target: int | str | None = rules.get(word)
    if target is None:
        device = _DEV_NAME.fullmatch(word)
        if device is not None:
            return next((g for g in table if g.minor == int(device[1])), None)
        target = int(word) if _NUMBER.fullmatch(word) else None
    if isinstance(target, int):
        return next((g for g in table if g.id == target), None)
    return _by_path(table, target) if target is not None else None


def _by_path(table: Sequence[Gpu], path: str) -> Gpu | None:
    """The GPU whose device file is ``path``: by name, else by its device numbers (a link,
    another name of the same device)."""
    found = next((g for g in table if g.path == path), None)
    if found is not None:
        return found
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    rdev = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return next((g for g in table if (g.major, g.minor) == rdev), None)


def _listing(table: Sequence[Gpu]) -> str:
    return ", ".join(f"{g.id}={g.path}" for g in table) or "none"


def pick(table: Sequence[Gpu], count: int, busy: Iterable[int],
         near: Iterable[int] = ()) -> tuple[int, ...]:
    """Choose ``count`` free GPUs: those on the job's NUMA nodes (``near``) first, then
    the lowest ids (the caller holds the node lock from reading ``busy`` until the ids
    are recorded).

    Raises
    ------
    GpusUnavailable
        when fewer than ``count`` are free (:class:`GpusMissing` when the node has fewer).
    """
    if count > len(table):
        raise GpusMissing(f"the job was granted {count} GPU(s) here, but geco finds "
                          f"{len(table)} on this node: its complex_values count GPUs that "
                          "are not there (the driver, [gpu] devices)")
    taken, local = set(busy), set(near)
    free = [g for g in table if g.id not in taken]
    if len(free) < count:
        raise GpusUnavailable(f"the job needs {count} GPU(s) here, but only {len(free)} of "
                              f"this node's {len(table)} are free")
    free.sort(key=lambda g: (g.numa not in local, g.id))
    return tuple(sorted(g.id for g in free[:count]))


class MigCaps(NamedTuple):
    """The node's MIG capability devices (``/dev/nvidia-caps/nvidia-cap<minor>``).

    A process reaches a MIG instance through its GPU's device and the instance's caps
    (``gpu0/gi1/access``, ``gpu0/gi1/ci0/access``); ``config`` (make and remove instances
    on any GPU) and ``monitor`` (watch them all) are the node's.

    Attributes
    ----------
    major: their character major, handed out when the driver loads (the ``nvidia-caps``
        line of ``/proc/devices``).
    table: ``/proc/driver/nvidia-caps/mig-minors`` as read, ``<name> <minor>`` per line;
        None when it cannot be read. Kept unparsed: the driver lists every cap it could
        ever make (135 per possible GPU, some 4,300 lines), and only a job granted GPUs
        needs any of it (:meth:`minors`, a few ms).
    """

    major: int
    table: bytes | None = None

    def minors(self, gpus: Collection[int]) -> list[int] | None:
        """The minors of the node's caps and of those of the GPUs whose device minors are
        ``gpus`` (``gpu<N>/...``, N being that minor), in the table's order; None when the
        table is missing or holds a line other than ``<name> <minor>``."""
        if self.table is None or _MIG_LINES.fullmatch(self.table) is None:
            return None
        names = rb"(?!gpu)\S+"
        if gpus:
            names += rb"|gpu(?:" + b"|".join(b"%d" % g for g in sorted(gpus)) + rb")/\S+"
        return [int(m) for m in re.findall(rb"^(?:" + names + rb") (\d+)$", self.table,
                                           re.MULTILINE)]


# mig-minors, every line of it: a GPU's cap is "gpu<N>/...", the node's are any other name
_MIG_LINES = re.compile(rb"(?:(?:gpu\d+/\S+|(?!gpu)\S+) \d+(?:\n|\Z))*")


def mig_caps(proc: Path = Path("/proc")) -> MigCaps | None:
    """This node's MIG capability devices; None when no driver registered them (no
    ``nvidia-caps`` character major in ``proc/devices``).

    What geco cannot tell apart it denies whole: without a readable table, a job is
    denied every cap (:func:`denied`).
    """
    major = _char_major(proc / "devices", _CAPS_DRIVER)
    if major is None:
        return None
    try:
        return MigCaps(major, (proc / _CAPS_TABLE).read_bytes())
    except OSError:
        return MigCaps(major)


def _char_major(devices: Path, driver: bytes) -> int | None:
    """The major ``driver`` holds among the character devices of ``/proc/devices``."""
    try:
        text = devices.read_bytes()
    except OSError:
        return None
    # "Character devices:" and its "<major> <driver>" lines, a blank line, "Block devices:"
    for line in text.partition(b"\n\n")[0].splitlines()[1:]:
        number, _, name = line.strip().partition(b" ")
        if name == driver and number.isdigit():
            return int(number)
    return None


def denied(table: Sequence[Gpu], ids: Iterable[int],
           caps: MigCaps | None = None) -> list[tuple[str, int, int | None]]:
    """The devices a job granted ``ids`` may not open: ``(type, major, minor)``, minor None
    for every minor of the major.

    On a GPU node, every other GPU of ``table``, and with MIG (``caps``) the caps of those
    GPUs' instances and the node's (``config``, ``monitor``); a job granted no GPU, every
    cap. ``nvidiactl`` and ``nvidia-uvm`` stay open: CUDA needs them with any GPU, and
    they reach none by themselves.

    On a node where geco knows no GPU (``table`` empty; a job granted some was refused):
    every minor of NVIDIA's major, ``nvidiactl`` too, and every cap. The driver may load,
    and nvidia-modprobe make ``/dev/nvidia<N>``, after the job started.
    """
    every_cap = [("c", caps.major, None)] if caps is not None else []
    if not table:
        return [("c", _NVIDIA_MAJOR, None), *every_cap]
    mine = set(ids)
    others: list[tuple[str, int, int | None]] = [
        ("c", g.major, g.minor) for g in table if g.id not in mine]
    if caps is None or not mine:
        return others + every_cap
    minors = caps.minors({g.minor for g in table if g.id not in mine})
    if minors is None:
        return others + every_cap
    return others + [("c", caps.major, minor) for minor in minors]


def job_environment(cfg: Config, key: JobKey, hostname: str | None = None) -> dict[str, str]:
    """:func:`environment` for a running job, from its resource file ({} on a node without
    GPUs: there the job is told nothing about them; no ids on record: it has none).

    Raises
    ------
    GpuGrantError, GecoError
        as :func:`held` does.
    """
    table = node_table(cfg.gpu_devices)
    if not table:
        return {}
    from geco.sge import resourcefile  # only on a GPU node

    try:
        rs = resourcefile.read(cfg.resources_dir, key)
    except GecoError:
        rs = None
    return environment(_held(table, cfg, key, rs, hostname))


def held(cfg: Config, key: JobKey, rs: ResourceSet | None,
         hostname: str | None = None) -> tuple[int, ...]:
    """The GPU ids job ``key`` holds on ``hostname`` (default: this host) by its resource
    set ``rs`` (None: none on record); () on a node without GPUs.

    The job's containment saved the ids it mapped Grid Engine's words to; words still on
    record are a grant it could not map (the job was contained with no GPU).

    Raises
    ------
    GpuGrantError
        when Grid Engine granted the job a GPU id that names no GPU of this node: the hook
        that tells the job its GPUs (prolog, starter) holds it with this sentence.
    GecoError
        when ``[gpu] devices`` cannot be used.
    """
    table = node_table(cfg.gpu_devices)
    return _held(table, cfg, key, rs, hostname) if table else ()


def _held(table: Sequence[Gpu], cfg: Config, key: JobKey, rs: ResourceSet | None,
          hostname: str | None) -> tuple[int, ...]:
    try:
        node = rs.node(hostname) if rs is not None else None
        share = parse_share(node.gpus) if node is not None else Share()
    except GecoError:
        share = Share()
    try:
        return map_share(share, table, cfg.gpu_names).ids
    except GpuGrantError as exc:
        raise GpuGrantError(exc.msg, job=key, node=hostname or os.uname().nodename) from None


def environment(ids: Sequence[int]) -> dict[str, str]:
    """What a job on a GPU node is told: ``GECO_GPUS`` (the node's ids) and the CUDA view.

    The kernel lets the job open its GPUs only, and CUDA numbers the GPUs it can open
    from 0 in PCI bus order, so ``CUDA_VISIBLE_DEVICES`` is ``0..n-1`` (Slurm's
    ConstrainDevices does the same); ``""`` hides every GPU from a job granted none.
    """
    return {"GECO_GPUS": format_ids(ids),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(ids))),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
