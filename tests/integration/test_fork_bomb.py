"""A job's task limit on the real Grid Engine: a fork bomb hurts only its own job.

Each job gets its own ``pids.max``: ``[cgroup] pids_per_slot`` x its slots on the node,
at least ``pids_min`` (here 48 and 64, so a bomb is held small and fast). Whoever makes
the job's cgroups sets it from the site configuration: the prolog on a node without
the exec() preload, gecod at the shepherd's exec with it. Both are shown here.

The bomb (forkbomb.c) forks without end from every process until the test has seen
what it looks for (a stop file; at most BOMB_SECONDS), then ends by itself (h_rt
would end it too); a counter it keeps stops it at 2,000 processes, so a
node without the limit is not taken down by its own test: the test then fails because
no fork was refused. While it runs, another job starts and runs on the node's other
slot (sge_execd forks its shepherd, gecod contains it), gecod answers STATUS, and
`geco status --job` shows the bomb at its limit. Afterwards the bomb's job has ended
normally, its cgroups are gone, none of its processes is left, no queue is in error.
A bomb that never stops is ended by h_rt (Grid Engine kills it before the epilog); one
that outlives its job script in a session of its own (a site without Grid Engine's
additional-group-id kill) keeps the shepherd from forking the epilog, and gecod ends it
when the shepherd exits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import (
    job_cgroups,
    no_queue_in_error,
    sh,
    site_settings,
    wait_for_cgroups,
    wait_until,
)

pytestmark = pytest.mark.sge

GECO = "/usr/bin/geco"
FORKBOMB = Path(__file__).with_name("forkbomb.c")
SETTINGS = {("cgroup", "pids_per_slot"): 48, ("cgroup", "pids_min"): 64}
BOMB_SECONDS = 100  # the bomb's own bound, under its h_rt; the test stops it sooner
REPORT = re.compile(r"forkbomb: peak (\d+) processes, (\d+) forks refused \(EAGAIN\), "
                    r"(\d+) other fork errors\n")


def pids_dir(key: str) -> Path:
    return job_cgroups(key)["pids"]


def refused(key: str) -> int:
    """Forks the job's task limit has refused so far (0 once its cgroup is gone)."""
    try:
        text = (pids_dir(key) / "pids.events").read_text()
    except (KeyError, OSError):
        return 0
    return int(dict(line.split() for line in text.splitlines()).get("max", 0))


def bombs_alive() -> list[int]:
    """Bomb processes that still run. Zombies do not count: killed orphans wait for this
    machine's pid 1 to reap them, which it does in its own time."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit() or (p / "comm").read_text().strip() != "forkbomb":
                continue
            stat = (p / "stat").read_bytes()
            if stat[stat.rindex(b")") + 2:].split()[0] != b"Z":
                found.append(int(p.name))
        except OSError:
            pass
    return found


def test_without_the_preload_the_prolog_gives_each_slot_its_share_of_tasks(
        sge: Any, job_dir: Any, journal: Any) -> None:
    """Given the hooks alone (no preload in sge_execd) and 48 tasks per slot with a floor of
    64, when a 2-slot parallel job runs, then the prolog made its cgroups with pids.max 96
    and journaled that limit (job-contained PIDS_LIMIT=96)."""
    with site_settings(SETTINGS):
        job = job_dir.submit("twoslots", "-pe", "mpi", "2", script="sleep 3\n")
        key = f"{job}.1"
        dirs = wait_for_cgroups(key)
        limit = (dirs["pids"] / "pids.max").read_text().strip()
        [record] = sge.wait_finished(job, timeout=90)
        [contained] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-contained")
        events = [e.get("GECO_EVENT") for e in journal.entries(JOB_ID=str(job))]

    assert record["exit_status"] == "0"
    assert limit == "96"
    assert (contained["SYSLOG_IDENTIFIER"], contained["PIDS_LIMIT"], contained["SLOTS"]) == (
        "geco-prolog", "96", "2")
    assert "quarantined" not in events  # the prolog made them, not gecod
    assert job_cgroups(key) == {}


def compile_bomb(job_dir: Any, job_owner: Any) -> None:
    binary = job_dir.path / "forkbomb"
    if not binary.exists():
        subprocess.run(["cc", "-O2", "-o", str(binary), str(FORKBOMB)], check=True,
                       timeout=120)
        os.chown(binary, job_owner.uid, job_owner.gid)


def test_a_fork_bomb_that_never_stops_is_ended_by_h_rt_and_the_epilog_still_runs(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given the hooks alone and a bomb that would fork for 10 minutes, when its h_rt of
    15 s passes, then Grid Engine kills it, the shepherd can still fork the epilog (the
    bomb's processes are gone first), the epilog journals job-end and removes the cgroups,
    and no bomb process is left and no queue is in error state."""
    compile_bomb(job_dir, job_owner)
    with site_settings(SETTINGS):
        job = job_dir.submit("endless", "-l", "h_rt=0:0:15",
                             script="exec ./forkbomb 600 2000\n")
        key = f"{job}.1"
        wait_for_cgroups(key)
        wait_until(lambda: refused(key) > 0, 60, "the bomb to reach its task limit")
        [record] = sge.wait_finished(job, timeout=120)
        [end] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="job-end")

    assert record["exit_status"] != "0"  # killed at h_rt
    assert end["CLEANED_BY"] == "epilog"
    assert job_cgroups(key) == {}
    assert bombs_alive() == []
    assert no_queue_in_error(sge) == {}


def test_a_fork_bomb_fills_only_its_own_job_and_the_node_keeps_working(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given gecod and the preload, and 48 tasks per slot with a floor of 64, when job A
    (1 slot) runs a fork bomb, then A is held at 64 tasks and its forks are refused;
    meanwhile `geco status --job A` shows that, gecod answers STATUS, and job B starts on
    the other slot (contained by gecod), sees A at its limit and exits with its own status.
    When the bomb stops, A ends normally: exit 0, cgroups gone, no bomb process left, no
    queue in error state."""
    compile_bomb(job_dir, job_owner)
    with site_settings(SETTINGS, gecod):
        stop = job_dir.path / "stop-bomb"
        a = job_dir.submit("bomb", "-l", "h_rt=120",
                           script=f"exec ./forkbomb {BOMB_SECONDS} 2000 {stop}\n")
        key_a = f"{a}.1"
        wait_for_cgroups(key_a)
        wait_until(lambda: refused(key_a) > 0, 60, "the bomb to reach its task limit")
        limit = (pids_dir(key_a) / "pids.max").read_text().strip()
        status_a = sh([GECO, "status", "--job", key_a, "--json"], check=False)
        status = sh([GECO, "status", "--json"], check=False)
        b = job_dir.submit("neighbour", script=(
            f"cat /sys/fs/cgroup/pids/GECO/{key_a}/pids.current\n"
            "echo job B ran\nexit 7\n"))
        [record_b] = sge.wait_finished(b, timeout=60)
        stop.touch()  # B has run beside the bomb at its limit: A may end now
        [record_a] = sge.wait_finished(a, timeout=120)
        [end_a] = journal.wait_for(30, JOB_ID=str(a), GECO_EVENT="job-end")
        quarantined_b = journal.entries(JOB_ID=str(b), GECO_EVENT="quarantined")

    assert limit == "64"
    assert status_a.returncode == 0, status_a.stderr
    [shown] = json.loads(status_a.stdout)["jobs"]
    assert shown["pids_limit"] == 64 and 0 < shown["pids_current"] <= 64
    assert shown["pids_refused"] > 0
    assert status.returncode == 0, status.stderr
    assert key_a in [j["key"] for j in json.loads(status.stdout)["jobs"]]

    assert (record_b["exit_status"], record_b["failed"]) == ("7", "0")
    b_saw, b_said = job_dir.output("neighbour", b).splitlines()
    assert (int(b_saw), b_said) == (64, "job B ran")  # B ran while A was at its limit
    assert [e["SYSLOG_IDENTIFIER"] for e in quarantined_b] == ["gecod"]

    assert (record_a["exit_status"], record_a["failed"]) == ("0", "0")
    report = REPORT.fullmatch(job_dir.output("bomb", a))
    assert report, job_dir.output("bomb", a)
    peak, forks_refused, other = map(int, report.groups())
    assert peak < 64 and forks_refused > 0 and other == 0  # the shepherd is task 64
    assert end_a["CLEANED_BY"] in ("epilog", "gecod")
    assert job_cgroups(key_a) == {}
    assert bombs_alive() == []
    assert no_queue_in_error(sge) == {}


def test_a_bomb_that_outlives_its_job_script_is_ended_by_gecod_when_the_shepherd_exits(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any, journal: Any) -> None:
    """Given gecod with the preload, a site without Grid Engine's additional-group-id kill
    (ENABLE_ADDGRP_KILL=false) and a job that starts a bomb in a session of its own and
    exits, when the job script ends, then the bomb survives Grid Engine's kill and keeps
    its cgroup full, so the shepherd (in the job's cgroups) cannot fork the epilog (qacct:
    failed 14, before epilog; should the fork win a slot freed by the script, the epilog
    ends the job instead); the shepherd exits all the same and gecod ends the job: the
    bomb is killed, the cgroups are gone, job-end is journaled, no queue in error state.
    Without the preload nothing ends such a bomb before gecod's reaper does."""
    compile_bomb(job_dir, job_owner)
    sge.configure(SGE_EXECD_PARAMS="ENABLE_ADDGRP_KILL=false", GECO_EXECD_PRELOAD=gecod.preload)
    try:
        with site_settings(SETTINGS, gecod):
            # the script ends once the bomb is at its limit (or once it cannot fork grep)
            job = job_dir.submit("escaped", script=(
                "setsid ./forkbomb 120 2000 </dev/null >/dev/null 2>&1 &\n"
                "while [ ! -e /sys/fs/cgroup/pids/GECO/$JOB_ID.1/pids.events ] || "
                "grep -q '^max 0$' /sys/fs/cgroup/pids/GECO/$JOB_ID.1/pids.events; "
                "do sleep 0.2; done\n"))
            key = f"{job}.1"
            [record] = sge.wait_finished(job, timeout=90)
            [end] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="job-end")
            wait_until(lambda: job_cgroups(key) == {}, 30, "the job's cgroups to go")
    finally:
        sge.configure(GECO_EXECD_PRELOAD=gecod.preload)

    # 14: before epilog, the shepherd could not fork it; then gecod ended the job
    assert (record["failed"].split()[0], end["CLEANED_BY"]) in (("14", "gecod"),
                                                                ("0", "epilog"))
    assert int(end["KILLED"]) > 0
    assert bombs_alive() == []
    assert no_queue_in_error(sge) == {}
