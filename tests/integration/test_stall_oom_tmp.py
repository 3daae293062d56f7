"""An OOM report reaches the job's own /tmp file, never a file another user planted in the
node's /tmp ([tmp] private = true).

With a private /tmp each job has its own mount namespace: a job's ``-e /tmp/<name>`` is
in the job's /tmp. gecod appends the OOM report as the job's owner from a child process;
before, that child opened the path in the node's namespace, so another user who had
made /tmp/<name> there, writable by all, read the victim's report and the victim never
got it. The child now enters the job's namespace first.

Real Grid Engine with geco's preload in sge_execd (it enters the job's namespace before
the shepherd opens the job's files) and a real gecod. The attacker
(:data:`stallkit.ATTACKER`, an ordinary account) plants /tmp/<name> in the node's /tmp;
the test user's job writes its stderr to /tmp/<name>, has a process killed for its
memory, and prints what its own /tmp/<name> holds once the report is somewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import privatetmpkit
from tests.integration.livekit import site_settings, wait_until
from tests.servicekit import ensure_user
from tests.stallkit import ALLOCATE, ATTACKER

pytestmark = pytest.mark.sge

WAIT = 120.0
# The victim's job: a child killed for its memory (-l m_mem_free well below 800M), then,
# once its own /tmp/<name> has geco's report ("seen") or the test says "go", what that
# file holds, printed on stdout (its .o file, in the job's directory).
VICTIM = f"""name="$1"
/usr/bin/python3 -c "{ALLOCATE}"
while [ ! -e go ]; do
  if grep -q '^geco: job ' "/tmp/$name"; then touch seen; break; fi
  sleep 0.1
done
echo BEGIN; cat "/tmp/$name"; echo END
"""


@pytest.fixture(scope="module")
def private_tmp(sge: Any, gecod: Any) -> Iterator[None]:
    with site_settings({("tmp", "private"): True}, gecod):
        yield


@pytest.fixture
def planted(private_tmp: None) -> Iterator[Path]:
    """/tmp/<name> in the node's /tmp, the attacker's, empty, mode 0666."""
    attacker = ensure_user(ATTACKER)
    with privatetmpkit.planted("oom-tmp", attacker.uid, attacker.gid) as path:
        yield path


def test_the_oom_report_goes_to_the_jobs_own_tmp_file_not_one_planted_in_the_nodes(
        sge: Any, gecod: Any, journal: Any, job_dir: Any, planted: Path) -> None:
    """Given another user's world-writable /tmp/<name> in the node's /tmp, when the test
    user's job with -e /tmp/<name> has a process killed for its memory, then the job's
    own /tmp/<name> has geco's report and the planted file stays empty."""
    name = planted.name
    script = job_dir.script(name, VICTIM)
    job = int(sge.submit("-cwd", "-N", name, "-l", "m_mem_free=200M", "-e", str(planted),
                         script, name, cwd=job_dir.path))
    job_dir.ids.append(job)
    seen, go = job_dir.path / "seen", job_dir.path / "go"
    try:
        journal.wait_for(WAIT, JOB_ID=str(job), GECO_EVENT="oom")
        # the report is somewhere: where the job sees it, the node's file, or nowhere
        wait_until(lambda: seen.exists() or planted.stat().st_size > 0 or journal.entries(
            JOB_ID=str(job), GECO_EVENT="oom-report-failed"), WAIT, "the report written")
    finally:
        go.touch()
    sge.wait_finished(job, timeout=WAIT)
    out = job_dir.output(name, job)
    own = out.split("BEGIN\n", 1)[-1].rsplit("END\n", 1)[0]
    node = planted.read_text()
    print(f"the job's own /tmp/{name}:\n{own}the node's /tmp/{name} (planted):\n{node}")
    assert any(line.startswith(f"geco: job {job} ") for line in own.splitlines()), out
    assert node == ""
