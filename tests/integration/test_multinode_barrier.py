"""Parallel jobs over three emulated hosts: all set up at once or none, one qstat per job.

``integration/cluster/cluster.sh up 3`` gives three execution hosts (own hostname,
network, execd, gecod, cgroup parent, one cluster key) on the real Grid Engine, and a
qstat that counts its calls. A ``-pe`` job gets one slot on each host; its master is
geco-node1 (``-masterq``). The prolog there asks qstat once and PREPAREs the other two
hosts over TCP; each `qrsh -inherit` task then lands in its host's cgroups, built from
the master's resource set. A host whose gecod is down gets the job re-queued with
nothing of it left anywhere. A forged, replayed or misdirected request is refused and
journaled.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from geco.resourceset import NodeResources, ResourceSet
from geco.sge import v1format
from geco.wire.frame import decode, encode
from geco.wire.messages import (
    CLUSTER_MAX_PAYLOAD,
    Ack,
    AckStatus,
    MsgType,
    NodeRequest,
    StatusReply,
)
from tests.clusterkit import QUEUE, cluster, exchange_from, submit_pe

pytestmark = pytest.mark.sge

STATE = Path("/run/geco-test-cluster")
PORT = 6446
M = 1024 * 1024

# run on every host of the job: where the task is, its cgroups, its cores, its RAM+swap cap
TASK = ('echo "task $(hostname) $(grep Cpus_allowed_list /proc/self/status | cut -f2)'
        ' $(grep :memory: /proc/self/cgroup | cut -d: -f3)'
        ' $(cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)'
        '/memory.memsw.limit_in_bytes)"')
SCRIPT = f"""#!/bin/bash
{TASK}
for h in $(awk 'NR > 1 {{ print $1 }}' "$PE_HOSTFILE"); do
  qrsh -inherit "$h" '{TASK}' &
done
wait
"""


def submit(sge: Any, owner: Any, name: str, *extra: str) -> tuple[int, Path]:
    job, out = submit_pe(sge, owner, name, SCRIPT, *extra)
    return job, out / "out"


def qstat_calls(job: int) -> list[str]:
    return [line for line in (STATE / "qstat.log").read_text().splitlines()
            if str(job) in line.split()]


def job_cgroups(job: int) -> list[Path]:
    return list(Path("/sys/fs/cgroup").glob(f"*/geco-test-node*/{job}.1"))


def state_of(job: int) -> str:
    for line in subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True,
                               check=False).stdout.splitlines():
        cols = line.split()
        if cols[:1] == [str(job)]:
            return cols[4]
    return ""


def test_a_parallel_job_runs_on_three_hosts_each_contained_with_one_qstat(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given a -pe job of 3 slots with h_vmem=300M over the three hosts, then every task
    (the master's and the two `qrsh -inherit` ones) runs in its own host's job cgroups with
    that host's core and a 300M RAM+swap cap; qstat was asked once for the whole job; the
    slaves were prepared before the job started, and the master's record says what each
    made; and the job ends with one job-end record
    carrying every host's figures."""
    job, out = submit(sge, job_owner, "barrier", "-l", "h_vmem=300M")
    [record] = sge.wait_finished(job, timeout=180)
    tasks = {line.split()[1]: line.split()[2:] for line in out.read_text().splitlines()
             if line.startswith("task ")}
    ncpu = os.cpu_count() or 1

    assert record["exit_status"] == "0", out.read_text()
    assert sorted(tasks) == ["geco-node1", "geco-node2", "geco-node3"], out.read_text()
    for host, (cpus, cgroup, memsw) in tasks.items():
        k = int(host.removeprefix("geco-node"))
        assert cpus == str((k - 1) % ncpu)
        assert cgroup == f"/geco-test-node{k}/{job}.1"
        assert int(memsw) == 300 * M
    assert len(qstat_calls(job)) == 1, qstat_calls(job)
    [prepared] = journal.wait_for(JOB_ID=job, GECO_EVENT="job-prepared",
                                  SYSLOG_IDENTIFIER="geco-prolog")
    assert sorted(prepared["SLAVE_HOSTS"].split()) == ["geco-node2", "geco-node3"]
    # each slave's READY said the core and the cap its task then saw
    made = json.loads(prepared["NODE_LIMITS"])
    assert {host: (limits["cpus"], limits["memory_swap"]) for host, limits in made.items()} \
        == {host: (tasks[host][0], int(tasks[host][2])) for host in ("geco-node2", "geco-node3")}
    [end] = journal.wait_for(JOB_ID=job, GECO_EVENT="job-end")
    assert end["NODES"] == "3" and "NODES_MISSING" not in end
    figures = json.loads(end["NODE_FIGURES"])
    assert sorted(figures) == ["geco-node1", "geco-node2", "geco-node3"]
    assert all(f["memory_peak"] > 0 for f in figures.values())
    assert int(end["JOB_MEMORY_PEAK_MAX"]) == max(f["memory_peak"] for f in figures.values())
    assert job_cgroups(job) == []


def test_a_host_whose_gecod_is_down_gets_the_job_requeued_with_nothing_left(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given geco-node3's gecod stopped, when a 3-host job is submitted, then its prolog on
    geco-node1 journals that geco-node3 did not prepare it, the job is re-queued (not in
    error) within 15 s, no cgroup of it is left on any host and no queue is in error. With
    the gecod started again, a new job over the three hosts runs. (Grid Engine itself holds
    a re-queued parallel job for minutes, "until clean up of a previous run has
    finished", when the queue has an epilog: the re-queued one is deleted.)"""
    stopped = cluster("stop-gecod", "3")
    assert stopped.returncode == 0, stopped.stderr
    try:
        job, _ = submit(sge, job_owner, "barrier-down")
        [failed] = journal.wait_for(60, JOB_ID=job, GECO_EVENT="barrier-failed")
        noticed = time.monotonic()
        while "q" not in state_of(job) or "R" not in state_of(job):
            assert time.monotonic() - noticed < 15, state_of(job)
            time.sleep(0.2)
        assert failed["NODE"] == "geco-node3" and failed["STATUS"] == "unreachable"
        [done] = journal.wait_for(JOB_ID=job, GECO_EVENT="prolog-done")
        assert done["EXIT_STATUS"] == "99"
        assert job_cgroups(job) == []
        assert not any("E" in st for st in sge.queue_states().values())
        assert not (Path("/var/lib/geco-test-node2/resources") / f"{job}.1").exists()
    finally:
        started = cluster("start-gecod", "3")
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
    assert started.returncode == 0, started.stderr
    again, out = submit(sge, job_owner, "barrier-up")
    [record] = sge.wait_finished(again, timeout=180)
    assert record["exit_status"] == "0"
    assert sorted(line.split()[1] for line in out.read_text().splitlines()
                  if line.startswith("task ")) == ["geco-node1", "geco-node2", "geco-node3"]


def send(frame: bytes, host: str = "10.77.2.11") -> bytes:
    """``frame`` to ``host``'s cluster channel from geco-node1, one of the cluster's hosts."""
    return exchange_from(1, frame, host)


@pytest.mark.parametrize("case", ["forged", "replayed", "wrong-host"])
def test_a_forged_replayed_or_misdirected_prepare_is_refused_and_journaled(
        journal: Any, three_hosts: None, case: str) -> None:
    """Given geco-node2's cluster channel, when it gets a PREPARE MAC'd with another key, the
    same valid PREPARE a second time, or one addressed to geco-node3, then it answers with a
    BAD_REQUEST ACK (no NODE_REPLY), journals cluster-refused with the reason, and makes
    no cgroup for the job (the one valid PREPARE's is ABORTed by the test)."""
    key = (STATE / "cluster.key").read_bytes()
    job = 990000 + {"forged": 1, "replayed": 2, "wrong-host": 3}[case]
    host = "geco-node3" if case == "wrong-host" else "geco-node2"
    rs = ResourceSet(job, 1, owner="root", nodes=(NodeResources("geco-node1"),
                                                  NodeResources(host, is_slave=True)))
    frame = encode(MsgType.PREPARE, NodeRequest(job, 1, host, v1format.serialize(rs)),
                   os.urandom(32) if case == "forged" else key)
    if case == "replayed":
        first = decode(send(frame), key, max_payload=CLUSTER_MAX_PAYLOAD)
        assert first.type is MsgType.NODE_REPLY
        assert StatusReply.unpack(first.payload).document["status"] == "ready"
    try:
        reply = decode(send(frame), key)
    finally:
        if case == "replayed":
            send(encode(MsgType.ABORT, NodeRequest(job, 1, host), key))
    reason = {"forged": "mac", "replayed": "nonce", "wrong-host": "host"}[case]

    assert job_cgroups(job) == []
    assert reply.type is MsgType.ACK
    assert Ack.unpack(reply.payload).status is AckStatus.BAD_REQUEST
    # a forged frame's job is only claimed: it never enters that job's story
    field = "CLAIMED_JOB_ID" if case == "forged" else "JOB_ID"
    [refused] = journal.wait_for(**{field: job}, GECO_EVENT="cluster-refused")
    assert refused["REASON"] == reason
    assert refused["PEER"].startswith("10.77.1.11:")
    if case == "forged":
        assert "JOB_ID" not in refused


def test_a_task_of_a_job_no_master_prepared_is_refused_on_a_slave_host(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given the cluster queue without geco's prolog (so no host is prepared), when the job
    starts its `qrsh -inherit` tasks, then the slave hosts refuse them ([cluster] slaves =
    "strict"), saying the job was not prepared there, and ask no qstat for them."""
    subprocess.run(["qconf", "-mattr", "queue", "prolog", "NONE", QUEUE], check=True,
                   capture_output=True)
    try:
        job, _ = submit(sge, job_owner, "barrier-strict")
        refusals: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(refusals) < 2 and time.monotonic() < deadline:
            refusals = [e for e in journal.entries(JOB_ID=job, GECO_EVENT="quarantine-refused")
                        if "was not prepared on this host" in e["MESSAGE"]]
            time.sleep(0.2)
    finally:
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
        subprocess.run(["qconf", "-mattr", "queue", "prolog",
                        "root@/usr/libexec/geco/prolog $job_id $ja_task_id", QUEUE],
                       check=True, capture_output=True)
    hosts = [re.search(r"on this host \((\S+)\)", e["MESSAGE"]) for e in refusals]
    assert sorted(h[1] for h in hosts if h) == ["geco-node2", "geco-node3"], refusals
    assert [c.split()[0] for c in qstat_calls(job)] == ["geco-node1"]


def test_a_slave_whose_gecod_is_down_at_the_end_is_named_missing_and_its_reaper_cleans_up(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given a 3-host job running (all hosts prepared), when geco-node3's gecod stops before
    the job ends, then the job's one job-end record names geco-node3 as missing and holds
    the other two hosts' figures; once that gecod runs again, its reaper removes the job's
    cgroups there."""
    job, out = submit_pe(sge, job_owner, "barrier-end",
                         "#!/bin/bash\nwhile [ ! -e go ]; do sleep 0.2; done\n",
                         output="/dev/null")
    try:
        journal.wait_for(60, JOB_ID=job, GECO_EVENT="job-prepared",
                         SYSLOG_IDENTIFIER="geco-prolog")
        assert cluster("stop-gecod", "3").returncode == 0
        (out / "go").touch()
        [record] = sge.wait_finished(job, timeout=120)
        [end] = journal.wait_for(JOB_ID=job, GECO_EVENT="job-end")
    finally:
        started = cluster("start-gecod", "3")
    assert started.returncode == 0, started.stderr
    assert record["exit_status"] == "0"
    assert end["NODES"] == "3" and end["NODES_MISSING"] == "geco-node3"
    assert sorted(json.loads(end["NODE_FIGURES"])) == ["geco-node1", "geco-node2"]
    # the cluster's reaper_interval is 10 s: a round every 10 s, cgroups judged after 20 s
    deadline = time.monotonic() + 90
    while job_cgroups(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_cgroups(job) == []
