"""The whole of geco on a real Grid Engine: sge_execd with the exec() preload, and gecod.

For this module sge_execd runs with ``LD_PRELOAD=/usr/lib/geco/libgeco_preload.so``
and a real gecod serves the site configuration's socket, as on a production node.
When execd is about to exec a job's ``sge_shepherd`` (for the batch job, and for
every ``qrsh -inherit`` task of a parallel job), the preload asks gecod to put
that very process into the job's cgroups and only then lets the exec happen, so
nothing of the job ever runs outside them.

A test that does not ask for gecod gets execd without the preload again (the hooks
alone: tests/conftest.py's ``execd_as_asked``); gecod is stopped after the module.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import processes_of, rescheduled

pytestmark = pytest.mark.sge

FORKER = Path(__file__).with_name("forker.c")
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def cgroups_of(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            out[c] = path
    return out


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone since it was listed
    return stat.rpartition(")")[2].split()[0] == "Z"


def wait_for_output(path: Path, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        assert time.monotonic() < deadline, f"{path} never said {text!r}: {content!r}"
        time.sleep(0.1)


def test_the_shepherd_is_quarantined_before_it_runs_and_500_children_forked_at_once_are_inside(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given a job that forks 500 children the moment it starts, then while they live every
    process of the job owner on the node is in the job's cgroups (cpuset, memory, freezer),
    and the journal shows gecod quarantined the job's shepherd at its exec, before the
    prolog ran."""
    binary = job_dir.path / "forker"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(FORKER)], check=True, timeout=120)
    os.chown(binary, job_owner.uid, job_owner.gid)
    job = job_dir.submit("forker", script="exec ./forker 500 10\n")
    report = wait_for_output(job_dir.path / f"forker.o{job}", "forked 500 children")

    members = processes_of(job_owner.uid)
    # a zombie has run its last (an earlier module's ssh session, its parent not yet
    # done): its cgroups read as the root's, and it can fork nothing
    outside = {p: cgroups_of(p) for p in members
               if not _zombie(p) and any(cgroups_of(p).get(c) != f"/GECO/{job}.1"
                                         for c in ("cpuset", "memory", "freezer"))}
    [record] = sge.wait_finished(job, timeout=120)
    events = [e.get("GECO_EVENT") for e in journal.entries(JOB_ID=str(job))]

    assert len(members) >= 501, report
    assert outside == {}
    assert record["exit_status"] == "0"
    assert events.index("quarantined") < events.index("job-contained")


def test_a_qrsh_inherit_task_of_a_parallel_job_runs_in_the_same_cgroups(
        sge: Any, gecod: Any, job_dir: Any) -> None:
    """Given a `-pe mpi 2` job whose script starts a task with `qrsh -inherit` (no prolog runs
    for such a task), then the task reports the job's own cgroups and both of the job's
    cores, exactly like the master."""
    job = job_dir.submit(
        "mpi", "-pe", "mpi", "2",
        script="/usr/bin/python3 probe.py\n"
               "qrsh -inherit \"$HOSTNAME\" /usr/bin/python3 \"$PWD/probe.py\"\n")
    [record] = sge.wait_finished(job, timeout=120)
    reports = [r for r in job_dir.reports("mpi", job) if "cgroups" in r]

    assert record["exit_status"] == "0", job_dir.output("mpi", job, stream="e")
    assert len(reports) == 2 and reports[0]["pid"] != reports[1]["pid"]
    for r in reports:
        assert r["cgroups"]["cpuset"] == f"/GECO/{job}.1"
        assert r["cgroups"]["memory"] == f"/GECO/{job}.1"
        assert len(r["cpus"]) == 2


def test_after_gecod_is_killed_and_restarted_running_jobs_stay_contained_and_cores_are_not_reused(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given a running one-slot job, when gecod is killed with SIGKILL and started again, then
    the job's processes are still in its cgroups, and a new job starts normally on the
    other core (no core is handed out twice)."""
    first = job_dir.submit("survivor", probe="--sleep 8")
    before = wait_for_output(job_dir.path / f"survivor.o{first}", "cgroups")
    pid = int(before.split('"pid": ')[1].split(",")[0])

    gecod.kill9()
    still = cgroups_of(pid)
    gecod.start()
    second = job_dir.submit("newcomer")
    [new_record] = sge.wait_finished(second, timeout=90)
    [old_record] = sge.wait_finished(first, timeout=90)
    old, new = job_dir.reports("survivor", first)[0], job_dir.reports("newcomer", second)[0]

    assert still["cpuset"] == still["memory"] == f"/GECO/{first}.1"
    assert (old_record["exit_status"], new_record["exit_status"]) == ("0", "0")
    assert new["cgroups"]["cpuset"] == f"/GECO/{second}.1"
    assert not set(old["cpus"]) & set(new["cpus"])
    assert journal.entries(JOB_ID=str(second), GECO_EVENT="quarantined")


def test_while_gecod_is_down_a_job_is_requeued_never_run_uncontained_and_no_queue_fails(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given gecod stopped for longer than the preload waits for it (request_timeout, 10 s),
    when a job is submitted, then the preload refuses its shepherd's exec and says why in the
    journal, and Grid Engine reschedules the job ("failed 1: assumedly before job", no queue
    instance in error state); the job never ran. (A gecod back within the 10 s is simply
    waited for; Grid Engine re-dispatches a rescheduled job only after about a minute, so
    this test deletes it instead of waiting.)"""
    gecod.stop()
    try:
        job = job_dir.submit("waiting")
        deadline = time.monotonic() + 60
        while not rescheduled(job) and time.monotonic() < deadline:
            time.sleep(0.5)
        ran = (job_dir.path / f"waiting.o{job}").exists()
        states = sge.queue_states()
    finally:
        gecod.start()
        subprocess.run(["qdel", str(job)], capture_output=True, env=CLEAN_ENV, timeout=60)
    qmaster_log = Path("/var/spool/gridengine/qmaster/messages").read_text()
    refusals = [e["MESSAGE"] for e in journal.entries()
                if f"job {job}.1): quarantine by gecod" in e.get("MESSAGE", "")]

    assert not ran
    assert {q: s for q, s in states.items() if "E" in s} == {}
    assert rescheduled(job)
    assert f"rescheduling job {job}.1" in qmaster_log
    assert refusals and refusals[0].endswith("exec refused (policy=refuse, errno EAGAIN)")
    assert "cannot connect" in refusals[0]
