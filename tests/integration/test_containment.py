"""Jobs on the real single-host Grid Engine are contained by geco's hooks.

Every job here is submitted by the unprivileged test user to the queue whose
prolog, epilog and starter_method are geco's (as installed by
``scripts/install.sh``). The job payload ``probe.py`` reports, from inside the
job, what the kernel says: its cgroups, the CPUs it may run on, its memory
limits, and the ``GECO_*`` facts the starter exported.

The node has as many slots as cores, so whole-core binding is visible: two
one-slot jobs get one core each, a two-slot job gets both.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from geco.node.topology import Topology

pytestmark = pytest.mark.sge

GECO_CGROUPS = {c: Path("/sys/fs/cgroup") / c / "GECO" for c in ("cpuset", "memory", "freezer")}
M = 1 << 20


def host_cores() -> list[frozenset[int]]:
    """The PUs of each core of this host, per hwloc."""
    return [frozenset(core.pus) for core in Topology.load().cores]


def assert_contained(report: dict[str, Any], key: str) -> None:
    for controller in ("cpuset", "memory", "freezer"):
        assert report["cgroups"][controller] == f"/GECO/{key}", (controller, report["cgroups"])


def whole_cores(cpus: list[int]) -> list[frozenset[int]]:
    """The cores that ``cpus`` consists of; fails unless it is made of whole cores only."""
    cores = [c for c in host_cores() if c & set(cpus)]
    assert set().union(*cores) == set(cpus), f"{cpus} is not a set of whole cores"
    return cores


def test_serial_job_runs_in_its_own_cgroups_on_one_whole_core_with_its_memory_limit(
        sge: Any, job_dir: Any) -> None:
    """Given a serial job requesting m_mem_free=300M, when it runs, then from inside it
    sees its own cgroups GECO/<job>.1, exactly one whole core, a 300M RAM limit, and the
    same facts in GECO_* variables; it exits 0 and its stderr is empty."""
    job = job_dir.submit("serial", "-l", "m_mem_free=300M")
    [record] = sge.wait_finished(job, timeout=90)
    first = job_dir.reports("serial", job)[0]

    assert (record["exit_status"], record["failed"]) == ("0", "0")
    assert job_dir.output("serial", job, stream="e") == ""
    assert_contained(first, f"{job}.1")
    assert len(whole_cores(first["cpus"])) == 1
    assert int(first["memory_limit"]) == 300 * M
    assert first["env"]["GECO_NCPUS"] == str(len(first["cpus"]))
    assert first["env"]["GECO_MEMORY_LIMIT"] == str(300 * M)
    assert first["env"]["GECO_NODE"] == os.uname().nodename


def test_pe_smp_2_job_gets_two_whole_cores(sge: Any, job_dir: Any) -> None:
    job = job_dir.submit("smp", "-pe", "smp", "2")
    [record] = sge.wait_finished(job, timeout=90)
    first = job_dir.reports("smp", job)[0]

    assert record["exit_status"] == "0"
    assert_contained(first, f"{job}.1")
    assert len(whole_cores(first["cpus"])) == 2


def test_concurrent_array_tasks_get_distinct_cgroups_and_disjoint_cores(
        sge: Any, job_dir: Any) -> None:
    """Given a 2-task array job whose tasks overlap in time, then each task has its own
    cgroups and the two core sets do not intersect."""
    job = job_dir.submit("array", "-t", "1-2", probe="--sleep 4")
    records = sge.wait_finished(job, timeout=120)
    tasks = {t: job_dir.reports("array", job, t) for t in (1, 2)}

    assert sorted(r["exit_status"] for r in records) == ["0", "0"]
    one, two = tasks[1][0], tasks[2][0]
    assert_contained(one, f"{job}.1")
    assert_contained(two, f"{job}.2")
    # both ran at the same time: each started before the other finished
    assert one["start"] < tasks[2][-1]["done"] and two["start"] < tasks[1][-1]["done"]
    assert not set(one["cpus"]) & set(two["cpus"])


def test_job_over_its_m_mem_free_is_killed_by_the_kernel_and_its_neighbour_is_untouched(
        sge: Any, job_dir: Any) -> None:
    """Given a job with m_mem_free=200M that touches 400M and a neighbour job running at
    the same time, then the kernel kills the hog's allocating process (SIGKILL: 137 as seen
    by the job's shell) while the neighbour allocates its 100M and finishes normally."""
    neighbour = job_dir.submit("neighbour", "-l", "m_mem_free=300M",
                               probe="--alloc 100 --sleep 4")
    hog = job_dir.submit("hog", "-l", "m_mem_free=200M",
                      script="/usr/bin/python3 probe.py --alloc 400\necho \"probe exit $?\"\n")
    [hog_record] = sge.wait_finished(hog, timeout=120)
    [neighbour_record] = sge.wait_finished(neighbour, timeout=120)
    hog_out = job_dir.output("hog", hog)

    assert hog_out.splitlines()[-1] == "probe exit 137"
    assert "allocated_mib" not in hog_out
    assert int(json.loads(hog_out.splitlines()[0])["memory_limit"]) == 200 * M
    assert hog_record["failed"] == "0"  # the job's shell survived: only the hog was killed
    assert neighbour_record["exit_status"] == "0"
    assert [r.get("allocated_mib") for r in job_dir.reports("neighbour", neighbour)][1] == 100


def test_h_vmem_sets_the_ram_plus_swap_limit_to_h_vmem_times_slots(
        sge: Any, job_dir: Any) -> None:
    """Given -l h_vmem=300M -pe smp 2, then memory+swap is limited to 600M (h_vmem is per
    slot), and RAM cannot exceed it either."""
    job = job_dir.submit("vmem", "-l", "h_vmem=300M", "-pe", "smp", "2")
    [record] = sge.wait_finished(job, timeout=90)
    first = job_dir.reports("vmem", job)[0]

    assert record["exit_status"] == "0"
    assert int(first["memsw_limit"]) == 600 * M
    assert int(first["memory_limit"]) <= 600 * M
    assert first["env"]["GECO_VMEM_LIMIT"] == str(600 * M)


def test_after_all_jobs_nothing_is_left_behind(
        sge: Any, job_dir: Any, job_owner: Any) -> None:
    """Given every job of this module has ended, then no GECO/<job>.* cgroup, no process of
    the test user and no resource file of these jobs remains, and no queue is in error."""
    assert job_dir.ids, "run with the other tests of this module"
    deadline = time.monotonic() + 30
    while any(sge.is_known(j) for j in job_dir.ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = sorted(str(p) for root in GECO_CGROUPS.values() if root.is_dir()
                  for p in root.iterdir() if p.is_dir() and p.name.split(".")[0] in
                  {str(j) for j in job_dir.ids})
    processes = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                 and _uid(p) == job_owner.uid]
    resources = sorted(p.name for p in Path("/var/lib/geco/resources").glob("*")
                       if p.name.split(".")[0] in {str(j) for j in job_dir.ids})

    assert left == []
    assert processes == []
    assert resources == []
    assert {q: s for q, s in sge.queue_states().items() if "E" in s} == {}


def _uid(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None
