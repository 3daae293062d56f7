"""A job's task limit (pids.max): the rule in the configuration, what a job gets, where it
lands on cgroup v2, and how `geco status --job` shows it.

The kernel's side (a fork past pids.max fails; the v1 pids hierarchy) is in
tests/system/test_pids_limit.py; a fork bomb under the real Grid Engine in
tests/integration/test_fork_bomb.py. cgroup v2 is a fake cgroup2 tree here (the
files a real cgroupfs shows, made up front), as in test_cgroup_delegation.py.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from geco import config
from geco.cgroup import Limits, V2Backend
from geco.config import Config
from geco.job import containment
from geco.jobkey import JobKey
from geco.node.limits import PidsLimit, Rules, pids_unenforced
from geco.node.topology import Topology
from geco.reports.jobstatus import JobStatus, Process, format_table, to_dict
from geco.resourceset import NodeResources

# -- the rule ------------------------------------------------------------------


def test_the_defaults_give_a_small_job_the_floor_and_a_big_one_1024_per_slot() -> None:
    """Given the shipped defaults (1024 per slot, at least 4096), then 1 to 4 slots get
    4096, 8 slots 8192 and 128 slots 131072."""
    rule = PidsLimit.from_config(Config())
    assert rule == PidsLimit(per_slot=1024, minimum=4096)
    assert [rule.for_slots(n) for n in (1, 2, 4, 5, 8, 128)] == [
        4096, 4096, 4096, 5120, 8192, 131072]


@pytest.mark.parametrize(("per_slot", "minimum", "slots", "limit"), [
    (0, 4096, 8, 0),          # pids_per_slot = 0: no limit, whatever the floor
    (100, 0, 3, 300),         # no floor
    (100, 250, 2, 250),       # the floor wins
    (100, 250, 3, 300),       # the slots win
    (100, 0, 0, 100),         # no slots here still means one slot's worth, never "none"
    (1 << 20, 0, 4, 1 << 22),  # exactly what a pid namespace can hold: kept
    (1 << 20, 0, 5, 0),       # beyond it (the kernel would refuse it): no limit
])
def test_the_limit_is_per_slot_times_slots_at_least_the_floor(
        per_slot: int, minimum: int, slots: int, limit: int) -> None:
    assert PidsLimit(per_slot, minimum).for_slots(slots) == limit


def test_the_rule_is_read_from_the_cgroup_section(tmp_path: Path) -> None:
    path = tmp_path / "geco.toml"
    path.write_text("[cgroup]\npids_per_slot = 64\npids_min = 128\n")
    assert PidsLimit.from_config(config.load(path)) == PidsLimit(64, 128)


@pytest.mark.parametrize(("value", "shown"), [("-1", "-1"), ('"lots"', "'lots'"),
                                              ("1.5", "1.5"), ("true", "True")])
def test_a_bad_value_is_logged_and_the_default_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, value: str, shown: str) -> None:
    path = tmp_path / "geco.toml"
    path.write_text(f"[cgroup]\npids_per_slot = {value}\n")
    with caplog.at_level(logging.WARNING, logger="geco.config"):
        cfg = config.load(path)
    assert cfg.pids_per_slot == 1024
    assert caplog.messages == [f"config {path}: cgroup.pids_per_slot must be a whole number "
                               f">= 0, got {shown}; using the default 1024"]


# -- cgroup v2 (a fake cgroup2 tree) ---------------------------------------------------


class FakeCgroup2(V2Backend):
    """V2Backend on a fake cgroup2 tree: a new job directory gets the interface files a
    real cgroupfs makes in a new cgroup (a plain mkdir makes none)."""

    def create(self, key: str, limits: Limits) -> None:
        d = self.base / key
        if not d.exists():
            d.mkdir()
            for name, value in (("cpuset.cpus", ""), ("cpuset.mems", ""),
                                ("memory.max", "max"), ("pids.max", "max"),
                                ("cgroup.procs", "")):
                (d / name).write_text(f"{value}\n")
        super().create(key, limits)


def fake_cgroup2(mount: Path, jobs: list[str]) -> FakeCgroup2:
    """A cgroup2 mount with cpuset, memory and pids, its base GECO and the jobs ``jobs``."""
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset memory pids\n")
    base = mount / "GECO"
    base.mkdir()
    (base / "cpuset.cpus.effective").write_text("0-3\n")
    (base / "cpuset.mems.effective").write_text("0\n")
    backend = FakeCgroup2(mount, "GECO", proc=mount.parent / "proc")
    for key in jobs:
        backend.create(key, Limits())
    return backend


def test_given_cgroup2_when_a_job_is_contained_then_its_pids_max_is_the_rule_for_its_slots(
        tmp_path: Path) -> None:
    """Given [cgroup] pids_per_slot = 100, pids_min = 250 and a 3-slot job on a cgroup2
    node, when contained (the path the prolog and gecod share), then its pids.max holds
    300 and the limits read back say so."""
    backend = fake_cgroup2(tmp_path / "cg", [])
    limits = containment.contain(
        "42.1", NodeResources("n001", slots=3), backend, state_dir=tmp_path / "state",
        rules=Rules(PidsLimit(100, 250)), topology=Topology.load("core:4 pu:1"))
    assert limits.pids == 300
    assert (tmp_path / "cg" / "GECO" / "42.1" / "pids.max").read_text().strip() == "300"
    assert backend.read_limits("42.1").pids == 300


def test_given_cgroup2_and_pids_per_slot_0_when_contained_then_pids_max_says_max(
        tmp_path: Path) -> None:
    backend = fake_cgroup2(tmp_path / "cg", [])
    containment.contain("42.1", NodeResources("n001", slots=1), backend,
                        state_dir=tmp_path / "state", rules=Rules(PidsLimit(0, 4096)),
                        topology=Topology.load("core:4 pu:1"))
    assert (tmp_path / "cg" / "GECO" / "42.1" / "pids.max").read_text().strip() == "max"
    assert backend.read_limits("42.1").pids == 0


def test_given_cgroup2_then_the_tasks_now_at_peak_and_refused_are_its_usage(
        tmp_path: Path) -> None:
    backend = fake_cgroup2(tmp_path / "cg", ["42.1"])
    d = tmp_path / "cg" / "GECO" / "42.1"
    (d / "pids.current").write_text("128\n")
    (d / "pids.peak").write_text("128\n")
    (d / "pids.events").write_text("max 5012\n")
    usage = backend.usage("42.1")
    assert (usage["pids_current"], usage["pids_peak"], usage["pids_max_events"]) == (
        128, 128, 5012)


# -- a node where the limit cannot be enforced ---------------------------------------


@dataclasses.dataclass
class Node:
    version: int
    controllers: tuple[str, ...]


@pytest.mark.parametrize(("version", "where"), [(1, "mounted (cgroup v1)"),
                                                (2, "available (cgroup v2)")])
def test_without_the_pids_controller_the_node_says_the_limit_is_not_enforced(
        version: int, where: str) -> None:
    node = Node(version, ("cpuset", "memory"))
    assert pids_unenforced(node, PidsLimit(1024, 4096)) == (  # type: ignore[arg-type]
        f"the pids controller is not {where}: the task limit ([cgroup] pids_per_slot) is "
        "not enforced on this node")


def test_with_the_pids_controller_or_no_limit_asked_there_is_nothing_to_say() -> None:
    assert pids_unenforced(Node(1, ("cpuset", "memory", "pids")),  # type: ignore[arg-type]
                           PidsLimit(1024, 4096)) == ""
    assert pids_unenforced(Node(2, ("cpuset", "memory")),  # type: ignore[arg-type]
                           PidsLimit(0, 4096)) == ""


# -- geco status --job -----------------------------------------------------------------

BOMBED = JobStatus(
    key=JobKey(42, 1), host="n001", owner="mallory", job_name="bomb.sh", cpus="1", mems="0",
    memory_limit=0, memory_swap_limit=0, memory_current=1 << 20, memory_peak=1 << 20,
    cpu_user=1.0, cpu_system=2.0, oom_kills=0, pids_limit=4096, pids_current=4096,
    pids_peak=4096, pids_refused=123456, processes=(Process(7, "bomb"),),
    running_for=10.0, runtime_limit=0.0)


def test_a_job_at_its_task_limit_shows_the_limit_and_the_forks_refused() -> None:
    """Given a fork bomb held at its limit, then `geco status --job` shows its tasks, the
    limit and how many forks the limit refused, text and JSON alike."""
    [tasks] = [line for line in format_table(BOMBED).split("\n")
               if line.startswith("  tasks ")]
    assert tasks == ("  tasks        4096 now, peak 4096, limit 4096; 123456 fork(s) refused "
                     "at the limit")
    doc = to_dict(BOMBED)
    assert (doc["pids_limit"], doc["pids_current"], doc["pids_peak"], doc["pids_refused"]) == (
        4096, 4096, 4096, 123456)


def test_a_kernel_without_pids_peak_shows_now_and_the_limit() -> None:
    st = dataclasses.replace(BOMBED, pids_current=3, pids_peak=None, pids_refused=None,
                             pids_limit=0)
    assert "  tasks        3 now, limit none" in format_table(st).split("\n")


def test_limits_keep_the_task_limit_they_were_given() -> None:
    assert Limits(pids=300).pids == 300
