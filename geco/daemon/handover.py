"""Handing gecod's sockets to the gecod just installed, with no moment unanswered.

An upgrade replaces gecod's code under the running daemon. A restart would leave its
sockets unanswered while the new gecod imports and starts (half a second on a node,
seconds on a slow one), and every job start on the node would wait that long. So the
running gecod (the *predecessor*) hands over instead, on SIGUSR2 (``geco handover``,
which the package's postinst runs):

1. it starts the installed gecod (the *successor*: its own command line again) with
   its listening sockets and one end of a socketpair, named in ``$GECO_HANDOVER``;
2. the successor does what takes time (imports, configuration, key, topology) while
   the predecessor serves on, then says ``ready``;
3. the predecessor stops accepting (new connections wait in the kernel's backlog: none
   is refused), answers every connection it took, lets its job ends and a reaper round
   finish, and says ``drained``;
4. the successor reads the node back from the cgroup tree, serves on the same sockets,
   tells systemd it is the service's main process now (``MAINPID=``, ``READY=1``, then
   a barrier: systemd has read it), and says ``serving``; the predecessor exits 0.

A successor that fails before ``ready`` changes nothing: the predecessor serves on and
says why (journal, and its STATUS, which ``geco handover`` reads). After ``drained``
there is no way back: if the successor does not say ``serving`` the predecessor exits 1
and systemd restarts gecod (``Restart=on-failure``), a plain restart.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from geco.config import Config
from geco.errors import GecoError
from geco.wire.address import Address

__all__ = ["ENV", "Predecessor", "Successor", "matches", "request", "systemd_barrier"]

ENV = "GECO_HANDOVER"
READY, DRAINED, SERVING, FAILED = b"ready\n", b"drained\n", b"serving\n", b"failed: "
# The longest a message of the handover may take to arrive once the other side is due.
_LINE_TIMEOUT = 60.0
# The longest systemd may take to read MAINPID= before the successor goes on without it.
_BARRIER_TIMEOUT = 5.0
# How often ``geco handover`` asks gecod whether it has handed over.
_POLL = 0.1


def _read_line(sock: socket.socket, timeout: float) -> bytes:
    """One line from the other gecod; b"" when it went away or said nothing in time."""
    sock.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = sock.recv(64)
            if not chunk:
                return b""
            data += chunk
    except OSError:
        return b""
    return data


def matches(sock: socket.socket, addr: Address) -> bool:
    """True when ``sock`` is a socket listening on ``addr`` (what the predecessor passed
    must be what this gecod's configuration names, else a restart is needed)."""
    try:
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        name = sock.getsockname()
    except OSError:
        return False
    if addr.family == "unix":
        return sock.family == socket.AF_UNIX and name == addr.path
    # gecod's TCP socket is on loopback, the cluster channel's on any address
    return sock.family in (socket.AF_INET, socket.AF_INET6) and name[1] == addr.port


@dataclass
class Predecessor:
    """The running gecod's side: the successor it started and the line to it."""

    proc: subprocess.Popen[bytes]
    line: socket.socket

    @classmethod
    def start(cls, listeners: dict[str, socket.socket]) -> Predecessor:
        """Start the installed gecod with ``listeners`` (name: socket) passed down."""
        ours, theirs = socket.socketpair()
        fds = {"line": theirs.fileno(), **{n: s.fileno() for n, s in listeners.items()}}
        env = dict(os.environ, **{ENV: ",".join(f"{n}={fd}" for n, fd in fds.items())})
        env.pop("WATCHDOG_PID", None)  # that was this process; the watchdog stays the unit's
        try:
            proc = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env=env,
                                    pass_fds=tuple(fds.values()), stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise GecoError.from_oserror("cannot start the installed gecod", exc,
                                         program=sys.executable) from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(proc, ours)

    def fileno(self) -> int:
        return self.line.fileno()

    def failure(self) -> str | None:
        """After the line became readable: None when the successor is ready, else why it
        will not take over (its own words when it said them)."""
        said = _read_line(self.line, _LINE_TIMEOUT)
        if said == READY:
            return None
        self.line.close()
        try:
            code = self.proc.wait(timeout=_LINE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        why = said.removeprefix(FAILED).decode("utf-8", "replace").strip() \
            if said.startswith(FAILED) else "no reason given"
        return f"the installed gecod (pid {self.proc.pid}) exited with status {code}: {why}"

    def abandon(self) -> None:
        """End the successor before it took anything over (this gecod is stopping)."""
        self.line.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=_LINE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def drained(self) -> bool:
        """Say this gecod answers nothing any more; wait for the successor to serve."""
        try:
            self.line.setblocking(True)
            self.line.sendall(DRAINED)
        except OSError:
            return False
        served = _read_line(self.line, _LINE_TIMEOUT) == SERVING
        self.line.close()
        return served


@dataclass
class Successor:
    """The new gecod's side: the sockets it inherited and the line back."""

    line: socket.socket
    sockets: dict[str, socket.socket] = field(default_factory=dict)

    @classmethod
    def from_environ(cls) -> Successor | None:
        """The handover this process was started for (``$GECO_HANDOVER``), else None."""
        text = os.environ.pop(ENV, "")
        if not text:
            return None
        fds: dict[str, int] = {}
        for item in text.split(","):
            name, _, fd = item.partition("=")
            if not fd.isdigit() or name in fds:
                raise GecoError(f"${ENV} is not what a gecod passes: {text!r}")
            fds[name] = int(fd)
        if "line" not in fds:
            raise GecoError(f"${ENV} names no line to the running gecod: {text!r}")
        try:
            line = socket.socket(fileno=fds.pop("line"))
            sockets = {name: socket.socket(fileno=fd) for name, fd in fds.items()}
        except OSError as exc:
            raise GecoError(f"${ENV} names a file descriptor that is no socket: {exc}") \
                from None
        return cls(line, sockets)

    def take(self, name: str, addr: Address) -> socket.socket | None:
        """The inherited socket ``name``, checked against ``addr``; None when the
        predecessor had none."""
        sock = self.sockets.pop(name, None)
        if sock is None:
            return None
        if not matches(sock, addr):
            sock.close()
            raise GecoError(f"the running gecod's {name} socket is not {addr} of this "
                            f"configuration (changed since it started?): restart gecod "
                            f"instead (systemctl restart gecod)")
        return sock

    def ready(self) -> None:
        """Say this gecod is loaded; wait until the predecessor answers nothing any more."""
        try:
            self.line.sendall(READY)
        except OSError as exc:
            raise GecoError("the running gecod went away before the handover") from exc
        if _read_line(self.line, _LINE_TIMEOUT * 2) != DRAINED:
            raise GecoError("the running gecod did not stop serving to hand over")

    def failed(self, reason: str) -> None:
        """Say why this gecod cannot take over (the predecessor serves on and reports it)."""
        with contextlib.suppress(OSError):
            self.line.sendall(FAILED + reason.replace("\n", " ").encode() + b"\n")
        self.line.close()

    def serving(self) -> None:
        """Say this gecod serves: the predecessor exits."""
        with contextlib.suppress(OSError):  # it is gone already; nothing waits for the word
            self.line.sendall(SERVING)
        self.line.close()


def systemd_barrier(notify: Callable[[str, list[int]], bool]) -> bool:
    """Wait until systemd has read every message this process sent it (BARRIER=1).

    ``notify`` sends a message with file descriptors (sd_notify). False without
    systemd or when it did not answer in time.
    """
    r, w = os.pipe()
    try:
        sent = notify("BARRIER=1", [w])
        os.close(w)
        w = -1
        if not sent:
            return False
        poll = select.poll()
        poll.register(r, select.POLLHUP)
        return bool(poll.poll(int(_BARRIER_TIMEOUT * 1000)))
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def request(cfg: Config, *, timeout: float) -> str:
    """Ask the running gecod to hand over to the installed one (``geco handover``, root).

    Returns what happened, in one line; raises GecoError when gecod is not running,
    cannot be signalled, reports that the installed gecod could not take over, or has
    not handed over within ``timeout`` seconds.
    """
    from geco.wire import client  # a client's module: gecod itself never needs it

    before = client.status(cfg)
    pid = int(before["pid"])
    asked = time.time()
    try:
        os.kill(pid, signal.SIGUSR2)
    except PermissionError:
        raise GecoError(f"only root may ask gecod (pid {pid}) to hand over") from None
    except ProcessLookupError:
        raise GecoError(f"gecod (pid {pid}) has just exited") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(_POLL)
        try:
            now = client.status(cfg)
        except GecoError:
            continue  # the answer waits in the backlog, or systemd restarts gecod
        failed = now.get("handover_failed")
        if now.get("pid") != pid:
            return (f"gecod {before.get('gecod')} (pid {pid}) handed over to gecod "
                    f"{now.get('gecod')} (pid {now.get('pid')}) in "
                    f"{time.time() - asked:.2f} s")
        if isinstance(failed, dict) and float(failed.get("at", 0)) >= asked:
            raise GecoError(f"gecod (pid {pid}) serves on: {failed.get('reason')}")
    raise GecoError(f"gecod (pid {pid}) did not hand over within {timeout:g} s "
                    f"(journalctl -u gecod says why)")
