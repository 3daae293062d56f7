"""A job's task limit on this machine's real cgroup v1 hierarchies: the rule of the
configuration lands in the job's pids.max through containment.contain (the path the
prolog and gecod share), and the kernel holds a fork loop at it.

Every test works in its own parent ``geco-test-<pid>-<n>`` (tests/cgroup_testkit.py),
removed afterwards with plain syscalls. cgroup v2 is covered by
tests/unit/test_pids_rule.py (a fake tree) and tests/vm/test_cgroup_v2.py (the kernel).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from geco.cgroup import V1Backend, find_hierarchies, parse_mountinfo
from geco.cgroup import _base as cgroup_base
from geco.config import Config
from geco.job.containment import contain
from geco.node.limits import PidsLimit, Rules, pids_unenforced
from geco.reports import jobstatus
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge.resourcefile import write as write_resources
from tests.cgroup_testkit import (
    Child,
    eventually,
    fork_forever,
    read,
    usable_v1_hierarchies,
    v1_backend,
)

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]
needs_pids = pytest.mark.skipif("pids" not in HIER,
                                reason="the pids controller is not mounted on this machine")
RULE = PidsLimit(per_slot=16, minimum=24)


@pytest.fixture
def backend() -> Iterator[V1Backend]:
    with v1_backend(HIER, exclusive_cpus=False) as b:
        yield b


def contain_child(backend: V1Backend, key: str, slots: int, children: list[int],
                  tmp_path: Path, rule: PidsLimit = RULE) -> Child:
    """Fork a fork loop, contain it as job ``key`` with ``slots`` slots, let it run."""
    child = Child(fork_forever, children)
    contain(key, NodeResources(short_hostname(), slots=slots), backend,
            state_dir=tmp_path / "state", rules=Rules(rule), pid=child.pid)
    child.go()
    return child


@needs_pids
def test_given_a_one_slot_job_when_it_forks_forever_then_the_kernel_holds_it_at_the_floor(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given [cgroup] pids_per_slot = 16, pids_min = 24 and a 1-slot job, when its process
    forks without end, then its pids.max is 24, it never has more than 24 tasks, the kernel
    counts the refused forks, and the backend reports both."""
    contain_child(backend, "20.1", 1, children, tmp_path)
    d = backend.paths("20.1")["pids"]

    assert read(d / "pids.max") == "24"
    assert eventually(lambda: len(backend.pids("20.1")) == 24)
    assert eventually(lambda: backend.usage("20.1").get("pids_max_events", 0) > 0)
    usage = backend.usage("20.1")
    assert usage["pids_current"] == 24 == len(backend.pids("20.1"))
    assert usage.get("pids_peak", 24) == 24  # pids.peak: newer kernels only
    assert backend.read_limits("20.1").pids == 24


@needs_pids
def test_given_a_two_slot_job_then_its_limit_is_16_per_slot_above_the_floor(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    if len(backend.available_cpus().replace("-", ",").split(",")) < 2:
        pytest.skip("this machine has fewer than 2 cpus")
    contain_child(backend, "21.1", 2, children, tmp_path)
    assert read(backend.paths("21.1")["pids"] / "pids.max") == "32"
    assert eventually(lambda: len(backend.pids("21.1")) == 32)


@needs_pids
def test_given_a_job_at_its_limit_then_geco_status_shows_tasks_limit_and_refused_forks(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """What `geco status --job` reads for a fork bomb held at its limit (the real files)."""
    cfg = Config(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool")
    write_resources(cfg.resources_dir, ResourceSet(
        23, 1, owner="mallory", job_name="bomb", nodes=(NodeResources(short_hostname()),)))
    contain_child(backend, "23.1", 1, children, tmp_path)
    assert eventually(lambda: backend.usage("23.1").get("pids_max_events", 0) > 0)

    st = jobstatus.read(cfg, backend, "23.1")

    assert (st.pids_limit, st.pids_current) == (24, 24)
    assert st.pids_refused is not None and st.pids_refused > 0
    [tasks] = [line for line in jobstatus.format_table(st).split("\n")
               if line.startswith("  tasks ")]
    assert tasks.startswith("  tasks        24 now, ") and ", limit 24; " in tasks
    assert st.notes == ()


def test_given_no_pids_hierarchy_when_a_job_asks_for_a_limit_then_a_warning_once_and_status_says_so(
        children: list[int], tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a node whose pids controller is not mounted (the backend without that
    hierarchy), when two jobs are contained, then they run without a task limit, one
    warning names the fix, and `geco status --job` notes that the limit is not enforced."""
    monkeypatch.setattr(cgroup_base, "_warned", set())
    without = {c: h for c, h in HIER.items() if c != "pids"}
    cfg = Config(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool")
    with v1_backend(without, exclusive_cpus=False) as b, \
            caplog.at_level(logging.WARNING, logger="geco.cgroup"):
        for key in ("24.1", "24.2"):
            child = Child(lambda out: None, children)
            limits = contain(key, NodeResources(short_hostname()), b,
                             state_dir=tmp_path / "state", rules=Rules(RULE), pid=child.pid)
            assert limits.pids == 24  # asked for, but nothing can enforce it here
            assert b.read_limits(key).pids == 0
        st = jobstatus.read(cfg, b, "24.1")
    assert [r.getMessage() for r in caplog.records if r.name == "geco.cgroup._base"] == [
        "the pids controller is not mounted: task limits (pids.max, [cgroup] pids_per_slot) "
        "are not enforced on this node; mount it (cgroup v1 pids hierarchy) to have them"]
    assert pids_unenforced(b, RULE) in st.notes
    assert st.pids_limit == 0 and st.pids_current is None
