"""The preload in sshd: the second line behind sshd's PAM module, and JOB_ID from the client.

Real sshds on 127.0.0.1 (tests/sshkit.py) with geco's exec() preload loaded, as
``LD_PRELOAD`` in the ssh unit's environment puts it: one with the README's PAM
stack, one whose stack lacks geco's lines (a misconfigured node). A real gecod
answers both; real Grid Engine jobs of the test user (and of another user) run.

Seen from the user: a session sent with ``JOB_ID`` (``SendEnv``/``AcceptEnv``)
lands in that job of theirs, with that job's variables; ``JOB_ID`` of someone
else's job is refused with geco's line and nothing runs; and where PAM does
nothing, the session's first program still runs only inside its job (``~/.ssh/rc``
included), or not at all for a user without a job.
"""

from __future__ import annotations

import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import job_cpus, job_of, running_job
from tests.servicekit import JobOwner, ensure_user
from tests.sshkit import GECO_PAM_STACK, PLAIN_PAM_STACK, Sshd, rc_probe, running_sshd

pytestmark = pytest.mark.sge

OTHER = "gecotest-ssh2"  # another user, with a job of their own


@pytest.fixture(scope="module")
def users(sge: Any) -> tuple[str, str]:
    sge.require_hooks()
    ensure_user(OTHER)
    return sge.owner.name, OTHER


@pytest.fixture(scope="module")
def sshd(users: tuple[str, str], gecod_service: Any) -> Iterator[Sshd]:
    """The README's stack, and the preload in sshd."""
    with running_sshd("geco-test-sshd-pre", GECO_PAM_STACK, users, preload=True) as server:
        yield server


@pytest.fixture(scope="module")
def bare_sshd(users: tuple[str, str], gecod_service: Any) -> Iterator[Sshd]:
    """A stack without geco's lines (the node's admin forgot them), and the preload."""
    with running_sshd("geco-test-sshd-bare", PLAIN_PAM_STACK, (*users, "root"),
                      preload=True) as server:
        yield server


SHOW = "cat /proc/self/cgroup; echo ==; echo $JOB_ID $SGE_TASK_ID $GECO_CPUS"


def test_a_job_id_sent_with_the_session_picks_that_job_of_the_users(sshd: Sshd,
                                                                   sge: Any) -> None:
    """Given two running jobs of the user, when the session is sent with JOB_ID naming the
    older one, then it runs in that job with that job's variables; without JOB_ID, in the
    newest, with the newest one's."""
    with running_job(sge) as first:
        time.sleep(1.1)  # cgroup times have 1 s steps here: the second must be the newer
        with running_job(sge) as second:
            chosen = sshd.ssh(sge.owner.name, SHOW, send={"JOB_ID": first.split(".")[0],
                                                          "SGE_TASK_ID": "undefined"})
            plain = sshd.ssh(sge.owner.name, SHOW)
            cpus = {key: job_cpus(key) for key in (first, second)}
    for out, key in ((chosen, first), (plain, second)):
        assert out.returncode == 0, out.stderr
        cgroup, variables = out.stdout.split("==\n")
        assert job_of(cgroup) == key
        assert variables.split() == [key.split(".")[0], "undefined", cpus[key]]


def test_a_job_id_of_another_users_job_is_refused_and_nothing_runs(
        sshd: Sshd, sge: Any, users: tuple[str, str], journal: Any) -> None:
    """Given a job of the user and one of another user, when the user's session is sent
    with the other user's JOB_ID, then it is refused with geco's line, its command never
    runs, and the refusal is journaled."""
    owner: JobOwner = sge.owner
    marker = owner.home / "geco-ssh-jobid-ran"
    marker.unlink(missing_ok=True)
    with running_job(sge), running_job(sge, user=users[1]) as theirs:
        out = sshd.ssh(owner.name, f"touch {marker}", send={"JOB_ID": theirs.split(".")[0]})
    assert out.returncode != 0
    assert (f"geco: job {theirs} is not a job of yours running on {sshd.node}"
            in out.stderr), out.stderr
    assert not marker.exists()
    entry = journal.wait_for(GECO_EVENT="ssh-refused", SSH_USER=owner.name, REASON="job-id")
    assert entry[-1]["MESSAGE"].endswith(f"JOB_ID names {theirs}, not a job of theirs here")


def test_without_geco_in_the_pam_stack_the_preload_still_contains_sessions(
        bare_sshd: Sshd, sge: Any, users: tuple[str, str]) -> None:
    """Given sshd's PAM stack without geco's lines but the preload in sshd, then a user
    without a job here gets geco's line and their command never runs; the job owner's
    command and ~/.ssh/rc run inside their job, with its JOB_ID; root runs outside every
    job."""
    owner: JobOwner = sge.owner
    other_home = Path(pwd.getpwnam(users[1]).pw_dir)
    marker = other_home / "geco-ssh-bare-ran"
    marker.unlink(missing_ok=True)
    with rc_probe(owner.home, owner.uid, owner.gid) as rc_seen, running_job(sge) as key:
        mine = bare_sshd.ssh(owner.name, SHOW)
        outsider = bare_sshd.ssh(users[1], f"touch {marker}")
        root = bare_sshd.ssh("root", "cat /proc/self/cgroup")
        rc_cgroup = rc_seen.read_text()
    assert mine.returncode == 0, mine.stderr
    cgroup, variables = mine.stdout.split("==\n")
    assert job_of(cgroup) == job_of(rc_cgroup) == key
    assert variables.split()[:2] == [key.split(".")[0], "undefined"]
    assert outsider.returncode != 0
    assert (f"geco: you have no job running on {bare_sshd.node}; ssh to compute nodes is "
            "for your running jobs") in outsider.stderr, outsider.stderr
    assert not marker.exists()
    assert root.returncode == 0, root.stderr
    assert job_of(root.stdout) == ""
