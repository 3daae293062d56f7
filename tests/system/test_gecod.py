"""gecod as a real process: real Unix sockets, real cgroup v1, real journald.

The node, its gecod and the job processes come from :mod:`tests.gecodkit` (a spool dir
and a resource file per job, so no qstat is ever needed; every cgroup and process a test
creates is removed with plain syscalls after each test). What is checked is the kernel's
word: ``/proc/<pid>/cgroup``, the cgroup files, and journald's entries.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.cpulist import parse_cpulist
from geco.errors import GecoError, ProtocolError
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import resourcefile
from geco.wire import address, client
from geco.wire.frame import PEERCRED, PUBLIC_KEY, Frame, ack_for_error, decode, decode_ack, encode
from geco.wire.messages import (
    MAX_PAYLOAD,
    Ack,
    AckStatus,
    Adopt,
    AdoptReply,
    AdoptStage,
    JobStarted,
    MsgType,
    StatusReply,
)
from geco.wire.reader import read_frame
from tests.gecodkit import (
    CONTROLLERS,
    DEADLINE,
    HOST,
    MARKS,
    NOBODY,
    REPO,
    Gecod,
    MiB,
    Node,
    adopt,
    adopt_frame,
    assert_serving,
    exchange,
    free_tcp_port,
    logged,
    new_job,
    root_socket,
    start_gecod,
    status,
    wait_gone,
    with_unit_capabilities,
)
from tests.gecodkit import _clean_jobs as _clean_jobs  # after each test, on this module's node
from tests.gecodkit import gecod as gecod  # the module's gecod, on this module's node
from tests.gecodkit import node as node  # this module's node

pytestmark = MARKS



# -- quarantine -----------------------------------------------------------------


def test_a_process_in_its_jobs_spool_dir_is_moved_into_the_jobs_cgroups(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a spooled job with a resource file (256 MiB), when a process whose cwd is the
    job's spool dir sends JOB_STARTED for itself, then the ACK is OK, /proc/<pid>/cgroup
    shows it in <name>/<job>.1 in every controller, the memory limit is the resource
    file's, and the journal has a GECO_EVENT=quarantined entry with JOB_ID, SGE_TASK_ID, PID,
    where the resources came from and the part of its time that took (LOOKUP_MS)."""
    job = new_job()
    node.make_job(job, memory=256 * MiB)
    p = node.job_process(job)

    assert p.answer() == "OK"
    cgroups = p.cgroups()
    for c in CONTROLLERS:
        assert cgroups[c] == f"/{node.name}/{job}.1", (c, cgroups)
    limit = int((node.cgroup("memory", f"{job}.1") / "memory.limit_in_bytes").read_text())
    assert limit == 256 * MiB
    [entry] = journal.entries(GECO_EVENT="quarantined", JOB_ID=str(job), _PID=str(gecod.pid))
    assert (entry["SGE_TASK_ID"], entry["PID"], entry["CGROUP_CREATED"], entry["PRIORITY"],
            entry["RESOURCES"]) == ("1", str(p.pid), "1", "6", "file")
    assert 0 <= float(entry["LOOKUP_MS"]) <= float(entry["ELAPSED_MS"]), entry


def test_a_traced_job_gets_gecods_lines_in_its_trace_file_and_others_get_none(
        node: Node, gecod: Gecod) -> None:
    """Given two jobs of user nobody, one with trace level 4 in its resource file (-l
    geco_trace_level=4), when both are quarantined, then the traced job's trace file holds
    gecod's lines about it (and none about the other), root's with mode 0600 (nobody has
    no private group to read it through); the other job has no trace file."""
    traced, plain = new_job(), new_job()
    node.make_job(traced, owner="nobody", trace_level=4)
    node.make_job(plain, owner="nobody")
    assert node.job_process(traced).answer() == "OK"
    assert node.job_process(plain).answer() == "OK"

    trace_file = node.base / "trace" / f"{traced}.1.trace"
    st = trace_file.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    lines = trace_file.read_text().splitlines()
    assert lines and all(" gecod [" in line for line in lines), lines
    assert any(f"job {traced}.1" in line for line in lines), lines
    assert not any(f"{plain}." in line for line in lines), lines
    assert not (node.base / "trace" / f"{plain}.1.trace").exists()


def test_a_geco_parent_removed_while_gecod_runs_is_made_again_for_the_next_job(
        node: Node, gecod: Gecod) -> None:
    """Given gecod running and its empty GECO parent cgroups removed behind its back (an
    admin's cleanup script), when a job's process asks, then it is contained all the same."""
    for c in CONTROLLERS:
        parent = node.cgroup(c)
        assert not [d for d in parent.iterdir() if d.is_dir()], parent  # no job left in it
        parent.rmdir()
    job = new_job()
    node.make_job(job)
    p = node.job_process(job)

    assert p.answer() == "OK"
    assert all(v == f"/{node.name}/{job}.1" for c, v in p.cgroups().items()
               if c in CONTROLLERS)


def test_a_second_process_of_the_same_job_shares_its_cgroups(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job already quarantined, when a PE task's process (cwd the task dir below the
    job's) asks too, then it joins the same cgroups, which are not created a second time."""
    job = new_job()
    node.make_job(job)
    first = node.job_process(job)
    assert first.answer() == "OK"
    second = node.job_process(job, cwd=node.make_pe_task_dir(job))

    assert second.answer() == "OK"
    assert second.cgroups()["cpuset"] == first.cgroups()["cpuset"] == f"/{node.name}/{job}.1"
    pids = {int(x) for x in (node.cgroup("cpuset", f"{job}.1") / "cgroup.procs")
            .read_text().split()}
    assert {first.pid, second.pid} <= pids
    entries = journal.entries(GECO_EVENT="quarantined", JOB_ID=str(job), _PID=str(gecod.pid))
    assert sorted(e["CGROUP_CREATED"] for e in entries) == ["0", "1"]


def test_an_array_task_gets_its_own_cgroups_and_cores(node: Node, gecod: Gecod) -> None:
    job = new_job()
    node.make_job(job, 1)
    node.make_job(job, 2)
    one, two = node.job_process(job, 1), node.job_process(job, 2)

    assert (one.answer(), two.answer()) == ("OK", "OK")
    assert one.cgroups()["cpuset"] == f"/{node.name}/{job}.1"
    assert two.cgroups()["cpuset"] == f"/{node.name}/{job}.2"
    cpus = [(node.cgroup("cpuset", f"{job}.{t}") / "cpuset.cpus").read_text().strip()
            for t in (1, 2)]
    assert cpus[0] != cpus[1] and "" not in cpus


# -- the end of a job ---------------------------------------------------------------



def leftover_in(node: Node, key: str) -> subprocess.Popen[bytes]:
    """A ``sleep`` put into the job's cgroups behind gecod's back (a daemon the job left)."""
    proc = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    for c in CONTROLLERS:
        (node.cgroup(c, key) / "cgroup.procs").write_text(str(proc.pid))
    return proc


def test_when_the_jobs_shepherd_exits_gecod_ends_the_job_at_once(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job whose shepherd gecod moved in (JOB_STARTED from the job's own spool dir),
    a qrsh -inherit task's process (from a PE task dir below it) and a process the job left
    behind, when the task's process exits then the job's cgroups stay; when the shepherd
    exits, gecod kills the leftover, removes the job's cgroups in every controller and its
    resource file, and journals job-end (CLEANED_BY=gecod) with the job's accounting."""
    since = time.time()
    job = new_job()
    node.make_job(job)
    shepherd = node.job_process(job)
    assert shepherd.answer() == "OK"
    task = node.job_process(job, cwd=node.make_pe_task_dir(job))
    assert task.answer() == "OK"
    leftover = leftover_in(node, f"{job}.1")

    task.exit()
    time.sleep(0.5)
    kept = all(node.cgroup(c, f"{job}.1").is_dir() for c in CONTROLLERS)
    shepherd.exit()
    wait_gone(node, f"{job}.1")

    assert kept
    assert leftover.wait(timeout=10) == -signal.SIGKILL
    [end] = journal.wait_for(GECO_EVENT="job-end", JOB_ID=str(job))
    assert (end["CLEANED_BY"], end["KILLED"], end["_PID"]) == ("gecod", "1", str(gecod.pid))
    assert int(end["MEMORY_PEAK"]) > 0 and float(end["CPU_USER_SEC"]) >= 0
    assert resourcefile.read(node.state_dir / "resources", JobKey(job, 1)) is None
    assert not logged(journal, since, GECO_EVENT="teardown-failed", JOB_ID=str(job))


def test_a_restarted_gecod_still_ends_the_jobs_it_finds_running(
        node: Node, journal: Any) -> None:
    """Given gecod A that moved a job's shepherd (a process called sge_shepherd) in, when A is
    killed with SIGKILL and gecod B started, and then the shepherd exits, then B tears the
    job down at once: it found the shepherd again by its working directory."""
    a = start_gecod(node, "jobend-restart")
    job = new_job()
    node.make_job(job)
    shepherd = node.job_process(job, sock=a.sock, named_shepherd=True)
    assert shepherd.answer() == "OK"
    assert Path(f"/proc/{shepherd.pid}/comm").read_text().strip() == "sge_shepherd"
    a.stop(signal.SIGKILL)
    b = start_gecod(node, "jobend-restart")
    try:
        shepherd.exit()
        wait_gone(node, f"{job}.1")
        [end] = journal.wait_for(GECO_EVENT="job-end", JOB_ID=str(job))
        assert (end["CLEANED_BY"], end["_PID"]) == ("gecod", str(b.pid))
    finally:
        assert b.stop() == 0, b.output()


def test_a_job_short_of_cores_gets_those_empty_cgroups_of_ended_jobs_hold(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given every core of the node held by empty job cgroups (a killed epilog left them;
    their spool dirs are still there), when a new job's shepherd asks, then gecod removes
    them (stale-cgroup-removed) and contains the new job at once, instead of refusing it
    for lack of cores."""
    ncores = len(parse_cpulist((node.cgroup("cpuset") / "cpuset.cpus")
                               .read_text().strip()))
    ended = [new_job() for _ in range(ncores)]
    for job in ended:
        node.make_job(job)
        # a task's process: its exit does not end the job, so its cgroups stay behind empty
        task = node.job_process(job, cwd=node.make_pe_task_dir(job))
        assert task.answer() == "OK"
        task.exit()
    job = new_job()
    node.make_job(job)
    p = node.job_process(job)

    assert p.answer() == "OK"
    assert p.cgroups()["cpuset"] == f"/{node.name}/{job}.1"
    removed = {e["JOB_ID"] for j in ended
               for e in journal.wait_for(GECO_EVENT="stale-cgroup-removed", JOB_ID=str(j))}
    assert removed == {str(j) for j in ended}


# -- refusals of frames -----------------------------------------------------------


def _valid_status(node: Node, **kw: Any) -> bytes:
    return encode(MsgType.STATUS, b"", node.key, **kw)


def _unsigned(node: Node) -> bytes:
    frame = _valid_status(node)
    return frame[:-32] + bytes(32)


def _badly_signed(node: Node) -> bytes:
    return _valid_status(node)[:-32] + encode(MsgType.STATUS, b"", os.urandom(32))[-32:]


def _stale(node: Node) -> bytes:
    return _valid_status(node, ts_ns=time.time_ns() - 120 * 10**9)


def _oversized(node: Node) -> bytes:
    header = bytearray(_valid_status(node)[:36])
    header[8:12] = struct.pack("<I", 5000)
    return bytes(header) + b"x" * 100


def _unknown_type(node: Node) -> bytes:
    return encode(99, b"", node.key)


def _wrong_version(node: Node) -> bytes:
    return encode(MsgType.STATUS, b"", node.key, version=2)


def _unknown_flag(node: Node) -> bytes:
    return encode(MsgType.STATUS, b"", node.key, flags=0x0002)


@pytest.mark.parametrize(("make", "reason", "status"), [
    (_unsigned, "mac", AckStatus.BAD_REQUEST),
    (_badly_signed, "mac", AckStatus.BAD_REQUEST),
    (_stale, "stale", AckStatus.BAD_REQUEST),
    (_oversized, "length", AckStatus.BAD_REQUEST),
    (_unknown_type, "type", AckStatus.BAD_REQUEST),
    (_wrong_version, "version", AckStatus.VERSION),
    (_unknown_flag, "flags", AckStatus.BAD_REQUEST),
    (lambda node: b"GET / HTTP/1.0\r\n\r\n", "magic", AckStatus.BAD_REQUEST),
], ids=["unsigned", "badly-signed", "stale", "oversized", "unknown-type", "version",
        "unknown-flag", "garbage"])
def test_a_bad_frame_is_answered_with_why_journaled_and_the_next_client_is_served(
        node: Node, gecod: Gecod, journal: Any, make: Any, reason: str,
        status: AckStatus) -> None:
    """Given a frame failing one protocol check, when sent, then gecod answers at once with
    an ACK (no job) whose status says BAD_REQUEST (VERSION for another protocol version),
    closes, journals a quarantine-refused entry at priority 4 naming the peer's pid/uid and
    the reason, and the next valid request is answered promptly."""
    since = time.time()
    data = make(node)
    started = time.monotonic()
    reply = exchange(gecod.sock, data)
    elapsed = time.monotonic() - started

    nonce = data[12:28] if len(data) >= 28 else bytes(16)
    ack = decode_ack(reply, node.key, nonce)
    assert (ack.job_id, ack.task_id, ack.status) == (0, 0, status)
    assert elapsed < DEADLINE  # answered, not left to time out
    [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", REASON=reason,
                              _PID=str(gecod.pid))
    assert (entry["PRIORITY"], entry["PEER_PID"], entry["PEER_UID"]) == \
        ("4", str(os.getpid()), "0")
    assert_serving(node, gecod)


def test_a_replayed_frame_is_refused_the_second_time(
        node: Node, gecod: Gecod, journal: Any) -> None:
    since = time.time()
    frame = _valid_status(node)
    first = decode(exchange(gecod.sock, frame), node.key)
    assert first.type is MsgType.STATUS_REPLY

    again = decode_ack(exchange(gecod.sock, frame), node.key, frame[12:28])
    assert again.status is AckStatus.BAD_REQUEST
    assert len(logged(journal, since, GECO_EVENT="quarantine-refused", REASON="nonce",
                               _PID=str(gecod.pid))) == 1
    assert_serving(node, gecod)


def test_a_truncated_frame_is_dropped_without_an_answer_and_journaled(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a client that sends half a JOB_STARTED frame and closes its side, then gecod
    closes without replying, journals it with the claimed job (reason closed), and serves on."""
    since = time.time()
    frame = encode(MsgType.JOB_STARTED, JobStarted(4242, 1, os.getpid()), node.key)

    assert exchange(gecod.sock, frame[:50], half_close=True) == b""
    assert exchange(gecod.sock, frame[:20], half_close=True) == b""
    entries = logged(journal, since, GECO_EVENT="quarantine-refused", REASON="closed",
                              _PID=str(gecod.pid))
    assert len(entries) == 2
    assert all(e["MESSAGE"].endswith("(truncated)") for e in entries)
    assert_serving(node, gecod)


def test_a_slowloris_client_is_dropped_at_the_deadline_and_others_are_served_meanwhile(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a client that sends half a header and then nothing, when a job process asks
    for quarantine meanwhile, then it is answered OK at once, and the slow client is
    disconnected after connection_deadline with a quarantine-refused entry (timeout)."""
    since = time.time()
    job = new_job()
    node.make_job(job)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.connect(gecod.sock)
        slow.sendall(_valid_status(node)[:10])
        started = time.monotonic()
        p = node.job_process(job)
        assert p.answer(timeout=DEADLINE * 3) == "OK"
        slow.setblocking(False)
        with pytest.raises(BlockingIOError):  # answered while the slow client still hangs on
            slow.recv(100)
        slow.setblocking(True)
        slow.settimeout(DEADLINE + 5)
        assert slow.recv(100) == b""  # closed by gecod
        dropped_after = time.monotonic() - started
    assert DEADLINE * 0.8 <= dropped_after < DEADLINE + 3
    [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", REASON="timeout",
                              _PID=str(gecod.pid))
    assert entry["MESSAGE"].endswith(f"no whole request within {DEADLINE:g} s "
                                     "(10 bytes received); dropped")


# -- refusals by policy ----------------------------------------------------------------


def test_a_process_asking_for_another_pid_is_refused(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a root process in the job's spool dir that asks to quarantine another pid
    (its parent, pytest), then REFUSED, journaled with its own pid as PEER_PID and the
    claimed pid, and pytest stays where it was."""
    since = time.time()
    job = new_job()
    node.make_job(job)
    mine = Path("/proc/self/cgroup").read_text()
    p = node.job_process(job, mode=f"pid={os.getpid()}")

    assert p.answer() == "REFUSED"
    assert Path("/proc/self/cgroup").read_text() == mine
    [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", JOB_ID=str(job),
                              _PID=str(gecod.pid))
    assert (entry["PEER_PID"], entry["PEER_UID"], entry["PID"], entry["REASON"]) == \
        (str(p.pid), "0", str(os.getpid()), "refused")
    assert entry["MESSAGE"].endswith(f"the message names pid {os.getpid()} but was sent by "
                                     f"pid {p.pid}: a process may only ask for itself")
    assert_serving(node, gecod)


def test_a_non_root_process_may_not_send_job_started(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a process in the job's spool dir that drops to uid nobody before asking for
    itself, then REFUSED (only root and execd_uids start jobs), and it stays outside."""
    since = time.time()
    job = new_job()
    node.make_job(job)
    p = node.job_process(job, mode="nobody")

    assert p.answer() == "REFUSED"
    assert p.cgroups()["cpuset"] != f"/{node.name}/{job}.1"
    [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", JOB_ID=str(job),
                              _PID=str(gecod.pid))
    assert entry["PEER_UID"] == str(NOBODY)
    assert entry["MESSAGE"].endswith(f"uid {NOBODY} may not send JOB_STARTED: only root "
                                     "(real or effective) and [gecod] execd_uids (0)")
    assert_serving(node, gecod)


def test_an_execd_child_with_real_uid_root_may_send_job_started(
        node: Node, gecod: Gecod) -> None:
    """Given a process that, like sge_execd's child about to exec the shepherd, has real uid
    root and effective uid nobody (SO_PEERCRED reports nobody), then OK with no execd_uids
    configured: a real-root process can become root again at will, so it is trusted."""
    job = new_job()
    node.make_job(job)
    p = node.job_process(job, mode="execd")

    assert p.answer() == "OK"
    assert p.cgroups()["cpuset"] == f"/{node.name}/{job}.1"


def test_a_process_outside_the_jobs_spool_dir_is_refused(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a root process whose cwd is another job's spool dir (or none), when it asks for
    job J, then REFUSED naming where it works; no cgroup is created for J."""
    since = time.time()
    job, other = new_job(), new_job()
    node.make_job(job)
    node.make_job(other)
    p = node.job_process(job, cwd=node.job_dir(other))
    q = node.job_process(job, cwd=node.base)

    assert (p.answer(), q.answer()) == ("REFUSED", "REFUSED")
    assert not node.cgroup("cpuset", f"{job}.1").exists()
    messages = sorted(e["MESSAGE"] for e in logged(
        journal, since, GECO_EVENT="quarantine-refused", JOB_ID=str(job), _PID=str(gecod.pid)))
    assert [m.split(": ", 1)[1] for m in messages] == sorted(
        f"process {pid} works in {cwd}, not in the spool dir of job {job}.1 "
        f"({node.spool}/<host>/active_jobs/{job}.1)"
        for pid, cwd in ((p.pid, node.job_dir(other)), (q.pid, node.base)))


def test_an_environment_file_naming_another_job_is_refused(
        node: Node, gecod: Gecod) -> None:
    job = new_job()
    d = node.make_job(job)
    (d / "environment").write_text("JOB_ID=1\nSGE_TASK_ID=undefined\n")
    assert node.job_process(job).answer() == "REFUSED"


def test_a_job_without_slots_on_this_host_fails(node: Node, gecod: Gecod,
                                                journal: Any) -> None:
    """Given a resource file that places the job on other hosts only, then FAILED,
    journaled with the hosts it has."""
    since = time.time()
    job = new_job()
    node.make_job(job)
    resourcefile.write(node.state_dir / "resources", ResourceSet(
        job, 1, owner="root", nodes=(NodeResources("elsewhere", slots=1),)))
    assert node.job_process(job).answer() == "FAILED"
    [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", JOB_ID=str(job),
                              _PID=str(gecod.pid))
    assert entry["MESSAGE"].endswith(f"job {job}.1 has no slots on this host ({HOST}); "
                                     "its hosts: elsewhere")


def test_the_job_owner_below_the_jobs_shepherd_may_ask_for_itself(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job of nobody whose (fake) sge_shepherd works in its spool dir, when a child of
    the shepherd running as nobody sends QUARANTINE_SELF (the starter's fallback), then OK
    and it is in the job's cgroups; a nobody process that does not descend from the
    shepherd, or one under the shepherd of a job of root, is refused."""
    since = time.time()
    job, roots = new_job(), new_job()
    node.make_job(job, owner="nobody")
    node.make_job(roots, owner="root")
    own = node.job_process(job, mode="self-nobody", shepherd=True)
    stray = node.job_process(job, mode="self-nobody", cwd=node.job_dir(job))
    foreign = node.job_process(roots, mode="self-nobody", shepherd=True)

    assert (own.answer(), stray.answer(), foreign.answer()) == ("OK", "REFUSED", "REFUSED")
    assert own.cgroups()["cpuset"] == f"/{node.name}/{job}.1"
    assert not node.cgroup("cpuset", f"{roots}.1").exists()
    reasons = sorted(e["MESSAGE"].split(": ", 1)[1] for e in logged(
        journal, since, GECO_EVENT="quarantine-refused", _PID=str(gecod.pid)))
    assert reasons == sorted([
        f"process {stray.pid} does not descend from the sge_shepherd of job {job}.1",
        f"uid {NOBODY} is not the owner (uid 0) of job {roots}.1"])


def test_without_a_resource_file_or_qmaster_a_job_is_contained_from_the_spool(
        node: Node, journal: Any) -> None:
    """Given a spooled 1-slot job with no resource file, a qstat that fails and a site
    with run_without_memory_limits = true, then the process is quarantined anyway (its
    cores, from the pe_hostfile, but no memory limit) and the journal says so with a
    degraded-containment warning: never uncontained without a word."""
    g = start_gecod(node, "noqmaster", degraded=True)
    try:
        job = new_job()
        node.make_job(job)
        resourcefile.remove(node.state_dir / "resources", JobKey(job, 1))
        p = node.job_process(job, sock=g.sock)

        assert p.answer() == "OK"
        assert p.cgroups()["cpuset"] == f"/{node.name}/{job}.1"
        cpus = (node.cgroup("cpuset", f"{job}.1") / "cpuset.cpus").read_text().strip()
        assert cpus and "," not in cpus and "-" not in cpus  # one core: the pe_hostfile's slot
        limit = int((node.cgroup("memory", f"{job}.1") / "memory.limit_in_bytes").read_text())
        assert limit >= 1 << 62  # the kernel's "no limit"
        [warning] = journal.entries(GECO_EVENT="degraded-containment", JOB_ID=str(job),
                                    _PID=str(g.pid))
        assert warning["PRIORITY"] == "4"
    finally:
        assert g.stop() == 0, g.output()


def test_without_a_resource_file_or_qmaster_a_job_is_not_started_by_default(
        node: Node, journal: Any) -> None:
    """Given the same job and qstat on a site that does not run jobs without memory
    limits (the default), then gecod answers FAILED (the preload refuses the exec and
    Grid Engine reschedules the job), makes no cgroup, and journals why."""
    g = start_gecod(node, "noqmaster-refused")
    try:
        job = new_job()
        node.make_job(job)
        resourcefile.remove(node.state_dir / "resources", JobKey(job, 1))

        assert node.job_process(job, sock=g.sock).answer() == "FAILED"
        assert not node.cgroup("cpuset", f"{job}.1").exists()
        [warning] = journal.entries(GECO_EVENT="degraded-containment-refused",
                                    JOB_ID=str(job), _PID=str(g.pid))
        assert warning["PRIORITY"] == "4"
    finally:
        assert g.stop() == 0, g.output()


def _unknown_job_qstat(node: Node, delay: float = 0.0) -> str:
    """A fake qstat that answers <unknown_jobs> (as SGE does for a finished job)."""
    fake = node.base / f"qstat-unknown-{delay:g}"
    fake.write_text(f"#!/bin/sh\nsleep {delay}\ncat <<'EOF'\n<?xml version='1.0'?>\n"
                    "<unknown_jobs >\n    <ST_name>1</ST_name>\n</unknown_jobs>\nEOF\n")
    fake.chmod(0o755)
    return str(fake)


def test_a_job_grid_engine_does_not_know_gets_no_such_job(node: Node, journal: Any) -> None:
    """Given no resource file and a qstat that answers <unknown_jobs>, then NO_SUCH_JOB,
    journaled, and no cgroup is made."""
    g = start_gecod(node, "unknown", qstat=_unknown_job_qstat(node))
    try:
        job = new_job()
        node.make_job(job)
        resourcefile.remove(node.state_dir / "resources", JobKey(job, 1))

        assert node.job_process(job, sock=g.sock).answer() == "NO_SUCH_JOB"
        assert not node.cgroup("cpuset", f"{job}.1").exists()
        [entry] = journal.entries(GECO_EVENT="quarantine-refused", JOB_ID=str(job),
                                  _PID=str(g.pid))
        assert entry["REASON"] == "no_such_job"
    finally:
        assert g.stop() == 0, g.output()


def test_over_tcp_the_processs_own_uid_and_cwd_decide(node: Node, journal: Any) -> None:
    """Given gecod on a loopback TCP port (no peer credentials), when a root process in the
    job's spool dir asks for itself, then OK; when a process that dropped to nobody asks,
    then REFUSED by its uid read from /proc, journaled without a peer pid."""
    port = free_tcp_port()
    since = time.time()
    g = start_gecod(node, "tcp", sock=f"port:{port}")
    try:
        job = new_job()
        node.make_job(job)
        ok = node.job_process(job, sock=f"port:{port}")
        nobody = node.job_process(job, mode="nobody", sock=f"port:{port}")

        assert (ok.answer(), nobody.answer()) == ("OK", "REFUSED")
        assert ok.cgroups()["cpuset"] == f"/{node.name}/{job}.1"
        [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", _PID=str(g.pid))
        assert "PEER_PID" not in entry
        assert re.fullmatch(
            rf"refused JOB_STARTED from 127\.0\.0\.1 port \d+ \(job {job}\.1 pid {nobody.pid}\): "
            rf"process {nobody.pid} runs as uid {NOBODY}: only root \(real or effective\) and "
            rf"\[gecod\] execd_uids \(0\) start jobs", entry["MESSAGE"]), entry["MESSAGE"]
        assert entry["PEER"].startswith("127.0.0.1:"), entry
    finally:
        assert g.stop() == 0, g.output()




def test_adopt_is_served_for_its_root_sender_on_the_privileged_socket_only(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given ADOPT (sshd's PAM module asking for a login), then gecod answers it on its
    privileged socket for the sender itself (root's login: admitted, journaled as
    ssh-admitted), and refuses it naming another pid, or on the public socket: a root
    process can only hand itself to a job, and only root's socket serves it."""
    since = time.time()
    me = os.getpid()
    root_sock = root_socket(gecod)
    assert adopt(root_sock, node.key, me, 0).status is AckStatus.OK
    assert journal.wait_for(GECO_EVENT="ssh-admitted", _PID=str(gecod.pid))[-1]["REASON"] == \
        "root"
    assert adopt(root_sock, node.key, me + 1, 0).status is AckStatus.REFUSED
    assert adopt(gecod.sock, node.key, me, 0).status is AckStatus.REFUSED
    refusals = logged(journal, since, GECO_EVENT="quarantine-refused", _PID=str(gecod.pid))
    assert [e["MESSAGE"].split(": ", 1)[1] for e in refusals[-2:]] == [
        f"ADOPT must name its sender (pid {me}), not pid {me + 1}",
        "ADOPT is sshd's (root's) request, on gecod's privileged socket"]


def test_adopts_exec_stage_is_refused_to_a_user_process_that_is_no_ssh_session(
        node: Node, gecod: Gecod) -> None:
    """Given a user's own process (not sshd's) that sends ADOPT's EXEC stage, peer-
    credentialed, for itself, then gecod refuses it: that stage is only for a process the
    kernel names sshd, under root's sshd (a user cannot hand a process of theirs to a job
    that way); the same stage MAC'd with the secret key is refused too."""
    ours, theirs = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(ours)
            _as_nobody()
            adopt = Adopt(0, 0, os.getpid(), NOBODY, AdoptStage.EXEC)
            frame = encode(MsgType.ADOPT, adopt, PUBLIC_KEY,
                           flags=PEERCRED)
            got = decode(exchange(gecod.sock, frame), PUBLIC_KEY,
                         peercred=True)
            reply = got.message
            assert isinstance(reply, AdoptReply)
            os.write(theirs, reply.status.name.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(theirs)
    with os.fdopen(ours, "rb") as pipe:
        answer = pipe.read().decode()
    assert os.waitpid(child, 0)[1] == 0
    assert answer == "REFUSED"
    me = os.getpid()
    secret_exec = Adopt(0, 0, me, 0, AdoptStage.EXEC)
    assert adopt_frame(root_socket(gecod), node.key, secret_exec).status is AckStatus.REFUSED
    from_user = "ADOPT's EXEC stage comes from an ssh session: sshd, under root's sshd"
    with_key = "ADOPT's EXEC stage is peer-credentialed (an ssh session's own process)"
    log = gecod.output_with(from_user, with_key)
    assert from_user in log
    assert with_key in log


# -- peer-credentialed requests: users without the key ------------------------------


def test_a_job_owner_without_the_key_is_quarantined_by_a_peercred_request(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job of nobody under its (fake) shepherd, when a child of the shepherd running
    as nobody, which cannot read the key, asks through geco.wire.client (a PEERCRED
    QUARANTINE_SELF), then OK, it is in the job's cgroups in every controller, and the
    journal says so with PEERCRED=1; the same request from a nobody process outside the
    shepherd's tree is REFUSED: the kernel, not a key, decides."""
    since = time.time()
    job = new_job()
    node.make_job(job, owner="nobody")
    own = node.job_process(job, mode="peercred", shepherd=True)
    stray = node.job_process(job, mode="peercred", cwd=node.job_dir(job))

    assert (own.answer(), stray.answer()) == ("OK", "REFUSED")
    cgroups = own.cgroups()
    for c in CONTROLLERS:
        assert cgroups[c] == f"/{node.name}/{job}.1", (c, cgroups)
    [ok] = logged(journal, since, GECO_EVENT="quarantined", JOB_ID=str(job),
                  _PID=str(gecod.pid))
    assert (ok["REQUEST"], ok["PEERCRED"], ok["PEER_UID"], ok["PID"]) == (
        "QUARANTINE_SELF", "1", str(NOBODY), str(own.pid))
    # the stray's claim is its own word, not the job's story: journaled as a claim only
    assert not logged(journal, since, GECO_EVENT="quarantine-refused", JOB_ID=str(job),
                      _PID=str(gecod.pid))
    [no] = logged(journal, since, GECO_EVENT="quarantine-refused", CLAIMED_JOB_ID=str(job),
                  _PID=str(gecod.pid))
    assert no["PEERCRED"] == "1"
    assert no["MESSAGE"].endswith(f"process {stray.pid} does not descend from the "
                                  f"sge_shepherd of job {job}.1")


def test_job_started_with_the_peercred_flag_is_refused_and_answered_in_kind(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a root process that sends JOB_STARTED for itself as a PEERCRED frame (the
    privileged request without the key), then gecod refuses it from its header alone: it
    answers BAD_REQUEST with a PEERCRED ACK (which a keyless sender can check), journals
    the refusal (REASON=flags, PEERCRED=1) with the rule's text, creates no cgroup, and
    serves on."""
    since = time.time()
    job = new_job()
    node.make_job(job)
    frame = encode(MsgType.JOB_STARTED, JobStarted(job, 1, os.getpid()),
                   PUBLIC_KEY, flags=PEERCRED)

    reply = exchange(gecod.sock, frame)
    ack = decode_ack(reply, PUBLIC_KEY, frame[12:28], peercred=True)
    assert (ack.job_id, ack.task_id, ack.status) == (0, 0, AckStatus.BAD_REQUEST)
    assert not node.cgroup("cpuset", f"{job}.1").exists()
    [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", REASON="flags",
                     _PID=str(gecod.pid))
    assert (entry["PEERCRED"], entry["PEER_PID"], entry["PEER_UID"]) == (
        "1", str(os.getpid()), "0")
    assert entry["MESSAGE"] == (
        f"refused a request from pid {os.getpid()} uid 0 (no readable claim): the PEERCRED "
        "flag is only allowed on STATUS, QUARANTINE_SELF, ADOPT and STARTER requests and their "
        "replies, got "
        "it on JOB_STARTED: JOB_STARTED must be MAC'd with the secret key")
    assert_serving(node, gecod)


def test_a_peercred_request_over_tcp_is_refused_and_geco_client_never_sends_one(
        node: Node, journal: Any) -> None:
    """Given gecod on a loopback TCP port, when a PEERCRED STATUS arrives there, then gecod
    refuses it (BAD_REQUEST, in kind) and journals why: over TCP no kernel names the sender.
    geco.wire.client does not even try as a user: over TCP nothing vouches for the reply either
    (root asks on gecod's privileged Unix socket instead)."""
    port = free_tcp_port()
    since = time.time()
    g = start_gecod(node, "tcp-peercred", sock=f"port:{port}")
    try:
        frame = encode(MsgType.STATUS, b"", PUBLIC_KEY,
                       flags=PEERCRED)
        reply = client.request(address.parse(f"port:{port}"), frame, 10)
        ack = decode_ack(reply, PUBLIC_KEY, frame[12:28], peercred=True)
        assert ack.status is AckStatus.BAD_REQUEST
        [entry] = logged(journal, since, GECO_EVENT="quarantine-refused", _PID=str(g.pid))
        assert (entry["REASON"], entry["PEERCRED"]) == ("flags", "1")
        assert "PEER_PID" not in entry
        assert re.fullmatch(
            r"refused a request from 127\.0\.0\.1 port \d+ \(no readable claim\): the "
            r"PEERCRED flag needs gecod's Unix socket: over TCP the kernel cannot name the "
            r"sender, so only frames MAC'd with the secret key are accepted here",
            entry["MESSAGE"]), entry["MESSAGE"]
        assert client.status(node.client_config(f"port:{port}"))["pid"] == g.pid
        conf = node.base / "tcp-peercred.toml"
        done = geco_cli("status", config_path=conf)
        assert (done.returncode, done.stdout, done.stderr) == (
            1, "", 'geco status: asking gecod without the secret key needs its Unix socket '
                   f'([gecod] socket = "path:..."), got port:{port}: over TCP neither the '
                   "kernel nor a root-owned directory vouches for either end\n")
    finally:
        assert g.stop() == 0, g.output()


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def geco_cli(*args: str, config_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``geco <args>`` as nobody with ``GECO_CONFIG=config_path``."""
    return subprocess.run([sys.executable, "-m", "geco.cli", *args], cwd="/",
                          capture_output=True, text=True, timeout=60, preexec_fn=_as_nobody,
                          env={"PYTHONPATH": str(REPO), "GECO_CONFIG": str(config_path),
                               "PATH": "/usr/bin:/bin"})


def test_geco_status_as_any_user_lists_the_jobs_gecod_contains(
        node: Node, gecod: Gecod) -> None:
    """Given a job quarantined by gecod (256 MiB), when `geco status` runs as nobody (no
    key), then it prints a summary and a table row with the job's key, cpus, NUMA nodes,
    memory limit and process count, as the kernel has them; `--json` prints gecod's
    document with the same facts."""
    job = new_job()
    node.make_job(job, memory=256 * MiB)
    assert node.job_process(job).answer() == "OK"
    cpuset = node.cgroup("cpuset", f"{job}.1")
    cpus, mems = ((cpuset / f).read_text().strip() for f in ("cpuset.cpus", "cpuset.mems"))
    conf = node.base / "gecod.toml"  # the module's gecod

    table = geco_cli("status", config_path=conf)
    assert (table.returncode, table.stderr) == (0, "")
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"gecod on {HOST} (pid {gecod.pid}): 1 job(s); cpus in use: ")
    assert lines[1].split() == ["JOB", "CPUS", "MEMS", "MEMORY", "PIDS"]
    assert [line.split() for line in lines[2:]] == [[f"{job}.1", cpus, mems, "256M", "1"]]

    as_json = geco_cli("status", "--json", config_path=conf)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    [entry] = doc["jobs"]
    assert (entry["key"], entry["cpus"], entry["mems"], entry["memory"], entry["pids"]) == (
        f"{job}.1", cpus, mems, 256 * MiB, 1)
    assert (doc["pid"], doc["job_count"], doc["truncated"]) == (gecod.pid, 1, False)


def test_geco_status_without_gecod_says_so_in_one_line_and_exits_1(node: Node) -> None:
    conf = node.write_config("nogecod")  # nobody ever listened on its socket
    done = geco_cli("status", config_path=conf)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"geco status: gecod is not running (no socket at "
               f"{node.socket_path('nogecod')})\n")


# -- geco.wire.client against fake gecods ----------------------------------------------------


@contextlib.contextmanager
def fake_gecod(path: Path, answer: Callable[[Frame], bytes | None]) -> Iterator[None]:
    """A listener on ``path`` that reads one request per connection and sends ``answer(frame)``
    (None: close without a reply); ``path``'s directory is left as the test made it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                got = decode(read_frame(conn, time.monotonic() + 5),
                             PUBLIC_KEY)
                reply = answer(got)
                if reply is not None:
                    conn.sendall(reply)
                    with contextlib.suppress(OSError):
                        conn.recv(1)  # until the client closes
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        listener.close()


def _peercred_ack(status: AckStatus) -> Callable[[Frame], bytes]:
    return lambda got: encode(MsgType.ACK, Ack(0, 0, status, got.nonce),
                              PUBLIC_KEY, flags=PEERCRED)


def test_geco_client_waits_out_busy_answers_within_its_timeout(node: Node) -> None:
    """Given a gecod that answers BUSY twice, then the document, when geco.wire.client asks for
    STATUS, then it retries and returns the document; one that is always BUSY makes it give
    up at its timeout with "gecod refused: BUSY"."""
    sock = node.base / "busy.sock"
    busy = _peercred_ack(AckStatus.BUSY)
    asked: list[Frame] = []

    def busy_twice(got: Frame) -> bytes:
        asked.append(got)
        if len(asked) <= 2:
            return busy(got)
        return encode(MsgType.STATUS_REPLY, StatusReply({"jobs": []}),
                      PUBLIC_KEY, flags=PEERCRED)

    with fake_gecod(sock, busy_twice):
        assert client.status(node.client_config(str(sock)), timeout=5) == {"jobs": []}
    assert len({f.nonce for f in asked}) == 3 and all(f.peercred for f in asked)
    sock.unlink()
    with fake_gecod(sock, busy):
        started = time.monotonic()
        with pytest.raises(client.GecodRefused) as info:
            client.status(node.client_config(str(sock)), timeout=0.5)
    assert (str(info.value), info.value.status) == ("gecod refused: BUSY", AckStatus.BUSY)
    assert time.monotonic() - started < 3


def test_geco_client_reports_a_silent_a_hanging_up_and_an_old_gecod(node: Node) -> None:
    """Given a gecod that never answers, one that hangs up, and one too old for PEERCRED
    (it answers with an ACK MAC'd with its secret key), then geco.wire.client raises
    GecodTimeout, GecodUnavailable and ProtocolError (flags), each saying so."""
    sock = node.base / "odd.sock"
    where = f"path:{sock}"
    cfg = node.client_config(where)

    def silent(got: Frame) -> None:
        time.sleep(1)

    with fake_gecod(sock, silent), pytest.raises(client.GecodTimeout) as timed_out:
        client.quarantine_self(cfg, 1, 1, timeout=0.3)
    assert str(timed_out.value) == f"gecod did not answer within 0.3 s (address={where})"
    sock.unlink()
    with fake_gecod(sock, lambda got: None), pytest.raises(client.GecodUnavailable) as hung_up:
        client.status(cfg, timeout=5)
    assert str(hung_up.value) == f"gecod closed the connection without an answer " \
                                 f"(address={where})"
    sock.unlink()
    old = lambda got: ack_for_error(  # noqa: E731
        b"", ProtocolError("flags must be 0", reason="flags"), node.key)
    with fake_gecod(sock, old), pytest.raises(ProtocolError) as too_old:
        client.status(cfg, timeout=5)
    assert too_old.value.reason == "flags"
    assert "upgrade gecod" in str(too_old.value)


@pytest.mark.parametrize(("mode", "owner"), [(0o777, 0), (0o755, NOBODY)],
                         ids=["world-writable", "owned-by-nobody"])
def test_geco_client_asks_no_socket_that_another_user_could_have_put_there(
        node: Node, mode: int, owner: int) -> None:
    """Given a listener in a directory that is writable by others or not owned by root,
    then geco.wire.client refuses to ask it (its reply would prove nothing) and says where to put
    the socket; nothing is sent."""
    d = node.base / f"untrusted-{mode:o}-{owner}"
    d.mkdir()
    os.chown(d, owner, -1)
    d.chmod(mode)
    sock = d / "gecod.sock"
    asked: list[Frame] = []

    def answer(got: Frame) -> None:
        asked.append(got)

    with fake_gecod(sock, answer), pytest.raises(GecoError) as info:
        client.status(node.client_config(str(sock)), timeout=5)
    assert str(info.value) == (
        f"gecod's socket {sock} is in {d}, which must be owned by root and writable by root "
        f"only (got uid {owner}, mode {mode:04o}): another user could answer in gecod's "
        f"place. Put the socket in a root-owned directory such as /run/geco (path={d})")
    assert asked == []


# -- the starter's fallback ---------------------------------------------------------

# Test-only: the starter reads /etc/geco/geco.toml and nothing else (the hooks have no
# environment override, on purpose). This runs it as the installed hook does (python -I
# -m geco.hooks.starter: here -s -P, and the checkout on PYTHONPATH, which the script takes
# out of the environment before the starter reads it), with geco.config.DEFAULT_PATH
# pointed at the test's configuration first.
STARTER = r"""
import os, sys
from pathlib import Path
os.environ.pop("PYTHONPATH")  # the checkout, for this process: not the job's
import geco.config
geco.config.DEFAULT_PATH = Path(sys.argv[1])
from geco.hooks import starter
sys.argv = ["starter", *sys.argv[2:]]
sys.exit(starter.main())
"""


def spool_for_starter(node: Node, job: int, job_script: str, owner: Any, **kw: Any) -> str:
    """Spool the job for :func:`run_starter`; return its owner's name. A qrsh task's command
    runs under its owner's login shell, as Grid Engine runs it: the test user's (bash), not
    nobody's (nologin); a batch job's is nobody's."""
    name = owner.name if job_script == "QRSH" else "nobody"
    node.make_job(job, owner=name, **kw)
    return name


def run_starter(node: Node, job: int, config_path: Path,
                job_script: str, owner: str = "nobody") -> subprocess.CompletedProcess[bytes]:
    """Run the starter as ``owner`` below the job's fake shepherd (real uid root, as
    sge_execd starts it), as Grid Engine does; the job is ``cat /proc/self/cgroup
    /proc/self/environ``."""
    env = {"JOB_ID": str(job), "SGE_TASK_ID": "undefined", "JOB_SCRIPT": job_script,
           "SGE_JOB_SPOOL_DIR": str(node.job_dir(job)), "PATH": "/usr/bin:/bin",
           "SGE_STARTER_SHELL_START_MODE": "unix_behavior", "SGE_STARTER_SHELL_PATH": "",
           "PYTHONPATH": str(REPO)}
    pw = pwd.getpwnam(owner)
    argv = node.under_shepherd([
        "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
        sys.executable, "-s", "-P", "-c", STARTER, str(config_path), "/bin/cat",
        "/proc/self/cgroup", "/proc/self/environ"])
    return subprocess.run(argv, cwd=node.job_dir(job), env=env, capture_output=True,
                          timeout=60)


def job_output(out: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """(controller -> cgroup, environment) from the job's output: /proc/self/cgroup's lines,
    then /proc/self/environ (NUL-separated, no newline in this test's environment)."""
    cgroup_text, _, environ = out.rpartition(b"\n")
    cgroups = {}
    for line in cgroup_text.decode().splitlines():
        _, ctrls, path = line.split(":", 2)
        cgroups.update(dict.fromkeys(ctrls.split(","), path))
    env = dict(item.split("=", 1) for item in environ.decode().split("\0") if item)
    return cgroups, env


@pytest.mark.parametrize("job_script", ["QRSH", "cat"], ids=["qrsh-task", "batch-job"])
def test_a_starter_outside_its_job_has_gecod_move_it_and_starts_the_job_inside(
        node: Node, gecod: Gecod, journal: Any, job_owner: Any, job_script: str) -> None:
    """Given a job of an unprivileged user with no cgroups yet, when its starter (the owner,
    below the job's fake shepherd, no key) finds itself outside the job's cgroups, then it
    asks gecod for itself (PEERCRED QUARANTINE_SELF), and the job, a qrsh -inherit task or
    a batch job, runs inside the job's cgroups with GECO_* facts that are the cgroup's."""
    job = new_job()
    owner = spool_for_starter(node, job, job_script, job_owner, memory=256 * MiB)

    ran = run_starter(node, job, node.base / "gecod.toml", job_script, owner)
    assert ran.returncode == 0, ran.stderr.decode()
    cgroups, env = job_output(ran.stdout)
    for c in CONTROLLERS:
        assert cgroups[c] == f"/{node.name}/{job}.1", (c, cgroups)
    cpus = (node.cgroup("cpuset", f"{job}.1") / "cpuset.cpus").read_text().strip()
    limit = (node.cgroup("memory", f"{job}.1") / "memory.limit_in_bytes").read_text().strip()
    assert (env["GECO_CPUS"], env["GECO_NCPUS"], env["GECO_MEMORY_LIMIT"], env["GECO_NODE"]) \
        == (cpus, str(len(parse_cpulist(cpus))), limit, os.uname().nodename)
    [moved] = journal.wait_for(GECO_EVENT="starter-quarantined", JOB_ID=str(job))
    assert moved["_UID"] == str(pwd.getpwnam(owner).pw_uid)


@pytest.mark.parametrize(("job_script", "policy", "stop"), [
    ("cat", "allow", signal.SIGTERM),
    ("QRSH", "refuse", signal.SIGKILL),
    ("QRSH", "allow", signal.SIGTERM),
], ids=["batch-job", "qrsh-task-refuse", "qrsh-task-allow"])
def test_without_gecod_a_batch_job_is_refused_and_a_qrsh_task_follows_the_policy(
        node: Node, journal: Any, job_owner: Any, job_script: str, policy: str,
        stop: int) -> None:
    """Given gecod stopped (SIGTERM: its socket is gone; SIGKILL: a dead socket is left),
    when a starter outside its job's cgroups cannot reach it, then a batch job is refused
    (exit 100, the plain sentence, whatever the policy); a qrsh -inherit task is refused
    the same way under unreachable_policy "refuse" (the sentence says why), and runs
    uncontained with a journaled warning under "allow"."""
    tag = f"stopped-{job_script.lower()}-{policy}"
    g = start_gecod(node, tag, unreachable_policy=f'"{policy}"')
    g.stop(stop)
    conf = node.base / f"{tag}.toml"
    sock = node.socket_path(tag)
    why = (f"gecod is not running (no socket at {sock})" if stop == signal.SIGTERM else
           f"gecod is not running (nobody listens on {sock})")
    host = os.uname().nodename
    job = new_job()
    owner = spool_for_starter(node, job, job_script, job_owner)

    ran = run_starter(node, job, conf, job_script, owner)
    if job_script == "QRSH" and policy == "allow":
        assert ran.returncode == 0, ran.stderr.decode()
        cgroups, env = job_output(ran.stdout)
        assert cgroups["cpuset"] != f"/{node.name}/{job}.1"
        assert not [k for k in env if k.startswith("GECO_")]
        [warning] = journal.wait_for(GECO_EVENT="task-not-contained", JOB_ID=str(job))
        assert (warning["PRIORITY"], warning["REASON"]) == ("4", why)
        return
    stderr = ran.stderr.decode()
    assert (ran.returncode, ran.stdout, stderr.count("\n")) == (100, b"", 1), stderr
    if job_script == "QRSH":
        sentence = (f"geco starter: qrsh -inherit task of job {job}.1 is not inside the job's "
                    f"cgroups on {host}; it is not started uncontained ({why}). Ask your "
                    f"admin to check gecod on {host} (cgroups=")
    else:
        sentence = (f"geco starter: job {job}.1 is not inside its cgroups on {host}; it is "
                    f"not started uncontained. Ask your admin to check the queue's geco "
                    f"prolog (cgroups=")
    assert sentence in stderr
    assert stderr.rstrip().endswith("; the job is put in error state")
    [failed] = journal.wait_for(GECO_EVENT="starter-not-quarantined", JOB_ID=str(job))
    assert failed["REASON"] == why


# -- restarts -------------------------------------------------------------------


def test_kill_9_and_restart_leaves_jobs_contained_and_rebuilds_from_the_cgroup_tree(
        node: Node, journal: Any) -> None:
    """Given gecod A that quarantined job X, when A is killed with SIGKILL and gecod B is
    started, then X's cgroup and process are untouched, B's STATUS lists X with its process,
    and a new job Y gets cores disjoint from X's."""
    a = start_gecod(node, "restart")
    x, y = new_job(), new_job()
    node.make_job(x)
    node.make_job(y)
    px = node.job_process(x, sock=a.sock)
    assert px.answer() == "OK"
    x_cpus = (node.cgroup("cpuset", f"{x}.1") / "cpuset.cpus").read_text().strip()

    assert a.stop(signal.SIGKILL) == -signal.SIGKILL
    b = start_gecod(node, "restart")  # the dead gecod's socket file is still there
    try:
        assert px.proc.poll() is None
        assert px.cgroups()["cpuset"] == f"/{node.name}/{x}.1"
        doc = status(node, b.sock)
        [entry] = [j for j in doc["jobs"] if j["key"] == f"{x}.1"]
        assert (entry["cpus"], entry["pids"]) == (x_cpus, 1)
        py = node.job_process(y, sock=b.sock)
        assert py.answer() == "OK"
        y_cpus = (node.cgroup("cpuset", f"{y}.1") / "cpuset.cpus").read_text().strip()
        assert y_cpus and not set(y_cpus.split(",")) & set(x_cpus.split(","))
    finally:
        assert b.stop() == 0, b.output()


def test_sigterm_stops_gecod_but_leaves_job_cgroups_and_processes_in_place(
        node: Node, journal: Any) -> None:
    g = start_gecod(node, "term")
    job = new_job()
    node.make_job(job)
    p = node.job_process(job, sock=g.sock)
    assert p.answer() == "OK"

    assert g.stop() == 0, g.output()
    assert not Path(g.sock).exists()
    assert p.proc.poll() is None
    assert p.cgroups()["memory"] == f"/{node.name}/{job}.1"
    for c in CONTROLLERS:
        assert node.cgroup(c, f"{job}.1").is_dir()
    assert journal.entries(GECO_EVENT="gecod-stopping", _PID=str(g.pid))


def test_sighup_rereads_the_configuration_and_says_what_needs_a_restart(
        node: Node, journal: Any) -> None:
    """Given gecod refusing a process running as nobody, when nobody is added to execd_uids
    (and the workers changed) and gecod gets SIGHUP, then the same request is answered OK,
    the reload is journaled, and the workers change is logged as needing a restart."""
    g = start_gecod(node, "hup")
    try:
        job = new_job()
        node.make_job(job)
        assert node.job_process(job, mode="nobody", sock=g.sock).answer() == "REFUSED"
        since = time.time()
        node.write_config("hup", execd_uids=f"[{NOBODY}]", workers="2")
        g.proc.send_signal(signal.SIGHUP)
        [reloaded] = journal.wait_for(GECO_EVENT="gecod-reloaded", _PID=str(g.pid))

        assert int(reloaded["__REALTIME_TIMESTAMP"]) >= since * 1e6
        assert node.job_process(job, mode="nobody", sock=g.sock).answer() == "OK"
        changed = "SIGHUP: gecod_workers changed to 2; it takes effect when gecod restarts"
        assert changed in g.output_with(changed)
    finally:
        assert g.stop() == 0, g.output()


def test_sigterm_answers_the_requests_already_being_worked_on(node: Node) -> None:
    """Given a request whose qstat takes 1.5 s, when gecod gets SIGTERM meanwhile, then the
    client still gets its answer, gecod exits 0 after that (more SIGTERMs meanwhile
    change nothing), and new clients are refused at once (the socket is closed)."""
    g = start_gecod(node, "drain", qstat=_unknown_job_qstat(node, 1.5))
    job = new_job()
    node.make_job(job)
    resourcefile.remove(node.state_dir / "resources", JobKey(job, 1))
    p = node.job_process(job, sock=g.sock)
    deadline = time.monotonic() + 10
    while "qstat-unknown" not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                text=True).stdout:
        assert time.monotonic() < deadline, "gecod never ran qstat"
        time.sleep(0.02)

    g.proc.send_signal(signal.SIGTERM)
    assert p.answer() == "NO_SUCH_JOB"
    # an impatient admin: more SIGTERMs while gecod drains and closes change nothing
    while g.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            g.proc.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    assert g.stop() == 0, g.output()
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(FileNotFoundError):
        s.connect(g.sock)


def test_the_real_exec_preload_is_quarantined_by_gecod_before_its_exec(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given preload/ built into a library and its config rendered by `geco preload-config`
    from gecod's own geco.toml, when a process called sge_execd in a job's spool dir execs a
    program named sge_shepherd under LD_PRELOAD, then that program already runs in the job's cgroups
    (the C client and gecod agree on the wire), and gecod journaled the quarantine."""
    build = node.base / "preload-build"
    make = subprocess.run(["make", "-s", "-C", str(REPO), f"BUILD={build}", "preload"],
                          capture_output=True, text=True, timeout=300)
    assert make.returncode == 0, make.stdout + make.stderr
    conf = node.base / "preload.conf"
    rendered = subprocess.run(
        [sys.executable, "-m", "geco.cli", "preload-config", "-o", str(conf)], cwd=REPO,
        capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(REPO), "GECO_CONFIG": str(node.base / "gecod.toml")})
    assert rendered.returncode == 0, rendered.stderr
    shepherd = node.base / "preload-bin" / "sge_shepherd"  # the fake shepherd is a shell
    shepherd.parent.mkdir(exist_ok=True)
    shutil.copy("/bin/cat", shepherd)
    job = new_job()
    node.make_job(job)

    # the preload works only in sge_execd (by the binary's name): a shell called so
    execd = shepherd.parent / "sge_execd"
    shutil.copy("/bin/sh", execd)
    ran = subprocess.run(
        [str(execd), "-c", f"exec {shepherd} /proc/self/cgroup"],
        cwd=node.job_dir(job), capture_output=True, text=True, timeout=60,
        env={"LD_PRELOAD": str(build / "libgeco_preload.so"), "GECO_PRELOAD_CONF": str(conf),
             "PATH": "/usr/bin:/bin"})

    assert ran.returncode == 0, ran.stderr
    cgroups = dict(line.split(":", 2)[1:] for line in ran.stdout.splitlines())
    assert cgroups["cpuset"] == cgroups["memory"] == f"/{node.name}/{job}.1"
    assert journal.wait_for(GECO_EVENT="quarantined", JOB_ID=str(job), _PID=str(gecod.pid))


# -- start-up refusals and systemd ----------------------------------------------------------


def _run_gecod(config: Path, user: int | None = None) -> subprocess.CompletedProcess[str]:
    def drop() -> None:
        if user is not None:
            os.setgroups([])
            os.setgid(user)
            os.setuid(user)
    return subprocess.run([sys.executable, "-m", "geco.daemon", "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO)}, preexec_fn=drop)


def test_start_up_refusals_are_one_line_and_exit_1(node: Node, gecod: Gecod) -> None:
    """Given a non-root user, an unsafe key file, or a socket another gecod owns, then
    gecod prints one line saying why and exits 1, and the running gecod is untouched."""
    config = node.write_config("startup")
    as_nobody = _run_gecod(config, NOBODY)
    assert (as_nobody.returncode, as_nobody.stderr) == (1, (
        "gecod: gecod must run as root (it creates cgroups and moves other users' processes "
        f"into them); running as uid {NOBODY}\n"))

    loose = node.base / "loose.key"
    loose.write_bytes(node.key)
    loose.chmod(0o644)
    config.write_text(config.read_text().replace(str(node.key_file), str(loose)))
    unsafe = _run_gecod(config)
    assert unsafe.returncode == 1
    assert unsafe.stderr.count("\n") == 1
    assert unsafe.stderr.startswith("gecod: the quarantine key file must not be accessible "
                                    "to group or others (mode 0600 or 0400), got 0644; fix: "
                                    f"`chmod 600 {loose}`")

    second = _run_gecod(node.write_config("startup2", sock=gecod.sock))
    assert (second.returncode, second.stderr) == (1, (
        f"gecod: another gecod is already listening on path:{gecod.sock}; stop it first "
        "(systemctl stop gecod)\n"))
    assert_serving(node, gecod)


def test_a_user_holding_gecods_tcp_port_is_named_and_gecod_refuses_to_start(
        node: Node) -> None:
    """Given port: mode and uid 65534 listening on that port while gecod is down (any user
    can), then gecod does not mistake it for a gecod: it names the uid, says why path: is
    the production choice, and exits 1."""
    port = free_tcp_port()
    ready, taken = os.pipe()
    squatter = os.fork()
    if squatter == 0:  # the user: bind the port, say so, hold it
        try:
            _as_nobody()
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
                s.listen(1)
                os.write(taken, b"x")
                time.sleep(60)
        finally:
            os._exit(0)
    try:
        assert os.read(ready, 1) == b"x"
        refused = _run_gecod(node.write_config("squatted", sock=f"port:{port}"))
    finally:
        os.kill(squatter, signal.SIGKILL)
        os.waitpid(squatter, 0)
        os.close(ready)
        os.close(taken)
    assert (refused.returncode, refused.stderr) == (1, (
        f"gecod: port:{port} is taken by uid {NOBODY}, not by a gecod (gecod runs as root): "
        "in port: mode any user can bind gecod's port while it is down. Stop that process; "
        'for production use [gecod] socket = "path:/run/geco/gecod.sock", which no user can '
        "take\n"))


def test_systemd_is_told_ready_status_watchdog_and_stopping(node: Node,
                                                            journal: Any) -> None:
    """Given NOTIFY_SOCKET and WATCHDOG_USEC=200 ms, then gecod sends READY=1 once
    listening, STATUS= with the job count, WATCHDOG=1 every ~100 ms from its loop, and
    STOPPING=1 on SIGTERM."""
    path = node.base / "systemd-notify.socket"
    messages: list[str] = []

    def receive(ns: socket.socket, until: str, count: int = 1) -> None:
        deadline = time.monotonic() + 10
        while messages.count(until) < count and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                messages.append(ns.recv(4096).decode())

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ns:
        ns.bind(str(path))
        ns.settimeout(0.2)
        g = start_gecod(node, "notify", env={"NOTIFY_SOCKET": str(path),
                                             "WATCHDOG_USEC": "200000"})
        started = time.monotonic()
        receive(ns, "WATCHDOG=1", 3)
        three_pings = time.monotonic() - started
        assert g.stop() == 0
        receive(ns, "STOPPING=1")
    assert messages[0] == "READY=1", messages
    assert messages[1].startswith(f"STATUS=serving on path:{g.sock}: ") and \
        messages[1].endswith(" job(s) contained, 0 request(s) answered, 0 refused"), messages
    assert messages.count("WATCHDOG=1") >= 3 and three_pings < 2.0, (three_pings, messages)
    assert messages[-1] == "STOPPING=1", messages


def test_the_capabilities_gecod_service_grants_are_enough(node: Node, journal: Any) -> None:
    """Given gecod running with only the unit's CapabilityBoundingSet (setpriv), then a
    JOB_STARTED from a process with euid nobody and real uid root (execd's child; nobody
    listed in execd_uids) and a QUARANTINE_SELF from a nobody-owned job's process are both
    answered OK and the processes are in their cgroups, each job with its device rules (on
    this node without GPUs, NVIDIA's devices denied: no nvidia-devices-open record): the
    unit does not starve gecod."""
    since = time.time()
    g = start_gecod(node, "caps", prefix=with_unit_capabilities(),
                    execd_uids=f"[{NOBODY}]")
    try:
        status_line = Path(f"/proc/{g.pid}/status").read_text()
        [bnd] = [ln.split()[1] for ln in status_line.splitlines() if ln.startswith("CapBnd:")]
        assert int(bnd, 16) != int(Path("/proc/self/status").read_text().split("CapBnd:")[1]
                                   .split()[0], 16)  # really reduced
        execd_job, owner_job = new_job(), new_job()
        node.make_job(execd_job)
        node.make_job(owner_job, owner="nobody")
        p = node.job_process(execd_job, mode="execd", sock=g.sock)
        q = node.job_process(owner_job, mode="self-nobody", shepherd=True, sock=g.sock)
        assert (p.answer(), q.answer()) == ("OK", "OK"), g.output()
        assert p.cgroups()["cpuset"] == f"/{node.name}/{execd_job}.1"
        assert q.cgroups()["cpuset"] == f"/{node.name}/{owner_job}.1"
        assert not logged(journal, since, GECO_EVENT="nvidia-devices-open", _PID=str(g.pid))
    finally:
        assert g.stop() == 0, g.output()


def test_a_status_reply_with_more_jobs_than_fit_is_cut_to_4096_bytes_and_says_so() -> None:
    """Given 300 job cgroups (far more than 4096 bytes of JSON), then the STATUS_REPLY
    payload is at most 4096 bytes, lists the first jobs in key order, marks itself
    truncated, and still counts all 300; with 3 jobs nothing is cut."""
    from geco.daemon.status import JobCgroup, NodeJobs, status_document

    jobs = tuple(JobCgroup(f"{1000 + i}.1", "0-63", "0-1", 1 << 40, 1 << 40, 12345)
                 for i in range(300))
    data = status_document(NodeJobs(jobs, "0-127"), pid=1)
    doc = StatusReply.unpack(data).document
    assert len(data) <= MAX_PAYLOAD
    assert (doc["job_count"], doc["truncated"]) == (300, True)
    assert [j["key"] for j in doc["jobs"]] == [j.key for j in jobs[:len(doc["jobs"])]]
    # nothing more would have fitted
    assert len(data) + len(json.dumps(jobs[len(doc["jobs"])].as_json(),
                                      separators=(",", ":"))) + 1 > MAX_PAYLOAD
    small = StatusReply.unpack(status_document(NodeJobs(jobs[:3], "0-127")))
    assert (small.document["truncated"], len(small.document["jobs"])) == (False, 3)


# -- two lanes: root's socket, and everyone's with a budget per uid -------------------




def _connect_as_nobody(path: str, count: int) -> tuple[int, int]:
    """As uid 65534, open ``count`` connections to ``path``; return (refused by the kernel,
    closed by gecod within 2 s)."""
    ours, theirs = os.pipe()
    child = os.fork()
    if child == 0:
        refused = closed = 0
        try:
            _as_nobody()
            held = []
            for _ in range(count):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                except PermissionError:
                    refused += 1
                    s.close()
                    continue
                held.append(s)
            deadline = time.monotonic() + 2
            while held and time.monotonic() < deadline:
                ready, _, _ = select.select(held, [], [], 0.1)
                for s in ready:
                    held.remove(s)
                    closed += 1
            os.write(theirs, f"{refused} {closed}".encode())
        finally:
            os._exit(0)
    os.close(theirs)
    try:
        answer = os.read(ours, 64).decode().split()
    finally:
        os.close(ours)
        os.waitpid(child, 0)
    return int(answer[0]), int(answer[1])


def test_only_root_can_connect_to_the_privileged_socket_where_job_started_is_served(
        node: Node, gecod: Gecod) -> None:
    """Given gecod's two sockets, then the privileged one is root's, mode 0600: the kernel
    refuses uid 65534's connect; root's JOB_STARTED is answered there."""
    root_sock = root_socket(gecod)
    st = os.stat(root_sock)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 0, 0)
    assert stat.S_IMODE(os.stat(gecod.sock).st_mode) == 0o666
    assert _connect_as_nobody(root_sock, 3) == (3, 0)

    job = new_job()
    node.make_job(job)
    assert node.job_process(job, sock=root_sock).answer() == "OK"


def test_a_users_connections_beyond_their_share_are_closed_and_others_are_served(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given uid 65534 opening 100 connections to the public socket and holding them, then
    gecod closes one of the uid's idle ones for each of the 36 beyond its share of 64 at
    once (its oldest: the rest when their deadline passes), keeps serving root on the same
    socket meanwhile, and journals the refusals of that uid as a few records and a summary,
    not one each."""
    since = time.time()
    refused, closed = _connect_as_nobody(gecod.sock, 100)
    assert (refused, closed) == (0, 100)
    assert_serving(node, gecod)

    def counted() -> tuple[list[dict[str, str]], list[dict[str, str]], collections.Counter[str]]:
        about = logged(journal, since, PEER_UID=str(NOBODY), _PID=str(gecod.pid))
        summaries = [e for e in about if e["GECO_EVENT"] == "quarantine-refused-summary"]
        single = [e for e in about if e["GECO_EVENT"] == "quarantine-refused"]
        reasons = collections.Counter(e["REASON"] for e in single)
        for summary in summaries:
            for item in summary["REASONS"].split(","):
                reason, count = item.split(":")
                reasons[reason] += int(count)
        return summaries, single, reasons

    # The windows in which the refusals came are summed up (a slow machine spreads them
    # over two); the deadline-closed ones may come in a later window than the 36.
    deadline = time.monotonic() + 25
    while True:
        summaries, single, reasons = counted()
        if summaries and reasons["evicted"] >= 36:
            break
        assert time.monotonic() < deadline, f"no refusal summary: {reasons}"
        time.sleep(0.5)
    windows = int((time.time() - since) // 10) + 2  # each (partial) 10 s window since
    assert len(single) <= 10 * windows, (len(single), windows)
    assert len(single) < 36 + 64
    assert reasons["evicted"] == 36, reasons
    summary = summaries[0]
    assert summary["MESSAGE"].startswith(f"uid {NOBODY}: ")
