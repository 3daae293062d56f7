"""Topology loading through the hwloc bridge, and kernel cpu lists.

Given/When/Then in each test's name and docstring. Expected topologies come
from the real tools: hwloc-calc for synthetic descriptions, /sys for this host.
Error texts are asserted in full.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from geco.cpulist import MAX_CPU, format_cpulist, parse_cpulist
from geco.errors import TopologyError
from geco.node.topology import Core, Topology

BOX = "pack:2 numa:2 core:16 pu:2"
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def _hwloc_calc(desc: str, *location: str) -> frozenset[int]:
    """PU OS indexes of a location, as hwloc's own command-line tool computes them."""
    if shutil.which("hwloc-calc") is None:
        pytest.skip("hwloc-calc (package hwloc) is not installed on this machine")
    out = subprocess.run(
        ["hwloc-calc", "-i", desc, "--physical-input", "--physical-output",
         "-I", "pu", "--sep", ",", *location],
        check=True, capture_output=True, text=True).stdout
    return parse_cpulist(out.strip())


def _pus_where(topo: Topology, **match: int) -> frozenset[int]:
    return frozenset(pu for c in topo.cores
                     if all(getattr(c, k) == v for k, v in match.items()) for pu in c.pus)


# --- cpu lists ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "cpus"), [
    (b"0-3,8", {0, 1, 2, 3, 8}),
    (b"0-3,8\n", {0, 1, 2, 3, 8}),
    ("5", {5}),
    (b"", set()),
    (b"\n", set()),
    (b"8,0-1,1", {0, 1, 8}),
    (b"0-15:2/8", {0, 1, 8, 9}),
])
def test_given_kernel_cpu_list_when_parsed_then_it_is_the_set_it_names(
        text: str | bytes, cpus: set[int]) -> None:
    """The kernel writes a trailing newline, accepts overlaps and a-b:used/group strides."""
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize(("text", "message"), [
    (b"0-3,,8", "cpu list '0-3,,8' is malformed at offset 4: "
                "expected a number or a range like 0-3, got an empty item"),
    (b" 1", "cpu list ' 1' is malformed at offset 0: "
            "expected a number or a range like 0-3, got ' 1'"),
    (b"0-3,", "cpu list '0-3,' is malformed at offset 4: "
              "expected a number or a range like 0-3, got an empty item"),
    (b"1-", "cpu list '1-' is malformed at offset 0: "
            "expected a number or a range like 0-3, got '1-'"),
    (b"-1", "cpu list '-1' is malformed at offset 0: "
            "expected a number or a range like 0-3, got '-1'"),
    (b"0,3-1", "cpu list '0,3-1' is malformed at offset 2: range 3-1 runs backwards"),
    (b"0-3\n\n", "cpu list '0-3\\n\\n' is malformed at offset 0: "
                 "expected a number or a range like 0-3, got '0-3\\n'"),
    (b"65536", "cpu list '65536' is malformed at offset 0: numbers must be <= 65535, got 65536"),
    (b"0-7:0/4", "cpu list '0-7:0/4' is malformed at offset 0: "
                 "group 0/4 must have 0 < used <= group size"),
    (b"0-7:5/4", "cpu list '0-7:5/4' is malformed at offset 0: "
                 "group 5/4 must have 0 < used <= group size"),
    (b"\xff", "cpu list '\\xff' is malformed at offset 0: "
              "expected a number or a range like 0-3, got '\\xff'"),
    ("0-3,\u0663", "cpu list '0-3,\u0663' is malformed at offset 4: "
                   "only ASCII digits, '-', ',', ':' and '/' may appear"),
])
def test_given_malformed_cpu_list_when_parsed_then_value_error_names_text_and_offset(
        text: str | bytes, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cpulist(text)
    assert str(info.value) == message


@pytest.mark.parametrize(("cpus", "text"), [
    ({0, 1, 2, 3, 8}, "0-3,8"),
    ({4, 5}, "4-5"),
    ({7}, "7"),
    (set(), ""),
    ([3, 1, 2, 2], "1-3"),
])
def test_given_cpu_numbers_when_formatted_then_kernel_canonical_list(
        cpus: set[int], text: str) -> None:
    assert format_cpulist(cpus) == text


def test_given_negative_cpu_when_formatted_then_value_error() -> None:
    with pytest.raises(ValueError) as info:
        format_cpulist({3, -2})
    assert str(info.value) == "cpu numbers must be >= 0, got -2"


@given(st.frozensets(st.integers(0, MAX_CPU), max_size=64))
@example(frozenset({0, 1, 2, 3, 8}))
@example(frozenset({MAX_CPU}))
def test_given_any_cpu_set_when_formatted_and_parsed_then_it_comes_back(
        cpus: frozenset[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == cpus
    assert parse_cpulist((text + "\n").encode()) == cpus


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20)), max_size=12))
def test_given_any_kernel_list_when_parsed_and_formatted_then_canonical_form_is_stable(
        ranges: list[tuple[int, int]]) -> None:
    """Unsorted, overlapping input prints back canonically, and the canonical form is a fixpoint."""
    text = ",".join(f"{lo}-{lo + width}" if width else str(lo) for lo, width in ranges)
    cpus = parse_cpulist(text)
    assert cpus == frozenset(n for lo, width in ranges for n in range(lo, lo + width + 1))
    canonical = format_cpulist(cpus)
    assert format_cpulist(parse_cpulist(canonical)) == canonical


# --- synthetic topologies -------------------------------------------------------------------

def test_given_box_description_when_loaded_then_cores_match_hwloc_calc() -> None:
    """Given 2 packages x 2 NUMA nodes x 16 cores x 2 threads, every core, NUMA node and
    package holds the PUs hwloc-calc says it does."""
    topo = Topology.load(BOX)
    assert len(topo.cores) == 2 * 2 * 16
    assert [c.index for c in topo.cores] == list(range(64))
    assert topo.numa_nodes == (0, 1, 2, 3)
    assert topo.packages == (0, 1)
    assert topo.pus == _hwloc_calc(BOX, "all")
    for core in topo.cores:
        assert frozenset(core.pus) == _hwloc_calc(BOX, f"core:{core.index}")
        assert len(core.pus) == 2
    for node in topo.numa_nodes:
        assert _pus_where(topo, numa=node) == _hwloc_calc(BOX, f"numa:{node}")
    for package in topo.packages:
        assert _pus_where(topo, package=package) == _hwloc_calc(BOX, f"pack:{package}")


def test_given_description_without_numa_level_when_loaded_then_one_node_spans_packages() -> None:
    """hwloc inserts one NUMA node at the machine level; cores still know their package."""
    topo = Topology.load("pack:8 core:64 pu:2")
    assert len(topo.cores) == 512
    assert len(topo.pus) == 1024
    assert topo.numa_nodes == (0,)
    assert topo.packages == tuple(range(8))
    assert _pus_where(topo, package=5) == _hwloc_calc("pack:8 core:64 pu:2", "pack:5")


def test_given_restriction_when_loaded_then_only_those_pus_remain_with_their_numa_nodes() -> None:
    topo = Topology.load(BOX, restrict=range(30, 36))
    assert topo.pus == frozenset(range(30, 36))
    assert [(c.index, c.pus, c.numa) for c in topo.cores] == [
        (0, (30, 31), 0), (1, (32, 33), 1), (2, (34, 35), 1)]


def test_given_restriction_outside_the_topology_when_loaded_then_topology_error() -> None:
    with pytest.raises(TopologyError) as info:
        Topology.load(BOX, restrict={500, 501})
    assert str(info.value) == (
        "hwloc could not load synthetic topology 'pack:2 numa:2 core:16 pu:2': "
        "restricting to the cpu list left no PU (errno=EINVAL restrict=500-501)")


def test_given_empty_restriction_when_loaded_then_topology_error() -> None:
    with pytest.raises(TopologyError) as info:
        Topology.load(BOX, restrict=())
    assert str(info.value) == ("hwloc could not load synthetic topology "
                               "'pack:2 numa:2 core:16 pu:2': restricting to no PU at all")


@pytest.mark.parametrize(("desc", "message"), [
    ("pack:2 numa:x", "hwloc could not load synthetic topology 'pack:2 numa:x': "
                      "invalid synthetic description (errno=EINVAL)"),
    # hwloc 2 wants PUs as the last level; "core:2" alone is refused
    ("core:2", "hwloc could not load synthetic topology 'core:2': "
               "invalid synthetic description (errno=EINVAL)"),
    ("", "hwloc could not load synthetic topology '': "
         "invalid synthetic description (errno=EINVAL)"),
    ("core:2\0 pu:2", "hwloc could not load synthetic topology 'core:2\\x00 pu:2': "
                      "the description must be printable ASCII"),
])
def test_given_invalid_synthetic_description_when_loaded_then_error_names_it(
        desc: str, message: str) -> None:
    with pytest.raises(TopologyError) as info:
        Topology.load(desc)
    assert str(info.value) == message


def test_given_topology_when_asked_numa_of_unknown_pus_then_value_error_names_them() -> None:
    topo = Topology.load("core:2 pu:1")
    with pytest.raises(ValueError) as info:
        topo.numa_of_pus({1, 7, 8})
    assert str(info.value) == "PUs 7-8 are not in synthetic topology 'core:2 pu:1' (PUs 0-1)"
    with pytest.raises(ValueError) as info:
        topo.core_of(9)
    assert str(info.value) == "PU 9 is not in synthetic topology 'core:2 pu:1' (PUs 0-1)"


def test_given_cores_without_numa_node_when_asked_mems_then_node_zero() -> None:
    """A kernel without NUMA has exactly node 0, which is what cpuset.mems must name."""
    topo = Topology(cores=(Core(0, (0, 1)), Core(1, (2, 3))))
    assert topo.numa_of_pus({2, 3}) == frozenset({0})
    assert topo.numa_of_pus(()) == frozenset()
    assert topo.core_of(3) == Core(1, (2, 3))


def test_given_a_pu_in_two_cores_when_topology_built_then_value_error() -> None:
    with pytest.raises(ValueError) as info:
        Topology(cores=(Core(0, (0, 1)), Core(1, (1, 2))))
    assert str(info.value) == "PU 1 appears in cores 0 and 1; each PU belongs to one core"


# --- this host ------------------------------------------------------------------------------

def test_given_this_host_when_loaded_then_pus_match_the_kernels_online_cpus() -> None:
    topo = Topology.load()
    assert topo.synthetic is None
    assert topo.name == "this host"
    assert topo.pus == parse_cpulist((SYS_CPU / "online").read_bytes())


def test_given_this_host_when_loaded_then_cores_match_sysfs_thread_siblings() -> None:
    topo = Topology.load()
    for core in topo.cores:
        for pu in core.pus:
            siblings = (SYS_CPU / f"cpu{pu}" / "topology" / "thread_siblings_list").read_bytes()
            assert frozenset(core.pus) == parse_cpulist(siblings)


def test_given_this_host_when_loaded_then_numa_nodes_match_sysfs() -> None:
    topo = Topology.load()
    nodes = sorted(SYS_NODE.glob("node[0-9]*"))
    if not nodes:
        assert topo.numa_of_pus(topo.pus) == frozenset({0})
        return
    for node in nodes:
        cpus = parse_cpulist((node / "cpulist").read_bytes())
        if cpus:
            assert _pus_where(topo, numa=int(node.name[4:])) == cpus


def test_given_host_loaded_twice_when_compared_then_cached_object_until_fresh() -> None:
    first = Topology.load()
    assert Topology.load() is first
    again = Topology.load(fresh=True)
    assert again == first
    assert Topology.load() is again


# --- the bridge -----------------------------------------------------------------------------

def test_given_bridge_not_built_when_loading_then_error_says_how_to_build_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "geco._hwloc_cffi", None)
    with pytest.raises(TopologyError) as info:
        Topology.load(BOX)
    assert str(info.value) == (
        "the hwloc bridge geco._hwloc_cffi is not built: run 'python -m geco._hwloc_build' "
        "in the source tree, or reinstall geco with pip "
        "(cause=import of geco._hwloc_cffi halted; None in sys.modules)")


def test_given_bridge_built_for_other_hwloc_when_loading_then_refused_with_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lib = types.SimpleNamespace(geco_hwloc_build_api=lambda: 0x20800,
                                geco_hwloc_runtime_api=lambda: 0x30000)
    fake = types.ModuleType("geco._hwloc_cffi")
    fake.ffi = None  # type: ignore[attr-defined]
    fake.lib = lib  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "geco._hwloc_cffi", fake)
    with pytest.raises(TopologyError) as info:
        Topology.load(BOX)
    assert str(info.value) == (
        "geco._hwloc_cffi was built against hwloc API 0x20800 but libhwloc 0x30000 is loaded; "
        "rebuild it ('python -m geco._hwloc_build' or reinstall geco)")
