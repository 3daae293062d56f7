"""A node's CPU topology (cores, their hardware threads, NUMA nodes, packages) and cpu lists.

:meth:`Topology.load` asks hwloc, in-process, through the small cffi bridge
built by :mod:`geco._hwloc_build` (its docstring says why cffi in API mode and
not ``lstopo`` XML). The bridge hands back four flat ``int`` arrays, one entry
per PU; this module groups them into :class:`Core` records, which is all the
allocator (:mod:`geco.node.cores`) needs. No hwloc struct ever reaches Python.

Facts about what is loaded:

* The whole node, even when the caller sits in a smaller cpuset (the prolog
  runs inside the job's cgroup): hwloc's ``INCLUDE_DISALLOWED`` flag is set.
  Which PUs geco may hand out comes from its own cgroup, not from here.
* Offline PUs are not in the topology (hwloc leaves them out).
* A PU's NUMA node is the nearest one (smallest locality containing it); on
  nodes with memory-only NUMA nodes of the same locality (HBM, NVDIMM) the
  lowest OS index wins, normally the DRAM node.
* hwloc honours ``HWLOC_XMLFILE`` / ``HWLOC_SYNTHETIC`` / ``HWLOC_FSROOT`` in the
  environment when loading "this host"; an admin can use that to replay another
  node's topology.
* The host topology is loaded once per process and cached (CPU hotplug while a
  daemon runs: pass ``fresh=True``).

Cpu lists (``cpuset.cpus``) are :mod:`geco.cpulist`'s.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from geco.cpulist import format_cpulist
from geco.errors import TopologyError

__all__ = ["Core", "Topology"]

HOST = "this host"

# ---------------------------------------------------------------- topology


@dataclass(frozen=True, slots=True)
class Core:
    """One core: the unit geco hands out by default.

    Attributes
    ----------
    index: hwloc's logical index of the core (0..ncores-1, in topology order).
    pus: OS indexes (kernel CPU numbers) of its hardware threads, ascending.
    numa: OS index of its NUMA node (what ``cpuset.mems`` takes); -1 when none.
    package: logical index of its package (socket); -1 when none.
    """

    index: int
    pus: tuple[int, ...]
    numa: int = -1
    package: int = -1


@dataclass(frozen=True, slots=True)
class Topology:
    """The cores of one node (or of a synthetic description), in topology order.

    Attributes
    ----------
    cores: one record per core, by logical index.
    synthetic: the hwloc synthetic description it came from; None for this host.
    pus: every PU's OS index (derived).
    """

    cores: tuple[Core, ...]
    synthetic: str | None = None
    pus: frozenset[int] = field(init=False, repr=False, compare=False)
    _by_pu: dict[int, Core] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_pu: dict[int, Core] = {}
        for core in self.cores:
            for pu in core.pus:
                if pu in by_pu:
                    raise ValueError(f"PU {pu} appears in cores {by_pu[pu].index} "
                                     f"and {core.index}; each PU belongs to one core")
                by_pu[pu] = core
        # frozen dataclass: derived fields are set once, here
        object.__setattr__(self, "_by_pu", by_pu)
        object.__setattr__(self, "pus", frozenset(by_pu))

    @property
    def name(self) -> str:
        """What error messages call it: ``this host`` or ``synthetic topology '...'``."""
        return HOST if self.synthetic is None else f"synthetic topology {self.synthetic!r}"

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        """OS indexes of the NUMA nodes that have cores, ascending (empty when none)."""
        return tuple(sorted({c.numa for c in self.cores if c.numa >= 0}))

    @property
    def packages(self) -> tuple[int, ...]:
        """Logical indexes of the packages, ascending (empty when hwloc shows none)."""
        return tuple(sorted({c.package for c in self.cores if c.package >= 0}))

    def core_of(self, pu: int) -> Core:
        """Return the core holding PU ``pu`` (an OS index).

        Raises
        ------
        ValueError
            when the PU is not in this topology.
        """
        try:
            return self._by_pu[pu]
        except KeyError:
            raise ValueError(f"PU {pu} is not in {self.name} "
                             f"(PUs {format_cpulist(self.pus)})") from None

    def numa_of_pus(self, pus: Iterable[int]) -> frozenset[int]:
        """Return the NUMA nodes to put in ``cpuset.mems`` for these PUs.

        Parameters
        ----------
        pus: OS indexes of PUs of this topology.

        Returns
        -------
        The OS indexes of their NUMA nodes; ``{0}`` for PUs of a topology
        without NUMA nodes (the kernel then has exactly node 0). Empty for no PUs.

        Raises
        ------
        ValueError
            naming the PUs that are not in this topology.
        """
        wanted = frozenset(pus)
        unknown = wanted - self.pus
        if unknown:
            raise ValueError(f"PUs {format_cpulist(unknown)} are not in {self.name} "
                             f"(PUs {format_cpulist(self.pus)})")
        return frozenset(max(self._by_pu[pu].numa, 0) for pu in wanted)

    @classmethod
    def load(cls, synthetic: str | None = None, *, restrict: Iterable[int] | None = None,
             fresh: bool = False) -> Topology:
        """Load this host's topology, or build one from an hwloc synthetic description.

        Parameters
        ----------
        synthetic: e.g. ``"pack:2 numa:2 core:16 pu:2"``; None = this host.
        restrict: keep only these PUs (OS indexes), as ``hwloc_topology_restrict``.
        fresh: reload this host's topology instead of using the per-process cache.

        Returns
        -------
        The topology. This host's (without ``restrict``) is cached per process.

        Raises
        ------
        TopologyError
            when the bridge is not built or was built for another hwloc, when
            hwloc rejects the description, or when loading or restricting fails;
            the message names the synthetic description or "this host".
        """
        if synthetic is None and restrict is None:
            if fresh:
                _host_topology.cache_clear()
            return _host_topology()
        return _load(synthetic, None if restrict is None else frozenset(restrict))


def _bridge() -> tuple[Any, Any]:
    """Import the cffi module, refusing one built against another hwloc major version."""
    try:
        from geco._hwloc_cffi import ffi, lib
    except ImportError as exc:
        raise TopologyError(
            "the hwloc bridge geco._hwloc_cffi is not built: run "
            "'python -m geco._hwloc_build' in the source tree, or reinstall geco with pip",
            cause=str(exc)) from exc
    built, running = lib.geco_hwloc_build_api(), lib.geco_hwloc_runtime_api()
    # hwloc's rule: the ABI is stable within a major API version (the top 16 bits)
    if built >> 16 != running >> 16:
        raise TopologyError(
            f"geco._hwloc_cffi was built against hwloc API {built:#x} but libhwloc "
            f"{running:#x} is loaded; rebuild it ('python -m geco._hwloc_build' or reinstall geco)")
    return ffi, lib


@cache
def _host_topology() -> Topology:
    return _load(None, None)


def _load(synthetic: str | None, restrict: frozenset[int] | None) -> Topology:
    what = HOST if synthetic is None else f"synthetic topology {synthetic!r}"
    ffi, lib = _bridge()
    if synthetic is not None and ("\0" in synthetic or not synthetic.isascii()):
        raise TopologyError(f"hwloc could not load {what}: "
                            "the description must be printable ASCII")
    if restrict is not None and not restrict:
        raise TopologyError(f"hwloc could not load {what}: restricting to no PU at all")
    desc = ffi.NULL if synthetic is None else synthetic.encode("ascii")
    only = ffi.NULL if restrict is None else format_cpulist(restrict).encode("ascii")
    out = ffi.new("struct geco_topo *")
    rc = lib.geco_topo_load(desc, only, out)
    try:
        if rc != 0:
            code = _errno.errorcode.get(rc, str(rc))
            raise TopologyError(f"hwloc could not load {what}: "
                                f"{ffi.string(out.msg).decode('ascii', 'replace')}",
                                errno=code,
                                restrict=None if restrict is None else format_cpulist(restrict))
        n = out.npus
        columns = [ffi.unpack(a, n) for a in (out.pu_os, out.core, out.numa, out.package)]
    finally:
        lib.geco_topo_release(out)
    return _group(*columns, synthetic=synthetic)


def _group(pu_os: list[int], core: list[int], numa: list[int], package: list[int],
           *, synthetic: str | None) -> Topology:
    """Group per-PU columns into cores, by core logical index."""
    # A PU hwloc shows without a core above it is its own core; number those
    # after the real cores so every index stays unique.
    next_free = max(core, default=-1) + 1
    groups: dict[int, list[int]] = {}
    first: dict[int, int] = {}
    for i, c in enumerate(core):
        if c < 0:
            c, next_free = next_free, next_free + 1
        groups.setdefault(c, []).append(pu_os[i])
        first.setdefault(c, i)
    cores = tuple(
        Core(index=c, pus=tuple(sorted(pus)), numa=numa[first[c]], package=package[first[c]])
        for c, pus in sorted(groups.items())
    )
    return Topology(cores=cores, synthetic=synthetic)
