"""The test cluster on one machine: the qmaster and three execution hosts in namespaces.

``integration/cluster/cluster.sh up 3`` gives each host its own hostname, network,
execd, gecod, geco config and cgroup parent; ``down`` removes all of it. These tests
hold it to that: Grid Engine sees three hosts, a job sent to one runs there (its name,
its address, its cgroups, its core), and nothing is left once the cluster is down.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.clusterkit import ON_CLUSTER, cluster

pytestmark = pytest.mark.sge

HOSTS = ("geco-node1", "geco-node2", "geco-node3")
QUEUE = "geco-test-cluster.q"


def leftovers() -> list[str]:
    """What the cluster may leave behind: namespaces (network, mount), links, cgroups,
    daemons, exec hosts.
    (Its lines in /etc/hosts stay on purpose: see `down` in cluster.sh.)"""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines()
              if line.startswith("geco-test-n")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"link {line.split()[1]}" for line in links.splitlines() if "gecotv" in line]
    found += [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob("*/geco-test-node*")]
    found += [f"run dir {d}" for d in Path("/run").glob("geco-test-node*")]
    found += [f"execd {p}" for p in subprocess.run(["pgrep", "-x", "sge_execd"],
                                                    capture_output=True, text=True).stdout.split()
              if subprocess.run(["nsenter", "-t", p, "-u", "hostname"], capture_output=True,
                                text=True).stdout.strip() in HOSTS]
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text()
              .splitlines() if "/geco-test-cluster/" in line.split()[4]]
    qhost = subprocess.run(["qhost"], capture_output=True, text=True).stdout
    found += [f"exec host {h}" for h in HOSTS if h in qhost]
    return found


def test_grid_engine_lists_three_hosts_each_with_its_own_daemons(three_hosts: None) -> None:
    """Given the cluster up, then qhost lists the three hosts with load values (their execds
    report), and each host has its own execd and gecod running."""
    qhost = subprocess.run(["qhost"], capture_output=True, text=True, check=True).stdout
    status = cluster("status").stdout

    for host in HOSTS:
        [line] = [row for row in qhost.splitlines() if row.split()[:1] == [host]]
        assert line.split()[3] != "-", qhost
        assert f"{host}: execd up, gecod up" in status, status


@pytest.mark.parametrize("host", HOSTS)
def test_a_job_sent_to_a_host_runs_there_contained_by_that_hosts_gecod(
        sge: Any, three_hosts: None, job_owner: Any, tmp_path: Path, host: str) -> None:
    """Given the cluster, when a job is sent to one host, then it runs with that host's name
    and address, inside that host's cgroup parent (its gecod's), and ends normally."""
    out = job_owner.make_dir("cluster")
    script = out / "where.sh"
    script.write_text("hostname\nhostname -I\ncat /proc/self/cgroup\n")
    subprocess.run(["chown", f"{job_owner.uid}:{job_owner.gid}", str(script)], check=True)
    job = sge.submit("-q", QUEUE, *ON_CLUSTER, "-l", f"h={host}", "-cwd", "-o", "where.out",
                     "-j", "y", str(script), cwd=out)
    [record] = sge.wait_finished(job, timeout=120)
    lines = (out / "where.out").read_text().splitlines()
    k = host.removeprefix("geco-node")

    assert record["exit_status"] == "0" and record["hostname"] == host
    assert lines[0] == host
    assert lines[1].split() == [f"10.77.{k}.11"]
    for controller in ("cpuset", "memory", "freezer"):
        assert any(line.endswith(f":{controller}:/geco-test-node{k}/{job}.1")
                   for line in lines), lines


def test_down_leaves_nothing_behind(three_hosts: None) -> None:
    """Given the cluster up (and used by the tests above), when it is brought down, then no
    namespace, link, cgroup, run dir, execd or exec host of it is left. It is brought up
    again afterwards: the session's other multinode tests, in whatever order they run,
    share it."""
    assert leftovers() != []  # the cluster is there to be removed
    down = cluster("down")
    try:
        assert down.returncode == 0, down.stdout + down.stderr
        assert leftovers() == []
    finally:
        again = cluster("up", "3")
    assert again.returncode == 0, again.stdout + again.stderr
