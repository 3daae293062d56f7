"""gecod hands its sockets to the gecod installed after it (``geco handover``, SIGUSR2).

An upgrade of the package must not leave a moment in which a job start waits for a
restart: the running gecod starts the installed one, serves until it is loaded, then
stops accepting, and the new one serves on the same sockets (:mod:`geco.daemon.handover`).
Real gecods from :mod:`tests.gecodkit` (real cgroup v1, journald), clients asking without
pause on both sockets all the while.

The new gecod is not the test's child (the old one started it), so it is ended by pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geco.errors import GecoError
from tests.gecodkit import (
    MARKS,
    REPO,
    Node,
    alive,
    new_job,
    root_socket,
    start_gecod,
    status,
    stop_by_pid,
    wait_gone,
)
from tests.gecodkit import _clean_jobs as _clean_jobs  # after each test, on this module's node
from tests.gecodkit import node as node  # this module's node

pytestmark = MARKS

NOBODY = 65534
WAIT = 60.0  # seconds for a whole handover, on a machine as slow as it gets


def _until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.02)


@dataclass
class Askers:
    """Clients asking STATUS without pause on each socket, counting every answer."""

    node: Node
    sockets: list[str]
    pids: set[int] = field(default_factory=set)
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Askers:
        for sock in self.sockets:
            thread = threading.Thread(target=self._ask, args=(sock,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _ask(self, sock: str) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                pid = status(self.node, sock)["pid"]
            except GecoError as exc:
                self.failures.append(f"{sock}: {exc}")
                continue
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.pids.add(pid)
            self.answered += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


@dataclass
class FakeSystemd:
    """systemd's notify socket as gecod meets it: every message kept, the file descriptors
    of a BARRIER=1 closed at once (systemd's answer: "read up to here")."""

    path: Path
    messages: list[str] = field(default_factory=list)
    _sock: socket.socket = field(init=False)

    def __post_init__(self) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(0.2)
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        while self._sock.fileno() >= 0:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(4096, socket.CMSG_SPACE(16))
            except TimeoutError:
                continue
            except OSError:
                return
            for level, kind, fds in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                    for fd in memoryview(fds).cast("i"):
                        os.close(fd)
            self.messages.append(data.decode())

    def close(self) -> None:
        self._sock.close()


def _geco(*args: str, config: Path, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.run([sys.executable, "-m", "geco.cli", *args], cwd="/",
                          capture_output=True, text=True, timeout=WAIT * 2,
                          preexec_fn=drop if as_nobody else None,
                          env={"PYTHONPATH": str(REPO), "GECO_CONFIG": str(config),
                               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def test_handover_answers_every_request_and_the_new_gecod_keeps_every_job(
        node: Node, journal: Any, figures: list[str]) -> None:
    """Given gecod with a job's shepherd contained and clients asking without pause on its
    public and its root socket, when root runs `geco handover`, then a new gecod (another
    pid) answers on both sockets, the old one exits 0, no request failed or was refused,
    systemd (its notify socket) was told the new main pid and confirmed it with a barrier,
    and the job contained before is the new gecod's: the shepherd's exit is torn down by it,
    once. The journal tells the handover from both sides."""
    systemd = FakeSystemd(node.base / "notify.socket")
    g = start_gecod(node, "handover", env={"NOTIFY_SOCKET": str(systemd.path)})
    job = new_job()
    node.make_job(job)
    shepherd = node.job_process(job, sock=g.sock, named_shepherd=True)
    assert shepherd.answer() == "OK"
    since = time.time()
    askers = Askers(node, [g.sock, root_socket(g)]).start()
    new_pid = 0
    try:
        _until(lambda: askers.answered > 10, "clients answered before the handover")
        done = _geco("handover", config=node.base / "handover.toml")
        assert done.returncode == 0, (done.stderr, g.output())
        assert g.proc.wait(timeout=WAIT) == 0, g.output()
        new_pid = status(node, g.sock)["pid"]
        assert new_pid != g.pid and alive(new_pid)
        assert f"(pid {g.pid}) handed over to gecod " in done.stdout \
            and f"(pid {new_pid})" in done.stdout, done.stdout
        before = askers.answered
        _until(lambda: askers.answered > before + 10, "clients answered after the handover")
        askers.stop()
        assert askers.failures == [], askers.failures[:5]
        assert askers.pids == {g.pid, new_pid}
        # systemd was told the new main pid, and confirmed it, before the old gecod went
        told = systemd.messages
        assert told[0] == "READY=1", told
        assert told.index(f"MAINPID={new_pid}\nREADY=1") < told.index("BARRIER=1"), told
        figures.append(f"gecod handover (2 clients asking without pause on its 2 sockets): "
                       f"{askers.answered} STATUS answered, none refused, the slowest in "
                       f"{askers.slowest * 1000:.0f} ms (a figure: the machine's load decides)")

        shepherd.exit()
        wait_gone(node, f"{job}.1")
        [end] = journal.wait_for(GECO_EVENT="job-end", JOB_ID=str(job))
        assert end["_PID"] == str(new_pid)
        [gave] = journal.wait_for(GECO_EVENT="gecod-handed-over", _PID=str(g.pid))
        assert gave["SUCCESSOR_PID"] == str(new_pid)
        [took] = journal.wait_for(GECO_EVENT="gecod-took-over", _PID=str(new_pid))
        assert float(took["__REALTIME_TIMESTAMP"]) / 1e6 > since
    finally:
        askers.stop()
        systemd.close()
        if new_pid:
            stop_by_pid(new_pid)
        g.stop()


def test_a_new_gecod_that_cannot_start_changes_nothing_and_says_why(
        node: Node, journal: Any) -> None:
    """Given gecod running and its key file since made readable by others (gecod refuses
    such a key at start), when root runs `geco handover`, then it exits 1 with the new
    gecod's own reason, and the old gecod (same pid) serves on, on both sockets."""
    g = start_gecod(node, "handover-broken")
    try:
        node.key_file.chmod(0o644)
        done = _geco("handover", config=node.base / "handover-broken.toml")
        assert done.returncode == 1, (done.stdout, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(f"geco handover: gecod (pid {g.pid}) serves on: the installed "
                               f"gecod (pid "), line
        assert "exited with status 1: " in line and str(node.key_file) in line, line
        assert status(node, g.sock)["pid"] == g.pid
        assert status(node, root_socket(g))["pid"] == g.pid
        [failed] = journal.wait_for(GECO_EVENT="gecod-handover-failed", _PID=str(g.pid))
        assert failed["REASON"] in line
    finally:
        node.key_file.chmod(0o600)
        assert g.stop() == 0, g.output()


def test_a_new_gecod_refuses_sockets_its_configuration_does_not_name(
        node: Node, journal: Any) -> None:
    """Given gecod running and its configuration since changed to another socket, when it
    is asked to hand over (SIGUSR2), then the new gecod refuses the old sockets and says a
    restart is needed; the old gecod serves on and reports it in its STATUS."""
    g = start_gecod(node, "handover-moved")
    config = node.base / "handover-moved.toml"
    good = config.read_text()
    try:
        config.write_text(good.replace(g.sock, str(node.base / "elsewhere.sock")))
        os.kill(g.pid, signal.SIGUSR2)
        _until(lambda: "handover_failed" in status(node, g.sock), "the failure in STATUS")
        doc = status(node, g.sock)
        assert doc["pid"] == g.pid
        reason = doc["handover_failed"]["reason"]
        assert "public socket is not path:" in reason and "restart gecod" in reason, reason
        assert not (node.base / "elsewhere.sock").exists()
    finally:
        config.write_text(good)
        assert g.stop() == 0, g.output()


def test_only_root_may_ask_for_a_handover(node: Node) -> None:
    """Given gecod running, when a user runs `geco handover`, then one line says only root
    may, exit 1, and the same gecod serves on."""
    g = start_gecod(node, "handover-user")
    try:
        done = _geco("handover", config=node.base / "handover-user.toml", as_nobody=True)
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == f"geco handover: only root may ask gecod (pid {g.pid}) to hand " \
                              f"over\n"
        assert status(node, g.sock)["pid"] == g.pid
    finally:
        assert g.stop() == 0, g.output()


def test_gecod_started_with_a_handover_it_was_not_given_refuses_to_start(
        node: Node) -> None:
    """$GECO_HANDOVER naming descriptors that are no gecod's sockets: one line, exit 1."""
    config = node.write_config("handover-env")
    done = subprocess.run([sys.executable, "-m", "geco.daemon", "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=WAIT,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                               "GECO_HANDOVER": "line=0,public=1"})
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("gecod: "), line
    assert not os.path.exists(node.socket_path("handover-env"))

