"""No user writes another user's job story (issue 48, 2).

journald takes any field from any local process: with ``logger --journald`` alone an
ordinary user can send ``SYSLOG_IDENTIFIER=gecod GECO_EVENT=job-end`` with the
``JOB_ID`` of another user's job, made-up accounting and escape sequences. Before,
`geco journal N` printed such an entry as gecod's, its summary took the made-up figures,
and the escape sequences reached root's terminal raw.

Real Grid Engine with geco's preload and a real gecod: the test user's job runs and
ends; then the attacker (:data:`stallkit.ATTACKER`) forges its end. Root's `geco
journal` shows the forged entry under the attacker's uid, ends the story with gecod's
own figures, and prints no control character but newlines.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.integration.livekit import CLEAN_ENV, GECO, no_queue_in_error
from tests.servicekit import JobOwner, ensure_user
from tests.stallkit import ATTACKER

pytestmark = pytest.mark.sge

WAIT = 120.0
FAKE_PEAK = 999 << 30


@pytest.fixture(scope="module")
def attacker() -> JobOwner:
    return ensure_user(ATTACKER)


def _forge(attacker: JobOwner, job: int) -> None:
    """The attacker's job-end of ``job``, as logger --journald sends it."""
    entry = "\n".join([
        "MESSAGE=job ended: peak memory 999G \x1b]0;pwned\x07\x1b[2J",
        "SYSLOG_IDENTIFIER=gecod", "GECO_EVENT=job-end", f"JOB_ID={job}", "SGE_TASK_ID=1",
        f"MEMORY_PEAK={FAKE_PEAK}", "KILLED=42", "CLEANED_BY=gecod", "SGE_CLUSTER=forged",
        "JOB_SUBMITTED=1"]) + "\n"
    subprocess.run(["runuser", "-u", attacker.name, "--", "logger", "--journald"],
                   input=entry, text=True, check=True, timeout=30, env=CLEAN_ENV)


def test_a_job_end_another_user_forges_is_shown_as_theirs_and_never_as_gecods(
        sge: Any, gecod: Any, attacker: JobOwner, journal: Any, job_dir: Any) -> None:
    """Given the test user's job ended and its job-end journaled by gecod, when the
    attacker sends a job-end of that job with gecod's identifier, 999G of peak memory, 42
    processes killed and escape sequences, then root's `geco journal` shows that entry
    under the attacker's uid, sums the job up with gecod's figures, and prints no escape
    character; --json names the attacker's uid."""
    job = job_dir.submit("short", "-l", "m_mem_free=64M", script="#!/bin/sh\necho done\n")
    [record] = sge.wait_finished(job, timeout=WAIT)
    assert (record["failed"], record["exit_status"]) == ("0", "0"), record
    [real] = journal.wait_for(WAIT, JOB_ID=str(job), GECO_EVENT="job-end", _UID="0")
    _forge(attacker, job)
    journal.wait_for(WAIT, JOB_ID=str(job), _UID=str(attacker.uid))

    shown = subprocess.run([GECO, "journal", str(job)], capture_output=True, text=True,
                           timeout=60, env=CLEAN_ENV, check=False)
    print(shown.stdout)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    forged = [line for line in lines if f"[uid {attacker.uid}]" in line]
    assert len(forged) == 1 and "\\x1b]0;pwned\\x07\\x1b[2J" in forged[0], lines
    assert not any(" gecod  " in line and "999G" in line for line in lines), lines
    assert lines[-1].startswith(f"job {job}.1 ended "), lines
    assert "999G" not in lines[-1] and "42 processes" not in lines[-1], lines[-1]
    peak = int(real["MEMORY_PEAK"])
    assert peak < FAKE_PEAK and "peak memory 999G" not in lines[-1], (peak, lines[-1])
    assert not [c for c in shown.stdout if ord(c) < 32 and c != "\n"], shown.stdout

    as_json = subprocess.run([GECO, "journal", str(job), "--json"], capture_output=True,
                             text=True, timeout=60, env=CLEAN_ENV, check=True)
    uids = [json.loads(line).get("_UID") for line in as_json.stdout.splitlines()]
    assert str(attacker.uid) in uids and "0" in uids, uids
    assert no_queue_in_error(sge) == {}
