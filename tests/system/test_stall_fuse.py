"""A user's FUSE daemon that never answers cannot stall the node: the job's end aborts it.

A FUSE request the daemon has read but not answered keeps its process in the kernel
(``request_wait_answer``) through SIGKILL, until the daemon answers or the connection is
aborted (fs/fuse/dev.c). A user whose daemon runs outside the job (or stops answering)
would get every job end of theirs found stuck and the node's queue disabled. The job's
end aborts, through fusectl, the owner's connections that have requests waiting
(:mod:`geco.job.teardown`), never root's or another user's, and journals it.

The daemon here speaks the raw /dev/fuse protocol: it mounts as root with
``user_id=`` the test user (as fusermount would for them), outside the job's cgroups,
answers INIT and LOOKUP of one file, and never answers its OPEN. A process of the user
in the job opens that file. Real v1 cgroups (``tests/cgroup_testkit.py``), journald.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from geco.cgroup import Limits, V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.job.ending import Ender, end_job
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.sge.execd import JobRef
from tests.cgroup_testkit import Child, eventually, usable_v1_hierarchies, v1_fixtures

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
if not WHY_NOT and "freezer" not in HIER:
    WHY_NOT = "this machine has no cgroup v1 freezer hierarchy"
if not WHY_NOT and not os.path.exists("/dev/fuse"):
    WHY_NOT = "this machine has no /dev/fuse"
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]

FUSECTL = Path("/sys/fs/fuse/connections")
HANGING = "hang"  # the one file of the mount: its OPEN is never answered

children, backend = v1_fixtures(HIER)

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2

# fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
_IN = struct.Struct("<IIQQIIIHH")
_INIT, _LOOKUP, _GETATTR, _OPEN, _FORGET, _INTERRUPT, _BATCH_FORGET = 26, 1, 3, 14, 2, 36, 42
_UNANSWERED = {_OPEN, _FORGET, _INTERRUPT, _BATCH_FORGET}


def _attr(ino: int, mode: int, uid: int, gid: int) -> bytes:
    """fuse_attr: ino size blocks atime mtime ctime (ns x3) mode nlink uid gid rdev blksize
    flags."""
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 5, 0, 0, 0, 0, 0, 0, 0, mode, 1, uid, gid,
                       0, 4096, 0)


def serve(mount_point: str, uid: int, gid: int) -> Callable[[int], None]:
    """A Child body: mount a FUSE file system on ``mount_point`` for ``uid`` (root's mount,
    fusermount's options), say ``mounted``, then serve it until the connection ends."""
    def body(out: int) -> None:
        fd = os.open("/dev/fuse", os.O_RDWR)
        opts = f"fd={fd},rootmode=40000,user_id={uid},group_id={gid}".encode()
        if _libc.mount(b"geco-test-fuse", mount_point.encode(), b"fuse.geco-test",
                       _MS_NOSUID | _MS_NODEV, opts) != 0:
            os.write(out, os.strerror(ctypes.get_errno()).encode())
            return
        os.write(out, b"mounted")
        os.close(out)

        def reply(unique: int, payload: bytes = b"", error: int = 0) -> None:
            os.write(fd, struct.pack("<IiQ", 16 + len(payload), error, unique) + payload)

        while True:
            try:
                request = os.read(fd, 1 << 20)
            except OSError:  # ENODEV: the connection was aborted or unmounted
                return
            length, opcode, unique, node, *_ = _IN.unpack_from(request)
            arg = request[_IN.size:length]
            if opcode == _INIT:  # 7.31, no flags, max_write 4096; the rest of its 64 bytes 0
                reply(unique, struct.pack("<IIIIHHII", 7, 31, 0, 0, 0, 0, 4096, 0)
                      + bytes(36))
            elif opcode == _GETATTR:
                mode = 0o40755 if node == 1 else 0o100644
                reply(unique, bytes(16) + _attr(node, mode, uid, gid))
            elif opcode == _LOOKUP and arg.rstrip(b"\0") == HANGING.encode():
                reply(unique, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0)
                      + _attr(2, 0o100644, uid, gid))
            elif opcode == _LOOKUP:
                reply(unique, error=-2)  # ENOENT
            elif opcode not in _UNANSWERED:
                reply(unique, error=-38)  # ENOSYS
    return body


class Fuse(NamedTuple):
    """A mounted test file system: where, its fusectl connection (the mount's device
    minor), and its daemon."""

    mount_point: Path
    connection: str
    daemon: Child

    @property
    def waiting(self) -> int:
        return int((FUSECTL / self.connection / "waiting").read_text())


def _connection(mount_point: Path) -> str:
    """The fusectl name of the FUSE mount on ``mount_point`` (its anonymous device's minor)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mount_point):
            major, minor = fields[2].split(":")
            assert major == "0", line
            return minor
    raise AssertionError(f"{mount_point} is not mounted")


def _fusectl_mounted() -> bool:
    return any(line.split(" - ")[1].startswith("fusectl ")
               for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture
def fuse(backend: V1Backend, children: list[int]) -> Iterator[Callable[[int, int], Fuse]]:
    """Mounts FUSE file systems for a uid; afterwards every daemon is SIGKILLed (its
    connection is then aborted, so whoever waits on it dies), every mount detached and
    removed, and fusectl unmounted if the test mounted it. Torn down before ``backend``
    and ``children`` (which it depends on): their reap would wait for a stuck process."""
    fusectl_before = _fusectl_mounted()
    made: list[Fuse] = []

    def mount(uid: int, gid: int) -> Fuse:
        where = Path(tempfile.mkdtemp(prefix="geco-test-fuse-"))
        where.chmod(0o755)
        daemon = Child(serve(str(where), uid, gid), children)
        made.append(Fuse(where, "", daemon))
        daemon.go()
        said = daemon.output()
        assert said == b"mounted", said
        made[-1] = Fuse(where, _connection(where), daemon)
        return made[-1]

    try:
        yield mount
    finally:
        for f in made:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(f.daemon.pid, signal.SIGKILL)
                os.waitpid(f.daemon.pid, 0)
            _libc.umount2(str(f.mount_point).encode(), _MNT_DETACH)
            with contextlib.suppress(OSError):
                f.mount_point.rmdir()
        if not fusectl_before and _fusectl_mounted():
            _libc.umount2(str(FUSECTL).encode(), _MNT_DETACH)


def open_file(path: Path, uid: int | None = None) -> Callable[[int], None]:
    """A body that (as ``uid``, if given) opens ``path``: a never-answered FUSE OPEN."""
    def body(out: int) -> None:
        os.close(out)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        os.open(path, os.O_RDONLY)
    return body


def in_fuse_wait(pid: int) -> bool:
    return Path(f"/proc/{pid}/wchan").read_text() == "request_wait_answer"


def test_given_a_job_process_in_a_fuse_wait_when_the_job_ends_then_the_owners_fuse_is_aborted(
        backend: V1Backend, children: list[int], fuse: Callable[[int, int], Fuse],
        journal_log: Any, tmp_path: Path, job_owner: Any) -> None:
    """Given a process of the owner's job waiting on the owner's FUSE daemon (outside the
    job) that read its OPEN and never answers, and a root process outside the job waiting
    on root's FUSE daemon just the same, when the job ends, then the owner's connection
    is aborted (fuse-aborted journaled, naming it), the job's process dies, its cgroups are
    removed and no queue is disabled; root's connection and its waiter are left alone."""
    job = 7_100_000 + os.getpid() % 100_000
    key = JobKey.parse(f"{job}.1")
    (tmp_path / "qmod").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/qmod.args\n")
    (tmp_path / "qmod").chmod(0o755)
    cfg = Config()._replace(kill_timeout=2.0, state_dir=tmp_path / "state",
                              qstat=str(tmp_path / "qstat"), qstat_timeout=10.0,
                              disable_queue_on_stuck=True)
    resourcefile.write(cfg.resources_dir, ResourceSet(
        job, 1, owner=job_owner.name, nodes=(NodeResources(short_hostname()),)))
    users = fuse(job_owner.uid, job_owner.gid)
    roots = fuse(0, 0)
    backend.create(key, Limits())
    stuck = Child(open_file(users.mount_point / HANGING, job_owner.uid), children)
    backend.add_pid(key, stuck.pid)
    stuck.go()
    bystander = Child(open_file(roots.mount_point / HANGING), children)
    bystander.go()
    assert eventually(lambda: in_fuse_wait(stuck.pid) and in_fuse_wait(bystander.pid))

    ended = end_job(JobRef(key.job, key.task, tmp_path / "no-spool"), cfg, backend,
                    Ender("epilog"))

    assert ended is not None
    done = ended.teardown
    assert (done.stuck, done.error, done.queue_disabled) == ((), "", None), done
    assert done.clean
    assert stuck.wait(10) == -signal.SIGKILL
    assert not any(p.exists() for p in backend.paths(key).values())
    assert not (tmp_path / "qmod.args").exists()
    [aborted] = journal_log.entries(JOB_ID=str(job), GECO_EVENT="fuse-aborted")
    assert {k: aborted[k] for k in ("FUSE_CONNECTION", "USER", "WAITING", "PIDS",
                                    "CLEANED_BY", "PRIORITY")} == {
        "FUSE_CONNECTION": users.connection, "USER": job_owner.name, "WAITING": "1",
        "PIDS": str(stuck.pid), "CLEANED_BY": "epilog", "PRIORITY": "4"}
    assert aborted["MESSAGE"] == (
        f"job {key}: aborted the FUSE connection {FUSECTL / users.connection} of "
        f"{job_owner.name} (1 request(s) waiting): process(es) {stuck.pid} of the job "
        "outlived SIGKILL waiting for its FUSE daemon's answer")
    assert journal_log.entries(JOB_ID=str(job), GECO_EVENT="cleanup-stuck") == []
    [_] = journal_log.entries(JOB_ID=str(job), GECO_EVENT="job-end")
    # root's connection: untouched, its waiter still waits (fusectl: mounted by the teardown
    # when it was not)
    assert roots.waiting == 1
    assert in_fuse_wait(bystander.pid)
