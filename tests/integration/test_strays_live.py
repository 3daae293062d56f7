"""The doors out of a job, tried from inside real Grid Engine jobs: nothing of them outlives it.

A job's own processes die with its cgroups. A job can also ask a root daemon to
start a process for its owner: ``at`` (atd) and ``crontab`` (cron) here; such a
process is born outside every job cgroup. When the owner's last job on the node
ends, the epilog kills it and journals ``strays-killed`` (geco.job.strays).

The epilog ends these jobs; the last test ends one through gecod (a queue with
the preload and no epilog, as ``demo.sh`` sets up), which looks ``[strays]
delay`` (10 s) after the job's end.

The daemons are started by the tests when they are not running, and stopped
afterwards by their pid (only those started here). Cron runs a crontab entry
at a minute boundary at the earliest; the test uses an ``@reboot`` entry
instead, which cron runs when it starts: the job installs its crontab, then
the test starts cron (so it is skipped when cron runs already). ``systemd-run
--user`` needs systemd as PID 1 (only the QEMU machine has it): its process is
the same case as these, a process of the user outside every job.

Also: a process of another user, one of an exempt user, and one of a user who
still has another job running on the node are left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import alive, site_config_rewritten
from tests.integration.livekit import CLEAN_ENV, sh, wait_until, with_setting

pytestmark = pytest.mark.sge

GECO = "/usr/bin/geco"
ATD, CRON = Path("/usr/sbin/atd"), Path("/usr/sbin/cron")
CRON_REBOOT_MARK = Path("/run/crond.reboot")  # Debian's cron runs @reboot entries only without it
# Job script lines: wait (at most a minute) for a file the test or a door writes.
WAIT_FOR = "i=0; while [ ! -s {0} ] && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done\n"


def daemon_pids(name: str) -> list[int]:
    """Pids of root processes whose command is ``name``."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if (entry.isdigit() and Path(f"/proc/{entry}/comm").read_text().strip() == name
                    and os.stat(f"/proc/{entry}").st_uid == 0):
                found.append(int(entry))
    return found


@contextlib.contextmanager
def started(binary: Path, name: str, pidfile: Path) -> Iterator[int]:
    """``binary`` started (it daemonizes; its pid in ``pidfile``) and stopped by that pid."""
    assert not daemon_pids(name)
    sh([str(binary)])
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, f"{name} started")
    pid = int(pidfile.read_text().split()[0])
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not alive(pid), 30, f"{name} stopped")


@pytest.fixture(scope="module")
def atd() -> Iterator[None]:
    """atd running: the one there, or one started for this module."""
    if daemon_pids("atd"):
        yield
        return
    with started(ATD, "atd", Path("/run/atd.pid")):
        yield


def cgroups_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def outside_every_job(pid: int) -> bool:
    return "/GECO/" not in cgroups_of(pid)


def real_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def go(job_dir: Any, name: str) -> None:
    """Let the job waiting for ``name`` end."""
    (job_dir.path / name).write_text("go\n")


def door_pid(job_dir: Any, name: str) -> int:
    path = job_dir.path / name
    wait_until(lambda: path.exists() and path.read_text().strip(), 60, f"{name} written")
    return int(path.read_text())


def at_job(name: str) -> str:
    """A job script: ``at now`` starts ``sleep 600`` (its pid in <name>.pid), then waits
    for <name>.go."""
    return (f"echo 'echo $$ > {name}.pid; exec sleep 600' | at now\n"
            + WAIT_FOR.format(f"{name}.pid") + WAIT_FOR.format(f"{name}.go"))


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test made or found; SIGKILLed afterwards if a failed test left them."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def check_killed(journal: Any, job: int, owner: Any, pid: int,
                 cleaned_by: str = "epilog") -> dict[str, str]:
    """The job's strays-killed entry names the owner and ``pid`` (sleep); the process is gone."""
    [entry] = journal.wait_for(60, JOB_ID=str(job), GECO_EVENT="strays-killed")
    assert not alive(pid)
    assert (entry["USER"], entry["USER_ID"], entry["CLEANED_BY"]) == (
        owner.name, str(owner.uid), cleaned_by)
    assert str(pid) in entry["PIDS"].split()
    assert f"{pid}:sleep" in entry["COMMANDS"].split()
    return entry


# ---------------------------------------------------------------------------


def test_a_process_started_with_at_inside_a_job_dies_with_the_job(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any, atd: None,
        leftovers: list[int]) -> None:
    """Given atd, when a job runs `at now` to start `sleep 600` and ends, then while it
    ran that process was its owner's and outside the job's cgroups, `geco check` named atd
    as an open door (exit 1); afterwards the process is dead and the journal's
    strays-killed entry of the job names the owner, its pid and its command."""
    job = job_dir.submit("at", script=at_job("at"))
    pid = door_pid(job_dir, "at.pid")
    leftovers.append(pid)
    inside_view = (real_uid(pid), outside_every_job(pid), cgroups_of(pid))
    check = sh([GECO, "check"], check=False)
    go(job_dir, "at.go")
    [record] = sge.wait_finished(job, timeout=90)

    assert inside_view[:2] == (job_owner.uid, True), inside_view[2]
    assert check.returncode == 1
    assert any(line.startswith("open  atd runs (pid ") for line in check.stdout.splitlines())
    assert "door(s) out of a job open" in check.stderr
    assert record["exit_status"] == "0"
    check_killed(journal, job, job_owner, pid)


@pytest.fixture
def cron_after(job_owner: Any) -> Iterator[Callable[[], None]]:
    """Start cron (for its @reboot entries) when the test says; stop it and remove the test
    user's crontab afterwards. Skipped when cron runs already."""
    if daemon_pids("cron"):
        pytest.skip("cron runs already: it runs @reboot entries only when it starts, and "
                    "another entry would take up to a minute")
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: sh(["crontab", "-r", "-u", job_owner.name], check=False))

        def start() -> None:
            CRON_REBOOT_MARK.unlink(missing_ok=True)  # no cron runs: the mark is stale
            stack.enter_context(started(CRON, "cron", Path("/run/crond.pid")))

        yield start


def test_a_process_cron_starts_for_a_crontab_made_inside_a_job_dies_with_the_job(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any,
        cron_after: Callable[[], None], leftovers: list[int]) -> None:
    """Given a job that installs a crontab with `crontab -` (an @reboot entry starting
    `sleep 600`), when cron starts while the job runs and the job then ends, then cron's
    process was the owner's and outside the job's cgroups; afterwards it is dead and the
    job's strays-killed entry names it."""
    entry = f"@reboot cd {job_dir.path} && echo $$ > cron.pid && exec sleep 600"
    job = job_dir.submit("cron", script=(f"echo '{entry}' | crontab -\ntouch cron.done\n"
                                         + WAIT_FOR.format("cron.pid")
                                         + WAIT_FOR.format("cron.go")))
    wait_until(lambda: (job_dir.path / "cron.done").exists(), 60, "the job's crontab")
    cron_after()
    pid = door_pid(job_dir, "cron.pid")
    leftovers.append(pid)
    inside_view = (real_uid(pid), outside_every_job(pid), cgroups_of(pid))
    go(job_dir, "cron.go")
    [record] = sge.wait_finished(job, timeout=90)

    assert inside_view[:2] == (job_owner.uid, True), inside_view[2]
    assert record["exit_status"] == "0"
    check_killed(journal, job, job_owner, pid)


def test_other_users_and_a_job_still_running_keep_their_processes(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any, atd: None,
        leftovers: list[int]) -> None:
    """Given a job B of the test user that keeps running, a process of another user (nobody)
    outside every job, and a job A of the test user that starts `sleep 600` through `at`,
    when A ends, then the at process and B live on (A's epilog journals strays-kept naming
    B); when B ends too, the at process dies (B's strays-killed), B's own processes went
    with its cgroups, and nobody's process is untouched throughout."""
    other = subprocess.Popen(["setsid", "sleep", "600"], user="nobody", group="nogroup",
                             extra_groups=[], env=CLEAN_ENV, stdin=subprocess.DEVNULL)
    leftovers.append(other.pid)
    try:
        b = job_dir.submit("b", script="echo $$ > b.pid\n" + WAIT_FOR.format("b.go"))
        b_pid = door_pid(job_dir, "b.pid")
        a = job_dir.submit("a", script=at_job("a"))
        at_pid = door_pid(job_dir, "a.pid")
        leftovers.append(at_pid)
        go(job_dir, "a.go")
        sge.wait_finished(a, timeout=90)
        [kept] = journal.wait_for(30, JOB_ID=str(a), GECO_EVENT="strays-kept")
        after_a = (alive(at_pid), alive(b_pid), other.poll())
        go(job_dir, "b.go")
        [record] = sge.wait_finished(b, timeout=90)
        check_killed(journal, b, job_owner, at_pid)
        after_b = (alive(b_pid), other.poll())
    finally:
        other.kill()
        other.wait(timeout=30)

    assert after_a == (True, True, None)
    assert kept["REASON"] == f"job {b}.1 of {job_owner.name} still runs on this node"
    assert kept["PIDS"] == str(at_pid)
    assert journal.entries(JOB_ID=str(a), GECO_EVENT="strays-killed") == []
    assert record["exit_status"] == "0"
    assert after_b == (False, None)


def test_an_exempt_users_processes_outside_jobs_outlive_their_last_job(
        sge: Any, job_dir: Any, job_owner: Any, journal: Any, atd: None,
        leftovers: list[int]) -> None:
    """Given the test user listed in [strays] exempt_users (an admin), when their only job
    starts `sleep 600` through `at` and ends, then the process lives on and the epilog
    journals strays-kept saying the user is exempt."""
    def exempt(text: str) -> str:
        return with_setting(text, "strays", "exempt_users", "@@").replace(
            '"@@"', f'["{job_owner.name}"]')

    with site_config_rewritten(exempt):
        job = job_dir.submit("exempt", script=at_job("exempt"))
        pid = door_pid(job_dir, "exempt.pid")
        leftovers.append(pid)
        go(job_dir, "exempt.go")
        sge.wait_finished(job, timeout=90)
        [kept] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="strays-kept")
        lives = alive(pid)

    assert lives
    assert kept["REASON"] == f"{job_owner.name} is exempt ([strays] exempt_users)"
    assert journal.entries(JOB_ID=str(job), GECO_EVENT="strays-killed") == []


def test_gecod_ending_a_job_without_an_epilog_kills_what_it_left_through_at(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any, journal: Any, atd: None,
        leftovers: list[int]) -> None:
    """Given a queue with geco's starter and no epilog (gecod ends its jobs when their
    shepherd exits), when a job there starts `sleep 600` through `at` and ends, then gecod
    kills that process [strays] delay seconds later and journals strays-killed with
    CLEANED_BY=gecod."""
    queue = "geco-test-strays.q"
    with sge.temporary_queue(queue, prolog="NONE", epilog="NONE", slots="1",
                             starter_method="/usr/libexec/geco/starter"):
        wait_until(lambda: f"{queue}@{sge.host}" in sge.queue_states(), 30, "the queue")
        job = job_dir.submit("gecod", "-q", queue, script=at_job("gecod"))
        pid = door_pid(job_dir, "gecod.pid")
        leftovers.append(pid)
        outside = outside_every_job(pid)
        go(job_dir, "gecod.go")
        [record] = sge.wait_finished(job, timeout=90)
        [end] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="job-end")
        check_killed(journal, job, job_owner, pid, cleaned_by="gecod")

    assert outside
    assert record["exit_status"] == "0"
    assert end["CLEANED_BY"] == "gecod"
