"""Issue 38 on the Grid Engine this machine runs (Son of Grid Engine 8.1.9), with the code
Open Cluster Scheduler's jobs go through: a job's journal records say which job of its
number they are about, and ``geco journal`` shows that job.

Grid Engine reuses job numbers (after they wrap around, a qmaster installed anew: this
machine's test runs restart at 1), so every record geco writes about a job once it has
read the job's spool carries ``SGE_CLUSTER`` (the cell's ``common/cluster_name``, else
``$SGE_ROOT/$SGE_CELL``) and ``JOB_SUBMITTED`` (the job's submission time). The OCS
parts that need OCS's own output are shown on its recordings (tests/unit/test_ocs_*.py);
a job that never carries geco's preload is shown here by test_preload_scope.py and, the
way OCS's execd passes its environment on, by tests/system/test_ocs_preload.py.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.integration.livekit import GECO, journal_story, sh

pytestmark = pytest.mark.sge

CELL = "/var/lib/gridengine/default"
# what the records of every job-level step say (gecod at the shepherd's exec, the prolog,
# the epilog), once the job's spool has been read
STEPS = ("job-contained", "job-end")


def cluster_name() -> str:
    """This cluster as geco's records name it (see the module docstring)."""
    try:
        return open(f"{CELL}/common/cluster_name").read().strip()
    except FileNotFoundError:  # Debian's packages write none
        return CELL


def submitted(record: dict[str, str]) -> int:
    """qacct's ``qsub_time`` (local time, to the second) in seconds since the epoch."""
    return int(time.mktime(time.strptime(record["qsub_time"], "%a %b %d %H:%M:%S %Y")))


def test_a_jobs_records_name_its_cluster_and_submission_and_geco_journal_shows_that_job(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given gecod and the preload, when a job runs, then its job-contained and job-end
    records carry SGE_CLUSTER (this cell) and JOB_SUBMITTED (the qsub_time qacct
    accounts), and `geco journal N` shows this job's story: its job-end, and, where the
    journal holds other jobs numbered N (earlier runs on this machine), a heading naming
    this job's submission and a last line saying --all shows the others."""
    job = job_dir.submit("story", script="echo ran\n")
    [record] = sge.wait_finished(job, timeout=120)
    journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")
    when = submitted(record)

    mine = [e for e in journal.entries(JOB_ID=str(job)) if e.get("GECO_EVENT") in STEPS
            and e.get("JOB_SUBMITTED") == str(when)]
    assert sorted(e["GECO_EVENT"] for e in mine) == sorted(STEPS), (
        f"job {job} (submitted {when}): {journal.entries(JOB_ID=str(job))}")
    assert {e.get("SGE_CLUSTER") for e in mine} == {cluster_name()}

    lines, heading = journal_story(job)
    others = sh([GECO, "journal", "--all", str(job)]).stdout
    if heading:  # other jobs numbered N: this one is named, the newest
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
        assert heading.startswith(f"-- job {job} submitted {stamp}"), heading
        assert len(re.findall(rf"^-- job {job}[ :]", others, re.MULTILINE)) >= 2, others
    else:
        assert others.splitlines() == lines
    assert any(" job-end " in line for line in lines), lines
    assert lines[-1].startswith(f"job {job}.1 ended "), lines
