"""The starter's fallback on the real Grid Engine: gecod runs, sge_execd has no preload.

Sites that cannot preload sge_execd still run gecod. A job process that reaches geco's
starter_method outside its job's cgroups (a queue whose prolog is not geco's, a
``qrsh -inherit`` task, for which no prolog runs) asks gecod to move it; gecod checks
through /proc that it is the job's owner and descends from that job's shepherd.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.sge

CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
def queue_without_prolog(sge: Any) -> Iterator[str]:
    """A queue whose starter is geco's but which has no prolog or epilog of geco's."""
    with sge.temporary_queue("geco-test-fallback.q", prolog="NONE", epilog="NONE", slots="1",
                             starter_method="/usr/libexec/geco/starter") as queue:
        yield queue


def test_a_batch_job_without_geco_prolog_is_moved_in_by_gecod_before_it_runs(
        sge: Any, gecod_service: Any, job_dir: Any, journal: Any,
        queue_without_prolog: str) -> None:
    """Given a queue without geco's prolog and a running gecod, when a job starts there,
    then the starter has gecod create the job's cgroups and move it in, and the job runs
    inside them (what the starter refuses when gecod is not there)."""
    job = job_dir.submit("fallback", "-q", queue_without_prolog)
    [record] = sge.wait_finished(job, timeout=90)
    report = job_dir.reports("fallback", job)[0]

    assert record["exit_status"] == "0", job_dir.output("fallback", job, stream="e")
    assert report["cgroups"]["cpuset"] == report["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert len(report["cpus"]) == 1
    assert journal.entries(JOB_ID=str(job), GECO_EVENT="starter-quarantined")
    # no epilog of geco's ran here: clean up the job's cgroups as the reaper will
    subprocess.run(["/opt/geco-dev/venv/bin/python", "-c",
                    "from geco import cgroup, config\n"
                    f"b = cgroup.for_config(config.load())\nb.destroy('{job}.1')"],
                   check=True, env=CLEAN_ENV, timeout=60)


def test_a_qrsh_inherit_task_without_the_preload_is_moved_in_by_the_starter(
        sge: Any, gecod_service: Any, job_dir: Any, journal: Any) -> None:
    """Given sge_execd without the preload, when a `-pe mpi 2` job starts a task with
    `qrsh -inherit`, then the task's starter has gecod move it into the job's cgroups."""
    job = job_dir.submit(
        "mpi", "-pe", "mpi", "2",
        script="qrsh -inherit \"$HOSTNAME\" /usr/bin/python3 \"$PWD/probe.py\"\n")
    [record] = sge.wait_finished(job, timeout=90)
    [task] = [r for r in job_dir.reports("mpi", job) if "cgroups" in r]

    assert record["exit_status"] == "0", job_dir.output("mpi", job, stream="e")
    assert task["cgroups"]["cpuset"] == task["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert len(task["cpus"]) == 2
    assert journal.entries(JOB_ID=str(job), GECO_EVENT="starter-quarantined")
