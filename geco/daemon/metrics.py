"""gecod's Prometheus endpoint: ``GET /metrics`` on ``[metrics] listen``, one thread, one
client at a time.

Every host that reaches the port may be hostile, so the endpoint costs gecod a bounded
amount whatever they send: one thread of its own (never a thread per connection, as
``prometheus_client``'s own server makes), one connection at a time, a deadline for the
request (:data:`_READ_DEADLINE`) and one for the reply (:data:`_WRITE_DEADLINE`), a
request head of at most :data:`_MAX_REQUEST` bytes, ``GET`` (and ``HEAD``) of
``/metrics`` and ``/`` only (404, 405, 400 or 431 otherwise, and the connection closed).
A client that connects and sends nothing, or reads the reply a byte at a time, holds
the endpoint until its deadline and costs only the metrics, never gecod's workers.
The body (:mod:`geco.daemon.exposition`) comes from memory: the usage sampler's last
round and a few of the server's counters.

``[metrics] listen`` is ``"<IP address>:<port>"`` (``127.0.0.1:9477``,
``[::1]:9477``, ``0.0.0.0:9477``), or ``""``: off. A value that is not one is an error
at gecod's start (:func:`parse_listen`). A port that cannot be bound, or a node without
python3-prometheus-client, costs the metrics only: one line in the journal, and gecod
serves on without them (:func:`open_endpoint`). A handover (:mod:`geco.daemon.handover`)
passes the listening socket on, like gecod's others: a scrape never finds the port closed.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from geco import log
from geco._tuple import NamedTuple
from geco.config import Config
from geco.daemon.sampler import Snapshot
from geco.errors import ConfigError, GecoError
from geco.wire import address

__all__ = ["Endpoint", "Health", "Listen", "describe", "listener", "open_endpoint",
           "parse_listen"]

_log = log.get("gecod.metrics")

# Seconds a client has, from its accept, to send its whole request head (Prometheus
# sends it at once).
_READ_DEADLINE = 1.0
# Seconds a client has to read the whole reply (1 MB, a node of 1,000 jobs, needs 2 MB/s).
_WRITE_DEADLINE = 5.0
# Bytes of request head (request line and headers) read at most.
_MAX_REQUEST = 8192
# Connections the kernel queues while one is served; more are refused by the kernel.
_BACKLOG = 16
# Seconds the thread pauses accepting after the process ran out of file descriptors.
_ACCEPT_PAUSE = 1.0
_EXAMPLES = "e.g. \"127.0.0.1:9477\" or \"[::1]:9477\"; \"\" = off"
_INDEX = b"geco: gecod's metrics are at /metrics\n"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class Health(NamedTuple):
    """gecod's own counters at a scrape (memory reads only)."""

    requests: int
    refused: int
    queue_depth: int


class Body(Protocol):
    """What the endpoint serves (:class:`geco.daemon.exposition.Renderer`)."""

    content_type: str

    def prepare(self) -> None:
        """Make the part that changes once per sampler round (the sampler's thread)."""

    def render(self) -> bytes:
        """The body of ``/metrics``, now."""


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the endpoint listens: an IP address (v4 or v6) and a TCP port."""

    host: str
    port: int

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen | None:
    """``[metrics] listen`` read: None when it is ``""`` (off).

    Raises
    ------
    ConfigError
        naming the value and what is wrong with it.
    """
    if not text:
        return None

    def bad(why: str) -> ConfigError:
        return ConfigError(f"[metrics] listen = {text!r} {why} ({_EXAMPLES})")

    host, colon, port = text.rpartition(":")
    if not colon:
        raise bad("names no port: it must be <address>:<port>")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise bad("puts an IPv4 address in brackets: brackets are for IPv6 only")
    elif ":" in host:
        raise bad("must put an IPv6 address in brackets, [address]:port")
    if not host:
        raise bad("names no address: give the one Prometheus reaches (0.0.0.0 for all)")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise bad(f"does not name an IP address: {host!r} (a host name is not taken: "
                  f"give the address itself)") from None
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise bad(f"does not name a TCP port 1..65535: {port!r}")
    return Listen(ip.compressed, int(port))


def describe(cfg: Config) -> str:
    """One line for ``geco check``: where the endpoint listens, or why it would not."""
    try:
        where = parse_listen(cfg.metrics_listen)
    except ConfigError as exc:
        return str(exc)
    if where is None:
        return "no Prometheus endpoint ([metrics] listen = \"\")"
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return (f"[metrics] listen = {str(where)!r}, but python3-prometheus-client is not "
                f"installed: gecod serves no metrics")
    return f"gecod serves Prometheus metrics on http://{where}/metrics"


def _bind(where: Listen) -> socket.socket:
    sock = socket.socket(where.family, socket.SOCK_STREAM)
    try:
        # a restarted gecod binds at once beside connections in TIME_WAIT; a second
        # listener on the port is still refused (SO_REUSEADDR, not SO_REUSEPORT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((where.host, where.port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        holders = address.port_listeners(where.port) if exc.errno == errno.EADDRINUSE \
            else set()
        held = f" (listening there: uid {', '.join(map(str, sorted(holders)))})" \
            if holders else ""
        raise GecoError.from_oserror(f"cannot listen on {where}{held}", exc) from exc
    return sock


def _inherited_matches(sock: socket.socket, where: Listen) -> bool:
    try:
        name = sock.getsockname()
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        return False
    return bool(listening) and sock.family == where.family \
        and (ipaddress.ip_address(name[0]).compressed, name[1]) == (where.host, where.port)


def listener(where: Listen, inherited: socket.socket | None = None) -> socket.socket:
    """A socket listening on ``where``: ``inherited`` (from the gecod handing over) when
    it is that one, else a new one.

    Raises
    ------
    GecoError
        when the address cannot be bound (taken, not this host's).
    """
    if inherited is not None:
        if _inherited_matches(inherited, where):
            return inherited
        inherited.close()  # the configuration changed since: the predecessor's goes with it
    return _bind(where)


def _response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              head_only: bool = False, extra: str = "") -> bytes:
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n")
    return head.encode("ascii") + (b"" if head_only else body)


def _error(status: int, why: str, extra: str = "") -> bytes:
    return _response(status, f"{why}\n".encode(), extra=extra)


class Endpoint:
    """The endpoint's thread and its listening socket (see the module docstring).

    Parameters
    ----------
    sock: the listening socket (closed by :meth:`close`, never shut down: after a
        handover the successor listens on it still).
    body: what ``/metrics`` serves.
    where: what the journal calls it.
    """

    def __init__(self, sock: socket.socket, body: Body, where: str) -> None:
        self.listener = sock
        self.body = body
        self.where = where
        self.served = 0  # replies of /metrics
        self.refused = 0  # clients answered with an error, or dropped at a deadline
        self._conn: socket.socket | None = None  # the client being served
        sock.setblocking(False)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closing = threading.Event()
        self._finishing = False  # closing for a handover: the client taken gets its reply
        self._thread = threading.Thread(target=self._serve, name="gecod-metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, *, finish: bool = False) -> None:
        """Stop the thread and close the socket. A client being served is dropped (a slow
        one does not hold gecod's stop up) unless ``finish`` (a handover: the successor
        takes the next client, this one gets its reply, within the deadlines)."""
        self._finishing = finish
        self._closing.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        conn = self._conn
        if conn is not None and not finish:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the thread --------------------------------------------------------------

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing.is_set():
                ready = sel.select()
                if self._closing.is_set():
                    return
                if any(key.fileobj is self.listener for key, _ in ready):
                    self._accept_one()

    def _accept_one(self) -> None:
        try:
            conn, _peer = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # taken by a gecod sharing the socket during a handover, or gone
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                _log.warning("metrics: cannot accept a connection: %s", exc)
                time.sleep(_ACCEPT_PAUSE)  # this thread's own pause: nobody else waits
            else:
                _log.warning("metrics: cannot accept a connection: %s", exc)
            return
        self._conn = conn
        try:
            self._handle(conn)
        except OSError:  # the client went away, or missed its deadline
            self.refused += 1
        except Exception:  # a bug: the client gets nothing, gecod serves on
            self.refused += 1
            _log.exception("metrics: a scrape failed")
        finally:
            self._conn = None
            conn.close()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        """The request head (up to the blank line); None when over :data:`_MAX_REQUEST`.

        Raises OSError (TimeoutError) past the deadline or when the client went away.
        """
        deadline = time.monotonic() + _READ_DEADLINE
        data = b""
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            if len(data) > _MAX_REQUEST:
                return None
            left = deadline - time.monotonic()
            # closed mid-request with its bytes unread, the client would see a reset
            if left <= 0 or (self._closing.is_set() and not self._finishing):
                raise TimeoutError("the request did not come in time")
            conn.settimeout(left)
            chunk = conn.recv(_MAX_REQUEST + 1 - len(data))
            if not chunk:
                raise ConnectionResetError("the client closed before its request was whole")
            data += chunk
        return data

    def _handle(self, conn: socket.socket) -> None:
        head = self._read_head(conn)
        reply, ok = self._reply(head)
        conn.settimeout(_WRITE_DEADLINE)  # the whole reply's (sendall keeps one deadline)
        conn.sendall(reply)
        if ok:
            self.served += 1
        else:
            self.refused += 1

    def _reply(self, head: bytes | None) -> tuple[bytes, bool]:
        if head is None:
            return _error(431, f"the request head is over {_MAX_REQUEST} bytes"), False
        line = head.split(b"\n", 1)[0].rstrip(b"\r")
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not line.isascii():
            return _error(400, "not an HTTP/1 request"), False
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _error(405, "only GET and HEAD", extra="Allow: GET, HEAD\r\n"), False
        head_only = method == b"HEAD"
        if target == b"/metrics":
            return _response(200, self.body.render(), self.body.content_type, head_only), True
        if target == b"/":
            return _response(200, _INDEX, head_only=head_only), True
        return _error(404, "no such page: the metrics are at /metrics"), False


def open_endpoint(cfg: Config, where: Listen, snapshot: Callable[[], Snapshot],
                  health: Callable[[], Health], node: str,
                  inherited: socket.socket | None = None) -> Endpoint | None:
    """The endpoint on ``where``, not started yet; None (and one line in the journal) when
    it cannot be: python3-prometheus-client missing, the address not bindable. The
    metrics are then missing, nothing else: gecod serves on.

    ``snapshot`` and ``health`` are :class:`geco.daemon.exposition.Renderer`'s sources;
    call the endpoint's ``body.prepare`` after each sampler round.
    """
    try:
        from geco.daemon import exposition
    except ImportError as exc:
        if inherited is not None:
            inherited.close()
        _log.error("[metrics] listen = %r, but the Prometheus client library cannot be "
                   "imported (%s): install python3-prometheus-client and restart gecod; "
                   "serving without metrics", cfg.metrics_listen, exc,
                   extra=log.job_fields(None, None, "metrics-unavailable"))
        return None
    try:
        sock = listener(where, inherited)
    except GecoError as exc:
        _log.error("[metrics] %s; serving without metrics", exc,
                   extra=log.job_fields(None, None, "metrics-unavailable"))
        return None
    return Endpoint(sock, exposition.Renderer(snapshot, health, node), str(where))
