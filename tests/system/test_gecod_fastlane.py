"""gecod's fast lane: later tasks of a contained job served in C, everything else as before.

gecod runs with :mod:`tests.gecodkit` (its :class:`Node`, :func:`start_gecod`,
:func:`end_jobs`), and the requests come on root's socket, where the
preload sends them and the lane accepts. A job's first process (its shepherd,
in the job's spool dir) is always Python's; a ``qrsh -inherit`` task's process
(a PE task dir below it) of a job gecod holds is the lane's. What a user or an
admin sees must not tell the two apart: the same ACK, cgroups, journal fields
and stderr line; the lane's entries differ only in ``CODE_*``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gecodkit import (
    CONTROLLERS,
    HOST,
    MARKS,
    Gecod,
    JobProcess,
    Node,
    logged,
    make_node,
    new_job,
    start_gecod,
    status,
    wait_gone,
)
from tests.gecodkit import _clean_jobs as _clean_jobs  # after each test, on this module's node
from tests.gecodkit import gecod as gecod  # the module's gecod, on this module's node

pytestmark = MARKS

REPO = Path(__file__).resolve().parents[2]
LANE = "lane/journal.c"

# A process that sends one JOB_STARTED frame for itself twice, on root's socket; prints
# both ACK statuses (the second is the replay).
TWICE = r"""
import os, sys
from geco.wire import address, client
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
key_file, where, job = sys.argv[1:4]
key = open(key_file, "rb").read()
frame = encode(MsgType.JOB_STARTED, JobStarted(int(job), 1, os.getpid()), key)
for _ in range(2):
    reply = client.request(address.parse(where), frame, 30)
    print(decode_ack(reply, key, frame[12:28]).status.name, flush=True)
"""

# A process that sends JOB_STARTED for itself N times (fresh frames), on root's socket;
# prints how many were answered OK.
MANY = r"""
import os, sys
from geco.wire import address, client
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
key_file, where, job, n = sys.argv[1:5]
key = open(key_file, "rb").read()
ok = 0
for _ in range(int(n)):
    frame = encode(MsgType.JOB_STARTED, JobStarted(int(job), 1, os.getpid()), key)
    reply = client.request(address.parse(where), frame, 30)
    ok += decode_ack(reply, key, frame[12:28]).status.name == "OK"
print(ok, flush=True)
"""

# A process that sends its JOB_STARTED frame and more bytes after it, in one write, on
# root's socket; prints the ACK's status and its pid.
TRAILING = r"""
import os, socket, sys
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
key_file, where, job = sys.argv[1:4]
key = open(key_file, "rb").read()
frame = encode(MsgType.JOB_STARTED, JobStarted(int(job), 1, os.getpid()), key)
reply = b""
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(where)
    s.sendall(frame + bytes(64))
    try:
        while chunk := s.recv(4096):
            reply += chunk
    except ConnectionResetError:  # gecod closed with our extra bytes unread: after the ACK
        pass
print(decode_ack(reply, key, frame[12:28]).status.name, os.getpid(), flush=True)
"""

# STATUS (a frame shorter than a JOB_STARTED) and more bytes after it, in one write, on
# root's socket; prints the reply's type.
STATUS_TRAILING = r"""
import socket, sys
from geco.wire.frame import PEERCRED, PUBLIC_KEY, decode, encode
from geco.wire.messages import MsgType
frame = encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED)
reply = b""
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(sys.argv[1])
    s.sendall(frame + bytes(64))
    try:
        while chunk := s.recv(65536):
            reply += chunk
    except ConnectionResetError:
        pass
print(decode(reply, PUBLIC_KEY).type.name, flush=True)
"""


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with make_node(Node, "lane", f"geco-test-{os.getpid()}-lane") as n:
        yield n


def root_sock(node: Node) -> str:
    return str(node.base / "gecod-root.sock")


def contained_job(node: Node) -> tuple[int, JobProcess]:
    """A spooled job whose shepherd gecod moved in (Python: the first process of a job)."""
    job = new_job()
    node.make_job(job)
    shepherd = node.job_process(job, sock=root_sock(node))
    assert shepherd.answer() == "OK"
    return job, shepherd


def task_of(node: Node, job: int, petask: str = f"1.{HOST}") -> JobProcess:
    """A qrsh -inherit task's process asking from its PE task dir, on root's socket."""
    return node.job_process(job, cwd=node.make_pe_task_dir(job, petask=petask),
                            sock=root_sock(node))


def entry_of(journal: Any, gecod: Gecod, job: int, pid: int) -> dict[str, Any]:
    [entry] = journal.wait_for(GECO_EVENT="quarantined", JOB_ID=str(job), PID=str(pid),
                               _PID=str(gecod.pid))
    return dict(entry)


def public(entry: dict[str, Any]) -> set[str]:
    """The fields an admin reads (journald's own and the source location left out)."""
    return {k for k in entry if not k.startswith("_") and not k.startswith("CODE_")}


def test_a_later_task_is_served_by_the_lane_and_looks_as_if_python_had_served_it(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job whose shepherd gecod moved in, when two qrsh -inherit tasks ask from
    their PE task dirs, then each is OK and in the job's cgroups in every controller; their
    journal entries come from the lane with the fields Python's entry has but for the
    resources it read (CGROUP_CREATED 0, the job's cpus and memory limit, LANE root),
    gecod's stderr has the same line as for Python's, and STATUS counts them as answered."""
    job, shepherd = contained_job(node)
    served_before = status(node, gecod.sock)["served"]
    tasks = [task_of(node, job, f"{n}.{HOST}") for n in (1, 2)]

    for task in tasks:
        assert task.answer() == "OK"
        for c in CONTROLLERS:
            assert task.cgroups()[c] == f"/{node.name}/{job}.1", c
    first = entry_of(journal, gecod, job, shepherd.pid)
    later = [entry_of(journal, gecod, job, t.pid) for t in tasks]
    assert first["CODE_FILE"].endswith("requestlog.py") and first["CGROUP_CREATED"] == "1"
    for entry, task in zip(later, tasks, strict=True):
        assert entry["CODE_FILE"] == LANE
        # the job's resources were read for the first (where from and how long): a later
        # task reads none, Python's or the lane's
        assert public(entry) == public(first) - {"RESOURCES", "LOOKUP_MS"}
        assert (entry["CGROUP_CREATED"], entry["LANE"], entry["REQUEST"], entry["PEER_PID"]) \
            == ("0", "root", "JOB_STARTED", str(task.pid))
        assert (entry["CPUS"], entry["MEMS"], entry["MEMORY_LIMIT"], entry["MEMSW_LIMIT"]) \
            == (first["CPUS"], first["MEMS"], first["MEMORY_LIMIT"], first["MEMSW_LIMIT"])
        assert entry["MESSAGE"] == f"quarantined process {task.pid} into job {job}.1 " \
                                   f"(pid {task.pid} uid 0)"
        assert float(entry["ELAPSED_MS"]) >= 0
    lines = gecod.output_with(*(f"quarantined process {t.pid} into job {job}.1"
                                for t in tasks)).splitlines()
    for task in tasks:
        assert any("|INFO ]: (journal.c:" in line and
                   f"quarantined process {task.pid} into job {job}.1" in line for line in lines)
    assert status(node, gecod.sock)["served"] >= served_before + 2


def test_a_task_that_sends_more_than_its_frame_still_reads_the_lanes_ack(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a contained job, when a task sends its JOB_STARTED and 64 more bytes in one
    write, then the lane serves the frame and the task reads its OK before the connection
    ends."""
    job, _shepherd = contained_job(node)
    proc = subprocess.run(
        [sys.executable, "-c", TRAILING, str(node.key_file), root_sock(node), str(job)],
        cwd=node.make_pe_task_dir(job), capture_output=True, text=True, timeout=60,
        check=False, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    assert proc.stdout.split()[:1] == ["OK"], proc.stderr
    pid = int(proc.stdout.split()[1])
    assert entry_of(journal, gecod, job, pid)["CODE_FILE"] == LANE


def test_a_shorter_frame_with_more_bytes_after_it_is_answered_as_without_the_lane(
        node: Node, gecod: Gecod) -> None:
    """Given STATUS (shorter than the JOB_STARTED the lane reads at once) followed by 64
    more bytes in one write on root's socket, then Python answers the STATUS: the bytes the
    lane read past the frame are not taken for part of it."""
    proc = subprocess.run(
        [sys.executable, "-c", STATUS_TRAILING, root_sock(node)], capture_output=True,
        text=True, timeout=60, check=False, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    assert proc.stdout.split() == ["STATUS_REPLY"], proc.stderr


def test_a_task_dir_with_a_large_environment_file_is_still_the_lanes(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a contained job whose PE task dir has a 40 KB environment file (a job with a
    large environment), naming the job on its last lines, then the lane serves the task."""
    job, _shepherd = contained_job(node)
    d = node.make_pe_task_dir(job)
    padding = "".join(f"GECO_TEST_PAD_{n}={'x' * 200}\n" for n in range(200))
    (d / "environment").write_text(f"{padding}JOB_ID={job}\nSGE_TASK_ID=undefined\n")
    task = node.job_process(job, cwd=d, sock=root_sock(node))
    assert task.answer() == "OK"
    assert entry_of(journal, gecod, job, task.pid)["CODE_FILE"] == LANE


def test_a_frame_is_taken_once_whichever_side_served_it(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given one frame sent twice by the same process, from a PE task dir (the lane serves
    the first) and from the job's own dir (Python serves it), then the second is refused as
    a replay (BAD_REQUEST, journaled REASON=nonce) in both cases: one replay cache."""
    since = time.time()
    job, _shepherd = contained_job(node)
    for cwd in (node.make_pe_task_dir(job), node.job_dir(job)):
        proc = subprocess.run(
            [sys.executable, "-c", TWICE, str(node.key_file), root_sock(node), str(job)],
            cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
        assert proc.stdout.split() == ["OK", "BAD_REQUEST"], proc.stderr
    refused = logged(journal, since, GECO_EVENT="quarantine-refused", REASON="nonce",
                     _PID=str(gecod.pid))
    assert len(refused) == 2


def test_what_the_lane_cannot_vouch_for_is_refused_by_python_in_its_own_words(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a contained job, when a task asks from a PE task dir whose environment names
    another job, or asks for another pid, then Python refuses it as without the lane, with
    its sentence in the journal."""
    since = time.time()
    job, _shepherd = contained_job(node)
    d = node.make_pe_task_dir(job)
    (d / "environment").write_text("JOB_ID=1\nSGE_TASK_ID=undefined\n")
    assert node.job_process(job, cwd=d, sock=root_sock(node)).answer() == "REFUSED"
    other = node.job_process(job, cwd=node.make_pe_task_dir(job, petask=f"2.{HOST}"),
                             sock=root_sock(node), mode="pid=1")
    assert other.answer() == "REFUSED"
    refused = logged(journal, since, GECO_EVENT="quarantine-refused", JOB_ID=str(job),
                     _PID=str(gecod.pid))
    assert len(refused) == 2
    assert all(e["CODE_FILE"].endswith("requestlog.py") for e in refused)
    text = " ".join(e["MESSAGE"] for e in refused)
    assert "environment names job 1" in text and "a process may only ask for itself" in text


def test_once_a_job_has_ended_the_lane_no_longer_serves_it(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job whose task the lane served, when its shepherd exits (gecod ends the job
    under its lock, which withdraws it from the lane), then its cgroups go, and a task
    asking afterwards is Python's (the lane never moves a process into a job being torn
    down or gone)."""
    job, shepherd = contained_job(node)
    task = task_of(node, job)
    assert task.answer() == "OK"
    assert entry_of(journal, gecod, job, task.pid)["CODE_FILE"] == LANE
    task.exit()
    shepherd.exit()
    wait_gone(node, f"{job}.1")

    late = node.job_process(job, cwd=node.job_dir(job) / f"1.{HOST}", sock=root_sock(node))
    late.answer()
    entries = journal.entries(JOB_ID=str(job), PID=str(late.pid), _PID=str(gecod.pid))
    assert entries and all(e["CODE_FILE"] != LANE for e in entries), entries


def test_a_traced_jobs_tasks_are_pythons_so_its_trace_file_gets_their_lines(
        node: Node, gecod: Gecod, journal: Any) -> None:
    """Given a job traced at level 4 (its records go to its trace file, which only Python
    writes), when a qrsh -inherit task asks, then Python serves it and the trace file has
    the task's line."""
    job = new_job()
    node.make_job(job, trace_level=4)
    assert node.job_process(job, sock=root_sock(node)).answer() == "OK"
    task = task_of(node, job)
    assert task.answer() == "OK"

    assert entry_of(journal, gecod, job, task.pid)["CODE_FILE"].endswith("requestlog.py")
    trace = (node.base / "trace" / f"{job}.1.trace").read_text()
    assert f"quarantined process {task.pid} into job {job}.1" in trace


def test_a_new_key_after_sighup_is_the_lanes_key_too(node: Node, journal: Any) -> None:
    """Given a gecod whose lane serves a job's tasks, when the quarantine key is replaced
    and gecod gets SIGHUP, then a task signed with the new key is served by the lane, and
    one signed with the old key is refused (BAD_REQUEST, journaled REASON=mac)."""
    g = start_gecod(node, "hupkey")
    old = node.key_file.read_bytes()
    root = str(node.base / "hupkey-root.sock")
    try:
        job = new_job()
        node.make_job(job)
        assert node.job_process(job, sock=root).answer() == "OK"
        node.key_file.write_bytes(os.urandom(32))
        g.proc.send_signal(signal.SIGHUP)
        journal.wait_for(GECO_EVENT="gecod-reloaded", _PID=str(g.pid))

        tasks = [node.job_process(job, cwd=node.make_pe_task_dir(job, petask=f"{n}.{HOST}"),
                                  sock=root) for n in (1, 2)]
        assert [t.answer() for t in tasks] == ["OK", "OK"]
        assert entry_of(journal, g, job, tasks[1].pid)["CODE_FILE"] == LANE
        node.key_file.write_bytes(old)
        stale = node.job_process(job, cwd=node.make_pe_task_dir(job, petask=f"3.{HOST}"),
                                 sock=root)
        # its client cannot check the answer (MAC'd with the new key): the journal says it
        [refused] = journal.wait_for(GECO_EVENT="quarantine-refused", REASON="mac",
                                     _PID=str(g.pid))
        assert refused["PEER_PID"] == str(stale.pid) and refused["ACK_STATUS"] == "BAD_REQUEST"
    finally:
        node.key_file.write_bytes(old)
        assert g.stop() == 0, g.output()


@pytest.mark.parametrize("traced", [False, True], ids=["lane", "python"])
def test_a_flood_of_a_jobs_tasks_is_journaled_as_a_few_entries_and_a_summary(
        node: Node, gecod: Gecod, journal: Any, traced: bool) -> None:
    """Given a contained job, when one of its tasks sends 450 JOB_STARTED in a row (served
    by the lane; by Python for a traced job) and the job ends, then all were answered OK,
    and the journal
    has the job's first 200 successes of each 10 s window one by one and one summary per
    window for the rest (GECO_EVENT=quarantined-summary, QUARANTINED): every success
    counted once, journald spared one record each (its rate limit would drop a later
    OOM kill's)."""
    since = time.time()
    job = new_job()
    node.make_job(job, trace_level=4 if traced else 0)
    shepherd = node.job_process(job, sock=root_sock(node))
    assert shepherd.answer() == "OK"
    proc = subprocess.run(
        [sys.executable, "-c", MANY, str(node.key_file), root_sock(node), str(job), "450"],
        cwd=node.make_pe_task_dir(job), capture_output=True, text=True, timeout=120,
        check=False, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    assert proc.stdout.split() == ["450"], proc.stderr
    shepherd.exit()  # the job ends within the window: what the lane held is still told
    wait_gone(node, f"{job}.1")

    def counted() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        about = logged(journal, since, JOB_ID=str(job), _PID=str(gecod.pid))
        # gecod never waits for journald: a record its socket has no room for (journald
        # slowed by a busy machine) is dropped, and counted in the next log-records-dropped
        dropped = sum(int(e["DROPPED"]) for e in logged(
            journal, since, GECO_EVENT="log-records-dropped", _PID=str(gecod.pid)))
        return ([e for e in about if e["GECO_EVENT"] == "quarantined"],
                [e for e in about if e["GECO_EVENT"] == "quarantined-summary"], dropped)

    deadline = time.monotonic() + 40  # the window ends within 10 s, a drop report 10 s later
    while True:
        single, summaries, dropped = counted()
        told = len(single) + sum(int(e["QUARANTINED"]) for e in summaries)
        if told >= 451 or (dropped and told + dropped >= 451):
            break
        assert time.monotonic() < deadline, (len(single), summaries, dropped)
        time.sleep(0.5)
    windows = int((time.time() - since) // 10) + 2  # each (partial) 10 s window since
    assert told == 451 or told < 451 <= told + dropped, (told, dropped)
    assert (summaries or dropped) and len(single) <= 200 * windows, (len(single), windows)
    assert all(e["WINDOW_S"] == "10.0" and e["SGE_TASK_ID"] == "1" for e in summaries)
    code = "requestlog.py" if traced else LANE
    assert [e for e in single[1:] if not e["CODE_FILE"].endswith(code)] == []
    summary = summaries[0]
    assert summary["MESSAGE"] == (f"job {job}.1: {int(summary['QUARANTINED']):,} more "
                                  "processes quarantined in 10 s (a job's first 200 a "
                                  "window are journaled one by one)")
    assert summary["PRIORITY"] == "6"
