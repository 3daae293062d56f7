"""`geco usage` of a parallel job over three emulated hosts: every host's figures, on the master.

At the job's end each slave host's gecod sends its samples with its answer to the
master's RELEASE; the master keeps them beside its own, so the job's owner reads the
whole job where the job ran its script, and the job's one job-end record has the
efficiency over all hosts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.clusterkit import cluster, submit_pe

pytestmark = pytest.mark.sge

GECO = "/usr/bin/geco"
HOSTS = ["geco-node1", "geco-node2", "geco-node3"]
M = 1 << 20
# On every host of the job (the master's script and a qrsh -inherit task on each other
# host): touch 100M and spend 2 s of CPU.
BURN_EVERYWHERE = """#!/bin/bash
burn='/usr/bin/python3 -c "import time
held = bytearray(100 << 20)
for i in range(0, len(held), 4096): held[i] = 1
while time.process_time() < 2: pass"'
for h in $(awk 'NR > 1 { print $1 }' "$PE_HOSTFILE"); do
  qrsh -inherit "$h" "$burn" &
done
eval "$burn"
wait
"""


def test_a_parallel_jobs_owner_reads_every_hosts_figures_on_the_master(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given a 3-host job (m_mem_free=400M a slot, one slot a host) that touches 100M and
    spends 2 s of CPU on each host, when it has ended, then `geco usage` on the master
    (geco-node1) reports each of the three hosts (1 core and 400M requested, at least
    1.5 s of CPU and a 100M peak) and, for its owner, one line over the whole job; the
    job-end record's efficiency is the whole job's, and every host's samples are named
    in it."""
    job, out = submit_pe(sge, job_owner, "usage-pe", BURN_EVERYWHERE, "-l", "m_mem_free=400M")
    [record] = sge.wait_finished(job, timeout=180)
    assert (record["exit_status"], record["failed"]) == ("0", "0"), (out / "out").read_text()
    [end] = journal.wait_for(JOB_ID=job, GECO_EVENT="job-end")

    as_root = cluster("run", "1", GECO, "usage", str(job), "--json")
    assert as_root.returncode == 0, as_root.stderr
    reports = json.loads(as_root.stdout)
    assert [r["host"] for r in reports] == HOSTS, reports
    for r in reports:
        assert (r["job"], r["owner"], r["running"], r["cores"]) == (
            f"{job}.1", job_owner.name, False, 1), r
        assert r["memory_requested"] == 400 * M, r
        assert r["cpu_seconds"] >= 1.5, r
        assert 100 * M <= r["memory_peak"] < 400 * M, r

    as_owner = cluster("run", "1", "runuser", "-u", job_owner.name, "--", GECO, "usage",
                       str(job))
    assert as_owner.returncode == 0, as_owner.stderr
    for host in HOSTS:
        assert f"job {job}.1 (pe.sh) of {job_owner.name} on {host}: ended" \
            in as_owner.stdout, as_owner.stdout
    [whole] = [line for line in as_owner.stdout.splitlines()
               if line.startswith(f"job {job}.1 on its 3 hosts: ")]
    assert "CPU efficiency " in whole and "memory efficiency " in whole, whole

    assert end["NODES"] == "3"
    assert float(end["MEMORY_EFFICIENCY"]) == pytest.approx(
        100 * sum(r["memory_peak"] for r in reports) / (3 * 400 * M), abs=0.1)
