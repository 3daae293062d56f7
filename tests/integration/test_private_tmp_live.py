"""A private /tmp, /var/tmp and /dev/shm for every Grid Engine job ([tmp] private = true).

This machine's Grid Engine with geco's hooks, the exec() preload in sge_execd and gecod,
the site's geco.toml switched to private /tmp for the module (gecod restarted: the
preload always knows where namespaces are pinned). Jobs of two users run at once; what
each sees is what it prints, what the node keeps is looked at from outside.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.config import Config
from geco.job import privatetmp
from geco.jobkey import JobKey
from tests.integration.livekit import (
    job_cgroups,
    job_of,
    no_queue_in_error,
    rescheduled,
    running_job,
    site_settings,
)
from tests.integration.samekit import (
    CLIENT_ENV,
    GECO,
    QUEUES,
    Same,
    on_terminal,
    same_queues,
    screen_text,
)
from tests.servicekit import ensure_user
from tests.sshkit import GECO_PAM_STACK, Sshd, running_sshd

pytestmark = pytest.mark.sge

OTHER_USER = "gecotest2"
SITE_STATE = Path("/var/lib/geco")
WAIT = 180.0
M = 1 << 20
# Writes /tmp/x, /var/tmp/v, 20M in /dev/shm/y and a file in $TMPDIR, says what it sees
# there (JSON), then holds on until the test touches "go" in its directory.
LOOK_AND_HOLD = """#!/bin/sh
echo "$JOB_ID" > /tmp/x && echo "$JOB_ID" > /var/tmp/v
head -c 20971520 /dev/zero > /dev/shm/y
touch "$TMPDIR/t"
printf '{"tmp": "%s", "var_tmp": "%s", "shm": "%s", "tmpdir": "%s", "x": "%s"}\\n' \\
  "$(ls -A /tmp | tr '\\n' ' ')" "$(ls -A /var/tmp | tr '\\n' ' ')" \\
  "$(ls -A /dev/shm | tr '\\n' ' ')" "$TMPDIR" "$(cat /tmp/x)"
touch up
while [ ! -e go ]; do sleep 0.2; done
"""
# Past the cap of a job granted 64M (/dev/shm: 32M): the second write fails.
PAST_THE_CAP = """#!/bin/sh
head -c 25165824 /dev/zero > /dev/shm/a && echo first-ok
head -c 16777216 /dev/zero > /dev/shm/b || echo second-failed
"""


@pytest.fixture(scope="module")
def private_tmp(sge: Any, gecod: Any) -> Iterator[None]:
    with site_settings({("tmp", "private"): True}, gecod):
        yield


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        time.sleep(0.2)


def _places(job: int) -> privatetmp.Places:
    return privatetmp.places(Config(state_dir=SITE_STATE), JobKey(job, 1))


def test_two_users_jobs_see_only_their_own_tmp_and_shm_and_leave_nothing_behind(
        sge: Any, gecod: Any, journal: Any, private_tmp: None, job_dir: Any,
        job_owner: Any) -> None:
    """Given jobs of two users running at once, each writing /tmp/x, /var/tmp/v, 20M of
    /dev/shm/y and a file in Grid Engine's $TMPDIR, then each sees only its own files
    (and its $TMPDIR), the node's /dev/shm has neither's, each job's memory cgroup holds
    its 20M; once they end, nothing of them is left on the node, their job-end records
    say what was freed, and no queue instance went into error."""
    other = ensure_user(OTHER_USER)
    theirs_dir = other.make_dir("private-tmp")
    (theirs_dir / "look.sh").write_text(LOOK_AND_HOLD)
    os.chown(theirs_dir / "look.sh", other.uid, other.gid)
    mine = job_dir.submit("look", "-l", "m_mem_free=256M", script=LOOK_AND_HOLD.split("\n", 1)[1])
    theirs = sge.submit("-cwd", "-N", "look", "-l", "m_mem_free=256M", "look.sh",
                        cwd=theirs_dir, user=other.name)
    try:
        _until(lambda: (job_dir.path / "up").exists() and (theirs_dir / "up").exists(),
               "both jobs writing and holding")
        for job in (mine, theirs):
            places = _places(job)
            assert (places.tmp / "x").read_text() == f"{job}\n"
            memory = job_cgroups(f"{job}.1")["memory"]
            usage = int((memory / "memory.usage_in_bytes").read_text())
            assert usage >= 20 * M, usage  # its /dev/shm pages are the job's
        assert not Path("/dev/shm/y").exists()
    finally:
        (job_dir.path / "go").touch()
        (theirs_dir / "go").touch()
    [record] = sge.wait_finished(mine, timeout=WAIT)
    [other_record] = sge.wait_finished(theirs, timeout=WAIT)
    assert record["exit_status"] == other_record["exit_status"] == "0"

    for job, out in ((mine, job_dir.output("look", mine)),
                     (theirs, (theirs_dir / f"look.o{theirs}").read_text())):
        seen = json.loads(out)
        tmpdir = Path(seen["tmpdir"])
        assert seen["x"] == str(job)
        assert sorted(seen["tmp"].split()) == sorted(["x", tmpdir.name]), seen
        assert seen["var_tmp"].split() == ["v"], seen
        assert seen["shm"].split() == ["y"], seen
        [end] = journal.wait_for(JOB_ID=job, GECO_EVENT="job-end")
        assert int(end["SHM_FREED"]) >= 20 * M, end
        assert int(end["TMP_FREED"]) > 0, end
        places = _places(job)
        assert not places.job_dir.exists() and not os.path.lexists(places.pin)
    assert no_queue_in_error(sge) == {}


def test_a_job_writing_past_its_shm_cap_gets_enospc(
        sge: Any, gecod: Any, private_tmp: None, job_dir: Any) -> None:
    """Given a job granted 64M (its /dev/shm: 32M), when it writes 24M and then 16M more
    there, then the second write fails (no space left on the device), and the job goes
    on and ends as it would."""
    job = job_dir.submit("cap", "-l", "m_mem_free=64M", script=PAST_THE_CAP.split("\n", 1)[1])
    [record] = sge.wait_finished(job, timeout=WAIT)
    out, err = job_dir.output("cap", job), job_dir.output("cap", job, stream="e")
    assert out == "first-ok\nsecond-failed\n", (out, err)
    assert "No space left on device" in err
    assert record["exit_status"] == "0"


# A 2-slot job: the master writes /tmp/master, a `qrsh -inherit` task on the same host
# reads it, looks at its $TMPDIR and writes /tmp/task, which the master then reads.
SHARED_BY_TASKS = """#!/bin/sh
echo from-master > /tmp/master
printf '%s\n' 'cat /tmp/master; test -d "$TMPDIR" && echo task-tmpdir-ok' \
  'echo from-task > /tmp/task' > task.sh
qrsh -inherit "$(hostname)" /bin/sh "$PWD/task.sh"
cat /tmp/task
ls -A /tmp | grep -v "^$JOB_ID\\\\." | tr '\\n' ' '; echo
"""


def test_the_tasks_of_a_parallel_job_on_one_host_share_its_tmp(
        sge: Any, gecod: Any, private_tmp: None, job_dir: Any) -> None:
    """Given a 2-slot -pe smp job whose master starts a `qrsh -inherit` task on the same
    host, then the task reads the master's /tmp file and finds its own $TMPDIR, the master
    reads the task's, and /tmp holds only their files (and Grid Engine's $TMPDIR)."""
    job = job_dir.submit("tasks", "-pe", "smp", "2", "-l", "m_mem_free=128M",
                         script=SHARED_BY_TASKS.split("\n", 1)[1])
    [record] = sge.wait_finished(job, timeout=WAIT)
    out, err = job_dir.output("tasks", job), job_dir.output("tasks", job, stream="e")
    assert out.splitlines() == ["from-master", "task-tmpdir-ok", "from-task", "master task "],\
        (out, err)
    assert record["exit_status"] == "0"


@pytest.fixture(scope="module")
def same(sge: Any, gecod: Any, private_tmp: None, job_owner: Any) -> Iterator[Same]:
    """The interactive jobs' queue (geco's starter and the preload, as the differential
    suite has it)."""
    with same_queues(sge, job_owner, "private-tmp") as kit:
        yield kit


def test_an_interactive_qrsh_sees_its_own_tmp(same: Same) -> None:
    """Given `qrsh <command>` as the test user, then the command's /tmp holds only what
    it wrote there (and Grid Engine's $TMPDIR where it set one), and it exits as it
    would."""
    same.enable()
    same.wait_idle()
    command = ("echo q > /tmp/q; ls -A /tmp | tr '\\n' ' '; echo; "
               "echo ${TMPDIR-unset}; exit 3")
    done = subprocess.run(
        same.client_argv("qrsh", "-q", QUEUES[GECO], "-N", "ptmp", "-l", "m_mem_free=128M",
                         command),
        cwd=same.path, env=CLIENT_ENV, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=WAIT)
    assert done.returncode == 3, done
    listing, tmpdir = done.stdout.splitlines()[-2:]
    expected = {"q"} | ({Path(tmpdir).name} if tmpdir.startswith("/tmp/") else set())
    assert set(listing.split()) == expected, done.stdout


def test_a_qlogin_session_sees_its_own_tmp(same: Same) -> None:
    """Given `qlogin` as the test user on a terminal, when the session writes a file in
    /tmp and lists it, then /tmp holds only that file (and Grid Engine's $TMPDIR for the
    job), the node's /tmp never had it, and the session exits as it would."""
    same.enable()
    same.wait_idle()
    mark = f"ql-{uuid.uuid4().hex[:8]}"
    term = on_terminal(
        same.client_argv("qlogin", "-q", QUEUES[GECO], "-N", mark, "-l", "m_mem_free=128M"),
        cwd=same.path, say=f'echo q > /tmp/{mark}; echo "BEG""IN $(ls -A /tmp | tr "\\n" " ")'
                           f'E""ND"\n', until="END", then="exit 4\n", timeout=WAIT)
    text = screen_text(term.transcript)
    found = re.search(r"^BEGIN (.*)END$", text, re.MULTILINE)
    assert term.code == 4 and found, text
    seen = set(found.group(1).split())
    assert mark in seen, text
    assert all(re.fullmatch(r"\d+\.1\..+", name) for name in seen - {mark}), seen
    assert not Path("/tmp", mark).exists()


@pytest.fixture(scope="module")
def sshd(sge: Any, gecod: Any, private_tmp: None) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 with geco's PAM lines (tests/sshkit.py)."""
    with running_sshd("geco-test-sshd-tmp", GECO_PAM_STACK, ("root", sge.owner.name)) as server:
        yield server


def test_an_ssh_session_adopted_into_a_job_sees_the_jobs_tmp(
        sshd: Sshd, sge: Any, job_dir: Any) -> None:
    """Given a running job that wrote /tmp/mark, when its owner ssh-es in, then the
    session (adopted into the job, as pam_slurm_adopt's join_container) reads the job's
    /tmp/mark; root's session, in no job, sees the node's /tmp without it."""
    script = "#!/bin/sh\necho job-wrote > /tmp/mark\nexec sleep 600\n"
    with running_job(sge, "-l", "m_mem_free=128M", script=script, cwd=job_dir.path) as key:
        mark = _places(int(key.split(".")[0])).tmp / "mark"
        _until(mark.exists, "the job's /tmp/mark")
        out = sshd.ssh(sge.owner.name, "cat /tmp/mark; cat /proc/self/cgroup")
        assert out.returncode == 0, out.stderr
        mark_seen, cgroups = out.stdout.split("\n", 1)
        assert mark_seen == "job-wrote", out.stdout
        assert job_of(cgroups) == key
        mine = sshd.ssh("root", "cat /tmp/mark")
        assert mine.returncode != 0 and "No such file" in mine.stderr, mine


FULL = {("tmp", "min_free"): "1000000T"}  # more than any base has free: "full"


def test_a_job_that_cannot_get_its_tmp_is_requeued_never_run_with_the_nodes(
        sge: Any, gecod: Any, journal: Any, private_tmp: None, job_dir: Any) -> None:
    """Given [tmp] min_free above what the base has free (on_failure = "requeue", the
    default), when a job is submitted, then it never runs: its shepherd is refused, Grid
    Engine reschedules it (no queue instance in error state), and the journal says why
    under its JOB_ID, naming min_free."""
    with site_settings(FULL, gecod):
        job = job_dir.submit("noplace", "-l", "m_mem_free=128M",
                             script="echo ran > /tmp/should-not-run\n")
        try:
            _until(lambda: rescheduled(job), "the start refused and rescheduled")
            ran = (job_dir.path / f"noplace.o{job}").exists()
            why = [e["MESSAGE"] for e in journal.entries(JOB_ID=str(job))
                   if "min_free" in e.get("MESSAGE", "")]
            states = no_queue_in_error(sge)
        finally:
            subprocess.run(["qdel", "-f", str(job)], capture_output=True, env=CLIENT_ENV,
                           timeout=60)
    assert not ran
    assert why, [e.get("MESSAGE") for e in journal.entries(JOB_ID=str(job))]
    assert states == {}


def test_with_on_failure_shared_such_a_job_runs_with_the_nodes_tmp_and_says_so(
        sge: Any, gecod: Any, journal: Any, private_tmp: None, job_dir: Any) -> None:
    """Given the same full base and [tmp] on_failure = "shared", when a job writes a file in
    /tmp, then it runs and ends as it would, contained, the file is in the node's /tmp, and
    the journal has a warning (tmp-shared) naming min_free under its JOB_ID."""
    mark = Path("/tmp", f"shared-{uuid.uuid4().hex[:8]}")
    try:
        with site_settings({**FULL, ("tmp", "on_failure"): "shared"}, gecod):
            job = job_dir.submit("shared", "-l", "m_mem_free=128M",
                                 script=f"echo $JOB_ID > {mark}\n")
            [record] = sge.wait_finished(job, timeout=WAIT)
            [warning] = journal.wait_for(JOB_ID=job, GECO_EVENT="tmp-shared")
        assert record["exit_status"] == "0"
        assert mark.read_text() == f"{job}\n"
        assert "min_free" in warning["REASON"] and warning["PRIORITY"] == "4", warning
        assert not os.path.lexists(_places(job).pin)
    finally:
        mark.unlink(missing_ok=True)
