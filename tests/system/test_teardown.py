"""geco.job.teardown on this machine's real cgroup v1 hierarchies, with journald.

Each test works in its own parent ``geco-test-<pid>-<n>`` in every hierarchy,
removed afterwards with plain syscalls (thaw, SIGKILL, rmdir: see
``tests/cgroup_testkit.py``), so a broken teardown cannot leak cgroups or
processes. The test process is a child subreaper while a test runs, so the
daemons a job double-forks come back to it and their end (SIGKILL) can be read.

What is checked is what the kernel and the journal say: every process of the
job dies, the job-end entry carries the kill count and the CPU time the kernel
charged, and a process that cannot die (it sits in a sub-cgroup frozen on its
own, which thawing the job does not thaw) is reported with its state, keeps
the cgroups, and gets the queue instance disabled through qmod.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import gpushare
from geco.cgroup import Limits, V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.job.ending import Ender, end_job
from geco.job.teardown import StuckProcess, Teardown, tear_down
from geco.jobkey import JobKey
from geco.node import gpus
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.sge.execd import JobRef
from tests.cgroup_testkit import (
    Child,
    eventually,
    read,
    start_in,
    usable_v1_hierarchies,
    v1_fixtures,
)

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
if not WHY_NOT and "freezer" not in HIER:
    WHY_NOT = "this machine has no cgroup v1 freezer hierarchy"
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]

_BUSY = 50
_ids = itertools.count(1)


def unique_job() -> int:
    """A job number no other test (or session) uses at the same time: journal entries are ours."""
    return 7_000_000 + os.getpid() * 100 + next(_ids)


# -- fixtures -------------------------------------------------------------------


children, backend = v1_fixtures(HIER)


# journal_log (geco-test-teardown): tests/conftest.py


@pytest.fixture
def qmod(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in qmod that records its arguments and answers like Grid Engine's."""
    record = tmp_path / "qmod.args"
    script = tmp_path / "qmod"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {record}\n"
                      "echo \"root@node7 changed state of \\\"$2\\\" (disabled)\"\n")
    script.chmod(0o755)
    return script, record


def config(tmp_path: Path, kill_timeout: float) -> Config:
    return Config()._replace(kill_timeout=kill_timeout, state_dir=tmp_path / "state",
                               qstat_timeout=10.0, disable_queue_on_stuck=True)


# -- job bodies -----------------------------------------------------------------


def daemon_and_busy(out: int) -> None:
    """Start 50 busy children and a daemon (setsid, double fork); report their pids; sleep."""
    busy = []
    for _ in range(_BUSY):
        pid = os.fork()
        if pid == 0:
            os.close(out)
            while True:
                pass
        busy.append(pid)
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(out)
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            os.execvp("sleep", ["sleep", "300"])
        os.write(w, str(daemon).encode())
        os._exit(0)
    os.waitpid(middle, 0)
    daemon = int(os.read(r, 32))
    os.write(out, " ".join(map(str, [daemon, *busy])).encode())
    os.close(out)
    time.sleep(300)


def sleeper(out: int) -> None:
    os.close(out)
    os.execvp("sleep", ["sleep", "300"])


def exit_signal(pid: int) -> int:
    """Reap ``pid`` (our child, or adopted as subreaper); the signal that ended it."""
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"pid {pid} exited with {status:#x}"
    return os.WTERMSIG(status)


# -- a job that leaves processes behind -----------------------------------------


def test_given_a_daemon_and_50_busy_processes_when_torn_down_then_all_die_and_it_is_journaled(
        backend: V1Backend, children: list[int], journal_log: Any, tmp_path: Path,
        qmod: tuple[Path, Path]) -> None:
    job = unique_job()
    key = f"{job}.1"
    backend.create(key, Limits())
    child = start_in(backend, key, daemon_and_busy, children)
    daemon, *busy = map(int, child.output().split())
    children.extend([daemon, *busy])
    assert len(busy) == _BUSY
    assert os.getsid(daemon) != os.getsid(child.pid)  # its own session, its parent gone
    assert eventually(lambda: sorted(backend.pids(key)) == sorted([child.pid, daemon, *busy]))
    # the busy ones are charged CPU time: however fast the machine, wait until 0.1 s is
    counted = 0

    def charged() -> bool:
        nonlocal counted
        usage = backend.usage(key)
        counted = usage.get("cpu_user_usec", 0) + usage.get("cpu_system_usec", 0)
        return counted >= 100_000
    assert eventually(charged)

    result = end(key, backend, config(tmp_path, 10.0), "epilog")

    assert result.clean
    assert (result.key, result.killed, result.stuck, result.queue_disabled) == \
        (key, _BUSY + 2, (), None)
    assert not any(p.exists() for p in backend.paths(key).values())
    assert {pid: exit_signal(pid) for pid in [child.pid, daemon, *busy]} == \
        dict.fromkeys([child.pid, daemon, *busy], signal.SIGKILL)
    accounting = result.accounting
    assert accounting.cpu_user is not None and accounting.cpu_system is not None
    assert accounting.cpu_user > 0  # busy loops: user mode
    # what it had been charged before the kill, at least (user/system per tick: the sum)
    assert round((accounting.cpu_user + accounting.cpu_system) * 1_000_000) >= counted
    assert accounting.memory_peak > 0
    [entry] = journal_log.entries(JOB_ID=str(job), GECO_EVENT="job-end")
    assert {k: entry[k] for k in ("SGE_TASK_ID", "KILLED", "CLEANED_BY", "PRIORITY",
                                  "MEMORY_PEAK", "OOM_KILLS", "CPU_USER_SEC",
                                  "CPU_SYSTEM_SEC")} == {
        "SGE_TASK_ID": "1", "KILLED": str(_BUSY + 2), "CLEANED_BY": "epilog", "PRIORITY": "6",
        "MEMORY_PEAK": str(accounting.memory_peak), "OOM_KILLS": "0",
        "CPU_USER_SEC": f"{accounting.cpu_user:.3f}",
        "CPU_SYSTEM_SEC": f"{accounting.cpu_system:.3f}"}
    assert entry["MESSAGE"] == (f"job {key} ended: {accounting.describe()}; cgroups removed, "
                                f"{_BUSY + 2} leftover process(es) killed")
    assert not qmod[1].exists()


# -- a process that cannot die --------------------------------------------------


def test_given_a_process_in_a_self_frozen_sub_cgroup_when_torn_down_then_it_escalates(
        backend: V1Backend, children: list[int], journal_log: Any, tmp_path: Path,
        qmod: tuple[Path, Path]) -> None:
    """The SIGKILL stays pending while the sub-cgroup is frozen: the job is stuck, its cgroups
    are kept, the queue instance is disabled; once thawed, the reaper's retry finishes."""
    job = unique_job()
    key = f"{job}.1"
    cfg = config(tmp_path, 2.0)
    backend.create(key, Limits())
    child = start_in(backend, key, sleeper, children)
    assert eventually(lambda: read(Path(f"/proc/{child.pid}/comm")) == "sleep")
    assert backend.pids(key) == [child.pid]
    stuck_dir = backend.paths(key)["freezer"] / "stuck"
    stuck_dir.mkdir()
    (stuck_dir / "cgroup.procs").write_text(str(child.pid))
    (stuck_dir / "freezer.state").write_text("FROZEN")
    assert eventually(lambda: read(stuck_dir / "freezer.state") == "FROZEN")

    result = tear_down(key, backend, cfg, queue_instance="all.q@node7", cleaned_by="epilog",
                       qmod=str(qmod[0]))

    wchan = read(Path(f"/proc/{child.pid}/wchan"))
    assert not result.clean
    assert result.killed == 1
    assert result.stuck == (StuckProcess(child.pid, "D (disk sleep)", "sleep",
                                         "" if wchan == "0" else wchan, "stuck", frozen=True),)
    assert result.queue_disabled == "all.q@node7"
    assert result.error == ""
    assert all(p.is_dir() for p in backend.paths(key).values())
    assert stuck_dir.is_dir()
    assert qmod[1].read_text() == "-d all.q@node7\n"
    [stuck] = journal_log.entries(JOB_ID=str(job), GECO_EVENT="cleanup-stuck")
    brief = result.stuck[0].brief
    assert result.stuck[0].describe().endswith(
        ", cgroup stuck (frozen: the SIGKILL waits for a thaw)")
    assert brief == f"{child.pid}:D:{wchan if wchan != '0' else '?'}"
    assert {k: stuck[k] for k in ("PIDS", "STATES", "PRIORITY", "CLEANED_BY", "KILLED")} == {
        "PIDS": str(child.pid), "STATES": brief, "PRIORITY": "3", "CLEANED_BY": "epilog",
        "KILLED": "1"}
    assert stuck["MESSAGE"] == (
        f"job {key}: 1 process(es) still alive 2 s after SIGKILL: "
        f"{result.stuck[0].describe()}; cgroups kept, gecod's reaper tries again")
    [disabled] = journal_log.entries(JOB_ID=str(job), GECO_EVENT="queue-disabled")
    assert (disabled["QUEUE_INSTANCE"], disabled["PRIORITY"]) == ("all.q@node7", "3")
    assert journal_log.entries(JOB_ID=str(job), GECO_EVENT="job-end") == []

    # the reaper's next round, after an admin thawed the sub-cgroup
    (stuck_dir / "freezer.state").write_text("THAWED")
    assert child.wait() == -signal.SIGKILL
    again = end(key, backend, cfg, "reaper")
    assert again.clean
    assert (again.killed, again.stuck, again.queue_disabled) == (0, (), None)
    assert not stuck_dir.exists()
    assert not any(p.exists() for p in backend.paths(key).values())
    [record] = journal_log.entries(JOB_ID=str(job), GECO_EVENT="job-end")
    assert (record["CLEANED_BY"], record["KILLED"]) == ("reaper", "0")
    assert qmod[1].read_text() == "-d all.q@node7\n"  # not run again
    assert not (cfg.state_dir / "stuck" / key).exists()


# -- a GPU fd handed to a later job ---------------------------------------------
#
# The kernel's devices cgroup checks a device at open(2) only: an fd opened in one job and
# passed (SCM_RIGHTS) to a process of a later job keeps the GPU. Without a GPU or its
# driver here, the "GPUs" are [gpu] devices made with mknod on the numbers of drivers
# every kernel has (c 1:7 /dev/full, c 1:8 /dev/random): an open succeeds (a fake NVIDIA
# node would give ENXIO, so no fd), and the devices cgroup checks numbers, not drivers.


@pytest.fixture
def devices() -> Iterator[Path]:
    """A directory the job owner may look into (pytest's tmp_path is root's alone), for
    the GPU nodes; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="geco-test-gpus-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path)


def gpu_node(tmp_path: Path, devices: Path) -> tuple[Config, dict[str, str]]:
    """A node with two GPUs (id 0 = c 1:7, id 1 = c 1:8, in ``devices``): the config and
    their paths."""
    paths = {}
    for gpu, minor in (("gpu0", 7), ("gpu1", 8)):
        path = devices / gpu
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        paths[gpu] = str(path)
    cfg = config(tmp_path, 10.0)._replace(gpu_devices=(paths["gpu0"], paths["gpu1"]))
    return cfg, paths


def end(key: str, backend: V1Backend, cfg: Config, cleaned_by: str) -> Teardown:
    """End the job as every way of ending it does (geco.job.ending.end_job: its resource
    set read once, the job-end record, its files forgotten), with no look for strays."""
    job = JobKey.parse(key)
    ended = end_job(JobRef(job.job, job.task, cfg.state_dir / "no-spool"), cfg, backend,
                    Ender(cleaned_by))
    assert ended is not None
    return ended.teardown


def gpu_job(cfg: Config, backend: V1Backend, owner: str, gpu_ids: str) -> str:
    """A job of ``owner`` holding GPUs ``gpu_ids`` here: its resource file, and cgroups
    that deny it the node's other GPUs (as containment makes them)."""
    job = unique_job()
    key = f"{job}.1"
    resourcefile.write(cfg.resources_dir, ResourceSet(
        job, 1, owner=owner, nodes=(NodeResources(short_hostname(), gpus=gpu_ids),)))
    backend.create(key, Limits())
    table = gpus.node_table(cfg.gpu_devices)
    backend.deny_devices(key, gpus.denied(table, gpushare.parse_share(gpu_ids).ids))
    return key


def as_user(uid: int, body: Any) -> Any:
    """``body`` run as ``uid`` (real and effective): the job owner's process."""
    def run(out: int) -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        body(out)
    return run


def hand_over(path: str, sock: socket.socket) -> Any:
    """A body that opens the GPU ``path`` (its job may), sends the fd on ``sock``, sleeps."""
    def body(out: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        socket.send_fds(sock, [b"x"], [fd])
        os.write(out, b"sent")
        os.close(out)
        time.sleep(300)
    return body


def receive(path: str, sock: socket.socket) -> Any:
    """A body that tries to open the GPU ``path`` itself (its job may not: EPERM), then
    takes the fd handed over on ``sock``, says both, and sleeps holding it."""
    def body(out: int) -> None:
        try:
            os.close(os.open(path, os.O_RDONLY))
            own = "opened"
        except OSError as exc:
            own = errno.errorcode[exc.errno or 0]
        _, fds, _, _ = socket.recv_fds(sock, 16, 1)
        os.write(out, f"{own} held {os.readlink(f'/proc/self/fd/{fds[0]}')}".encode())
        os.close(out)
        time.sleep(300)
    return body


def hold(path: str) -> Any:
    """A body that opens the GPU ``path`` (its own job's) and sleeps holding it."""
    def body(out: int) -> None:
        os.open(path, os.O_RDONLY)
        os.write(out, b"holding")
        os.close(out)
        time.sleep(300)
    return body


def start(backend: V1Backend, key: str, body: Any, children: list[int]) -> Child:
    child = Child(body, children)
    backend.add_pid(key, child.pid)
    child.go()
    return child


def alive(child: Child) -> bool:
    return os.waitpid(child.pid, os.WNOHANG) == (0, 0)


def test_given_a_gpu_fd_passed_to_a_later_job_when_the_first_ends_then_its_holder_is_killed(
        backend: V1Backend, children: list[int], journal_log: Any, tmp_path: Path,
        devices: Path, job_owner: Any) -> None:
    """Given job A holding GPU 0, which hands an fd on it to a process of the same user's
    later job B (B is kept off GPU 0 by its cgroup: EPERM), another process of B holding
    B's own GPU 1, and a job C of the user that GPU 0 went to (as when it came free),
    holding it, when A is torn down, then B's holder of GPU 0 is SIGKILLed and journaled
    (gpu-fd-revoked: A's job id, the pid, B, the GPU); B's holder of GPU 1 and C's of its
    own GPU 0 live."""
    cfg, paths = gpu_node(tmp_path, devices)
    first = gpu_job(cfg, backend, job_owner.name, "0")
    later = gpu_job(cfg, backend, job_owner.name, "1")
    reassigned = gpu_job(cfg, backend, job_owner.name, "0")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender = start(backend, first, as_user(job_owner.uid, hand_over(paths["gpu0"], ours)),
                   children)
    holder = start(backend, later, as_user(job_owner.uid, receive(paths["gpu0"], theirs)),
                   children)
    bystander = start(backend, later, as_user(job_owner.uid, hold(paths["gpu1"])), children)
    new_owner = start(backend, reassigned, as_user(job_owner.uid, hold(paths["gpu0"])),
                      children)
    assert sender.output() == b"sent"
    assert holder.output() == f"EPERM held {paths['gpu0']}".encode()
    assert bystander.output() == b"holding"
    assert new_owner.output() == b"holding"

    result = end(first, backend, cfg, "epilog")

    assert result.clean
    assert sender.wait() == -signal.SIGKILL
    assert holder.wait(10) == -signal.SIGKILL
    assert alive(bystander) and alive(new_owner)
    [entry] = journal_log.entries(JOB_ID=first.split(".")[0], GECO_EVENT="gpu-fd-revoked")
    assert {k: entry[k] for k in ("SGE_TASK_ID", "PID", "HOLDER_JOB", "GPU", "USER",
                                  "PRIORITY")} == {
        "SGE_TASK_ID": "1", "PID": str(holder.pid), "HOLDER_JOB": later, "GPU": "0",
        "USER": job_owner.name, "PRIORITY": "4"}
    assert entry["MESSAGE"] == (
        f"job {first} ended: killed process {holder.pid} of {job_owner.name}'s job {later}, "
        f"which held the job's GPU 0 open (an fd handed over from the job: the kernel checks "
        "a device at open only)")
    assert journal_log.entries(JOB_ID=first.split(".")[0],
                               GECO_EVENT="gpu-fds-unchecked") == []


def test_given_no_time_to_look_then_the_owners_other_jobs_processes_die_and_it_is_journaled(
        backend: V1Backend, children: list[int], journal_log: Any, tmp_path: Path,
        devices: Path, job_owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the look's time budget spent before it reached any process (as when a user's
    other jobs hold more processes and fds than it can look through), when a job holding
    GPU 0 is torn down, then every process of the owner's other jobs here is killed (any may
    hold GPU 0), gpu-fds-unchecked names the job, its GPUs and them; a root process in such
    a job (Grid Engine's shepherd) and the jobs of other users are left alone."""
    monkeypatch.setattr("geco.job.gpufds.BUDGET", 0.0)
    cfg, paths = gpu_node(tmp_path, devices)
    first = gpu_job(cfg, backend, job_owner.name, "0")
    later = gpu_job(cfg, backend, job_owner.name, "1")
    someone_elses = gpu_job(cfg, backend, "someone-else", "")
    user = as_user(job_owner.uid, hold(paths["gpu1"]))
    mine = [start(backend, later, user, children) for _ in range(3)]
    shepherd = start(backend, later, hold(paths["gpu1"]), children)  # root's
    other = start(backend, someone_elses, hold("/dev/null"), children)
    for child in [*mine, shepherd, other]:
        assert child.output() == b"holding"

    result = end(first, backend, cfg, "epilog")

    assert result.clean
    assert [child.wait(10) for child in mine] == [-signal.SIGKILL] * 3
    assert alive(shepherd) and alive(other)
    [entry] = journal_log.entries(JOB_ID=first.split(".")[0], GECO_EVENT="gpu-fds-unchecked")
    pids = " ".join(str(c.pid) for c in sorted(mine, key=lambda c: c.pid))
    assert {k: entry[k] for k in ("GPUS", "USER", "PIDS", "PRIORITY")} == {
        "GPUS": "0", "USER": job_owner.name, "PIDS": pids, "PRIORITY": "4"}
    assert entry["MESSAGE"] == (
        f"job {first} ended, but the look for its GPU 0 among the processes of "
        f"{job_owner.name}'s other jobs here ran out of its 0 s: killed the 3 "
        f"process(es) of {job_owner.name} it did not reach ({pids}), as any may hold the GPU")
    assert journal_log.entries(JOB_ID=first.split(".")[0], GECO_EVENT="gpu-fd-revoked") == []
