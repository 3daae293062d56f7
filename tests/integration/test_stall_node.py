"""No user can stall a node: another user's jobs and logins go on while one attacks gecod.

Real Grid Engine with geco's preload in sge_execd, a real gecod, a real sshd with
geco's PAM lines. The attacker (:data:`stallkit.ATTACKER`, an ordinary account) runs,
for at least :data:`ATTACK_SECONDS` and until the test has seen each of its attacks
bite (:func:`stallkit.attack_until`), everything issue 32 found a user could do to a
node's gecod at once:

* a job of theirs whose stderr file is a FIFO nobody reads, with a child killed for
  its memory every few hundred ms (each OOM report once waited on the FIFO in a
  worker every job start needed);
* processes in that job holding 200,000 dup'd fds, and six loops of ssh logins of
  theirs to the node (each login's callerid lookup once walked every one of those fds
  in a shared worker, minutes per login);
* far more idle connections to gecod's public socket than their share (their own ssh
  session's next request once found its share full, and ran uncontained).

Meanwhile another user (the test user) starts jobs one after another, at least
:data:`VICTIM_JOBS`, and logs into each while it runs (each job runs until that login
is done). Each of their jobs starts at its first try, its shepherd's
JOB_STARTED answered in under a second (gecod's ``ELAPSED_MS``, accept to answer, less
the qstat it asked: ``stallkit.geco_ms``),
each login is admitted into their job with gecod's decision in under a second, no
queue goes into error, and once the attacker's job is deleted nothing of theirs is
left running. How long JOB_STARTED takes under each attack, beside a quiet node, is
``bench/bench_stall.py``'s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import SITE_SOCKET
from tests.flood import flooding
from tests.integration.livekit import no_queue_in_error, processes_of, wait_for_cgroups, wait_until
from tests.servicekit import JobOwner, Journal, ensure_user
from tests.sshkit import GECO_PAM_STACK, Sshd, running_sshd
from tests.stallkit import (
    ALLOCATE,
    ATTACKER,
    HOG_JOB,
    attack_until,
    fds_held,
    geco_ms,
    goal_ms,
    ssh_logins,
    unfifo,
)

pytestmark = pytest.mark.sge

ATTACK_SECONDS = 10.0  # at least; then until the attack and the victim showed enough
FDS = 200_000
LOGIN_LOOPS = 6
OOM_KILLS = 10  # of the attacker's job, at least
VICTIM_JOBS = 4  # at least, each logged into
# what the victim runs in each job they log into
LOGIN = "echo $JOB_ID; cat /proc/self/cgroup"
# The victim's job: it runs until the test logged into it (the test then makes
# done.<job id>), so a job costs Grid Engine's start and end, and a login never races
# the job's end.
VICTIM_JOB = """#!/bin/sh
until [ -e "{dir}/done.$JOB_ID" ]; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def attacker() -> JobOwner:
    return ensure_user(ATTACKER)


@pytest.fixture(scope="module")
def sshd(sge: Any, gecod: Any, attacker: JobOwner) -> Iterator[Sshd]:
    """sshd with geco's PAM lines, letting the test user and the attacker log in."""
    with running_sshd("geco-test-sshd-stall", GECO_PAM_STACK,
                      (sge.owner.name, attacker.name)) as server:
        yield server


def _victim_script(victim: JobOwner) -> Path:
    """:data:`VICTIM_JOB` in a fresh dir of the victim's."""
    script = victim.make_dir("stall-victim") / "victim.sh"
    script.write_text(VICTIM_JOB.format(dir=script.parent))
    script.chmod(0o755)
    os.chown(script, victim.uid, victim.gid)
    return script


def _victim_cycle(sge: Any, sshd: Sshd, script: Path, jobs: list[int]
                  ) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """One job of the victim's (its id appended to ``jobs``) and their login into it
    while it runs; the login's output and seconds, and the job, once the job ended."""
    victim = sge.owner
    job = sge.submit("-b", "y", "-o", "/dev/null", "-e", "/dev/null", "-l", "m_mem_free=64M",
                     str(script), cwd=script.parent)
    jobs.append(job)
    done = script.parent / f"done.{job}"
    try:
        wait_for_cgroups(f"{job}.1", timeout=120)
        t0 = time.monotonic()
        out = sshd.ssh(victim.name, LOGIN)
        took = time.monotonic() - t0
    finally:
        done.touch()
        os.chown(done, victim.uid, victim.gid)
    sge.wait_finished(job, timeout=120)
    return out, took, job


def _quiet(sge: Any, sshd: Sshd, journal: Any, script: Path, gecod_pid: int
           ) -> tuple[float, float]:
    """The victim's JOB_STARTED and login decision on the quiet node (ms): one job and one
    login into it, before any attack."""
    out, _took, job = _victim_cycle(sge, sshd, script, [])
    assert out.returncode == 0, out.stderr
    [started] = journal.wait_for(20, JOB_ID=str(job), GECO_EVENT="quarantined",
                                 REQUEST="JOB_STARTED")
    [adopted] = journal.wait_for(20, JOB_ID=str(job), GECO_EVENT="ssh-adopted",
                                 _PID=str(gecod_pid))
    return geco_ms(started), float(adopted["ELAPSED_MS"])


def _records(journal: Journal, since: float, gecod_pid: int, **match: str) -> list[dict[str, Any]]:
    return journal.entries(since, _PID=str(gecod_pid), **match)


def _oom_kills(journal: Journal, since: float, gecod_pid: int, hog: int) -> list[dict[str, Any]]:
    return _records(journal, since, gecod_pid, JOB_ID=str(hog), GECO_EVENT="oom")


def _fifo_refusals(journal: Journal, since: float, gecod_pid: int, hog: int
                   ) -> list[dict[str, Any]]:
    """gecod's OOM reports for the hog that it could not write (its .e file a FIFO)."""
    return _records(journal, since, gecod_pid, JOB_ID=str(hog),
                    GECO_EVENT="oom-report-failed")


def _over_budget(journal: Journal, since: float, gecod_pid: int, user: str
                 ) -> list[dict[str, Any]]:
    """``user``'s logins whose callerid lookup ran past its budget."""
    return [e for e in _records(journal, since, gecod_pid, SSH_USER=user)
            if e.get("CALLERID") == "over-budget"]


def _evicted(journal: Journal, since: float, gecod_pid: int, uid: int) -> bool:
    """Whether gecod closed an idle connection of ``uid``'s for a new one (journaled one by
    one, or counted in its window's summary): what the flooder then reads as its close."""
    return bool(_records(journal, since, gecod_pid, GECO_EVENT="quarantine-refused",
                         REASON="evicted", PEER_UID=str(uid))) or any(
        "evicted:" in e.get("REASONS", "")
        for e in _records(journal, since, gecod_pid, PEER_UID=str(uid),
                          GECO_EVENT="quarantine-refused-summary"))


def test_a_hostile_user_delays_no_other_users_job_start_or_login(
        sge: Any, gecod: Any, sshd: Sshd, attacker: JobOwner, journal: Any,
        figures: list[str]) -> None:
    """Given the attacker's FIFO-and-OOM job holding 200,000 fds, six loops of their ssh
    logins and a flood of idle connections of theirs, for at least 10 s and until the
    attack was shown real, when the test user meanwhile starts jobs one after another (at
    least 4, each running until its login is done) and logs into each, then every job of
    theirs starts at its first try with JOB_STARTED answered within 1 s, every login is
    admitted into their job with gecod's decision within 1 s (or 10 times the same on the
    quiet node, on a machine slower than that: stallkit.goal_ms), no queue is in error, the
    attack was real (OOM reports refused for the FIFO, logins past the callerid budget,
    connections evicted), and nothing of the attacker's outlives the job."""
    victim = sge.owner
    since = time.time()
    gecod_pid = gecod.proc.pid
    hog_dir = attacker.make_dir("stall-hog")
    script = hog_dir / "hog.sh"
    script.write_text(HOG_JOB.format(fds=FDS, ALLOCATE=ALLOCATE))
    os.chown(script, attacker.uid, attacker.gid)
    hog = sge.submit("-cwd", "-N", "hog", "-l", "m_mem_free=500M", "-o", "/dev/null",
                     str(script), cwd=hog_dir, user=attacker.name)
    key = sshd.dir / "client_key"  # root reads it; the attacker's copy below
    evil_key = hog_dir / "key"
    evil_key.write_bytes(key.read_bytes())
    os.chown(evil_key, attacker.uid, attacker.gid)
    evil_key.chmod(0o600)
    script = _victim_script(victim)
    jobs: list[int] = []
    logins: list[tuple[subprocess.CompletedProcess[str], float, int]] = []
    quiet = _quiet(sge, sshd, journal, script, gecod_pid)
    try:
        wait_for_cgroups(f"{hog}.1", timeout=120)
        held = fds_held(hog_dir, FDS, 120)
        login = ["ssh", "-i", str(evil_key), "-p", str(sshd.port), "-o", "BatchMode=yes",
                 "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                 f"{attacker.name}@127.0.0.1", "true"]
        with ssh_logins(attacker.name, login, LOGIN_LOOPS) as logged_in, \
                flooding(str(SITE_SOCKET), uid=attacker.uid, hold=300) as flood:
            started = time.monotonic()

            def shown() -> bool:  # the counts first: the journal is read once they are met
                return (len(logins) >= VICTIM_JOBS
                        and logged_in["logins admitted"] >= LOGIN_LOOPS
                        and len(_oom_kills(journal, since, gecod_pid, hog)) >= OOM_KILLS
                        and bool(_fifo_refusals(journal, since, gecod_pid, hog))
                        and bool(_over_budget(journal, since, gecod_pid, attacker.name))
                        and _evicted(journal, since, gecod_pid, attacker.uid))

            attack = attack_until(started, ATTACK_SECONDS, shown, lambda: logins.append(
                _victim_cycle(sge, sshd, script, jobs)))
    finally:
        unfifo(hog_dir / f"hog.e{hog}", attacker.uid, attacker.gid)
        subprocess.run(["qdel", "-f", str(hog)], capture_output=True, check=False)
        for job in jobs:
            subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
    sge.wait_finished(hog, timeout=120, accounting=False)

    # the victim: every job at its first try, its JOB_STARTED answered within the goal
    starts = []
    for job in jobs:
        [record] = sge.accounting(job)
        assert (record["failed"], record["exit_status"]) == ("0", "0"), record
        [started_rec] = journal.wait_for(20, JOB_ID=str(job), GECO_EVENT="quarantined",
                                         REQUEST="JOB_STARTED")
        starts.append(geco_ms(started_rec))
        assert not journal.entries(since, JOB_ID=str(job), GECO_EVENT="quarantine-refused")
    assert max(starts) < goal_ms(quiet[0]), (starts, quiet)
    # every login admitted into the job it was made during, decided within the goal
    decided = []
    for out, _took, job in logins:
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0] == str(job), out.stdout
        assert f"/{job}.1" in out.stdout, out.stdout
        [adopted] = journal.wait_for(20, JOB_ID=str(job), GECO_EVENT="ssh-adopted",
                                     _PID=str(gecod_pid))
        decided.append(float(adopted["ELAPSED_MS"]))
    assert max(decided) < goal_ms(quiet[1]), (decided, quiet)
    assert no_queue_in_error(sge) == {}
    figures.append(
        f"stall, one node, {attack:.0f} s of attack ({held:,} fds held, "
        f"{logged_in['logins admitted'] + logged_in['logins refused']} attacker logins, "
        f"{flood.stats['connected']:,} idle connections): the other user's {len(jobs)} jobs "
        f"started at once, JOB_STARTED (quiet {quiet[0]:.1f} ms) p50 "
        f"{statistics.median(starts):.1f} ms max "
        f"{max(starts):.1f} ms; their logins decided p50 {statistics.median(decided):.1f} ms "
        f"max {max(decided):.1f} ms (whole ssh p50 "
        f"{statistics.median(t for _, t, _ in logins) * 1000:.0f} ms)")

    # the attack was real
    assert attack >= ATTACK_SECONDS and len(jobs) >= VICTIM_JOBS, (attack, jobs)
    oom = _oom_kills(journal, since, gecod_pid, hog)
    assert len(oom) >= OOM_KILLS, len(oom)
    fifo = _fifo_refusals(journal, since, gecod_pid, hog)
    assert fifo and all("FIFO" in e["MESSAGE"] for e in fifo), fifo[:3]
    over = _over_budget(journal, since, gecod_pid, attacker.name)
    assert over, "no attacker login ran past the callerid budget"
    assert logged_in["logins admitted"] >= LOGIN_LOOPS, logged_in
    assert flood.stats["held closed by gecod"] > 0, flood.stats

    # nothing of the attacker's outlives the job (their processes outside it included:
    # gecod ends the strays of a user's last job on the node)
    wait_until(lambda: not processes_of(attacker.uid), 60,
               f"the attacker's processes to end: {processes_of(attacker.uid)}")
