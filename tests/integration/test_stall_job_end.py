"""No user stalls another's job end by holding a lock on a file of their own (issue 48, 1).

A job's usage samples file is root's and readable by its owner, and ``flock`` grants
``LOCK_EX`` on a descriptor open for reading. Before, every job end read the ended
job's samples for its efficiency under a blocking shared lock, with the job's lock
held: an owner holding the files of two of their ended jobs (from a third job) took
both of gecod's end workers, and another user's job that ended meanwhile got no
``job-end`` record and kept its cgroups until the holder let go.

Real Grid Engine with geco's preload in sge_execd, a queue with geco's starter only (as
``demo.sh`` sets a node up: gecod ends every job when its shepherd exits, in its two end
workers) and a real gecod sampling every second. The attacker
(:data:`stallkit.ATTACKER`, an ordinary account) runs a holder job that takes
``LOCK_EX`` on every samples file it can open and keeps it, and ends two jobs whose files
it holds; then the test user's job ends. Its ``job-end`` record comes while the attacker
still holds every lock, within twice its quiet time (a quiet job end first, same node,
same user), and the attacker's own ended jobs get theirs too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import (
    GECO,
    job_cgroups,
    no_queue_in_error,
    site_settings,
    wait_until,
)
from tests.servicekit import JobOwner, ensure_user
from tests.stallkit import ATTACKER

pytestmark = pytest.mark.sge

USAGE_DIR = Path("/var/lib/geco/usage")
STARTER = "/usr/libexec/geco/starter"
WAIT = 120.0
# The attacker's holder job: LOCK_EX on every samples file it can open (its own jobs'),
# kept until the test makes "stop"; "held.<job>" says which it holds.
HOLDER = f"""#!/usr/bin/python3
import fcntl, os, time
me = os.environ["JOB_ID"] + "."
held = {{}}
while not os.path.exists("stop"):
    for name in os.listdir("{USAGE_DIR}"):
        if name in held or name.startswith((me, ".")):
            continue
        try:
            fd = os.open(os.path.join("{USAGE_DIR}", name), os.O_RDONLY)
        except OSError:
            continue  # another user's
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[name] = fd
        open("held." + name.split(".")[0], "w").close()
    time.sleep(0.05)
"""
# An attacker's job that ends once the holder holds its samples file.
HELD = """#!/bin/sh
until [ -e "held.$JOB_ID" ]; do sleep 0.1; done
"""
# The victim's job: says when it ended.
VICTIM = """#!/bin/sh
date +%s.%N > "ended.$JOB_ID"
"""


@pytest.fixture(scope="module")
def attacker() -> JobOwner:
    return ensure_user(ATTACKER)


@pytest.fixture(scope="module")
def sampled_every_second(sge: Any, gecod: Any) -> Iterator[None]:
    """gecod sampling each job every second: an attacker's job has its file at once."""
    with site_settings({("usage", "interval"): 1.0}, gecod):
        yield


@pytest.fixture
def starter_only_queue(sge: Any) -> Iterator[str]:
    """The queue of a node with the preload: geco's starter only, no prolog or epilog."""
    with sge.temporary_queue("geco-test-stall-end.q", prolog="NONE", epilog="NONE",
                             starter_method=STARTER, slots="2") as queue:
        yield queue


def _script(owner: JobOwner, name: str, text: str) -> Path:
    path = owner.make_dir(f"stall-{name}") / f"{name}.sh"
    path.write_text(text)
    path.chmod(0o755)
    os.chown(path, owner.uid, owner.gid)
    return path


def _submit(sge: Any, queue: str, script: Path, owner: JobOwner) -> int:
    return int(sge.submit("-cwd", "-q", queue, "-b", "y", "-o", "/dev/null", "-e",
                          "/dev/null", "-l", "m_mem_free=64M", str(script), cwd=script.parent,
                          user=owner.name))


def _end_record(journal: Any, job: int) -> dict[str, Any]:
    found: list[dict[str, Any]] = journal.wait_for(WAIT, JOB_ID=str(job), GECO_EVENT="job-end",
                                                   _UID="0")
    [record] = found
    return record


def _end_seconds(sge: Any, journal: Any, script: Path, job: int) -> float:
    """Seconds from the victim's job's last command to gecod's ``job-end`` record."""
    [record] = sge.wait_finished(job, timeout=WAIT)
    assert (record["failed"], record["exit_status"]) == ("0", "0"), record
    ended = float((script.parent / f"ended.{job}").read_text())
    return int(_end_record(journal, job)["__REALTIME_TIMESTAMP"]) / 1e6 - ended


def test_an_owner_holding_their_ended_jobs_files_delays_no_other_users_job_end(
        sge: Any, gecod: Any, sampled_every_second: None, starter_only_queue: str,
        attacker: JobOwner, journal: Any, figures: list[str]) -> None:
    """Given the attacker holding LOCK_EX on the samples files of two of their jobs as
    those end (from a third job of theirs), when the test user's job ends, then its
    job-end record comes while every lock is still held, within twice its quiet time
    (1 s at least: a busy machine's scheduling), its cgroups are gone; the attacker's
    jobs got their records too, root's `geco usage` of one answers, no queue is in
    error."""
    victim = sge.owner
    victim_script = _script(victim, "victim", VICTIM)
    queue = starter_only_queue
    quiet = _end_seconds(sge, journal, victim_script, _submit(sge, queue, victim_script, victim))

    holder_script = _script(attacker, "holder", HOLDER)
    held_script = holder_script.parent / "ends.sh"
    held_script.write_text(HELD)
    held_script.chmod(0o755)
    os.chown(held_script, attacker.uid, attacker.gid)
    holder = _submit(sge, queue, holder_script, attacker)
    stop = holder_script.parent / "stop"
    try:
        theirs = []
        for _ in range(2):  # one after the other: the holder takes a core of two
            job = _submit(sge, queue, held_script, attacker)
            theirs.append(job)
            sge.wait_finished(job, timeout=WAIT)
        held = {p.name for p in holder_script.parent.glob("held.*")}
        assert {f"held.{job}" for job in theirs} <= held, held

        job = _submit(sge, queue, victim_script, victim)
        under_attack = _end_seconds(sge, journal, victim_script, job)
        wait_until(lambda: not job_cgroups(f"{job}.1"), WAIT, f"job {job}'s cgroups to go")
        for theirs_job in theirs:
            assert "CPU_EFFICIENCY" in _end_record(journal, theirs_job)
        usage = subprocess.run([GECO, "usage", str(theirs[0]), "--json"], cwd="/",
                               capture_output=True, text=True, timeout=60, check=False)
        assert usage.returncode == 0, usage.stderr
        assert not stop.exists()  # every lock still held
    finally:
        stop.touch()
        subprocess.run(["qdel", "-f", str(holder)], capture_output=True, check=False)
    sge.wait_finished(holder, timeout=WAIT, accounting=False)
    assert no_queue_in_error(sge) == {}
    figures.append(f"stall, job end: another user's job ended in {under_attack:.2f} s with "
                   f"the attacker holding the samples files of two ended jobs (quiet "
                   f"{quiet:.2f} s, {under_attack / quiet:.1f}x)")
    assert under_attack <= max(2 * quiet, 1.0), (under_attack, quiet)
