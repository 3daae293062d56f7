"""`geco rsrcinfo -j` against the live qstat of the real Grid Engine."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

pytestmark = pytest.mark.sge

GECO = "/usr/bin/geco"
M = 1 << 20


def rsrcinfo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GECO, "rsrcinfo", *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})


def test_a_running_job_is_described_from_the_live_qstat(sge: Any, job_dir: Any,
                                                        job_owner: Any) -> None:
    """Given a running `-pe smp 2 -l m_mem_free=100M,h_rt=600 -t 1-2` job, when an admin runs
    `geco rsrcinfo -j JOB.2 --format json`, then it shows task 2 on this host with 2 slots,
    200M of RAM (per slot x slots), the 600 s runtime limit and the owner."""
    job = job_dir.submit("live", "-t", "1-2", "-pe", "smp", "1", "-l",
                         "m_mem_free=100M,h_rt=600", probe="--sleep 20")
    deadline = time.monotonic() + 60
    while not (job_dir.path / f"live.o{job}.2").exists():
        assert time.monotonic() < deadline, "task 2 did not start"
        time.sleep(0.2)
    try:
        out = rsrcinfo("-j", f"{job}.2", "--format", "json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert (doc["job_id"], doc["task_id"], doc["is_array"], doc["owner"]) == (
            job, 2, True, job_owner.name)
        assert doc["runtime_limit"] == 600.0 and doc["cwd"] == str(job_dir.path)
        [node] = doc["nodes"]
        assert (node["name"], node["slots"], node["memory_limit"], node["is_slave"]) == (
            sge.host, 1, 100 * M, False)
    finally:
        subprocess.run(["qdel", str(job)], capture_output=True, timeout=60)
    sge.wait_finished(job, timeout=60, accounting=False)


def test_an_unknown_job_is_a_clear_answer_not_a_trace(sge: Any) -> None:
    out = rsrcinfo("-j", "999999")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("geco rsrcinfo: Grid Engine does not know job 999999 "
                          "(finished, deleted or never submitted) (job=999999)\n")
