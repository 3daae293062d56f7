"""How a job ends on the real Grid Engine: accounting, the journal's story, teardown escalation.

What a user or an admin sees after a job: its processes and cgroups gone, one
``GECO_EVENT=job-end`` journal entry with what the job used (peak memory, CPU
time, OOM kills, leftovers killed), ``geco journal N`` telling that story and
``geco status --job N`` showing the live figures while it runs. And when a
process of the job cannot be killed: the stuck pids and their states in the
journal, the cgroups kept, the queue instance disabled (``qstat -f`` state d),
and gecod's reaper removing the cgroups once the process is gone.

A process Grid Engine cannot find is made the way an adopted ssh session would
be: started from outside (root, as the job's owner) and written into the job's
cgroups, so it lacks the job's additional group id that Grid Engine kills by
before the epilog runs.

Helpers shared with test_walltime_live.py and test_trace_live.py are in livekit.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import alive
from tests.integration.livekit import (
    GECO,
    Adopted,
    job_cgroups,
    journal_story,
    no_queue_in_error,
    queue_instance,
    sh,
    site_settings,
    wait_for_cgroups,
    wait_until,
)

pytestmark = pytest.mark.sge

M = 1 << 20
# The events of an ordinary job's story, in the order they happen: gecod quarantines the
# shepherd at its exec (before the prolog runs), the prolog reads the job's resources and
# contains it, the epilog accounts for it.
STORY = ("quarantined", "resources-read", "job-contained", "job-end")
# A job step that burns 1 s of CPU by its own clock, then prints what that clock says
# (startup included); the job then waits, so that something can join it while it runs.
BURN = ("/usr/bin/python3 -c 'import time\n"
        "while time.process_time() < 1.0: pass\nprint(time.process_time())'\n")


# ---------------------------------------------------------------------------
# 1. a leftover process Grid Engine cannot find: killed, cgroups gone, accounted
# ---------------------------------------------------------------------------

def test_a_daemonized_child_grid_engine_leaves_running_is_killed_and_journaled(
        sge: Any, job_dir: Any, journal: Any) -> None:
    """Given a site without Grid Engine's additional-group-id kill (execd_params
    ENABLE_ADDGRP_KILL=false, as many sites run) and a job that double-forks a daemon into
    its own session and exits, when the job ends, then the daemon is dead all the same, the
    job's cgroups are gone, and the epilog's job-end entry counts it (KILLED=1)."""
    sge.configure(SGE_EXECD_PARAMS="ENABLE_ADDGRP_KILL=false")
    try:
        job = job_dir.submit("daemonize", script=(
            "setsid sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & echo $!' > daemon.pid\n"
            "sleep 1\n"))
        [record] = sge.wait_finished(job, timeout=90)
        [end] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")
    finally:
        sge.configure()
    daemon = int((job_dir.path / "daemon.pid").read_text())

    assert record["exit_status"] == "0"
    assert not alive(daemon)
    assert job_cgroups(f"{job}.1") == {}
    assert (end["KILLED"], end["CLEANED_BY"], end["SYSLOG_IDENTIFIER"]) == (
        "1", "epilog", "geco-epilog")



def test_a_process_grid_engine_cannot_find_is_killed_and_the_job_end_is_accounted(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given a job that burns 1 s of CPU and a process of its owner that joined its
    cgroups from outside Grid Engine, when the job ends, then the process is dead, every
    cgroup of the job is gone, and the journal has one job-end entry from the epilog with
    the leftover counted, the peak memory, the CPU time and no OOM kill.

    The CPU time: the kernel charges each slice of it as user or system time by the mode
    the CPU was in when it was counted (the loop asks its clock, a system call, on every
    turn), so only the sum is exact: it holds at least what the job's own clock said, and
    no more than the machine's CPUs could give while the job existed."""
    started = time.monotonic()
    job = job_dir.submit("leftover", script=BURN + "sleep 4\n")
    key = f"{job}.1"
    dirs = wait_for_cgroups(key)
    stray = Adopted(job_owner)
    try:
        stray.join(dirs)
        [record] = sge.wait_finished(job, timeout=90)
        [end] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")
        lived = time.monotonic() - started
        stray.runuser.wait(timeout=30)
        dead = not alive(stray.pid)
    finally:
        stray.end()

    assert record["exit_status"] == "0"
    assert dead
    assert job_cgroups(key) == {}
    assert end["KILLED"] == "1"  # the adopted process; the job itself ended on its own
    assert end["CLEANED_BY"] == "epilog"
    assert int(end["MEMORY_PEAK"]) > 0
    own_clock = float(job_dir.output("leftover", job).split()[-1])
    user, system = float(end["CPU_USER_SEC"]), float(end["CPU_SYSTEM_SEC"])
    assert user > 0 and system >= 0
    # the journal's figures have three decimals each
    assert own_clock - 0.002 <= user + system <= lived * (os.cpu_count() or 1)
    assert end["OOM_KILLS"] == "0"
    assert end["SGE_TASK_ID"] == "1"
    # seff's figures from the job's usage samples (the epilog kept the last one)
    assert 0 <= float(end["CPU_EFFICIENCY"]) <= 100 and float(end["WALL_SEC"]) > 0, end
    assert re.fullmatch(
        rf"job {key} ended: peak memory \S+, CPU \d+\.\d s user \+ \d+\.\d s system, "
        rf"no OOM kill, CPU efficiency \d+\.\d%(, memory efficiency \d+\.\d%)?; "
        rf"cgroups removed, {end['KILLED']} leftover process\(es\) killed",
        end["MESSAGE"]), end["MESSAGE"]


# ---------------------------------------------------------------------------
# 2. the journal tells a job's whole story; geco status --job / geco journal show it
# ---------------------------------------------------------------------------

def test_the_journal_tells_the_whole_story_and_geco_status_and_geco_journal_show_it(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given gecod and the exec() preload, when an ordinary job runs, then while it runs
    `geco status --job N` shows its cores and its processes; afterwards `journalctl
    JOB_ID=N` holds quarantined (gecod, at the shepherd's exec), resources-read and
    job-contained (prolog), then job-end, in time order; `geco journal N` prints those
    events in that order with the peak memory, and `geco status --job N` exits 1 saying
    the job has no cgroups."""
    job = job_dir.submit("story", "-l", "m_mem_free=150M", probe="--alloc 20 --sleep 5")
    key = f"{job}.1"
    dirs = wait_for_cgroups(key)
    out = job_dir.path / f"story.o{job}"
    # the probe's first line: the job itself runs now, not only its shepherd
    wait_until(lambda: out.exists() and out.read_text(), 60, "the job's first output")
    cpus = (dirs["cpuset"] / "cpuset.cpus").read_text().strip()
    live = sh([GECO, "status", "--job", str(job)], check=False)
    [record] = sge.wait_finished(job, timeout=90)
    journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")
    entries = journal.entries(JOB_ID=str(job))
    after = sh([GECO, "status", "--job", str(job)], check=False)
    lines, _ = journal_story(job)  # this job's, should the journal hold others numbered so

    assert record["exit_status"] == "0"
    assert live.returncode == 0, live.stderr
    shown = live.stdout.splitlines()
    assert shown[0] == f"job {key} on {sge.host}"
    assert re.fullmatch(r"  owner +gecotest", shown[1]) and re.fullmatch(r"  name +story", shown[2])
    assert f"  cores        {cpus}" in shown
    assert any(re.fullmatch(r"  memory +\S+ now, peak \S+, limit 150M", line) for line in shown)
    [processes] = [line for line in shown if line.startswith("  processes ")]
    assert int(processes.split()[1]) >= 2  # the shepherd, the job (python3)

    events = [e.get("GECO_EVENT") for e in entries]
    story_events = [e for e in events if e in STORY]
    assert story_events == list(STORY), events
    stamps = [int(e["__REALTIME_TIMESTAMP"]) for e in entries]
    assert stamps == sorted(stamps)
    by_event = {e["GECO_EVENT"]: e for e in entries if e.get("GECO_EVENT") in STORY}
    assert by_event["quarantined"]["SYSLOG_IDENTIFIER"] == "gecod"
    assert by_event["resources-read"]["SYSLOG_IDENTIFIER"] == "geco-prolog"
    assert (by_event["resources-read"]["OWNER"], by_event["resources-read"]["SLOTS"]) == (
        "gecotest", "1")
    contained = by_event["job-contained"]
    assert (contained["CPUS"], contained["MEMORY_LIMIT"]) == (cpus, str(150 * M))
    assert by_event["job-end"]["CLEANED_BY"] == "epilog"

    # geco journal: one line per entry, "<date> <time>  <program>  <event>  <message>",
    # in the journal's order, then the job-end summary
    assert [line.split()[3] for line in lines[:-1]] == [e for e in events if e], lines
    assert lines[-1].startswith(f"job {key} ended "), lines
    assert ": peak memory " in lines[-1] and ", no OOM kill, " in lines[-1]
    assert lines[-1].endswith("(by epilog)")

    assert after.returncode == 1
    assert after.stdout == ""
    assert after.stderr == (f"geco status: job {job} has no cgroups on {sge.host} "
                            "(not running here, or already ended)\n")


# ---------------------------------------------------------------------------
# 3. an unkillable member: reported, queue disabled, reaped once it can die
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def queue_reenabled(sge: Any) -> Iterator[None]:
    """Whatever happens in the block, the queue instance is enabled afterwards."""
    try:
        yield
    finally:
        sh(["qmod", "-e", queue_instance(sge)], check=False)
        states = sge.queue_states()
        assert "d" not in states.get(queue_instance(sge), ""), states


def freezer_state(path: Path) -> str:
    return (path / "freezer.state").read_text().strip()


def remove_leftover_cgroups(key: str, nested: Path) -> None:
    """Last resort after a failed test: the job's cgroups, nested one first, must not
    keep the job's cores busy for the tests after this one."""
    if nested.is_dir():
        (nested / "freezer.state").write_text("THAWED")
        for pid in (nested / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_until(lambda: not (nested / "cgroup.procs").read_text().strip(), 10,
                   f"{nested} to empty")
        nested.rmdir()
    for path in job_cgroups(key).values():
        with contextlib.suppress(OSError):
            path.rmdir()


def test_an_unkillable_member_is_reported_its_queue_disabled_and_the_reaper_cleans_up_later(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given a job with a process frozen in a nested freezer cgroup (a SIGKILL stays pending
    until it is thawed) and [epilog] kill_timeout = 2, when the job ends, then the epilog
    journals cleanup-stuck with that pid and its state, keeps the cgroups, disables the
    job's queue instance (journal queue-disabled; qstat -f state d) and Grid Engine still
    records the job as ended normally (the epilog exited 0). When the process is thawed it
    dies, and gecod's reaper removes the cgroups and journals reaped."""
    settings = {("epilog", "kill_timeout"): 2.0, ("epilog", "disable_queue_on_stuck"): True,
                ("gecod", "reaper_interval"): 3.0}
    with site_settings(settings, gecod), queue_reenabled(sge):
        job = job_dir.submit("stuck", script="sleep 4\n")
        key = f"{job}.1"
        dirs = wait_for_cgroups(key)
        nested = dirs["freezer"] / "geco-test-stuck"
        stray = Adopted(job_owner)
        try:
            nested.mkdir()
            stray.join({c: p for c, p in dirs.items() if c != "freezer"})
            stray.join({"freezer": nested})
            (nested / "freezer.state").write_text("FROZEN")
            wait_until(lambda: freezer_state(nested) == "FROZEN", 10, "the nested freezer")
            [record] = sge.wait_finished(job, timeout=120)
            [stuck] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="cleanup-stuck",
                                       CLEANED_BY="epilog")
            disabled = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="queue-disabled")
            states = sge.queue_states()
            kept = sorted(job_cgroups(key))
            still_alive = alive(stray.pid)

            (nested / "freezer.state").write_text("THAWED")
            stray.runuser.wait(timeout=30)
            # the reaper journals "reaped" every round it finds the job gone; the round
            # that could remove the cgroups says so
            [reaped] = journal.wait_for(60, JOB_ID=str(job), GECO_EVENT="reaped",
                                        CGROUPS_REMOVED="1")
            wait_until(lambda: job_cgroups(key) == {}, 30, "the reaper to remove the cgroups")
            ends = journal.entries(JOB_ID=str(job), GECO_EVENT="job-end")
        finally:
            stray.end()
            remove_leftover_cgroups(key, nested)

    assert record["exit_status"] == "0" and record["failed"] == "0"
    assert still_alive
    assert stuck["PIDS"] == str(stray.pid)
    # "<pid>:<state letter>:<kernel function it sleeps in>" (a frozen task: D on this kernel)
    pid, letter, wchan = stuck["STATES"].split(":")
    assert pid == str(stray.pid) and letter in ("D", "S", "R") and wchan
    assert (stuck["PRIORITY"], stuck["CLEANED_BY"]) == ("3", "epilog")
    assert re.fullmatch(
        rf"job {key}: 1 process\(es\) still alive 2 s after SIGKILL: pid {pid} \(sleep\) "
        rf"{letter} \([a-z ]+\) in {wchan}, cgroup geco-test-stuck \(frozen: the SIGKILL waits "
        rf"for a thaw\); cgroups kept, gecod's "
        r"reaper tries again", stuck["MESSAGE"]), stuck["MESSAGE"]
    qi = queue_instance(sge)
    assert [(d["QUEUE_INSTANCE"], d["PRIORITY"]) for d in disabled] == [(qi, "3")]
    assert disabled[0]["MESSAGE"] == (
        f"job {key}: disabled the queue instance {qi} (qmod -d) so that no new job starts on "
        f"this node while processes of this job cannot be killed; enable it again with "
        f"qmod -e {qi} once the node is healthy")
    assert "d" in states[queue_instance(sge)]
    assert {"cpuset", "freezer", "memory"} <= set(kept)
    assert (reaped["SGE_TASK_ID"], reaped["CLEANED_BY"]) == ("1", "reaper")
    assert reaped["MESSAGE"] == (
        f"job {key} no longer runs on this node ({reaped['REASON']}): its cgroups were "
        f"removed, {reaped['KILLED']} leftover process(es) killed")
    assert reaped["REASON"].startswith("not in the execd spool, and ")
    assert [e["CLEANED_BY"] for e in ends] == ["reaper"]
    assert no_queue_in_error(sge) == {}
