"""`geco usage` after real Grid Engine jobs: seff's efficiency, the advice, OOM kills, who may ask.

Jobs of the test user through this machine's Grid Engine with geco's hooks, the preload and
gecod; the report is read as the job's owner (whose primary group is theirs alone, so the
samples file is theirs to read) and as nobody.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.integration.livekit import GECO, no_queue_in_error

pytestmark = pytest.mark.sge

NOBODY = 65534
# Touch 300M, then keep one core busy for 20 s of CPU (the job asks for two and 1G).
BURN_ONE_OF_TWO = ("/usr/bin/python3 -c 'import time\n"
                   "held = bytearray(300 << 20)\n"
                   "for i in range(0, len(held), 4096): held[i] = 1\n"
                   "while time.process_time() < 20: pass'\n")
# Touch 300M in a job granted 100M: the kernel's OOM killer ends it.
TOO_BIG = ("/usr/bin/python3 -c 'held = bytearray(300 << 20)\n"
           "for i in range(0, len(held), 4096): held[i] = 1'\n")


def _usage(job: int, uid: int, gid: int, *how: str) -> subprocess.CompletedProcess[str]:
    """`geco usage JOB` as uid:gid, ``how`` (default: --json)."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return subprocess.run([GECO, "usage", str(job), *(how or ["--json"])], cwd="/",
                          capture_output=True, text=True, timeout=60, preexec_fn=drop,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def test_a_job_using_one_of_two_cores_and_300m_of_1g_is_told_so_and_only_its_owner_may_ask(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any) -> None:
    """Given a job granted 2 cores and 1G that keeps one core busy and touches 300M, when
    it has ended, then `geco usage` (its owner) reports about 50% CPU and about 30% memory
    efficiency, advises 1 core and less memory, and draws it to an SVG; nobody asking
    about it is refused in one line; no queue instance went into error."""
    job = job_dir.submit("burn", "-pe", "smp", "2", "-l", "m_mem_free=512M",
                         script=BURN_ONE_OF_TWO)
    [record] = sge.wait_finished(job, timeout=180)
    assert (record["exit_status"], record["failed"]) == ("0", "0"), record

    mine = _usage(job, job_owner.uid, job_owner.gid)
    assert mine.returncode == 0, mine.stderr
    [r] = json.loads(mine.stdout)
    assert (r["job"], r["owner"], r["running"], r["cores"]) == (f"{job}.1", job_owner.name,
                                                                False, 2)
    assert r["memory_requested"] == 1 << 30
    assert 35.0 <= r["cpu_efficiency"] <= 60.0, r
    assert 28.0 <= r["memory_efficiency"] <= 40.0, r
    assert r["oom_kills"] == 0
    [cores, memory] = r["advice"]
    assert cores.startswith("you asked 2 cores and used ") and cores.endswith(": request 1")
    assert memory.startswith("peak 3") and " of 1G: request " in memory, memory
    drawn = _usage(job, job_owner.uid, job_owner.gid, "--plot", str(job_dir.path / "burn.svg"))
    assert drawn.returncode == 0, drawn.stderr
    assert '<g id="cpu">' in (job_dir.path / "burn.svg").read_text()

    theirs = _usage(job, NOBODY, NOBODY)
    assert (theirs.returncode, theirs.stdout) == (1, "")
    assert theirs.stderr.startswith(f"geco usage: job {job}.1's usage is not yours to read")
    assert theirs.stderr.count("\n") == 1
    assert no_queue_in_error(sge) == {}


def test_an_oom_killed_job_reports_the_kill_and_what_to_request(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any) -> None:
    """Given a job granted 100M that touches 300M, when the kernel's OOM killer has ended
    it, then `geco usage` counts the kill and advises more memory than 100M."""
    job = job_dir.submit("toobig", "-l", "m_mem_free=100M", script=TOO_BIG)
    sge.wait_finished(job, timeout=180)
    mine = _usage(job, job_owner.uid, job_owner.gid)
    assert mine.returncode == 0, mine.stderr
    [r] = json.loads(mine.stdout)
    assert r["oom_kills"] >= 1 and r["memory_requested"] == 100 << 20, r
    assert r["advice"][0].startswith("the kernel's OOM killer ended ") and \
        r["advice"][0].endswith("request more than 100M of memory"), r["advice"]
