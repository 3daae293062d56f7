"""Ask gecod something, as any user: the starter's fallback and ``geco status``.

One connection carries one request and one reply (``docs/wire-format.md``).
The requests made here are *peer-credentialed* (flag PEERCRED, MAC keyed with
the public all-zero key): their senders run as ordinary users and cannot read
the secret key. gecod believes the kernel (SO_PEERCRED) about who asks, and
answers in kind.

Why the reply can be trusted without the secret key: it arrives on gecod's Unix
socket, whose directory only root can write (``/run/geco``), so nobody else can
have put a listener there. That premise is checked before anything is sent
(:func:`check_socket_dir`); over TCP it cannot hold (any user may bind a free
loopback port while gecod is down), so these requests are never sent over TCP.

Typical use::

    ack = client.quarantine_self(cfg, job_id, task_id)   # raises GecodUnavailable / ...
    doc = client.status(cfg)
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Any

from geco.config import Config
from geco.errors import GecoError, ProtocolError
from geco.wire import address
from geco.wire.address import Address
from geco.wire.frame import PEERCRED, PUBLIC_KEY, Frame, decode, encode, nonce_of
from geco.wire.messages import Ack, AckStatus, JobStarted, MsgType, StatusReply
from geco.wire.reader import read_frame

__all__ = [
    "GecodNotRunning",
    "GecodRefused",
    "GecodTimeout",
    "GecodUnavailable",
    "check_socket_dir",
    "quarantine_self",
    "request",
    "status",
]

# BUSY means "try again": first pause, then doubled up to the cap, within the deadline.
_BUSY_PAUSE = 0.05
_BUSY_PAUSE_MAX = 0.5


class GecodUnavailable(GecoError):
    """gecod could not be asked: not running, not answering, or the connection failed."""


class GecodNotRunning(GecodUnavailable):
    """Nobody listens on gecod's socket (no socket file, or a stale one)."""


class GecodTimeout(GecodUnavailable):
    """gecod did not answer within the request timeout."""


class GecodRefused(GecoError):
    """gecod answered, with an ACK status other than OK.

    Attributes
    ----------
    status: the ACK status (REFUSED, NO_SUCH_JOB, FAILED, BAD_REQUEST, VERSION, BUSY).
    """

    def __init__(self, status: AckStatus, **fields: object) -> None:
        self.status = status
        super().__init__(f"gecod refused: {status.name}", **fields)


def _where(addr: Address) -> str:
    return addr.path if addr.path is not None else f"{address.LOOPBACK}:{addr.port}"


def _unix_path(addr: Address) -> str:
    if addr.family != "unix" or addr.path is None:
        raise GecoError(f"asking gecod without the secret key needs its Unix socket "
                        f"([gecod] socket = \"path:...\"), got {addr}: over TCP neither the "
                        f"kernel nor a root-owned directory vouches for either end")
    return addr.path


def check_socket_dir(path: str) -> None:
    """Check that only root can have put a listener at ``path``, so its replies are gecod's.

    The socket's directory must be owned by root and writable by nobody else;
    each directory above it owned by root and writable by nobody else, or
    sticky (like /tmp: others cannot rename root's entries away).

    Raises
    ------
    GecodNotRunning
        when the directory does not exist (gecod never ran here).
    GecoError
        naming the directory and what is wrong with it.
    """
    directory = Path(os.path.dirname(os.path.abspath(path)))
    for d in (directory, *directory.parents):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            raise GecodNotRunning(f"gecod is not running (no socket at {path})") from None
        except OSError as exc:
            raise GecoError.from_oserror("cannot check gecod's socket directory", exc,
                                         path=d) from exc
        writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        sticky_ok = d != directory and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0 or (writable_by_others and not sticky_ok):
            raise GecoError(f"gecod's socket {path} is in {d}, which must be owned by root and "
                            f"writable by root only (got uid {st.st_uid}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): another user could answer in "
                            f"gecod's place. Put the socket in a root-owned directory such as "
                            f"/run/geco", path=d)


def request(addr: Address, frame: bytes, timeout: float) -> bytes:
    """Send one request on a new connection and return the one reply frame.

    Parameters
    ----------
    addr: gecod's address (:func:`geco.wire.address.parse`).
    frame: the encoded request.
    timeout: seconds for the whole exchange (connect, send, reply).

    Returns
    -------
    The reply's bytes, one whole frame (not yet verified: :func:`geco.wire.frame.decode`).

    Raises
    ------
    GecodNotRunning
        no socket file, or nobody listens on it (a gecod that died).
    GecodTimeout
        no whole reply within ``timeout``.
    GecodUnavailable
        any other connection failure, or gecod closed without a reply.
    ProtocolError
        the reply is not a well-shaped frame (magic, version, flags, length).
    """
    deadline = time.monotonic() + timeout
    try:
        sock = address.connect(addr, timeout)
    except GecoError as exc:
        cause = exc.__cause__
        code = cause.errno if isinstance(cause, OSError) else None
        if code == errno.ENOENT:
            raise GecodNotRunning(f"gecod is not running (no socket at {_where(addr)})") from exc
        if code == errno.ECONNREFUSED:
            raise GecodNotRunning(f"gecod is not running (nobody listens on {_where(addr)})"
                                  ) from exc
        if isinstance(cause, TimeoutError):
            raise GecodTimeout(f"gecod did not accept the connection within {timeout:g} s",
                               address=addr) from exc
        raise GecodUnavailable(exc.msg, **exc.fields) from exc
    with sock:
        try:
            sock.sendall(frame)
            return read_frame(sock, deadline)
        except ProtocolError as exc:
            if exc.reason == "timeout":
                raise GecodTimeout(f"gecod did not answer within {timeout:g} s",
                                   address=addr) from exc
            if exc.reason == "closed":
                raise GecodUnavailable("gecod closed the connection without an answer",
                                       address=addr) from exc
            raise
        except TimeoutError as exc:
            raise GecodTimeout(f"gecod did not take the request within {timeout:g} s",
                               address=addr) from exc
        except OSError as exc:
            raise GecodUnavailable.from_oserror("the connection to gecod failed", exc,
                                                address=addr) from exc


def _ack_of(got: Frame) -> Ack:
    """The ACK a decoded ACK frame carries (decode unpacked it once)."""
    assert isinstance(got.message, Ack)
    return got.message


def _ask(cfg: Config, msg_type: MsgType, payload: JobStarted | bytes,
         timeout: float | None) -> Frame:
    """One PEERCRED request, retried while gecod says BUSY or closes the connection unanswered
    (a full connection table); return the verified reply frame."""
    addr = _address(cfg)
    path = _unix_path(addr)
    check_socket_dir(path)
    limit = cfg.gecod_request_timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    pause = _BUSY_PAUSE
    while True:
        frame = encode(msg_type, payload, PUBLIC_KEY, flags=PEERCRED)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise GecodTimeout(f"gecod did not answer within {limit:g} s", address=addr)
        try:
            reply = request(addr, frame, remaining)
        except GecodTimeout as exc:  # name the caller's limit, not what was left of it
            raise GecodTimeout(f"gecod did not answer within {limit:g} s",
                               address=addr) from exc
        except GecodUnavailable as exc:
            closed = isinstance(exc.__cause__, ProtocolError) and exc.__cause__.reason == "closed"
            if not closed or time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, _BUSY_PAUSE_MAX)
            continue
        got = decode(reply, PUBLIC_KEY, max_skew=cfg.gecod_max_skew, peercred=True)
        if got.type is not MsgType.ACK:
            return got
        ack = _ack_of(got)
        if ack.request_nonce != nonce_of(frame):
            raise ProtocolError(f"the ACK answers request {ack.request_nonce.hex()}, not this "
                                f"one ({nonce_of(frame).hex()})", reason="nonce")
        if ack.status is not AckStatus.BUSY or time.monotonic() + pause >= deadline:
            return got
        time.sleep(pause)
        pause = min(pause * 2, _BUSY_PAUSE_MAX)


def _address(cfg: Config) -> address.Address:
    """Root asks on gecod's privileged socket (no user's flood in its way); others on the
    public one."""
    public = address.parse(cfg.gecod_socket)
    if os.geteuid() == 0:
        root = address.privileged(cfg.gecod_privileged_socket, public)
        if root.path is not None and os.path.exists(root.path):
            return root
    return public


def quarantine_self(cfg: Config, job_id: int, task_id: int,
                    timeout: float | None = None) -> Ack:
    """Ask gecod to move this process into the cgroups of job ``job_id.task_id``.

    gecod grants it when the caller runs as the job's owner (or root) and
    descends from that job's ``sge_shepherd`` (the starter_method does).

    Parameters
    ----------
    cfg: the configuration (``[gecod] socket``, ``request_timeout``, ``max_skew``).
    job_id, task_id: the job task (task 1 for a job that is not an array).
    timeout: seconds for the whole exchange; default ``[gecod] request_timeout``.

    Returns
    -------
    gecod's ACK, status OK: this process is in the job's cgroups.

    Raises
    ------
    GecodUnavailable
        (and its GecodNotRunning, GecodTimeout) when gecod cannot be asked.
    GecodRefused
        when gecod answers anything but OK (``status`` says what).
    GecoError
        a socket that is not a Unix socket in a root-only directory, or a reply
        that fails a protocol check (ProtocolError).
    """
    got = _ask(cfg, MsgType.QUARANTINE_SELF, JobStarted(job_id, task_id, os.getpid()), timeout)
    if got.type is not MsgType.ACK:
        raise ProtocolError(f"the reply must be an ACK, got {got.type.name}", reason="type")
    ack = _ack_of(got)
    if ack.status is not AckStatus.OK:
        raise GecodRefused(ack.status, job=job_id, task=task_id)
    return ack


def status(cfg: Config, timeout: float | None = None) -> dict[str, Any]:
    """Ask gecod what it contains on this node.

    Parameters
    ----------
    cfg: the configuration (as for :func:`quarantine_self`).
    timeout: seconds for the whole exchange; default ``[gecod] request_timeout``.

    Returns
    -------
    gecod's STATUS document: ``{"version", "jobs": [{key, cpus, mems, memory,
    memory_swap, pids}], "job_count", "truncated", "cpus_in_use",
    "available_cpus", "pid", "host", "uptime", ...}``.

    Raises
    ------
    GecodUnavailable, GecodRefused, GecoError
        as :func:`quarantine_self`.
    """
    got = _ask(cfg, MsgType.STATUS, b"", timeout)
    if got.type is MsgType.ACK:
        raise GecodRefused(_ack_of(got).status)
    msg = got.message
    if not isinstance(msg, StatusReply):
        raise ProtocolError(f"the reply to STATUS must be a STATUS_REPLY, got {got.type.name}",
                            reason="type")
    return msg.document
