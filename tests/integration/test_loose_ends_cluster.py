"""Issue 37, point 5: the emulated cluster's queue takes only the jobs that ask for it.

``integration/cluster/cluster.sh`` gives ``geco-test-cluster.q`` a FORCED complex
(``geco_test_cluster``): Grid Engine runs a job there only when it requests it, so a job
that names no queue (the demo's, another module's plain job) never lands on an emulated
host, whatever else is busy. ``qsub -w v`` asks Grid Engine's own verdict on an empty
cluster, without submitting anything.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.clusterkit import ON_CLUSTER, QUEUE

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
