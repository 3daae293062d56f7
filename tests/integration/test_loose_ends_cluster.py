"""Issue 37 on the emulated cluster. Point 5: its queue takes only the jobs that ask for
it. Point 2: a parallel job whose other host keeps failing is held in error with why.

``integration/cluster/cluster.sh`` gives ``geco-test-cluster.q`` a FORCED complex
(``geco_test_cluster``): Grid Engine runs a job there only when it requests it, so a job
that names no queue (the demo's, another module's plain job) never lands on an emulated
host, whatever else is busy. ``qsub -w v`` asks Grid Engine's own verdict on an empty
cluster, without submitting anything.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.clusterkit import ON_CLUSTER, QUEUE, cluster, submit_pe
from tests.integration.livekit import no_queue_in_error, with_setting

pytestmark = pytest.mark.sge

CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _verdict(owner: Any, *args: str) -> str:
    done = subprocess.run(["runuser", "-u", owner.name, "--", "qsub", "-w", "v", *args,
                           "-b", "y", "/bin/true"], capture_output=True, text=True,
                          env=CLEAN_ENV, cwd="/", timeout=60, check=False)
    return done.stdout + done.stderr


def test_the_cluster_queue_runs_only_jobs_that_ask_for_it(three_hosts: None,
                                                          job_owner: Any) -> None:
    """Given the emulated cluster up, then a job bound to one of its hosts but asking for
    no queue, or naming its queue without the request, has no suitable queue; the same
    job with the request has one."""
    assert "no suitable queues" in _verdict(job_owner, "-l", "h=geco-node1")
    assert "no suitable queues" in _verdict(job_owner, "-q", QUEUE)
    asked = _verdict(job_owner, "-q", QUEUE, *ON_CLUSTER)
    assert "found suitable queue" in asked, asked


MASTER_CONFIG = Path("/etc/netns/geco-test-n1/geco/geco.toml")  # geco-node1's geco.toml


def _state(job: int) -> str:
    for line in subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True,
                               env=CLEAN_ENV, timeout=60, check=False).stdout.splitlines():
        cols = line.split()
        if cols[:1] == [str(job)]:
            return cols[4]
    return ""


def _restart_gecod(k: int) -> None:
    for step in ("stop-gecod", "start-gecod"):
        done = cluster(step, str(k))
        assert done.returncode == 0, done.stderr


def test_a_parallel_job_whose_other_host_keeps_failing_is_held_in_error_with_why(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given [health] requeue_limit = 0 on the master, geco-node1 (held at the first
    failure: the default re-queues 3 times, and Grid Engine waits minutes before it
    dispatches a re-queued parallel job again), and geco-node3's gecod stopped, when a
    3-host job is submitted, then its prolog holds it in error (Eqw, exit 100) with one
    sentence naming geco-node3 and why, nothing of it is left on any host and no queue is
    in error."""
    original = MASTER_CONFIG.read_text()
    MASTER_CONFIG.write_text(with_setting(original, "health", "requeue_limit", 0))
    job = 0
    try:
        _restart_gecod(1)  # its hook service reads the setting at start
        stopped = cluster("stop-gecod", "3")
        assert stopped.returncode == 0, stopped.stderr
        job, _ = submit_pe(sge, job_owner, "held", "#!/bin/sh\necho ran\n")
        [held] = journal.wait_for(60, JOB_ID=job, GECO_EVENT="job-held")
        deadline = time.monotonic() + 60
        while "E" not in _state(job):
            assert time.monotonic() < deadline, _state(job)
            time.sleep(0.2)
        [done] = journal.wait_for(JOB_ID=job, GECO_EVENT="prolog-done")
        left = list(Path("/sys/fs/cgroup").glob(f"*/geco-test-node*/{job}.1"))
        in_error = no_queue_in_error(sge)
    finally:
        MASTER_CONFIG.write_text(original)
        if job:
            subprocess.run(["qdel", "-f", str(job)], capture_output=True, env=CLEAN_ENV,
                           timeout=60, check=False)
        started = cluster("start-gecod", "3")
        _restart_gecod(1)
    assert started.returncode == 0, started.stderr
    assert "host geco-node3 did not prepare it" in held["REASON"], held
    assert "re-queued 0 times" in held["MESSAGE"] and f"qmod -cj {job}" in held["MESSAGE"]
    assert held["PRIORITY"] == "3", held
    assert done["EXIT_STATUS"] == "100", done
    assert left == [] and in_error == {}, (left, in_error)
