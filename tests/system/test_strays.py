"""geco.job.strays on this machine: real processes of a real user, real cgroups, journald.

A job's owner can leave processes behind through a root daemon that forks for
them (atd, cron, systemd's user manager, sshd): born outside every job cgroup.
When the owner's last job on the node ends, :func:`geco.job.strays.after_job` kills
them. Here the job that ended is only a key (its cgroups are gone already);
what is around it is real: processes of the test user ``gecostray`` (a user of
its own, so that nothing of another test or a demo's jobs can be among them)
made the ways the doors make them, a job cgroup in a fresh ``geco-test-*``
parent, resource files and an execd spool in a temporary state dir. The real
doors from inside a real Grid Engine job are tested in
``tests/integration/test_strays_live.py``.

The test process is a child subreaper while a test runs, so a process whose
parent exits comes back to it: its end (SIGTERM or SIGKILL) can be read.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from geco.cgroup import Limits, V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.job import strays
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from tests.cgroup_testkit import usable_v1_hierarchies, v1_fixtures
from tests.servicekit import ensure_user

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]

USER = "gecostray"
_PR_SET_NAME = 15
_ids = itertools.count(1)


def unique_job() -> int:
    """A job number no other test (or session) uses at the same time: journal entries are ours."""
    return 8_000_000 + os.getpid() % 10_000 * 100 + next(_ids)


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def user() -> Any:
    """The test's own unprivileged user."""
    return ensure_user(USER)


children, backend = v1_fixtures(HIER)


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return Config()._replace(state_dir=tmp_path / "state",
                               execd_spool_dir=tmp_path / "spool", strays_grace=1.0)


def own_job(cfg: Config, job: int, owner: str) -> str:
    """Write the resource file of job ``<job>.1`` owned by ``owner``; return its key."""
    resourcefile.write(cfg.resources_dir, ResourceSet(job, 1, owner=owner,
                                                   nodes=(NodeResources(short_hostname()),)))
    return f"{job}.1"


# -- processes, made the ways the doors make them -------------------------------


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _report(w: int, pid: int) -> None:
    os.write(w, f"{pid}\n".encode())


def detached(owner: Any, children: list[int], *, ignore_term: bool = False) -> int:
    """A process of ``owner`` that left its parent behind (setsid, double fork), the way a
    job's ``setsid nohup cmd &`` or an at job's daemon does: its parent is the subreaper."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            os.setsid()
            _drop_to(owner.uid, owner.gid)
            pid = os.fork()
            if pid == 0:
                if ignore_term:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited across exec
                os.execvp("sleep", ["sleep", "300"])
            _report(w, pid)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r) as f:
        pid = int(f.read())
    children.append(pid)
    return pid


def forked_by_root_daemon(owner: Any, name: str, children: list[int]) -> tuple[int, int]:
    """A process of ``owner`` whose parent is a root process called ``name`` (cron's way:
    the daemon forks, the child becomes the user and runs the command); returns the
    daemon's pid and the process's. The daemon exits with 128 + the signal that ended it."""
    r, w = os.pipe()
    daemon = os.fork()
    if daemon == 0:
        try:
            os.close(r)
            ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode(), 0, 0, 0)
            pid = os.fork()
            if pid == 0:
                _drop_to(owner.uid, owner.gid)
                os.execvp("sleep", ["sleep", "300"])
            _report(w, pid)
            os.close(w)
            _, status = os.waitpid(pid, 0)
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0)
        finally:
            os._exit(1)
    os.close(w)
    children.append(daemon)
    with os.fdopen(r) as f:
        pid = int(f.read())
    children.append(pid)
    return daemon, pid


def by_admin(owner: Any, children: list[int]) -> subprocess.Popen[bytes]:
    """``runuser -u owner -- sleep 300`` from root: an admin acting as the user."""
    proc = subprocess.Popen(["runuser", "-u", owner.name, "--", "sleep", "300"],
                            stdin=subprocess.DEVNULL)
    children.append(proc.pid)
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 30
    while not kids.read_text().split() or comm(int(kids.read_text().split()[0])) != "sleep":
        assert time.monotonic() < deadline, "runuser did not start sleep"
        time.sleep(0.02)
    children.append(int(kids.read_text().split()[0]))
    return proc


def in_job(backend: V1Backend, key: str, owner: Any, children: list[int]) -> int:
    """A process of ``owner`` in job ``key``'s cgroups (moved in before it became the user)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            os.read(r, 1)
            _drop_to(owner.uid, owner.gid)
            os.execvp("sleep", ["sleep", "300"])
        finally:
            os._exit(0)
    children.append(pid)
    os.close(r)
    backend.add_pid(key, pid)
    os.write(w, b"g")
    os.close(w)
    return pid


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, our child not reaped yet, is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def ended_by(pid: int) -> int:
    """Reap ``pid`` (adopted as subreaper, or our child) and return the signal that ended it."""
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


# -- tests ------------------------------------------------------------------------


def test_the_last_job_ending_kills_the_owners_processes_outside_every_job(
        backend: V1Backend, cfg: Config, user: Any, job_owner: Any, children: list[int],
        journal_log: Any) -> None:
    """Given a user whose job has just ended, with no other job on the node, and around it:
    a daemon of theirs left detached, one forked for them by a root daemon named cron, one
    that ignores SIGTERM, one of theirs inside a job cgroup, one an admin started as them
    with runuser, and a detached process of another user; when after_job runs, then exactly
    the three outside every job that no admin started die (two by SIGTERM, the stubborn one
    by SIGKILL), and one strays-killed journal entry names the user, the pids and their
    commands."""
    job = unique_job()
    other_job = own_job(cfg, unique_job(), job_owner.name)  # a job cgroup of another user
    backend.create(other_job, Limits())
    daemon = detached(user, children)
    cron, by_cron = forked_by_root_daemon(user, "cron", children)
    stubborn = detached(user, children, ignore_term=True)
    inside = in_job(backend, other_job, user, children)
    admins = by_admin(user, children)
    others = detached(job_owner, children)

    result = strays.after_job(cfg, backend, JobKey(job, 1), user.name, cleaned_by="epilog")

    assert result.outcome is strays.Outcome.KILLED
    assert sorted(s.pid for s in result.strays) == sorted([daemon, by_cron, stubborn])
    assert {s.command for s in result.strays} == {"sleep"}
    assert result.left == ()
    assert (ended_by(daemon), ended_by(stubborn)) == (signal.SIGTERM, signal.SIGKILL)
    assert os.waitstatus_to_exitcode(os.waitpid(cron, 0)[1]) == 128 + signal.SIGTERM
    assert alive(inside) and alive(others) and admins.poll() is None
    [entry] = journal_log.wait_for(10, JOB_ID=str(job), GECO_EVENT="strays-killed")
    assert entry["USER"] == USER and entry["USER_ID"] == str(user.uid)
    assert entry["CLEANED_BY"] == "epilog" and entry["PRIORITY"] == "4"
    assert sorted(map(int, entry["PIDS"].split())) == sorted([daemon, by_cron, stubborn])
    assert sorted(entry["COMMANDS"].split()) == sorted(
        f"{p}:sleep" for p in (daemon, by_cron, stubborn))
    assert entry["MESSAGE"].startswith(f"job {job}.1 was the last job of {USER} on this node: "
                                       f"killed 3 process(es) of {USER} outside every job")


def test_another_job_of_the_owner_here_keeps_them_until_it_ends(
        backend: V1Backend, cfg: Config, user: Any, children: list[int],
        journal_log: Any) -> None:
    """Given a detached process of a user whose job has just ended, when the user has
    another job on the node -- one with cgroups, then one only in the execd spool (being
    dispatched) -- then the process is kept and journaled as kept with the job named; once
    neither is there, the next end kills it."""
    daemon = detached(user, children)
    running = own_job(cfg, unique_job(), user.name)
    backend.create(running, Limits())
    first = unique_job()

    kept = strays.after_job(cfg, backend, JobKey(first, 1), user.name, cleaned_by="gecod")

    assert kept.outcome is strays.Outcome.OTHER_JOB
    assert kept.reason == f"job {running} of {USER} still runs on this node"
    assert alive(daemon)
    [entry] = journal_log.wait_for(10, JOB_ID=str(first), GECO_EVENT="strays-kept")
    assert (entry["USER"], entry["PIDS"], entry["REASON"]) == (USER, str(daemon), kept.reason)

    backend.destroy(running)
    resourcefile.remove(cfg.resources_dir, JobKey.parse(running))
    dispatched = cfg.execd_spool_dir / short_hostname() / "active_jobs" / f"{unique_job()}.1"
    dispatched.mkdir(parents=True)
    (dispatched / "config").write_bytes(f"job_name=x\njob_owner={USER}\n".encode())
    spooled = strays.after_job(cfg, backend, JobKey(unique_job(), 1), user.name, cleaned_by="gecod")
    assert spooled.outcome is strays.Outcome.OTHER_JOB
    assert spooled.reason == f"job {dispatched.name} of {USER} still runs on this node"
    assert alive(daemon)

    (dispatched / "config").unlink()
    dispatched.rmdir()
    last = strays.after_job(cfg, backend, JobKey(unique_job(), 1), user.name, cleaned_by="gecod")
    assert last.outcome is strays.Outcome.KILLED
    assert [s.pid for s in last.strays] == [daemon]
    assert ended_by(daemon) == signal.SIGTERM


def test_a_job_whose_owner_cannot_be_read_keeps_them(
        backend: V1Backend, cfg: Config, user: Any, children: list[int]) -> None:
    """Given a job cgroup on the node with neither a resource file nor a spool dir, when a
    user's last known job ends, then their detached process is kept: the unknown job may be
    theirs."""
    daemon = detached(user, children)
    unknown = f"{unique_job()}.1"
    backend.create(unknown, Limits())

    result = strays.after_job(cfg, backend, JobKey(unique_job(), 1), user.name, cleaned_by="epilog")

    assert result.outcome is strays.Outcome.OTHER_JOB
    assert result.reason == f"the owner of job {unknown} on this node cannot be read"
    assert alive(daemon)


@pytest.mark.parametrize(("settings", "outcome"), [
    ({"strays_exempt_users": (USER,)}, strays.Outcome.EXEMPT),
    ({"strays_min_uid": 1 << 31}, strays.Outcome.SERVICE),
    ({"strays_kill": False}, strays.Outcome.OFF),
], ids=["exempt-user", "below-min-uid", "off"])
def test_exempt_users_service_accounts_and_kill_off_keep_them(
        backend: V1Backend, cfg: Config, user: Any, children: list[int],
        settings: dict[str, Any], outcome: strays.Outcome) -> None:
    """Given a detached process of a user whose last job ended, when the user is exempt by
    name, has a uid below min_uid, or [strays] kill is off, then the process is kept."""
    daemon = detached(user, children)

    result = strays.after_job(cfg._replace(**settings), backend,
                              JobKey(unique_job(), 1), user.name, cleaned_by="epilog")

    assert result.outcome is outcome
    assert alive(daemon)


def test_an_unknown_owner_is_journaled_and_nothing_is_killed(
        backend: V1Backend, cfg: Config, journal_log: Any) -> None:
    """Given a job whose owner nothing names, when it ends, then nothing is looked for and a
    warning says why."""
    job = unique_job()

    result = strays.after_job(cfg, backend, JobKey(job, 1), None, cleaned_by="reaper")

    assert result.outcome is strays.Outcome.UNKNOWN_OWNER
    [entry] = journal_log.wait_for(10, JOB_ID=str(job), GECO_EVENT="strays-kept")
    assert entry["REASON"] == "its owner is unknown" and entry["PRIORITY"] == "4"


def test_the_owner_comes_from_the_resource_file_else_the_spool(cfg: Config) -> None:
    """Given a job with a resource file and one only in the execd spool (a PE task's dir on
    a slave node), when their owners are asked, then each is named; a job with neither has
    none."""
    key = own_job(cfg, unique_job(), "alice")
    slave = cfg.execd_spool_dir / short_hostname() / "active_jobs" / f"{unique_job()}.1"
    (slave / "1.node7").mkdir(parents=True)
    (slave / "1.node7" / "config").write_bytes(b"job_owner=bob\n")

    assert strays.owner_of(cfg, key) == "alice"
    assert strays.owner_of(cfg, slave.name) == "bob"
    assert strays.owner_of(cfg, f"{unique_job()}.1") is None
