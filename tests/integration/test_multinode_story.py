"""A parallel job over three emulated hosts, as its owner and the admin see it while it runs.

``geco status --job`` on the master host shows every host of the job (root asks the
others over the cluster channel; a user, who cannot read the cluster key, is told which
hosts were not shown and why). An OOM kill on a slave host reaches the owner's output
file on the master once, in the words a kill on the master would get, and counts in the
job's one job-end record.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest

from tests.clusterkit import WAIT_ON_EVERY_HOST, cluster, submit_pe
from tests.integration import livekit as kit

pytestmark = pytest.mark.sge

GECO = "/usr/bin/geco"
HOSTS = ["geco-node1", "geco-node2", "geco-node3"]
M = 1024 * 1024


def on_master(*command: str) -> subprocess.CompletedProcess[str]:
    return cluster("run", "1", *command)


def test_geco_status_on_the_master_shows_every_host_of_a_running_parallel_job(
        sge: Any, three_hosts: None, job_owner: Any) -> None:
    """Given a 3-host job whose tasks all run (h_vmem=300M), when root runs `geco status
    --job` on geco-node1, then it shows the job on all three hosts, each with that host's
    core, a 300M RAM+swap limit and its running task; the job's owner running it sees
    geco-node1's figures and is told that geco-node2 and geco-node3 were not shown because
    the cluster key is root's."""
    job, out = submit_pe(sge, job_owner, "story-status", WAIT_ON_EVERY_HOST, "-l", "h_vmem=300M")
    try:
        deadline = time.monotonic() + 120
        while sorted(p.name for p in out.glob("up.*")) != [f"up.{h}" for h in HOSTS]:
            assert time.monotonic() < deadline, list(out.iterdir())
            time.sleep(0.3)
        as_root = on_master(GECO, "status", "--job", str(job), "--json")
        as_owner = on_master("runuser", "-u", job_owner.name, "--", GECO, "status", "--job",
                             str(job))
    finally:
        (out / "go").touch()
    [record] = sge.wait_finished(job, timeout=120)
    ncpu = os.cpu_count() or 1

    assert as_root.returncode == 0, as_root.stderr
    doc = json.loads(as_root.stdout)
    assert sorted(j["host"] for j in doc["jobs"]) == HOSTS, doc
    assert doc["hosts_not_shown"] == []
    for entry in doc["jobs"]:
        k = int(entry["host"].removeprefix("geco-node"))
        assert entry["key"] == f"{job}.1"
        assert entry["cpus"] == str((k - 1) % ncpu)
        assert entry["memory_swap_limit"] == 300 * M
        assert entry["processes"], entry
        assert sorted(entry["hosts"]) == HOSTS
    assert as_owner.returncode == 0, as_owner.stderr
    assert f"job {job}.1 on geco-node1\n" in as_owner.stdout
    assert "  hosts        3: " in as_owner.stdout
    for host in ("geco-node2", "geco-node3"):
        [line] = [x for x in as_owner.stdout.splitlines() if x.startswith(f"{host}: not shown")]
        assert "cluster key" in line and "as root" in line, line
    assert record["exit_status"] == "0"


def test_an_oom_kill_on_a_slave_host_is_told_once_in_the_owners_file_on_the_master(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given a 3-host job with m_mem_free=300M whose task on geco-node2 grows past it, then
    the kernel kills it there, and the owner's output file (on the master, geco-node1) says
    so exactly once, naming geco-node2 and the limit, as a kill on the master would; the
    master's gecod journals oom-relayed, and the job's one job-end counts the kill.
    (m_mem_free, which only geco enforces: with h_vmem, Grid Engine's own usage check may
    end the whole job first on a slow machine, failed 37, before the kernel's kill.)"""
    job, out = submit_pe(sge, job_owner, "story-oom", """#!/bin/bash
qrsh -inherit geco-node2 'tail /dev/zero'
echo "task on geco-node2 ended with $?"
""", "-l", "m_mem_free=300M")
    [record] = sge.wait_finished(job, timeout=180)
    [relayed] = journal.wait_for(30, JOB_ID=job, GECO_EVENT="oom-relayed")
    [end] = journal.wait_for(JOB_ID=job, GECO_EVENT="job-end")
    text = (out / "out").read_text()

    assert record["exit_status"] == "0", text
    [oom] = journal.wait_for(JOB_ID=job, GECO_EVENT="oom")
    assert oom["NODE"] == "geco-node2"
    assert text.count("geco: job") == 1, text
    assert text.count("on node geco-node2 used more memory than it requested and the kernel "
                      "stopped") == 1, text
    assert "limit: 300M" in text, text
    assert relayed["PEER"].startswith("10.77.2.11:")
    assert end["JOB_OOM_KILLS"] == "1"
    assert json.loads(end["NODE_FIGURES"])["geco-node2"]["oom_kills"] == 1


# run on every host of the job: its GPUs as it is told them and as the kernel lets it open
GPU_TASK = kit.OPEN_VERDICT + """import socket
print("gpus", socket.gethostname(), os.environ.get("GECO_GPUS"),
      os.environ.get("CUDA_VISIBLE_DEVICES"),
      *(verdict(f"/run/geco-test-cluster/dev/gpu{i}") for i in (0, 1)))
"""


def test_every_host_of_a_parallel_job_gives_its_task_only_the_gpus_it_picked_there(
        sge: Any, three_hosts: None, job_owner: Any) -> None:
    """Given hosts with two GPUs each and a queue booking one per host (Son of Grid Engine's
    count: geco picks the ids on each host from the state its master PREPAREd), when a
    3-host job asks -l gpu=1 (one per slot), then every task, the master's and the two
    `qrsh -inherit` ones, is told GPU 0 of its host (CUDA's 0) and opens it (ENXIO: no
    driver) while the kernel refuses it the other (EPERM)."""
    job, out = submit_pe(sge, job_owner, "story-gpus", f"""#!/bin/bash
cat > gpus.py <<'EOF'
{GPU_TASK}EOF
python3 gpus.py
for h in $(awk 'NR > 1 {{ print $1 }}' "$PE_HOSTFILE"); do
  qrsh -inherit "$h" "cd $PWD && python3 gpus.py" &
done
wait
""", "-l", "gpu=1")
    [record] = sge.wait_finished(job, timeout=180)
    text = (out / "out").read_text()
    tasks = {line.split()[1]: line.split()[2:] for line in text.splitlines()
             if line.startswith("gpus ")}
    assert record["exit_status"] == "0", text
    assert tasks == {h: ["0", "0", "ENXIO", "EPERM"] for h in HOSTS}, text
