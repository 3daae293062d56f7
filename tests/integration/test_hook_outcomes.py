"""What geco's hooks do when things are not as they should be, on the real Grid Engine.

Each test gives the hooks one bad condition (a queue without geco's prolog, a
corrupt resource file, an unreachable qmaster, a job that leaves a daemon
behind) and asserts the outcome a user or admin sees: the job's stderr, the
journal, the cgroups, the processes, and that no queue instance went into
error state.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import alive, site_config_rewritten
from tests.integration.livekit import Adopted

pytestmark = pytest.mark.sge

RESOURCES = Path("/var/lib/geco/resources")
M = 1 << 20


def run(argv: list[str], check: bool = True) -> None:
    subprocess.run(argv, check=check, capture_output=True, timeout=60,
                   env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})




def no_queue_in_error(sge: Any) -> bool:
    return not {q: s for q, s in sge.queue_states().items() if "E" in s}


@pytest.fixture
def queue_without_prolog(sge: Any) -> Iterator[str]:
    """A second queue on this host whose starter is geco's but with no prolog/epilog:
    the misconfiguration geco's starter must catch."""
    with sge.temporary_queue("geco-test-nogeco.q", prolog="NONE", epilog="NONE", slots="1",
                             starter_method="/usr/libexec/geco/starter") as queue:
        yield queue


def test_a_job_that_reaches_the_starter_uncontained_never_runs_and_says_why(
        sge: Any, job_owner: Any, job_dir: Any, queue_without_prolog: str) -> None:
    """Given a queue whose prolog is not geco's, when a job starts there, then geco's
    starter refuses to run it: the script never runs, the job is held in error state with
    one plain sentence in its stderr file, and no queue instance goes into error state."""
    script = job_dir.script("uncontained", "touch ran\n")
    job = sge.submit("-cwd", "-N", "uncontained", "-q", queue_without_prolog, script,
                     cwd=job_dir.path)
    stderr = job_dir.path / f"uncontained.e{job}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "geco starter" not in (
            stderr.read_text() if stderr.exists() else ""):
        time.sleep(0.3)
    text = stderr.read_text()

    assert not (job_dir.path / "ran").exists()
    assert f"geco starter: job {job}.1 is not inside its cgroups on {os.uname().nodename}; " \
           "it is not started uncontained. Ask your admin to check the queue's geco prolog " \
           "(cgroups=" in text
    assert text.rstrip().endswith("the job is put in error state")
    assert no_queue_in_error(sge)


def test_a_corrupt_resource_file_is_ignored_and_replaced_by_one_qstat(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given a truncated resource file already waiting for a held job, when the job is
    released, then the prolog logs a warning naming the file, asks qstat, and the job is
    contained with its real limits; the epilog removes the file."""
    script = job_dir.script("corrupt", "exec /usr/bin/python3 probe.py\n")
    job = sge.submit("-cwd", "-N", "corrupt", "-h", "-l", "m_mem_free=250M", script,
                     cwd=job_dir.path)
    RESOURCES.mkdir(parents=True, exist_ok=True)
    (RESOURCES / f"{job}.1").write_bytes(b"GECOResourceSet_v1{li" + str(job).encode() + b",li1,lf")
    run(["qrls", str(job)])
    [record] = sge.wait_finished(job, timeout=90)
    report = job_dir.reports("corrupt", job)[0]

    assert record["exit_status"] == "0"
    assert report["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert int(report["memory_limit"]) == 250 * M
    assert not (RESOURCES / f"{job}.1").exists()
    warnings = journal.entries(JOB_ID=str(job), PRIORITY="4")
    assert any("ignoring unusable resource file" in w["MESSAGE"]
               and f"path={RESOURCES}/{job}.1" in w["MESSAGE"] for w in warnings)


@pytest.fixture
def qmaster_unreachable() -> Iterator[None]:
    """Point the site configuration's qstat at a command that does not exist (what a
    node sees when it cannot reach the qmaster), on a site that runs such jobs without
    memory limits (run_without_memory_limits = true), then restore the file."""
    with site_config_rewritten(
            lambda _: '[qstat]\ncommand = "/nonexistent/qstat"\nretries = 0\n'
                      'run_without_memory_limits = true\n'):
        yield


def test_without_qmaster_the_job_runs_bound_to_its_cores_and_the_journal_says_so(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any,
        qmaster_unreachable: None) -> None:
    """Given a node that cannot ask qstat, when a job with m_mem_free=200M starts, then it
    still runs in its own cgroups on one whole core (what the node knows from its
    pe_hostfile), without the memory limit it cannot know, and a warning saying exactly
    that is journaled; it is never silently uncontained."""
    script = job_dir.script("noqmaster", "exec /usr/bin/python3 probe.py\n")
    job = sge.submit("-cwd", "-N", "noqmaster", "-l", "m_mem_free=200M", script, cwd=job_dir.path)
    [record] = sge.wait_finished(job, timeout=90)
    report = job_dir.reports("noqmaster", job)[0]

    assert record["exit_status"] == "0"
    assert report["cgroups"]["cpuset"] == f"/GECO/{job}.1"
    assert len(report["cpus"]) == 1
    assert report["env"]["GECO_MEMORY_LIMIT"] == "0"
    [warning] = journal.entries(JOB_ID=str(job), GECO_EVENT="degraded-containment")
    assert warning["PRIORITY"] == "4"
    assert f"job {job}.1 is contained with its cores only, WITHOUT memory limits" \
        in warning["MESSAGE"]


def test_a_daemon_left_behind_by_a_job_does_not_outlive_it(
        sge: Any, job_dir: Any, job_owner: Any) -> None:
    """Given a job that starts a detached daemon (setsid) and exits, then the daemon is
    dead when the job has ended (Grid Engine kills what carries the job's additional
    group id; geco's epilog kills whatever is still in the job's cgroups)."""
    script = job_dir.script("daemon",
                          "setsid sleep 300 </dev/null >/dev/null 2>&1 &\necho $!\n")
    job = sge.submit("-cwd", "-N", "daemon", script, cwd=job_dir.path)
    [record] = sge.wait_finished(job, timeout=90)
    daemon = int(job_dir.output("daemon", job).split()[0])

    assert record["exit_status"] == "0"
    assert not alive(daemon)
    assert not Path(f"/sys/fs/cgroup/cpuset/GECO/{job}.1").exists()


def wait_for_cgroup(job: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not Path(f"/sys/fs/cgroup/freezer/GECO/{job}.1").is_dir():
        assert time.monotonic() < deadline, f"job {job} got no cgroups in {timeout} s"
        time.sleep(0.1)


def test_a_process_grid_engine_does_not_know_is_killed_by_the_epilog_and_journaled(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given a process of the job's owner that joined the job's cgroups from outside Grid
    Engine (as an adopted ssh session does: it lacks the job's additional group id, so
    Grid Engine cannot find it), when the job ends, then geco's epilog kills it, removes
    the cgroups, and `journalctl JOB_ID=<job>` tells the story: contained (cores, limits,
    owner), prolog done, ended with one leftover process killed."""
    script = job_dir.script("adopted", "sleep 3\n")
    job = sge.submit("-cwd", "-N", "adopted", "-l", "m_mem_free=100M", script, cwd=job_dir.path)
    wait_for_cgroup(job)
    stray = Adopted(job_owner)  # waits until runuser has exec'd sleep, however slowly
    try:
        stray.join({c: Path(f"/sys/fs/cgroup/{c}/GECO/{job}.1")
                    for c in ("cpuset", "memory", "freezer", "pids")})
        [record] = sge.wait_finished(job, timeout=90)
        story = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")
        stray.runuser.wait(timeout=30)
    finally:
        stray.end()

    assert record["exit_status"] == "0"
    assert not alive(stray.pid)
    assert not Path(f"/sys/fs/cgroup/cpuset/GECO/{job}.1").exists()
    assert story[0]["KILLED"] == "1"
    events = [e.get("GECO_EVENT") for e in journal.entries(JOB_ID=str(job))]
    assert events.index("job-contained") < events.index("prolog-done") < events.index("job-end")
    contained = journal.entries(JOB_ID=str(job), GECO_EVENT="job-contained")[0]
    assert (contained["SGE_TASK_ID"], contained["MEMORY_LIMIT"], contained["OWNER"]) == (
        "1", str(100 * M), job_owner.name)
    assert contained["SYSLOG_IDENTIFIER"] == "geco-prolog"
