"""Socket fuzzing: a real gecod's public socket under hostile clients, while jobs start.

gecod runs with :mod:`tests.gecodkit`, as in ``tests/system/test_gecod.py``: its own
directory under /tmp, key, socket ``[gecod] socket``, connection_deadline 1 s,
and a cgroup parent ``geco-fuzz-<pid>``. The hostile clients are uid 65534: a
helper process running as nobody connects to the socket and hands each
connected socket to this process (SCM_RIGHTS), so gecod's SO_PEERCRED names
nobody while the bytes come from here. They send, in batches:

* random bytes and mutations of valid frames (hypothesis), each half-closed;
* every header field at its boundaries (magic, version, type, flags, the
  payload length up to 2**32-1, the timestamp at +-2**63) with a bad MAC, and
  authentic frames (secret key, or the public key of PEERCRED) whose u64 job
  and task ids go up to 2**64-1 and whose pids and reserved fields are hostile;
* every truncation of valid frames, half-closed or left hanging;
* slowloris (one byte every 0.3 s, slower than the deadline), half-closed and
  never-reading clients;
* 10,000 connections in a few seconds (up to 1,000 open at once, within
  gecod's fd budget): connect-and-close, garbage, valid STATUS requests.

Meanwhile a prober (root, in a real job's PE task spool dir, as sge_execd's child
about to exec a shepherd) forks a process every 10 ms that sends a real
JOB_STARTED for itself on gecod's privileged socket, as the preload does: each
must be answered OK, and its latency is the figure the issue asks for (p99
during the fuzz, beside the floor measured before it). After each batch gecod
must be alive, must have logged no traceback, and must answer a signed STATUS.
Every reply any client got must be one authentic frame (or none: gecod may
close a flood's connections unanswered).

``GECO_FUZZ_EXAMPLES=<n>`` sends ``n`` hypothesis inputs instead of 1,000 (and ``n``
connections instead of 10,000 when that is more).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geco.wire.frame import HEADER_BYTES, MAGIC, PEERCRED, PUBLIC_KEY, decode, encode
from geco.wire.messages import Ack, AckStatus, Adopt, AdoptStage, JobStarted, MsgType
from tests.fuzz import fuzzkit
from tests.gecodkit import (
    DEADLINE,
    MARKS,
    REPO,
    Gecod,
    Node,
    end_jobs,
    make_node,
    new_job,
    root_socket,
    start_gecod,
)

pytestmark = MARKS

NOBODY = 65534
PROBE_INTERVAL = 0.01  # seconds between the prober's JOB_STARTED requests
FLOOR_SECONDS = 2.0  # the prober's time alone with gecod before the fuzz starts

# Run as nobody: connect to gecod's socket whenever asked (a byte on the control socket,
# fd argv[2]) and hand the connected socket back over it, or a b"e" when the connect failed.
CONNECTOR = r"""
import os, socket, sys
path = sys.argv[1]
os.setgroups([]); os.setgid(65534); os.setuid(65534)
ctl = socket.socket(fileno=int(sys.argv[2]))
while ctl.recv(1):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(path)
    except OSError:
        ctl.sendall(b"e")
    else:
        socket.send_fds(ctl, [b"c"], [s.fileno()])
    s.close()
"""

# Run as root with its cwd in a job's spool dir: every interval, fork a child that sends
# JOB_STARTED for itself (as the preload does before the shepherd's exec) and reports
# [start, seconds, status]; print them all as JSON when stdin closes.
PROBER = r"""
import json, os, select, socket, sys, time
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
key_file, path, job, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
key = open(key_file, "rb").read()
encode(MsgType.JOB_STARTED, JobStarted(job, 1, os.getpid()), key)  # load libsodium
samples = []
print("ready", flush=True)
while not select.select([sys.stdin], [], [], interval)[0]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        start = time.monotonic()
        try:
            frame = encode(MsgType.JOB_STARTED, JobStarted(job, 1, os.getpid()), key)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(path)
                s.sendall(frame)
                reply = b""
                while chunk := s.recv(4096):
                    reply += chunk
            status = decode_ack(reply, key, frame[12:28]).status.name
        except Exception as exc:
            status = f"{type(exc).__name__}: {exc}"
        os.write(w, json.dumps([start, time.monotonic() - start, status]).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    samples.append(json.loads(data))
print(json.dumps(samples), flush=True)
"""


# -- the hostile user's connections -------------------------------------------------------


class Nobody:
    """Connections to gecod's socket made by uid 65534 (see CONNECTOR)."""

    def __init__(self, sock_path: str) -> None:
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([sys.executable, "-c", CONNECTOR, sock_path,
                                      str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     env={"PATH": "/usr/bin"})
        theirs.close()
        self.failed = 0  # connects refused or timed out

    def connect(self) -> socket.socket | None:
        """A socket connected by nobody, or None when gecod's backlog refused it."""
        self.ctl.sendall(b"?")
        msg, fds, _, _ = socket.recv_fds(self.ctl, 1, 1)
        if msg != b"c" or not fds:
            self.failed += 1
            return None
        return socket.socket(fileno=fds[0])

    def close(self) -> None:
        self.ctl.close()
        self.proc.wait(timeout=10)


def exchange(sock: socket.socket | None, data: bytes, *, half_close: bool = True,
             timeout: float = DEADLINE + 5) -> bytes:
    """Send ``data``, half-close, and return what gecod sends until it closes."""
    if sock is None:
        return b""
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := sock.recv(4096):
                out += chunk
        except (BrokenPipeError, ConnectionResetError):
            return b""  # gecod refused it before it read everything (an oversized frame)
    return out


def authentic(reply: bytes, key: bytes) -> None:
    """A reply is nothing (gecod may close a flood's connections unanswered) or one frame
    gecod made: an ACK, a STATUS_REPLY or an ADOPT_REPLY with a good MAC."""
    if reply:
        got = decode(reply, key, max_skew=3600)
        assert got.type in (MsgType.ACK, MsgType.STATUS_REPLY, MsgType.ADOPT_REPLY), got


# -- gecod, its checks, the prober --------------------------------------------------------


@dataclass
class Fuzz:
    node: Node
    gecod: Gecod
    nobody: Nobody
    job: int
    prober: subprocess.Popen[str]
    fuzz_started: float = 0.0
    inputs: int = 0

    def send(self, data: bytes, *, half_close: bool = True) -> bytes:
        """One hostile input on a connection of nobody's; its reply must be authentic."""
        self.inputs += 1
        reply = exchange(self.nobody.connect(), data, half_close=half_close)
        authentic(reply, self.node.key)
        return reply

    def send_as_root(self, data: bytes) -> bytes:
        self.inputs += 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.gecod.sock)
            reply = exchange(s, data)
        authentic(reply, self.node.key)
        return reply

    def check(self) -> None:
        """After a batch: gecod alive, no traceback in its log, a signed STATUS answered."""
        assert self.gecod.proc.poll() is None, f"gecod died:\n{self.gecod.output()[-5000:]}"
        log = self.gecod.output()
        assert "Traceback" not in log and "internal error" not in log, log[-5000:]
        frame = encode(MsgType.STATUS, b"", self.node.key)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.gecod.sock)
            got = decode(exchange(s, frame, timeout=30), self.node.key)
        assert got.type is MsgType.STATUS_REPLY
        assert json.loads(got.payload)["pid"] == self.gecod.pid


@pytest.fixture(scope="module")
def fuzz(journal: Any) -> Iterator[Fuzz]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with make_node(Node, "fuzz", f"geco-fuzz-{os.getpid()}") as node:
        gecod = start_gecod(node)
        job = new_job()
        node.make_job(job, slots=1)
        task_dir = node.make_pe_task_dir(job)
        prober = subprocess.Popen(
            # on gecod's privileged socket, where the preload asks
            [sys.executable, "-c", PROBER, str(node.key_file), root_socket(gecod), str(job),
             str(PROBE_INTERVAL)], cwd=task_dir, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
        node.processes.append(prober)
        nobody = Nobody(gecod.sock)
        try:
            assert prober.stdout is not None and prober.stdout.readline() == "ready\n"
            time.sleep(FLOOR_SECONDS)  # the floor: JOB_STARTED with nobody else around
            yield Fuzz(node, gecod, nobody, job, prober, fuzz_started=time.monotonic())
        finally:
            nobody.close()
            if prober.poll() is None:
                prober.kill()
            code = gecod.stop()
            end_jobs(node)
            assert code == 0, gecod.output()[-5000:]


# -- the batches ---------------------------------------------------------------------------


def _frames(key: bytes) -> list[bytes]:
    """Valid frames of each kind: what the mutations start from."""
    pid = os.getpid()
    return [
        encode(MsgType.JOB_STARTED, JobStarted(1, 1, pid), key),
        encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED),
        encode(MsgType.QUARANTINE_SELF, JobStarted(1, 1, pid), PUBLIC_KEY,
               flags=PEERCRED),
        encode(MsgType.ADOPT, Adopt(0, 0, pid, NOBODY, AdoptStage.ACCOUNT), key),
        encode(MsgType.ACK, Ack(1, 1, AckStatus.OK, bytes(16)), key),
    ]


@st.composite
def hostile_bytes(draw: st.DrawFn) -> bytes:
    """Random bytes, or a valid frame (of a random key) with bytes flipped, cut or added."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    frame = bytearray(draw(st.sampled_from(_frames(PUBLIC_KEY if draw(st.booleans())
                                                   else bytes(range(32))))))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(frame)))
        kind = draw(st.sampled_from(["flip", "cut", "insert", "end"]))
        if kind == "flip" and at < len(frame):
            frame[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del frame[at:at + draw(st.integers(1, 16))]
        elif kind == "insert":
            frame[at:at] = draw(st.binary(min_size=1, max_size=64))
        else:
            frame += draw(st.binary(max_size=5000))
    return bytes(frame)


def test_random_and_mutated_bytes_get_one_authentic_answer_or_none(fuzz: Fuzz) -> None:
    """Given uid nobody sending random bytes and mutated frames (each connection
    half-closed), then every reply is one authentic ACK or STATUS_REPLY or nothing, and
    afterwards gecod is alive, logged no traceback, and answers a signed STATUS."""

    @fuzzkit.fuzz_settings(1000)
    @given(data=hostile_bytes())
    def send(data: bytes) -> None:
        fuzz.send(data)

    send()
    fuzz.check()


def _header(magic: bytes = MAGIC, version: int = 1, type_: int = 1, flags: int = 0,
            length: int = 24, nonce: bytes = bytes(16), ts: int = 0) -> bytes:
    return struct.pack("<4sBBHI16sq", magic, version, type_, flags, length, nonce, ts)


def _boundary_frames(key: bytes) -> Iterator[tuple[str, bytes]]:
    """Each header field at its boundaries (MAC garbage: refused by shape or MAC), then
    authentic frames whose payload fields are at theirs (kinds in ``AUTHENTIC``)."""
    now = time.time_ns()
    u64 = [0, 1, 2**31 - 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
    u32 = [0, 1, os.getpid(), 2**31 - 1, 2**31, 2**32 - 1]
    for magic in (b"", b"G", b"GECQ"[:3], b"QCEG", b"\x00" * 4, b"\xff" * 4):
        yield "magic", magic + _header()[len(magic):]
    for version in (0, 2, 127, 128, 255):
        yield "version", _header(version=version) + bytes(56)
    for type_, flags in itertools.product((0, 1, 2, 3, 4, 5, 6, 7, 128, 255),
                                          (0, 1, 2, 3, 0x8000, 0xFFFF)):
        yield "type+flags", _header(type_=type_, flags=flags) + bytes(56)
    for length in (0, 1, 23, 24, 25, 4095, 4096, 4097, 2**16, 2**31 - 1, 2**31, 2**32 - 1):
        yield "length", _header(length=length) + bytes(min(length, 5000) + 32)
        yield "length", _header(length=length) + bytes(56)  # disagreeing with the size
    for ts in (-(2**63), -1, 0, now - 31 * 10**9, now + 31 * 10**9, 2**63 - 1):
        yield "timestamp", encode(MsgType.STATUS, b"", key, ts_ns=ts)
        yield "timestamp", encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED,
                                  ts_ns=ts)
    payload = struct.Struct("<QQII")
    for job, task, pid in itertools.product(u64, u64[::3], u32[::2]):
        for reserved in (0, 2**32 - 1):
            body = payload.pack(job, task, pid, reserved)
            yield "job_started", encode(MsgType.JOB_STARTED, body, key)
        yield "quarantine_self", encode(
            MsgType.QUARANTINE_SELF, payload.pack(job, task, pid, 0), PUBLIC_KEY,
            flags=PEERCRED)
    for job, pid, uid in itertools.product(u64[::2], u32[::2], (0, NOBODY, 2**32 - 1)):
        for stage in (0, 1, 2, 2**32 - 1):
            yield "adopt", encode(
                MsgType.ADOPT, struct.pack("<QQIIII", job, job, pid, uid, stage, 0), key)
    for size in (0, 1, 23, 25, 40, 4096):
        yield "payload_size", encode(MsgType.JOB_STARTED, bytes(size), key)
    for doc in (b"", b"{", b"[]", b"\xff\xfe", b"{}" + b" " * 4000):
        yield "status_reply", encode(MsgType.STATUS_REPLY, doc, key)


AUTHENTIC = ("timestamp", "job_started", "quarantine_self", "adopt")


def _renonce(frame: bytes, key: bytes) -> bytes:
    """The same authentic frame with a new nonce (and so a new MAC)."""
    return encode(frame[5], frame[36:-32], key, ts_ns=struct.unpack_from(
        "<q", frame, 28)[0], flags=int.from_bytes(frame[6:8], "little"))


def test_every_header_and_payload_field_at_its_boundaries_is_answered_or_closed(
        fuzz: Fuzz) -> None:
    """Given each field of the header at its boundaries (magic, version, type, flags, the
    payload length up to 2**32-1, the timestamp at +-2**63; the wire's only length field
    is this u32) and authentic frames whose u64 job and task ids go up to 2**64-1 with
    hostile pids and reserved fields, sent by nobody and (the authentic ones) by root,
    then every reply is authentic and no request moved this process anywhere; gecod is
    alive and serving afterwards."""
    cgroup_before = Path("/proc/self/cgroup").read_text()
    sent = 0
    for kind, frame in _boundary_frames(fuzz.node.key):
        fuzz.send(frame)
        if kind in AUTHENTIC:  # from root too, with a fresh nonce (the first one is spent)
            fuzz.send_as_root(_renonce(frame, fuzz.node.key))
        sent += 1
    assert sent > 300
    assert Path("/proc/self/cgroup").read_text() == cgroup_before
    fuzz.check()


def test_truncated_frames_half_closed_or_left_hanging_are_dropped(fuzz: Fuzz) -> None:
    """Given every prefix of valid frames, half-closed (gecod sees the end at once), and
    200 prefixes left hanging at once (gecod drops each at its connection deadline),
    then none is answered with anything but an authentic frame, all are closed by gecod,
    and gecod serves on."""
    for frame in _frames(fuzz.node.key):
        for cut in range(len(frame)):
            assert fuzz.send(frame[:cut]) == b"" or cut >= HEADER_BYTES
    hanging = []
    for cut in itertools.islice(itertools.cycle(range(1, 92)), 200):
        sock = fuzz.nobody.connect()
        if sock is not None:
            fuzz.inputs += 1
            hanging.append(sock)
            with contextlib.suppress(OSError):  # gecod may close a flood's connections at once
                sock.sendall(_frames(fuzz.node.key)[0][:cut])
    _wait_closed(hanging, fuzz.node.key, limit=DEADLINE * 20)
    fuzz.check()


def _wait_closed(socks: list[socket.socket], key: bytes, *, limit: float,
                 trickle: bytes | None = None) -> None:
    """Wait until gecod has closed every socket (EOF or reset), sending ``trickle`` one byte
    at a time to those still open every 0.3 s; fail when one is open after ``limit`` s (a
    hang, far beyond the deadline). What gecod sends before closing must be authentic."""
    open_ = {s: 0 for s in socks}
    give_up = time.monotonic() + limit
    try:
        while open_:
            assert time.monotonic() < give_up, f"{len(open_)} connections still open"
            readable, _, _ = select.select(list(open_), [], [], 0.3)
            for s in readable:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    del open_[s]
                    s.close()
                else:
                    authentic(data, key)
            if trickle is not None:
                for s, sent in list(open_.items()):
                    with contextlib.suppress(OSError):
                        s.send(trickle[sent:sent + 1])
                        open_[s] = sent + 1
                    assert open_[s] < len(trickle), "a slowloris client got its whole frame in"
    finally:
        for s in open_:
            s.close()


def test_slowloris_and_half_closed_clients_are_dropped_while_jobs_start(fuzz: Fuzz) -> None:
    """Given 100 clients of nobody's sending a valid frame one byte every 0.3 s (slower
    than the 1 s connection deadline), clients that half-close after part of a frame and
    never read, and clients that send a whole request and close before the answer,
    then gecod drops every slow client before its frame is complete and survives the
    rest, while the prober's jobs keep starting."""
    frame = encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED)
    slow = [s for s in (fuzz.nobody.connect() for _ in range(100)) if s is not None]
    fuzz.inputs += len(slow)
    _wait_closed(slow, fuzz.node.key, limit=DEADLINE * 30, trickle=frame)
    for cut in (1, 12, 35, 36, 40, len(frame) - 1, len(frame)):
        for how in (socket.SHUT_WR, socket.SHUT_RDWR):
            sock = fuzz.nobody.connect()
            if sock is None:
                continue
            fuzz.inputs += 1
            with sock, contextlib.suppress(OSError):
                sock.sendall(frame[:cut])
                sock.shutdown(how)
    for _ in range(50):  # a whole request, gone before its answer (gecod's send fails)
        sock = fuzz.nobody.connect()
        if sock is not None:
            fuzz.inputs += 1
            with sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.sendall(encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED))
    fuzz.check()


def test_ten_thousand_connections_in_a_few_seconds_leave_gecod_serving(fuzz: Fuzz) -> None:
    """Given uid nobody opening 10,000 connections in a few seconds, up to 1,000 open at
    once (connect and close; garbage; valid peer-credentialed STATUS requests), then
    every reply is authentic, gecod is alive afterwards and answers a signed STATUS."""
    count = max(10_000, fuzzkit.examples(0))
    held: list[socket.socket] = []
    status = encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED)
    for i in range(count):
        sock = fuzz.nobody.connect()
        fuzz.inputs += 1
        if sock is None:
            continue
        kind = i % 10
        if kind == 0:  # garbage, then read gecod's ACK (or nothing) later
            with contextlib.suppress(OSError):
                sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(60))
        elif kind == 1:  # a valid request of any user's
            with contextlib.suppress(OSError):
                sock.sendall(encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED)
                             if i % 20 == 1 else status[:20])
        held.append(sock)
        if len(held) >= 1000:
            _drain(held, fuzz.node.key)
    _drain(held, fuzz.node.key)
    fuzz.check()


def _drain(held: list[socket.socket], key: bytes) -> None:
    """Close the held connections; a reply already there must be authentic."""
    for sock in held:
        sock.setblocking(False)
        data = b""
        with contextlib.suppress(OSError):
            data = sock.recv(8192)
        authentic(data, key)
        sock.close()
    held.clear()


def test_zz_the_socket_fuzz_figures(fuzz: Fuzz) -> None:
    """The figures (this runs last): inputs tried, gecod crashes (0: alive, no traceback),
    and the JOB_STARTED latency of real job starts before (the floor) and during the fuzz."""
    fuzz.check()
    assert fuzz.prober.stdin is not None and fuzz.prober.stdout is not None
    fuzz.prober.stdin.close()
    samples = json.loads(fuzz.prober.stdout.readline())
    fuzz.prober.wait(timeout=30)
    # the floor leaves out the first request, which built the job's cgroups
    floor = sorted(t for start, t, s in samples[1:] if start < fuzz.fuzz_started and s == "OK")
    during = [(t, s) for start, t, s in samples if start >= fuzz.fuzz_started]
    ok = sorted(t for t, s in during if s == "OK")
    failed = [s for _, s in during if s != "OK"]
    fuzzkit.record("socket: inputs tried", fuzz.inputs)
    fuzzkit.record("socket: nobody's connects refused by gecod's backlog", fuzz.nobody.failed)
    fuzzkit.record("socket: gecod crashes", 0)  # fuzz.check() just passed
    fuzzkit.record("socket: JOB_STARTED during the fuzz", len(during))
    fuzzkit.record("socket: JOB_STARTED not OK during the fuzz", len(failed))
    if floor:
        fuzzkit.record("socket: JOB_STARTED p99 alone (floor)", _p99(floor) * 1e3, "ms")
    if ok:
        fuzzkit.record("socket: JOB_STARTED p50 during the fuzz", ok[len(ok) // 2] * 1e3, "ms")
        fuzzkit.record("socket: JOB_STARTED p99 during the fuzz", _p99(ok) * 1e3, "ms")
        fuzzkit.record("socket: JOB_STARTED max during the fuzz", ok[-1] * 1e3, "ms")
    assert during and ok, samples[-20:]
    # no flood on the public socket costs a job start its answer
    assert failed == [], sorted(set(failed))[:10]


def _p99(sorted_times: list[float]) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(len(sorted_times) * 0.99))]
