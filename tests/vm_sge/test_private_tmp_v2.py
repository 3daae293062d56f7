"""A job's private /tmp and /dev/shm on the modern node: gecod as a systemd unit, cgroup v2.

Runs INSIDE the QEMU machine, after tests/vm_sge/test_strays_systemd.py (same boot, same
Grid Engine with geco's starter and the preload). gecod.service runs in a mount namespace
of its own (ProtectSystem=): a job's namespace must still be made from the node's, where
sge_execd's shepherds enter it, Grid Engine's $TMPDIR (in the node's /tmp) must be there,
and its /dev/shm pages must count against the job's one cgroup (memory.current). The
host's suite tries the rest on cgroup v1 (tests/integration/test_private_tmp_live.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.config import Config
from geco.job import privatetmp
from geco.jobkey import JobKey
from tests.cleanslate import site_config_rewritten
from tests.integration import livekit as kit
from tests.jobdirkit import JobDir
from tests.unitkit import SLOW

M = 1 << 20
# Writes /tmp/x, /var/tmp/v and 20M in /dev/shm/y, says what it sees (JSON), then holds
# on until the test touches "go" in its directory.
LOOK_AND_HOLD = """echo "$JOB_ID" > /tmp/x && echo "$JOB_ID" > /var/tmp/v
head -c 20971520 /dev/zero > /dev/shm/y
printf '{"tmp": "%s", "var_tmp": "%s", "shm": "%s", "tmpdir": "%s"}\\n' \\
  "$(ls -A /tmp | tr '\\n' ' ')" "$(ls -A /var/tmp | tr '\\n' ' ')" \\
  "$(ls -A /dev/shm | tr '\\n' ' ')" "$TMPDIR"
touch up
while [ ! -e go ]; do sleep 1; done
"""


def _restart_gecod() -> None:
    subprocess.run(["systemctl", "restart", "gecod.service"], check=True, timeout=SLOW)


@pytest.fixture
def private_tmp(sge: Any) -> Iterator[None]:
    """[tmp] private = true in the site's geco.toml, gecod.service restarted (and back)."""
    try:
        with site_config_rewritten(
                lambda text: kit.with_setting(text, "tmp", "private", True)):
            _restart_gecod()
            yield
    finally:
        _restart_gecod()


def test_under_systemd_a_job_gets_its_own_tmp_and_shm_charged_to_its_cgroup_and_gone_after(
        sge: Any, job_dir: JobDir, journal: Any, private_tmp: None) -> None:
    """Given [tmp] private on a systemd node (gecod.service with its own /tmp), when a job
    writes /tmp/x, /var/tmp/v and 20M of /dev/shm/y, then it sees only its own files (and
    Grid Engine's $TMPDIR), the node's /tmp and /dev/shm hold none of them, and its
    cgroup's memory.current holds the 20M; after its end its directories and pin are gone
    and the job-end record counts the /dev/shm it freed."""
    job = job_dir.submit("ptmp", "-l", "m_mem_free=256M", script=LOOK_AND_HOLD)
    where = privatetmp.places(Config(), JobKey(job, 1))
    try:
        kit.wait_until(lambda: (job_dir.path / "up").exists(), SLOW, "the job writing")
        assert (where.tmp / "x").read_text() == f"{job}\n"
        assert not Path("/tmp/x").exists() and not Path("/dev/shm/y").exists()
        current = int((kit.V2_JOBS / f"{job}.1" / "memory.current").read_text())
        assert current >= 20 * M, current
    finally:
        (job_dir.path / "go").touch()
    [record] = sge.wait_finished(job, timeout=SLOW)
    assert (record["exit_status"], record["failed"]) == ("0", "0")
    seen = json.loads(job_dir.output("ptmp", job))
    tmpdir = Path(seen["tmpdir"])
    assert sorted(seen["tmp"].split()) == sorted(["x", tmpdir.name]), seen
    assert (seen["var_tmp"].split(), seen["shm"].split()) == (["v"], ["y"]), seen
    [end] = journal.wait_for(SLOW, JOB_ID=str(job), GECO_EVENT="job-end")
    assert int(end["SHM_FREED"]) >= 20 * M, end
    assert not where.job_dir.exists() and not os.path.lexists(where.pin)
