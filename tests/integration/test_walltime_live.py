"""gecod's walltime backstop on the real Grid Engine.

Grid Engine's execd enforces h_rt itself. The backstop is for what it misses:
here the situation where it cannot enforce anything, because sge_execd is down
while the job runs (the job's sge_shepherd keeps running on its own). Past h_rt
plus [gecod] walltime_grace, gecod kills every process of the job except the
shepherd; the shepherd then sees its job end and runs geco's epilog, which
removes the cgroups. When execd is back it reports the job as finished.

gecod runs without the exec() preload here (gecod_service): the prolog makes
the cgroups, gecod only watches them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import alive
from tests.integration import livekit as kit

pytestmark = pytest.mark.sge

EXECD_SPOOL = Path("/var/spool/gridengine/execd")
H_RT = 10
GRACE = 3


def execd_pid(host: str) -> int | None:
    """The running sge_execd's pid (per its pid file), or None."""
    try:
        pid = int((EXECD_SPOOL / host / "execd.pid").read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "sge_execd" else None


def shepherd_of(job: int, host: str) -> int:
    """The job's sge_shepherd pid, from the execd spool (written when it starts)."""
    path = EXECD_SPOOL / host / "active_jobs" / f"{job}.1" / "pid"
    kit.wait_until(path.exists, 30, f"{path}")
    return int(path.read_text().strip())


def test_past_h_rt_plus_grace_gecod_kills_what_grid_engine_cannot_and_the_epilog_cleans_up(
        sge: Any, gecod_service: Any, job_dir: Any, journal: Any) -> None:
    """Given a job with h_rt=10 s, [gecod] walltime_grace = 3 s, and sge_execd stopped while
    the job runs (nothing in Grid Engine enforces h_rt then), when 13 s have passed, then
    gecod kills the job's processes but not its shepherd and journals walltime-kill (h_rt,
    the running time, what it killed); the shepherd runs geco's epilog, which removes the
    cgroups (job-end); once execd is back the job is accounted for and no queue instance is
    in error state."""
    host = sge.host
    settings = {("gecod", "walltime_grace"): float(GRACE), ("gecod", "reaper_interval"): 2.0,
                ("gecod", "walltime_backstop"): True}
    with kit.site_settings(settings, gecod_service):
        job = job_dir.submit("walltime", "-l", f"h_rt=0:0:{H_RT}",
                             script="sleep 300 &\nsleep 300\necho after\n")
        key = f"{job}.1"
        kit.wait_for_cgroups(key)
        shepherd = shepherd_of(job, host)
        execd = execd_pid(host)
        assert execd is not None, "sge_execd is not running"
        try:
            # -ke: execd leaves its jobs running (-kej would kill them)
            kit.sh(["qconf", "-ke", host])
            kit.wait_until(lambda: not alive(execd), 30, f"sge_execd (pid {execd}) to stop")
            stopped = time.monotonic()
            kill = journal.wait_for(H_RT + GRACE + 40, JOB_ID=str(job),
                                    GECO_EVENT="walltime-kill")[0]
            killed_after = time.monotonic() - stopped
            [end] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="job-end")
            kit.wait_until(lambda: not alive(shepherd), 30, "the shepherd to finish")
            left = kit.job_cgroups(key)
        finally:
            # setup.sh starts a stopped execd again the way it always does (clean
            # environment, own session); nothing else of the cluster changes
            if execd_pid(host) is None:
                sge.configure()
        [record] = sge.wait_finished(job, timeout=120)

    assert kill["KILLED"] == "3"  # the job's shell and its two sleeps; not the shepherd
    assert kill["H_RT"] == str(H_RT)
    assert int(kill["RUNNING_FOR"]) >= H_RT + GRACE
    assert (kill["PRIORITY"], kill["WALLTIME_GRACE"]) == ("4", str(GRACE))
    assert kill["MESSAGE"] == (
        f"job {job}.1 has run {kill['RUNNING_FOR']} s, past its h_rt of {H_RT} s plus the "
        f"{GRACE} s grace: killed {kill['KILLED']} process(es) Grid Engine did not end (its "
        "sge_shepherd is spared to end the job)")
    assert kill["SGE_TASK_ID"] == "1"
    assert killed_after < H_RT + GRACE + 30
    assert end["CLEANED_BY"] == "epilog"
    assert left == {}
    assert "after" not in job_dir.output("walltime", job)
    assert record["exit_status"] != "0"
    assert kit.no_queue_in_error(sge) == {}
