"""Nothing unlimited, on the real Grid Engine: a job that requests no memory gets the node's
default per slot ([cgroup] memory_per_slot) and is OOM-killed past it with the usual report,
and all jobs together stay below the node's RAM less the reserve ([cgroup] memory_reserve).

gecod serves and sge_execd runs with the preload, as in test_oom_reports.py; the site
configuration is changed for the test and put back byte for byte.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration import livekit as kit

pytestmark = pytest.mark.sge

M = 1 << 20
# the job's view first (its cgroups, GECO_* and the parent's limit), then 400M touched
SCRIPT = ("/usr/bin/python3 probe.py\n"
          "cat /sys/fs/cgroup/memory/GECO/memory.limit_in_bytes\n"
          "/usr/bin/python3 probe.py --alloc 400\necho \"probe exit $?\"\n")
RESERVE = 256 * M


def test_a_job_without_a_memory_request_gets_the_default_and_is_told_when_it_goes_past_it(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given [cgroup] memory_per_slot = "200M" and memory_reserve = "256M", when a one-slot
    job that requests no memory touches 400M, then it ran with a 200M limit (its cgroup and
    GECO_MEMORY_LIMIT), its job-contained record says the node's default applied, the GECO
    parent held the node's RAM less 256M, the kernel stopped the 400M process, and the owner's
    stderr file says the node's default stopped it and what to request; the job itself
    ends as Grid Engine ends it (exit 0 of its last command)."""
    page = os.sysconf("SC_PAGE_SIZE")
    expected_parent = (os.sysconf("SC_PHYS_PAGES") * page - RESERVE) // page * page
    parent = Path("/sys/fs/cgroup/memory/GECO/memory.limit_in_bytes")
    try:
        with kit.site_settings({("cgroup", "memory_per_slot"): "200M",
                                ("cgroup", "memory_reserve"): "256M"}, gecod=gecod):
            job = job_dir.submit("nomem", script=SCRIPT)
            [record] = sge.wait_finished(job, timeout=120)
            [contained] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-contained")
            [oom] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="oom")
    finally:
        parent.write_text("-1")  # the reserve is this test's: the next ones run without

    lines = job_dir.output("nomem", job).splitlines()
    report = json.loads(lines[0])
    [parent_limit] = [ln for ln in lines if ln.isdigit()]  # the cat; probe.py writes JSON
    [message] = [ln for ln in job_dir.output("nomem", job, stream="e").splitlines()
                 if ln.startswith("geco: job ")]
    assert (record["exit_status"], record["failed"]) == ("0", "0")
    assert lines[-1] == "probe exit 137"
    assert int(report["memory_limit"]) == 200 * M
    assert report["env"]["GECO_MEMORY_LIMIT"] == str(200 * M)
    assert (contained["MEMORY_LIMIT"], contained["MEMORY_DEFAULT"]) == (str(200 * M), "yes")
    assert "this node's default for a job that requests no memory" in contained["MESSAGE"]
    assert int(parent_limit) == expected_parent
    assert oom["LIMIT"] == str(200 * M)
    assert message.startswith(f"geco: job {job} on node {sge.host} used more memory than this "
                              "node gives a job that requests none, and the kernel stopped ")
    assert "(the node's default: 200M per slot x 1 slot)" in message
    assert "Resubmit with a memory request, for example -l m_mem_free=" in message


def test_without_a_node_default_a_job_gets_grid_engines_complex_default(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given no [cgroup] memory default and the queue's h_vmem complex default of 2G
    (integration/sge/setup.sh: a consumable with a default, which Grid Engine books for
    every job that names none and qstat -j never lists), when a one-slot job requests no
    memory, then it runs with RAM+swap (and so RAM) held to that 2G, is told so in
    GECO_VMEM_LIMIT, and its job-contained record says a default applied."""
    with kit.site_settings({("cgroup", "memory_per_slot"): 0, ("cgroup", "vmem_per_slot"): 0},
                           gecod=gecod):
        job = job_dir.submit("complexdefault", probe="")
        [record] = sge.wait_finished(job, timeout=120)
        [contained] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-contained")
    report = job_dir.reports("complexdefault", job)[0]
    assert (record["exit_status"], record["failed"]) == ("0", "0")
    assert int(report["memsw_limit"]) == int(report["memory_limit"]) == 2 << 30
    assert report["env"]["GECO_VMEM_LIMIT"] == str(2 << 30)
    assert (contained["MEMSW_LIMIT"], contained["MEMORY_DEFAULT"]) == (str(2 << 30), "yes")
