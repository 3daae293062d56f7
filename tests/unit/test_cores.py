"""The core allocator: whole cores, packed on the fewest NUMA nodes and packages, never shared.

Given/When/Then in each test's name and docstring. Topologies are hwloc
synthetic descriptions (loaded through the real hwloc) plus this host;
expected placements are derived from the topology, not copied from output.
Error texts are asserted in full.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geco.cpulist import format_cpulist
from geco.errors import CoresUnavailable
from geco.node.cores import Allocation, allocate, busy_from_cpusets
from geco.node.topology import Core, Topology

NONE: frozenset[int] = frozenset()
SMALL = "core:2 pu:1"               # hwloc 2 refuses plain "core:2": the last level must be PUs
BOX = "pack:2 numa:2 core:16 pu:2"  # 2 packages x 2 NUMA nodes x 16 cores x 2 threads
BIG = "pack:8 core:64 pu:2"         # 512 cores, one NUMA node spanning 8 packages


@pytest.fixture(scope="module")
def box() -> Topology:
    return Topology.load(BOX)


@pytest.fixture(scope="module")
def big() -> Topology:
    return Topology.load(BIG)


def _cores(topo: Topology, alloc: Allocation) -> list[Core]:
    """The cores an allocation touches."""
    return [c for c in topo.cores if alloc.cpus.intersection(c.pus)]


def _pus(cores: Iterable[Core]) -> frozenset[int]:
    return frozenset(pu for c in cores for pu in c.pus)


def _node(topo: Topology, numa: int) -> list[Core]:
    return [c for c in topo.cores if c.numa == numa]


def _unavailable(topo: Topology, slots: int, **kwargs: object) -> str:
    with pytest.raises(CoresUnavailable) as info:
        allocate(topo, slots, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


# --- whole cores ----------------------------------------------------------------------------

def test_given_smt_box_when_one_slot_allocated_then_one_whole_core_with_both_threads(
        box: Topology) -> None:
    alloc = allocate(box, 1, busy_pus=NONE)
    cores = _cores(box, alloc)
    assert len(cores) == 1
    assert alloc.cpus == frozenset(cores[0].pus)
    assert len(alloc.cpus) == 2
    assert alloc.mems == frozenset({cores[0].numa})


def test_given_a_core_with_one_busy_thread_when_allocating_then_that_core_is_never_handed_out(
        box: Topology) -> None:
    """Given every core but one fully busy and the last one half busy, Then nothing is free."""
    first = box.cores[0]
    busy = box.pus - {first.pus[1]}
    assert _unavailable(box, 1, busy_pus=busy) == (
        "need 1 whole core, only 0 free (cores in use: 0-63 of 0-63)")


def test_given_this_host_when_allocating_each_core_then_each_is_a_whole_core_on_node_zero() -> None:
    host = Topology.load()
    busy: frozenset[int] = NONE
    for _ in host.cores:
        alloc = allocate(host, 1, busy_pus=busy)
        assert alloc.cpus.isdisjoint(busy)
        assert alloc.cpus == frozenset(_cores(host, alloc)[0].pus)
        assert alloc.mems == host.numa_of_pus(alloc.cpus)
        busy |= alloc.cpus
    assert busy == host.pus
    n = len(host.cores)
    assert _unavailable(host, 1, busy_pus=busy) == (
        f"need 1 whole core, only 0 free (cores in use: {format_cpulist(range(n))} "
        f"of {format_cpulist(range(n))})")


def test_given_two_core_box_when_both_slots_asked_then_both_cores_and_node_zero() -> None:
    small = Topology.load(SMALL)
    alloc = allocate(small, 2, busy_pus=NONE)
    assert alloc.cpus == small.pus
    assert alloc.mems == frozenset({0})
    assert alloc.cpus_text == "0-1"
    assert alloc.mems_text == "0"


# --- packing --------------------------------------------------------------------------------

def test_given_empty_box_when_16_slots_allocated_then_they_fill_one_numa_node(
        box: Topology) -> None:
    alloc = allocate(box, 16, busy_pus=NONE)
    cores = _cores(box, alloc)
    assert len(cores) == 16
    (node,) = {c.numa for c in cores}
    assert alloc.mems == frozenset({node})
    assert cores == _node(box, node)


def test_given_empty_box_when_32_slots_allocated_then_one_package_not_a_node_of_each(
        box: Topology) -> None:
    alloc = allocate(box, 32, busy_pus=NONE)
    cores = _cores(box, alloc)
    assert len(cores) == 32
    assert len({c.package for c in cores}) == 1
    assert len({c.numa for c in cores}) == 2
    assert alloc.mems == frozenset(c.numa for c in cores)


def test_given_17_slots_when_allocated_then_one_node_filled_and_the_rest_in_its_package(
        box: Topology) -> None:
    cores = _cores(box, allocate(box, 17, busy_pus=NONE))
    per_node = Counter(c.numa for c in cores)
    assert sorted(per_node.values()) == [1, 16]
    assert len({c.package for c in cores}) == 1


def test_given_partly_used_node_when_small_job_fits_there_then_it_goes_there(
        box: Topology) -> None:
    """Best fit: the node with the fewest free cores that still fits, so whole nodes stay free."""
    third = box.numa_nodes[2]
    busy = _pus(_node(box, third)[:10])          # 6 cores left in that node
    alloc = allocate(box, 4, busy_pus=busy)
    cores = _cores(box, alloc)
    assert {c.numa for c in cores} == {third}
    assert alloc.mems == frozenset({third})
    assert alloc.cpus.isdisjoint(busy)


def test_given_partly_used_node_when_job_does_not_fit_there_then_a_free_node_is_used(
        box: Topology) -> None:
    third = box.numa_nodes[2]
    busy = _pus(_node(box, third)[:10])
    cores = _cores(box, allocate(box, 7, busy_pus=busy))
    assert len({c.numa for c in cores}) == 1
    assert {c.numa for c in cores} != {third}


def test_given_a_package_with_holes_when_job_needs_two_nodes_then_best_fit_package(
        box: Topology) -> None:
    """Given package 1 with 20 free cores and package 0 empty, When 18 slots are asked,
    Then package 1 takes them (it still fits) and package 0 stays whole."""
    pkg1 = [c for c in box.cores if c.package == 1]
    busy = _pus(pkg1[:12])
    cores = _cores(box, allocate(box, 18, busy_pus=busy))
    assert {c.package for c in cores} == {1}
    assert len({c.numa for c in cores}) == 2


def test_given_big_node_when_64_slots_asked_then_one_whole_package(big: Topology) -> None:
    cores = _cores(big, allocate(big, 64, busy_pus=NONE))
    assert len({c.package for c in cores}) == 1
    assert len(cores) == 64


def test_given_big_node_half_busy_when_100_slots_asked_then_two_packages(big: Topology) -> None:
    busy = _pus([c for c in big.cores if c.package % 2 == 0])
    alloc = allocate(big, 100, busy_pus=busy)
    cores = _cores(big, alloc)
    assert len(cores) == 100
    assert len({c.package for c in cores}) == 2
    assert alloc.mems == frozenset({0})


def test_given_same_state_when_allocated_twice_then_same_answer(box: Topology) -> None:
    busy = _pus(box.cores[3:9])
    assert allocate(box, 5, busy_pus=busy) == allocate(box, 5, busy_pus=busy)


# --- never over-commit ----------------------------------------------------------------------

def test_given_four_cores_two_busy_when_four_slots_asked_then_exact_refusal() -> None:
    small = Topology.load("core:4 pu:1")
    assert _unavailable(small, 4, busy_pus=frozenset({0, 1})) == (
        "need 4 whole cores, only 2 free (cores in use: 0-1 of 0-3)")


def test_given_box_when_more_slots_than_cores_then_refused_with_nothing_in_use(
        box: Topology) -> None:
    assert _unavailable(box, 65, busy_pus=NONE) == (
        "need 65 whole cores, only 64 free (cores in use: none of 0-63)")


def test_given_zero_slots_when_allocating_then_value_error(box: Topology) -> None:
    with pytest.raises(ValueError) as info:
        allocate(box, 0, busy_pus=NONE)
    assert str(info.value) == "slots must be >= 1, got 0"


# --- reserved cores -------------------------------------------------------------------------

def test_given_admin_reserved_thread_when_allocating_everything_then_its_core_is_never_used(
        box: Topology) -> None:
    """Given PU 1 (sibling of PU 0) outside geco's cpuset, core 0 is reserved as a whole."""
    allowed = box.pus - {1}
    alloc = allocate(box, 63, busy_pus=NONE, allowed_pus=allowed)
    assert alloc.cpus == box.pus - {0, 1}
    assert _unavailable(box, 64, busy_pus=NONE, allowed_pus=allowed) == (
        "need 64 whole cores, only 63 free (cores in use: none of 1-63, reserved: 0)")


def test_given_reserved_package_when_allocating_then_only_the_other_package_is_used(
        box: Topology) -> None:
    allowed = _pus([c for c in box.cores if c.package == 1])
    alloc = allocate(box, 1, busy_pus=NONE, allowed_pus=allowed)
    assert alloc.cpus <= allowed
    busy = alloc.cpus
    assert _unavailable(box, 32, busy_pus=busy, allowed_pus=allowed) == (
        "need 32 whole cores, only 31 free (cores in use: 32 of 32-63, reserved: 0-31)")


# --- hardware threads -----------------------------------------------------------------------

def test_given_hardware_thread_mode_when_one_slot_then_one_thread(box: Topology) -> None:
    alloc = allocate(box, 1, busy_pus=NONE, hardware_threads=True)
    assert len(alloc.cpus) == 1
    assert alloc.mems == box.numa_of_pus(alloc.cpus)


def test_given_hardware_thread_mode_and_half_used_core_when_one_slot_then_its_sibling(
        box: Topology) -> None:
    """A half-used core is filled before a free core is broken up."""
    core = box.cores[5]
    alloc = allocate(box, 1, busy_pus=frozenset({core.pus[0]}), hardware_threads=True)
    assert alloc.cpus == frozenset({core.pus[1]})


def test_given_hardware_thread_mode_when_even_slots_then_whole_cores_are_used(
        box: Topology) -> None:
    alloc = allocate(box, 6, busy_pus=NONE, hardware_threads=True)
    assert alloc.cpus == _pus(_cores(box, alloc))
    assert len(_cores(box, alloc)) == 3


def test_given_hardware_thread_mode_when_exhausted_then_refusal_counts_threads(
        box: Topology) -> None:
    busy = frozenset(range(0, 120))
    allowed = box.pus - {127}
    assert _unavailable(box, 8, busy_pus=busy, allowed_pus=allowed,
                        hardware_threads=True) == (
        "need 8 hardware threads, only 7 free (PUs in use: 0-119 of 0-126, reserved: 127)")


# --- state from the cgroup tree -------------------------------------------------------------

def test_given_job_cpusets_as_read_from_cgroups_when_rebuilt_then_busy_is_their_union(
        box: Topology) -> None:
    """Given three jobs' cpuset.cpus files (bytes, trailing newline) and an empty new cgroup,
    When the busy set is rebuilt (as after a restart), Then the next job overlaps none."""
    busy: frozenset[int] = NONE
    files: list[bytes] = []
    for slots in (3, 16, 5):
        alloc = allocate(box, slots, busy_pus=busy)
        busy |= alloc.cpus
        files.append(alloc.cpus_text.encode() + b"\n")
    files.append(b"\n")
    rebuilt = busy_from_cpusets(files)
    assert rebuilt == busy
    assert allocate(box, 40, busy_pus=rebuilt).cpus.isdisjoint(busy)


def test_given_text_cpusets_when_rebuilt_then_same_as_bytes() -> None:
    assert busy_from_cpusets(["0-3", "8\n", ""]) == busy_from_cpusets([b"0-3", b"8\n"])


def test_given_malformed_cpuset_when_rebuilt_then_value_error_names_it() -> None:
    with pytest.raises(ValueError) as info:
        busy_from_cpusets([b"0-3\n", b"4-x\n"])
    assert str(info.value) == ("cpu list '4-x\\n' is malformed at offset 0: "
                               "expected a number or a range like 0-3, got '4-x'")


# --- random sequences -----------------------------------------------------------------------

TOPOLOGIES = [SMALL, BOX, BIG, None]  # None = this host
_ops = st.lists(st.tuples(st.booleans(), st.integers(1, 80), st.integers(0, 10_000)),
                min_size=1, max_size=24)


def _fewest_nodes(free_per_node: Counter[int], n: int) -> int:
    total = 0
    for k, size in enumerate(sorted(free_per_node.values(), reverse=True), start=1):
        total += size
        if total >= n:
            return k
    raise AssertionError("caller checked the total")


@pytest.mark.parametrize("hardware_threads", [False, True], ids=["cores", "threads"])
@pytest.mark.parametrize("desc", TOPOLOGIES, ids=lambda d: d or "host")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, reserved=st.integers(0, 3))
def test_given_random_allocate_free_sequences_then_invariants_hold(
        desc: str | None, hardware_threads: bool, ops: list[tuple[bool, int, int]],
        reserved: int) -> None:
    """Given any sequence of allocations and frees (and up to 3 cores with an admin-reserved
    thread), Then no PU is ever shared or reserved, every allocation is whole units, mems
    are exactly their NUMA nodes, the fewest NUMA nodes are used, and a request fails
    exactly when fewer units are free in total."""
    topo = Topology.load(desc)
    allowed = topo.pus - {c.pus[0] for c in topo.cores[len(topo.cores) - reserved:]}
    scale = max(1, len(topo.cores) // 16)  # job sizes relative to the node
    jobs: list[frozenset[int]] = []
    for is_alloc, size, pick in ops:
        busy: frozenset[int] = frozenset().union(*jobs)
        if not is_alloc and jobs:
            jobs.pop(pick % len(jobs))
            continue
        slots = 1 + (size * scale) % (len(topo.cores) + 2)
        taken = busy | (topo.pus - allowed)
        if hardware_threads:
            free_units = [(pu, c.numa) for c in topo.cores for pu in c.pus if pu not in taken]
        else:
            free_units = [(c.index, c.numa) for c in topo.cores if taken.isdisjoint(c.pus)]
        if len(free_units) < slots:
            with pytest.raises(CoresUnavailable):
                allocate(topo, slots, busy_pus=busy, allowed_pus=allowed,
                         hardware_threads=hardware_threads)
            continue
        alloc = allocate(topo, slots, busy_pus=busy, allowed_pus=allowed,
                         hardware_threads=hardware_threads)
        cores = _cores(topo, alloc)
        assert alloc.cpus.isdisjoint(taken)
        if hardware_threads:
            assert len(alloc.cpus) == slots
        else:
            assert len(cores) == slots
            assert alloc.cpus == _pus(cores)
        assert alloc.mems == frozenset(max(c.numa, 0) for c in cores)
        assert len({c.numa for c in cores}) == _fewest_nodes(
            Counter(numa for _, numa in free_units), slots)
        jobs.append(alloc.cpus)
