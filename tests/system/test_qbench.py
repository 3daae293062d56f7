"""``bench/geco_qbench.c``: the quarantine benchmark's C client and its floors.

The program is built with the preload's Makefile into a scratch directory once per
module. Each test runs it as the benchmark does and reads the one JSON line it
prints: ``floor-socket`` (a bare Unix-socket round trip), ``floor-cgroup`` and
``floor-cgroup-again`` (writes of its own pid into a ``cgroup.procs`` this module creates
and removes) and ``rtt``
against a fake gecod written here (the real protocol, :mod:`geco.wire`) or
against no socket at all.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.wire.frame import decode, encode
from geco.wire.messages import Ack, AckStatus, JobStarted, MsgType
from geco.wire.reader import read_frame

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: floor-cgroup writes cgroup.procs"),
]

REPO = Path(__file__).resolve().parents[2]
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
RESULT_KEYS = {"clients", "requests", "ok", "failed", "first_error", "wall_s", "p50_us",
               "p90_us", "p99_us", "max_us", "rate_per_s"}


@pytest.fixture(scope="module")
def qbench() -> Iterator[Path]:
    """geco_qbench, built by the project's Makefile into a scratch BUILD directory."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.fail("make and cc are needed: apt-get install build-essential")
    build = Path(tempfile.mkdtemp(prefix="geco-test-qbench-"))
    try:
        proc = subprocess.run(["make", "-C", str(REPO), f"BUILD={build}", "qbench"],
                              capture_output=True, text=True, env=BASE_ENV, check=False)
        if proc.returncode != 0:
            pytest.fail(f"make qbench failed:\n{proc.stdout}{proc.stderr}")
        yield build / "geco_qbench"
    finally:
        shutil.rmtree(build, ignore_errors=True)


def run(qbench: Path, *args: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    """Run geco_qbench; its exit status and the one JSON line it printed."""
    proc = subprocess.run([str(qbench), *args], capture_output=True, text=True,
                          env=BASE_ENV, timeout=timeout, check=False)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    result = json.loads(lines[0])
    assert set(result) == RESULT_KEYS
    return proc.returncode, result


def test_floor_socket_round_trips_every_request(qbench: Path) -> None:
    """Given no gecod at all, when floor-socket makes 500 round trips, then every one
    succeeds, exit 0, and the latencies are positive and ordered."""
    rc, result = run(qbench, "floor-socket", "--requests", "500")
    assert rc == 0, result
    assert result["clients"] == 1 and result["requests"] == 500
    assert result["ok"] == 500 and result["failed"] == 0 and result["first_error"] == ""
    assert 0 < result["p50_us"] <= result["p90_us"] <= result["p99_us"] <= result["max_us"]
    assert result["wall_s"] > 0 and result["rate_per_s"] > 0


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """An empty cgroup of this machine (v1 pids or freezer, else v2), removed afterwards."""
    root = Path("/sys/fs/cgroup")
    parents = [root / c for c in ("pids", "freezer") if (root / c / "cgroup.procs").exists()]
    if (root / "cgroup.controllers").exists():
        parents.append(root)
    if not parents:
        pytest.skip("no writable cgroup hierarchy under /sys/fs/cgroup")
    path = parents[0] / f"geco-test-qbench-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():  # none expected
            (parents[0] / "cgroup.procs").write_text(pid)
        path.rmdir()


@pytest.mark.parametrize("mode", ["floor-cgroup", "floor-cgroup-again"])
def test_floor_cgroup_moves_itself_into_the_cgroup(qbench: Path, cgroup: Path,
                                                   mode: str) -> None:
    """Given an empty cgroup, when floor-cgroup writes its pid 200 times (moved back to the
    parent before each, or, -again, left where it is), then every write succeeds, and the
    cgroup is empty again once the program has exited."""
    rc, result = run(qbench, mode, "--cgroup-procs", str(cgroup / "cgroup.procs"),
                     "--requests", "200")
    assert rc == 0, result
    assert result["ok"] == 200 and result["failed"] == 0 and result["p50_us"] > 0
    assert (cgroup / "cgroup.procs").read_text() == ""


@pytest.mark.parametrize("mode", ["floor-cgroup", "floor-cgroup-again"])
def test_floor_cgroup_names_a_write_that_fails(qbench: Path, tmp_path: Path, mode: str) -> None:
    """Given a cgroup.procs that does not exist, then every request fails, exit 1, and
    first_error names the failing step."""
    rc, result = run(qbench, mode, "--cgroup-procs",
                     str(tmp_path / "gone" / "cgroup.procs"), "--requests", "3")
    assert rc == 1
    assert result["ok"] == 0 and result["failed"] == 3 and "open: ENOENT" in result["first_error"]


def test_rtt_against_a_missing_socket_reports_connect(qbench: Path, tmp_path: Path) -> None:
    """Given no socket at the address, when rtt runs, then it exits 1 and first_error
    says it could not connect (ENOENT), in JSON, for every request."""
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    rc, result = run(qbench, "rtt", "--address", f"path:{tmp_path}/none.sock",
                     "--key-file", str(key), "--job", "7", "--task", "1", "--clients", "2",
                     "--requests", "2", "--timeout-ms", "300")
    assert rc == 1
    assert result["requests"] == 4 and result["ok"] == 0 and result["failed"] == 4
    assert result["first_error"] == "cannot connect: ENOENT"


class FakeGecod:
    """Answers every JOB_STARTED with a verified ACK of ``status``; records each
    request's pid, the sender's pid (SO_PEERCRED) and the sender's cwd."""

    def __init__(self, path: Path, key: bytes, status: AckStatus) -> None:
        self.key, self.status = key, status
        self.seen: list[tuple[int, int, str]] = []
        self.errors: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    conn.settimeout(None)
                    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                    peer = struct.unpack("3i", creds)[0]
                    frame = decode(read_frame(conn, time.monotonic() + 5),
                                   self.key)
                    msg = frame.message
                    assert isinstance(msg, JobStarted), frame
                    self.seen.append((msg.pid, peer, os.readlink(f"/proc/{peer}/cwd")))
                    conn.sendall(encode(
                        MsgType.ACK, Ack(msg.job_id, msg.task_id, self.status, frame.nonce),
                        self.key))
                except Exception as exc:  # reported by the test, never lost in the thread
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.mark.parametrize("status", [AckStatus.OK, AckStatus.REFUSED])
def test_rtt_sends_each_clients_own_pid_from_its_cwd(qbench: Path, tmp_path: Path,
                                                     status: AckStatus) -> None:
    """Given a gecod that acks (OK or REFUSED), when 3 clients send 4 requests each from
    --cwd, then gecod sees 12 requests, each for the sender's own pid, from that cwd; an
    OK run counts all 12 as ok (exit 0), a REFUSED one none, naming the status (exit 1)."""
    key = os.urandom(32)
    (tmp_path / "key").write_bytes(key)
    job_dir = tmp_path / "active_jobs" / "7.1"
    job_dir.mkdir(parents=True)
    gecod = FakeGecod(tmp_path / "gecod.sock", key, status)
    try:
        rc, result = run(qbench, "rtt", "--address", f"path:{tmp_path}/gecod.sock",
                         "--key-file", str(tmp_path / "key"), "--job", "7", "--task", "1",
                         "--clients", "3", "--requests", "4", "--cwd", str(job_dir),
                         "--timeout-ms", "5000")
    finally:
        gecod.close()
    assert gecod.errors == []
    assert len(gecod.seen) == 12
    assert all(pid == peer and cwd == str(job_dir) for pid, peer, cwd in gecod.seen)
    assert len({pid for pid, _, _ in gecod.seen}) == 3
    if status is AckStatus.OK:
        assert rc == 0 and result["ok"] == 12 and result["first_error"] == ""
        assert 0 < result["p50_us"] <= result["max_us"]
    else:
        assert rc == 1 and result["ok"] == 0 and result["failed"] == 12
        assert result["first_error"].startswith("gecod did not quarantine the job: ")
