"""ssh into a node running real Grid Engine jobs: only job owners get in, into their job.

A real OpenSSH ``sshd`` listens on 127.0.0.1 (its own port, host key and key-based
logins) with geco's PAM lines (``pam_geco.so``, which asks a real gecod, as the
README shows) in a PAM service of its own: sshd names its PAM service after its program
name, so it runs as a link ``geco-test-sshd`` and reads ``/etc/pam.d/geco-test-sshd``.
The node's own sshd and its PAM files are not touched.

Seen from the user: who is let in (root, an admin group's member, a job owner) and
who is refused with geco's one line before any command or forwarding runs; where
the session runs (``/proc/self/cgroup``, the cores it may use, the memory limit it
is under, ``~/.ssh/rc`` and scp included); which job a session joins when the user
has two (ssh from inside one of them, else the newest, or refused); the job's
variables in the session; what happens while gecod is down; and that the session
ends with its job.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import alive
from tests.integration.livekit import (
    OWN_MEMORY_LIMIT,
    job_cpus,
    job_memory_limit,
    job_of,
    running_job,
    sh,
    site_settings,
    wait_until,
)
from tests.servicekit import JobOwner, ensure_user
from tests.sshkit import (
    CLIENT_OPTIONS,
    GECO_PAM_STACK,
    SSHD,
    Sshd,
    free_port,
    rc_probe,
    running_sshd,
)

pytestmark = pytest.mark.sge

OUTSIDER = "gecotest-ssh"  # a user with no job
ADMIN, ADMIN_GROUP = "gecotest-sshadm", "geco-test-admins"
REFUSED = "geco: you have no job running on {node}; ssh to compute nodes is for your running jobs"


@pytest.fixture(scope="module")
def sshd(sge: Any, gecod_service: Any) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 with geco's PAM lines, gecod answering them; stopped (by
    its pid) afterwards."""
    sge.require_hooks()
    ensure_user(OUTSIDER)
    if subprocess.run(["getent", "group", ADMIN_GROUP], capture_output=True).returncode:
        sh(["groupadd", "-f", ADMIN_GROUP])
    ensure_user(ADMIN)
    sh(["usermod", "-a", "-G", ADMIN_GROUP, ADMIN])
    with running_sshd("geco-test-sshd", GECO_PAM_STACK,
                      ("root", sge.owner.name, OUTSIDER, ADMIN)) as server:
        yield server


def test_root_and_an_admin_group_member_get_in_without_a_job(sshd: Sshd, gecod_service: Any,
                                                              journal: Any) -> None:
    """Given no job of theirs on the node, then root gets in, and a member of the
    configured admin group gets in, both outside every job; each admission is journaled."""
    out = sshd.ssh("root", "cat /proc/self/cgroup")
    assert out.returncode == 0, out.stderr
    assert job_of(out.stdout) == ""
    with site_settings({("ssh", "admin_groups"): [ADMIN_GROUP]}, gecod_service):
        out = sshd.ssh(ADMIN, "cat /proc/self/cgroup")
    assert out.returncode == 0, out.stderr
    assert job_of(out.stdout) == ""
    entry = journal.wait_for(GECO_EVENT="ssh-admitted", SSH_USER=ADMIN)[-1]
    assert entry["REASON"] == "admin" and entry["RHOST"] == "127.0.0.1"
    assert journal.wait_for(GECO_EVENT="ssh-admitted", SSH_USER="root")[-1]["REASON"] == "root"


def test_a_user_without_a_job_is_refused_before_anything_runs(sshd: Sshd, gecod_service: Any,
                                                               journal: Any) -> None:
    """Given a user with no job on the node (an admin group that is not theirs configured),
    when they ssh in to run a command, or only to forward a port, then both are refused
    with geco's one line, the command never ran, and the refusal is journaled."""
    home = Path(pwd.getpwnam(OUTSIDER).pw_dir)
    marker = home / "geco-ssh-ran"
    marker.unlink(missing_ok=True)
    with site_settings({("ssh", "admin_groups"): [ADMIN_GROUP]}, gecod_service):
        out = sshd.ssh(OUTSIDER, f"touch {marker}")
        forward = sshd.ssh(OUTSIDER, options=("-N", "-L", f"{free_port()}:127.0.0.1:"
                                              f"{sshd.port}"), timeout=60)
    message = REFUSED.format(node=sshd.node)
    assert out.returncode == 255 and message in out.stderr, out.stderr
    assert forward.returncode == 255 and message in forward.stderr, forward.stderr
    assert not marker.exists()
    entry = journal.wait_for(GECO_EVENT="ssh-refused", SSH_USER=OUTSIDER)[-1]
    assert entry["REASON"] == "no-job" and entry["PRIORITY"] == "6"


def test_a_job_owners_session_runs_inside_their_job(sshd: Sshd, sge: Any,
                                                    journal: Any) -> None:
    """Given a running job of the user, when they ssh in, then the command, its sshd
    parent and ``~/.ssh/rc`` run in the job's cgroups, on the job's cores, under its
    memory limit, with the job's JOB_ID, SGE_TASK_ID and GECO_* variables; scp and sftp
    work, sftp's sshd (which runs no program) inside the job too; the adoption is
    journaled with the job's id."""
    owner: JobOwner = sge.owner
    with rc_probe(owner.home, owner.uid, owner.gid) as rc_seen, \
            running_job(sge, "-l", "m_mem_free=300M") as key:
        out = sshd.ssh(owner.name, "cat /proc/self/cgroup; echo ==; cat /proc/$PPID/cgroup;"
                       " echo ==; grep Cpus_allowed_list /proc/self/status; echo ==; "
                       "echo $JOB_ID $SGE_TASK_ID $GECO_CPUS $GECO_NCPUS $GECO_MEMORY_LIMIT")
        assert out.returncode == 0, out.stderr
        mine, parent, cores, variables = out.stdout.split("==\n")
        cpus = job_cpus(key)
        for text in (mine, parent, rc_seen.read_text()):
            assert job_of(text) == key, text
        assert cores.split()[-1] == cpus
        limit = job_memory_limit(key)
        assert limit == 300 * 2**20
        assert variables.split() == [key.split(".")[0], "undefined", cpus,
                                     str(len(parse_cpus(cpus))), str(limit)]
        seen = sshd.ssh(owner.name, OWN_MEMORY_LIMIT)
        assert int(seen.stdout) == limit
        sent = sshd.dir / "payload"
        sent.write_text("geco scp test\n")
        copied = owner.home / "geco-ssh-payload"
        copied.unlink(missing_ok=True)
        scp = subprocess.run(["scp", "-i", str(sshd.key), "-P", str(sshd.port),
                              *CLIENT_OPTIONS, str(sent),
                              f"{owner.name}@127.0.0.1:{copied}"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert scp.returncode == 0, scp.stderr
        assert copied.read_text() == "geco scp test\n"
        assert sftp_session_jobs(sshd, owner, sent) == {key}
        entry = journal.wait_for(GECO_EVENT="ssh-adopted", SSH_USER=owner.name)[-1]
        assert (entry["JOB_ID"], entry["SGE_TASK_ID"]) == tuple(key.split("."))
        assert entry["REASON"] == "only-job"


def sftp_session_jobs(sshd: Sshd, owner: JobOwner, payload: Path) -> set[str]:
    """Open an sftp session (internal-sftp: sshd serves it without running a program), put
    ``payload`` through it, and return the jobs of the owner's sshd processes serving it,
    read while it is open ("" for one outside every job)."""
    sftp = subprocess.Popen(["sftp", "-i", str(sshd.key), "-P", str(sshd.port),
                             *CLIENT_OPTIONS, "-b", "-", f"{owner.name}@127.0.0.1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert sftp.stdin is not None and sftp.stdout is not None
    try:
        sftp.stdin.write(f"put {payload} geco-sftp-payload\npwd\n")
        sftp.stdin.flush()
        while "Remote working directory" not in sftp.stdout.readline():
            assert sftp.poll() is None, sftp.stderr.read() if sftp.stderr else ""
        serving = {job_of(_read(p / "cgroup"))
                   for p in Path("/proc").glob("[0-9]*")
                   if _owner(p) == owner.uid and _exe(p) == str(SSHD)}
    finally:
        sftp.stdin.close()
        sftp.wait(timeout=60)
    assert sftp.returncode == 0
    assert (owner.home / "geco-sftp-payload").read_text() == payload.read_text()
    return serving


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _exe(proc_dir: Path) -> str:
    try:
        return os.readlink(proc_dir / "exe")
    except OSError:
        return ""


def _owner(proc_dir: Path) -> int | None:
    try:
        return proc_dir.stat().st_uid
    except OSError:
        return None


def test_with_two_jobs_a_session_joins_the_one_it_comes_from_else_the_newest(
        sshd: Sshd, sge: Any, gecod_service: Any, journal: Any) -> None:
    """Given two running jobs of the user, when job A's own process sshs to the node, then
    that session lands in A (the callerid rule); a session from outside lands in B (the
    newest); under ``several_jobs = "refuse"`` it is refused, naming both jobs."""
    owner: JobOwner = sge.owner
    work = owner.make_dir("ssh")
    key_copy = work / "key"
    shutil.copy(sshd.key, key_copy)
    os.chown(key_copy, owner.uid, owner.gid)
    key_copy.chmod(0o600)
    go, seen = work / "go", work / "seen"
    script = (f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.2; done\n"
              f"{sshd.command_line(owner.name, key_copy)} cat /proc/self/cgroup > {seen}.tmp"
              f" 2>{work}/ssh.err\nmv {seen}.tmp {seen}\nsleep 600\n")
    with running_job(sge, script=script, cwd=work) as first:
        time.sleep(1.1)  # cgroup times have 1 s steps here: B must be the newer one
        with running_job(sge) as second:
            go.write_text("")
            go.chmod(0o644)
            wait_until(seen.exists, 60, "job A's ssh to the node")
            assert job_of(seen.read_text()) == first, (work / "ssh.err").read_text()
            entry = journal.wait_for(GECO_EVENT="ssh-adopted", JOB_ID=first.split(".")[0])
            assert entry[-1]["REASON"] == "caller"
            out = sshd.ssh(owner.name, "cat /proc/self/cgroup")
            assert out.returncode == 0, out.stderr
            assert job_of(out.stdout) == second
            with site_settings({("ssh", "several_jobs"): "refuse"}, gecod_service):
                refused = sshd.ssh(owner.name, "true")
            assert refused.returncode == 255
            assert (f"geco: you have 2 jobs running on {sshd.node} ({first}, {second}); "
                    "ssh from inside the one your session should join") in refused.stderr


def test_a_session_ends_with_its_job_counts_in_its_accounting_and_the_next_login_is_refused(
        sshd: Sshd, sge: Any, journal: Any) -> None:
    """Given a session running in a job (a ``sleep``, which burns no CPU) that first burns
    0.6 s of CPU, when the job is deleted, then within 10 s no process of the session is left,
    the job's accounting (job-end) has the session's CPU time, and a new ssh of the user is
    refused."""
    owner: JobOwner = sge.owner
    with running_job(sge) as key:
        session = subprocess.Popen(
            # CPU time, not a second of the clock: under load a second's spin got 0.45 s
            sshd.argv(owner.name, "python3 -c 'import itertools, time; any(time.process_time()"
                      " >= 0.6 for _ in itertools.count())'; echo $PPID; exec sleep 611"),
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            assert session.stdout is not None
            user_side = int(session.stdout.readline())
            monitor = int(Path(f"/proc/{user_side}/stat").read_text().rsplit(")", 1)[1]
                          .split()[1])
            job = key.split(".")[0]
            subprocess.run(["qdel", "-f", job], capture_output=True, check=False)
            gone = [user_side, monitor]
            wait_until(lambda: not any(alive(pid) for pid in gone), 10,
                       "the session's sshd processes gone after qdel")
            assert session.wait(timeout=10) is not None
            assert not [p for p in Path("/proc").glob("[0-9]*")
                        if b"sleep\x00611" in _cmdline(p)]
        finally:
            if session.poll() is None:
                session.kill()
                session.wait()
    out = sshd.ssh(owner.name, "true")
    assert out.returncode == 255 and REFUSED.format(node=sshd.node) in out.stderr
    # the job's teardown: seconds here, longer in an emulated guest beside the host's suite
    [end] = journal.wait_for(60, GECO_EVENT="job-end", JOB_ID=key.split(".")[0])
    assert float(end["CPU_USER_SEC"]) + float(end["CPU_SYSTEM_SEC"]) >= 0.5, end


def test_while_gecod_is_down_the_helper_decides_as_configured(sshd: Sshd, sge: Any,
                                                              gecod_service: Any) -> None:
    """Given gecod stopped, then the PAM module falls back to the helper: by default it
    decides the same way (the job owner lands in their job, with its JOB_ID, SGE_TASK_ID and
    GECO_* variables, a user without a job is refused); under ``gecod_unreachable =
    "refuse"`` the owner is refused with geco's line while root still gets in."""
    owner: JobOwner = sge.owner
    with running_job(sge) as key:
        gecod_service.stop()
        try:
            out = sshd.ssh(owner.name, "cat /proc/self/cgroup; echo ==; "
                                       "echo $JOB_ID $SGE_TASK_ID $GECO_CPUS")
            assert out.returncode == 0, out.stderr
            where, variables = out.stdout.split("==\n")
            assert job_of(where) == key
            assert variables.split() == [key.split(".")[0], "undefined", job_cpus(key)]
            outsider = sshd.ssh(OUTSIDER, "true")
            assert outsider.returncode == 255
            assert REFUSED.format(node=sshd.node) in outsider.stderr
            with site_settings({("ssh", "gecod_unreachable"): "refuse"}):
                refused = sshd.ssh(owner.name, "true")
                root = sshd.ssh("root", "true")
            assert refused.returncode == 255
            assert (f"geco: logins to {sshd.node} are closed while its geco daemon is down; "
                    "ask your admin") in refused.stderr
            assert root.returncode == 0, root.stderr
        finally:
            gecod_service.start()


def parse_cpus(text: str) -> list[int]:
    """A kernel cpu list (``0-1,4``) as its cpu numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""
