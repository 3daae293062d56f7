"""Pick the cores a job is bound to: whole cores, packed for locality, never over-committed.

What the original GECO did wrong, and what this module does instead
(``research/geco-original.md`` §3 "Picking cores"):

* It handed out PUs (hardware threads), so two jobs could share a core's
  pipelines. Here the unit is a **whole core**: a job with ``n`` slots gets
  ``n`` cores that are completely free, with *all* their PUs (SMT siblings
  included). ``hardware_threads=True`` switches the unit to the PU.
* It spread jobs across sockets (``hwloc_distrib``). Here jobs are **packed**:
  the placement uses the fewest NUMA nodes, then the fewest packages.
* Its ``cpuset.mems`` did not follow the cores. Here ``mems`` is exactly the
  NUMA nodes of the chosen cores (as Slurm's ConstrainCores and OAR do).
* When its free set came back empty it skipped the restriction and handed out
  busy PUs again. Here a request that does not fit raises
  :class:`~geco.errors.CoresUnavailable`: never a partial or shared allocation.

The allocator keeps no state. The caller passes the PUs already in use,
rebuilt from the job cgroups' ``cpuset.cpus`` (:func:`busy_from_cpusets`), so
a restart loses nothing; it must hold the node-wide lock from reading the
busy set until the new cpuset is written.

How a placement is chosen (greedy on free-unit counts, no search: on a 512-core
node one call takes a fraction of a millisecond, see ``bench/bench_cores.py``):

1. Count the free units per NUMA node. ``k`` = the fewest nodes that can hold
   the job (the largest counts, summed until they reach ``n``).
2. ``k == 1``: the **best fit** node, i.e. the one with the fewest free units
   that still fits (big holes stay free for big jobs); ties go to the lowest
   index.
3. ``k > 1``: first the packages. If one package's ``k`` largest nodes hold the
   job, take the best-fit such package; else add packages, the most capable
   first, until they do. Within them, fill the ``k - 1`` largest nodes
   completely and put the rest in the best-fit remaining node.
4. Inside the node(s) used partly, the same best-fit/fill rule picks the
   package (a NUMA node may span packages: ``pack:8 core:64`` has one node)
   and, for hardware threads, the core, so a half-used core is filled
   before a free one is broken up. Within the last group, lowest index first.

Success never depends on the heuristic: whenever enough free units exist in
total, step 1 finds a ``k`` and steps 2-4 always have room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from geco._tuple import NamedTuple
from geco.cpulist import format_cpulist, parse_cpulist
from geco.errors import CoresUnavailable
from geco.node.topology import Topology

__all__ = ["Allocation", "allocate", "busy_from_cpusets"]


class Allocation(NamedTuple):
    """The cores given to one job on one node.

    Attributes
    ----------
    cpus: OS indexes of the PUs, for ``cpuset.cpus``.
    mems: OS indexes of the NUMA nodes of those PUs, for ``cpuset.mems``.
    """

    cpus: frozenset[int]
    mems: frozenset[int]

    @property
    def cpus_text(self) -> str:
        """``cpus`` in kernel list syntax (``"0-3,8"``)."""
        return format_cpulist(self.cpus)

    @property
    def mems_text(self) -> str:
        """``mems`` in kernel list syntax."""
        return format_cpulist(self.mems)


class _Unit(NamedTuple):
    """One thing that can be handed out: a whole core, or one PU in hardware-thread mode."""

    pus: tuple[int, ...]
    numa: int
    package: int
    core: int


_Key = Callable[[_Unit], int]


def _by_package(u: _Unit) -> int:
    return u.package


def _by_core(u: _Unit) -> int:
    return u.core


def busy_from_cpusets(cpusets: Iterable[str | bytes]) -> frozenset[int]:
    """Rebuild the set of PUs in use from existing job cgroups' ``cpuset.cpus``.

    Parameters
    ----------
    cpusets: the content of each job cgroup's ``cpuset.cpus`` (an empty one
        counts for nothing).

    Returns
    -------
    The union of all of them, to pass as ``busy_pus`` to :func:`allocate`.

    Raises
    ------
    ValueError
        when one of them is not a kernel cpu list (naming it).
    """
    busy: set[int] = set()
    for text in cpusets:
        busy |= parse_cpulist(text)
    return frozenset(busy)


def allocate(topo: Topology, slots: int, *, busy_pus: frozenset[int],
             allowed_pus: frozenset[int] | None = None,
             hardware_threads: bool = False) -> Allocation:
    """Choose the PUs and NUMA nodes for a job with ``slots`` slots on this node.

    Parameters
    ----------
    topo: the node's topology.
    slots: the job's slots on this node (>= 1).
    busy_pus: PUs other jobs hold (see :func:`busy_from_cpusets`).
    allowed_pus: PUs geco may hand out at all (its parent cgroup's
        ``cpuset.cpus``); None = every PU. A core with any PU outside this set
        is never handed out in whole-core mode (admin-reserved cores).
    hardware_threads: one slot = one PU instead of one whole core.

    Returns
    -------
    The allocation: whole cores (all their PUs) unless ``hardware_threads``,
    placed on the fewest NUMA nodes, then packages; ``mems`` = their NUMA nodes.

    Raises
    ------
    ValueError
        when ``slots`` < 1.
    CoresUnavailable
        when fewer than ``slots`` units are free; nothing is allocated.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    blocked = busy_pus if allowed_pus is None else busy_pus | (topo.pus - allowed_pus)
    units: list[_Unit] = []
    if hardware_threads:
        for c in topo.cores:
            units.extend(_Unit((pu,), c.numa, c.package, c.index)
                         for pu in c.pus if pu not in blocked)
    else:
        units.extend(_Unit(c.pus, c.numa, c.package, c.index)
                     for c in topo.cores if blocked.isdisjoint(c.pus))
    if len(units) < slots:
        raise _unavailable(topo, slots, len(units), busy_pus, allowed_pus, hardware_threads)
    chosen = _place(units, slots, (_by_package, _by_core) if hardware_threads else (_by_package,))
    cpus = frozenset(pu for u in chosen for pu in u.pus)
    return Allocation(cpus=cpus, mems=topo.numa_of_pus(cpus))


def _unavailable(topo: Topology, need: int, free: int, busy: frozenset[int],
                 allowed: frozenset[int] | None, hardware_threads: bool) -> CoresUnavailable:
    """Say how many units were asked for, how many are free, and which are taken."""
    if hardware_threads:
        unit, label = "hardware thread", "PUs"
        reserved = set() if allowed is None else set(topo.pus - allowed)
        usable = set(topo.pus) - reserved
        in_use = usable & busy
    else:
        unit, label = "whole core", "cores"
        reserved = {c.index for c in topo.cores
                    if allowed is not None and not allowed.issuperset(c.pus)}
        usable = {c.index for c in topo.cores} - reserved
        in_use = {c.index for c in topo.cores if c.index in usable and not busy.isdisjoint(c.pus)}
    detail = (f"{label} in use: {format_cpulist(in_use) or 'none'} "
              f"of {format_cpulist(usable) or 'none'}")
    if reserved:
        detail += f", reserved: {format_cpulist(reserved)}"
    return CoresUnavailable(f"need {need} {unit}{'' if need == 1 else 's'}, only {free} free "
                            f"({detail})")


def _group(units: Iterable[_Unit], key: _Key) -> dict[int, list[_Unit]]:
    """Group units by ``key``, keeping topology order inside each group."""
    groups: dict[int, list[_Unit]] = {}
    for u in units:
        groups.setdefault(key(u), []).append(u)
    return groups


def _fewest_groups(sizes: Iterable[int], n: int) -> int:
    """The fewest groups that can hold ``n`` units: the largest ones, summed until they do."""
    total = 0
    for k, size in enumerate(sorted(sizes, reverse=True), start=1):
        total += size
        if total >= n:
            return k
    raise AssertionError(f"{n} units do not fit; the caller checked the total")


def _split(groups: dict[int, list[_Unit]], candidates: Sequence[int], n: int,
           k: int) -> tuple[list[int], int, int]:
    """Spread ``n`` units over ``k`` of the ``candidates`` groups.

    Returns the groups to take whole (the ``k - 1`` largest, lowest index on
    ties), the group that takes the rest (best fit: the smallest that holds
    it), and how many units that rest is.
    """
    ordered = sorted(candidates, key=lambda g: (-len(groups[g]), g))
    whole = ordered[:k - 1]
    rest = n - sum(len(groups[g]) for g in whole)
    last = min((g for g in ordered[k - 1:] if len(groups[g]) >= rest),
               key=lambda g: (len(groups[g]), g))
    return whole, last, rest


def _fill(units: list[_Unit], n: int, levels: Sequence[_Key]) -> list[_Unit]:
    """Take ``n`` of ``units`` (all in one NUMA node), packing level by level."""
    if n == len(units) or not levels:
        return units[:n]
    groups = _group(units, levels[0])
    k = _fewest_groups((len(g) for g in groups.values()), n)
    whole, last, rest = _split(groups, list(groups), n, k)
    chosen = [u for g in whole for u in groups[g]]
    return chosen + _fill(groups[last], rest, levels[1:])


def _place(units: list[_Unit], n: int, levels: Sequence[_Key]) -> list[_Unit]:
    """Choose ``n`` of the free ``units``: fewest NUMA nodes, then fewest packages, best fit."""
    nodes = _group(units, lambda u: u.numa)
    k = _fewest_groups((len(g) for g in nodes.values()), n)
    if k == 1:
        best = min((x for x in nodes if len(nodes[x]) >= n), key=lambda x: (len(nodes[x]), x))
        return _fill(nodes[best], n, levels)
    whole, last, rest = _split(nodes, _packages_for(nodes, n, k), n, k)
    chosen = [u for x in whole for u in nodes[x]]
    return chosen + _fill(nodes[last], rest, levels)


def _packages_for(nodes: dict[int, list[_Unit]], n: int, k: int) -> list[int]:
    """The NUMA nodes of the fewest packages whose ``k`` largest nodes hold ``n`` units.

    One package when any can (best fit: the one with the fewest free units);
    otherwise packages are added, the most capable first, until they can.
    """
    by_package: dict[int, list[int]] = {}
    for x, members in nodes.items():
        # a NUMA node normally sits in one package; one spanning several counts
        # as part of its first core's package (the package criterion is secondary)
        by_package.setdefault(members[0].package, []).append(x)

    def capacity(xs: Iterable[int]) -> int:
        return sum(sorted((len(nodes[x]) for x in xs), reverse=True)[:k])

    fitting = [p for p, xs in by_package.items() if capacity(xs) >= n]
    if fitting:
        best = min(fitting, key=lambda p: (sum(len(nodes[x]) for x in by_package[p]), p))
        return by_package[best]
    chosen: list[int] = []
    for p in sorted(by_package, key=lambda p: (-capacity(by_package[p]), p)):
        chosen.extend(by_package[p])
        if capacity(chosen) >= n:
            return chosen
    raise AssertionError(f"{n} units do not fit in {k} NUMA nodes; the caller checked")
