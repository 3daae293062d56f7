"""Issue 10, point 3 on the real Grid Engine: a core is never held by a job that has ended.

Two ways a node cleans up after a job: geco's epilog (a queue with the hooks, no
preload), or gecod itself when the job's shepherd exits (sge_execd with the
preload, a queue with only geco's starter). Either may fail to run: Son of Grid
Engine kills a prolog or epilog still running when an interactive job with a pty
opens its output files, an admin's epilog may replace geco's, a node may lose
power. Whoever cleans up, the next jobs must find the cores free: this machine
has two, and every job here takes one whole core.

The first test runs before the module's ``gecod`` fixture starts (execd without the
preload); the second needs it. pytest runs them in this order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import events_of, job_cgroups, no_queue_in_error

pytestmark = pytest.mark.sge

STARTER = "/usr/libexec/geco/starter"
PROLOG = "root@/usr/libexec/geco/prolog $job_id $ja_task_id"
SLEEP = "sleep 2\n"


@pytest.fixture
def queue_without_epilog(sge: Any) -> Iterator[str]:
    """geco's prolog and starter, and no epilog: the epilog that was killed."""
    with sge.temporary_queue("geco-test-noepilog.q", prolog=PROLOG, epilog="NONE",
                             starter_method=STARTER, slots="2") as queue:
        yield queue


@pytest.fixture
def starter_only_queue(sge: Any) -> Iterator[str]:
    """The queue of a node with the preload: geco's starter only."""
    with sge.temporary_queue("geco-test-preload.q", prolog="NONE", epilog="NONE",
                             starter_method=STARTER, slots="2") as queue:
        yield queue


def wait_both(sge: Any, jobs: list[int]) -> list[dict[str, str]]:
    return [record for job in jobs for record in sge.wait_finished(job, timeout=120)]


def test_after_jobs_whose_epilog_never_ran_the_next_jobs_get_their_cores_at_once(
        sge: Any, job_dir: Any, journal: Any, queue_without_epilog: str) -> None:
    """Given two jobs that ended on both cores without an epilog (their empty cgroups are
    left), when two more jobs come, then each prolog takes the cores the ended jobs held
    (stale-cgroup-removed) and both jobs run at the first try: no "need 1 whole core"
    re-queue, one prolog run each, exit 0, and no queue goes into error state."""
    script = job_dir.script("cores", SLEEP)
    submit = lambda name: sge.submit("-cwd", "-N", name, "-q", queue_without_epilog,  # noqa: E731
                                     script, cwd=job_dir.path)
    ended = [submit("ended"), submit("ended")]
    wait_both(sge, ended)
    left = [job for job in ended if job_cgroups(f"{job}.1")]

    since = time.time()
    following = [submit("next"), submit("next")]
    records = wait_both(sge, following)

    assert left == ended
    assert [r["exit_status"] for r in records] == ["0", "0"], records
    for job in following:
        prologs = [e for e in journal.entries(JOB_ID=str(job), GECO_EVENT="prolog-done")]
        assert [e["EXIT_STATUS"] for e in prologs] == ["0"], job
    removed = {e["JOB_ID"] for job in ended
               for e in journal.entries(since, JOB_ID=str(job),
                                        GECO_EVENT="stale-cgroup-removed")}
    assert removed == {str(job) for job in ended}
    assert no_queue_in_error(sge) == {}


def test_with_the_preload_gecod_ends_a_job_when_its_shepherd_exits(
        sge: Any, gecod: Any, job_dir: Any, journal: Any, starter_only_queue: str) -> None:
    """Given sge_execd with the preload (and without Grid Engine's additional-group-id kill,
    ENABLE_ADDGRP_KILL=false) and a queue with no prolog or epilog, when a job that left a
    daemon behind (double-forked into its own session) ends, then gecod has killed the
    daemon and removed the job's cgroups by the time it journals the job's end (job-end,
    CLEANED_BY=gecod, with its accounting); two jobs started right after run at once on
    both cores."""
    sge.configure(GECO_EXECD_PRELOAD=gecod.preload, SGE_EXECD_PARAMS="ENABLE_ADDGRP_KILL=false")
    try:
        script = job_dir.script("leaver", (
            "setsid sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & echo $!' > leaver.pid\n"
            "echo started\n"))
        job = sge.submit("-cwd", "-N", "leaver", "-q", starter_only_queue, script,
                         cwd=job_dir.path)
        [record] = sge.wait_finished(job, timeout=120)
        [end] = journal.wait_for(JOB_ID=str(job), GECO_EVENT="job-end")
    finally:
        sge.configure(GECO_EXECD_PRELOAD=gecod.preload)
    cgroups_left = job_cgroups(f"{job}.1")
    daemon = int((job_dir.path / "leaver.pid").read_text())

    script = job_dir.script("after", SLEEP)
    following = [sge.submit("-cwd", "-N", "after", "-q", starter_only_queue, script,
                            cwd=job_dir.path) for _ in range(2)]
    records = wait_both(sge, following)

    assert record["exit_status"] == "0"
    assert job_dir.output("leaver", job) == "started\n"
    assert not Path(f"/proc/{daemon}").exists()
    assert (end["CLEANED_BY"], end["KILLED"]) == ("gecod", "1")
    assert int(end["MEMORY_PEAK"]) > 0
    assert cgroups_left == {}
    assert [r["exit_status"] for r in records] == ["0", "0"], records
    for later in following:
        assert "quarantine-refused" not in events_of(journal, later)
    assert no_queue_in_error(sge) == {}
