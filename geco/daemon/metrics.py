"""gecod's Prometheus endpoint: ``GET /metrics`` on ``[metrics] listen``, one thread
serving its clients together.

Every host that reaches the port may be hostile, so the endpoint costs gecod a bounded
amount whatever they send: one thread of its own (never a thread per connection, as
``prometheus_client``'s own server makes) with an event loop over its connections, at
most :data:`PER_PEER_CONNECTIONS` of them from one peer address and
:data:`MAX_CONNECTIONS` in all (a peer at its share, or the endpoint at its total, has
its oldest connection that has not sent a whole request head closed for the new one;
else its oldest), a deadline for the request head (:data:`_READ_DEADLINE`, from the
accept) and one for the reply (:data:`_WRITE_DEADLINE`), a request head of at most
:data:`_MAX_REQUEST` bytes, ``GET`` (and ``HEAD``) of ``/metrics`` and ``/`` only (404,
405, 400 or 431 otherwise, and the connection closed). A request head is answered as
soon as it is whole, so a client that connects and sends nothing, half a head, or reads
its reply a byte at a time holds one connection of its share until its deadline, never
the other clients, never gecod's workers. The body (:mod:`geco.usage.exposition`)
comes from memory: the usage sampler's last round and a few of the server's counters.

``[metrics] listen`` is ``"<IP address>:<port>"`` (``127.0.0.1:9477``,
``[::1]:9477``, ``0.0.0.0:9477``), or ``""``: off. A value that is not one is an error
at gecod's start (:func:`parse_listen`). A port that cannot be bound, or a node without
python3-prometheus-client, costs the metrics only: one line in the journal, and gecod
serves on without them (:func:`open_endpoint`). A handover (:mod:`geco.daemon.handover`)
passes the listening socket on, like gecod's others: a scrape never finds the port
closed, and the clients the old gecod took get their replies from it.
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
from geco.config import Config
from geco.errors import ConfigError, GecoError
from geco.wire import address

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.usage.sampler import Health, Snapshot

__all__ = ["MAX_CONNECTIONS", "PER_PEER_CONNECTIONS", "Endpoint", "Listen",
           "describe", "listener", "open_endpoint", "parse_listen", "reply_to"]

_log = log.get("daemon.metrics")

# Seconds a client has, from its accept, to send its whole request head (Prometheus
# sends it at once).
_READ_DEADLINE = 1.0
# Seconds a client has to read the whole reply (1 MB, a node of 1,000 jobs, needs 2 MB/s).
_WRITE_DEADLINE = 5.0
# Bytes of request head (request line and headers) read at most.
_MAX_REQUEST = 8192
# Connections held at once from one peer address: Prometheus needs one per scrape, the
# rest is room for a few servers behind one address (a proxy, an HA pair's NAT).
PER_PEER_CONNECTIONS = 16
# Connections held at once in all: each is an fd and, while it is written, its reply.
MAX_CONNECTIONS = 64
# Connections accepted in one pass of the loop, the clients taken are read in between.
_ACCEPT_BATCH = 16
# Connections the kernel queues until the loop accepts them; more are refused by the kernel.
_BACKLOG = 128
# Seconds the endpoint stops accepting after the process ran out of file descriptors.
_ACCEPT_PAUSE = 1.0
_EXAMPLES = "e.g. \"127.0.0.1:9477\" or \"[::1]:9477\"; \"\" = off"
_INDEX = b"geco: gecod's metrics are at /metrics\n"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class Body(Protocol):
    """What the endpoint serves (:class:`geco.usage.exposition.Renderer`)."""

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


def reply_to(data: bytes, body: Body) -> tuple[bytes, bool] | None:
    """The reply to a request whose first bytes are ``data``, and whether it is a page
    (not an error); None while its head is not whole and within :data:`_MAX_REQUEST`.

    Whatever a client sends is an answer or None here, never an exception.
    """
    if b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > _MAX_REQUEST:
            return _error(431, f"the request head is over {_MAX_REQUEST} bytes"), False
        return None
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not line.isascii():
        return _error(400, "not an HTTP/1 request"), False
    method, target = parts[0], parts[1].split(b"?", 1)[0]
    if method not in (b"GET", b"HEAD"):
        return _error(405, "only GET and HEAD", extra="Allow: GET, HEAD\r\n"), False
    head_only = method == b"HEAD"
    if target == b"/metrics":
        return _response(200, body.render(), body.content_type, head_only), True
    if target == b"/":
        return _response(200, _INDEX, head_only=head_only), True
    return _error(404, "no such page: the metrics are at /metrics"), False


def _peer(addr: object) -> str:
    """Whose share a connection counts against: the peer's address (an IPv4 client of a
    dual-stack socket as its IPv4 address)."""
    host = str(addr[0]) if isinstance(addr, tuple) and addr else ""
    return host.removeprefix("::ffff:")


@dataclass(eq=False, slots=True)
class _Client:
    """One connection: its request head as far as it came, then its reply's rest."""

    sock: socket.socket
    peer: str
    deadline: float  # monotonic: the head's, then the reply's
    data: bytes = b""
    out: memoryview | None = None  # the reply not sent yet (None: still reading)
    page: bool = False  # the reply is a page, not an error
    closed: bool = False


class Endpoint:
    """The endpoint's thread, its listening socket and its clients (see the module
    docstring).

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
        self.served = 0  # replies of /metrics (and /)
        self.refused = 0  # clients answered with an error, or dropped
        # the open connections, oldest first: all of them, and each peer's
        self._clients: dict[_Client, None] = {}
        self._by_peer: dict[str, dict[_Client, None]] = {}
        self._accepting = True
        self._paused_until = 0.0  # after EMFILE: accept again from then on
        sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closing = threading.Event()
        self._finishing = False  # closing for a handover: the clients taken get replies
        self._thread = threading.Thread(target=self._serve, name="gecod-metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, *, finish: bool = False) -> None:
        """Stop the thread and close the socket. The clients are dropped (a slow one
        does not hold gecod's stop up) unless ``finish`` (a handover: the successor takes
        the next clients, those taken get their replies, within their deadlines)."""
        self._finishing = finish
        self._closing.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._sel.close()
        self.listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the thread --------------------------------------------------------------

    def _serve(self) -> None:
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while self._running():
                self._pass(self._sel.select(self._timeout()))
                self._expire(time.monotonic())
        finally:
            for client in list(self._clients):
                self._drop(client)
            self._sel.close()

    def _running(self) -> bool:
        if not self._closing.is_set():
            return True
        if not self._finishing:
            return False
        self._stop_accepting()  # the successor accepts from here on
        return bool(self._clients)

    def _timeout(self) -> float | None:
        deadlines = [c.deadline for c in self._clients]
        if not self._accepting and self._paused_until:
            deadlines.append(self._paused_until)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _pass(self, ready: list[tuple[selectors.SelectorKey, int]]) -> None:
        """One round of what is ready: the clients first, then new connections (a head
        already in is answered before a burst of connections could evict its client)."""
        accept = False
        for key, _events in ready:
            client = key.data
            if isinstance(client, _Client):
                if not client.closed:
                    self._step(client)
            elif key.fileobj is self.listener:
                accept = True
            else:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 64)
        if accept and self._accepting and not self._closing.is_set():
            self._accept_batch()

    def _step(self, client: _Client) -> None:
        if client.out is None:
            self._read(client)
        else:
            self._write(client)

    def _expire(self, now: float) -> None:
        for client in [c for c in self._clients if c.deadline <= now]:
            self._drop(client)  # its head, or its reply, did not go through in time
        if self._paused_until and now >= self._paused_until and not self._closing.is_set():
            self._paused_until = 0.0
            self._accepting = True
            self._sel.register(self.listener, selectors.EVENT_READ)

    def _stop_accepting(self) -> None:
        if self._accepting:
            self._accepting = False
            self._sel.unregister(self.listener)

    def _accept_batch(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # taken by a gecod sharing the socket during a handover, or gone
            except OSError as exc:
                _log.warning("metrics: cannot accept a connection: %s", exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._stop_accepting()  # the clients taken are served meanwhile
                    self._paused_until = time.monotonic() + _ACCEPT_PAUSE
                return
            self._take(sock, _peer(addr))

    def _take(self, sock: socket.socket, peer: str) -> None:
        sock.setblocking(False)
        self._make_room(self._by_peer.get(peer, {}), PER_PEER_CONNECTIONS)
        self._make_room(self._clients, MAX_CONNECTIONS)
        client = _Client(sock, peer, time.monotonic() + _READ_DEADLINE)
        self._clients[client] = None
        self._by_peer.setdefault(peer, {})[client] = None
        self._sel.register(sock, selectors.EVENT_READ, client)
        self._read(client)  # Prometheus sends its head with the connect: answered at once

    def _make_room(self, among: dict[_Client, None], cap: int) -> None:
        """Close clients of ``among`` until it holds fewer than ``cap``: the oldest still
        sending its head (read once more first: it may be whole by now), else the
        oldest."""
        for client in list(among):
            if len(among) < cap:
                return
            if client.out is None and not client.closed:
                self._read(client)
                if not client.closed and client.out is None:
                    self._drop(client)
        while len(among) >= cap:  # every one is being answered
            self._drop(next(iter(among)))

    def _read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(_MAX_REQUEST + 1 - len(client.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client
            self._drop(client)
            return
        if not chunk:  # closed before its head was whole
            self._drop(client)
            return
        client.data += chunk
        try:
            reply = reply_to(client.data, self.body)
        except Exception:  # a bug: the client gets nothing, the endpoint serves on
            _log.exception("metrics: a scrape failed")
            self._drop(client)
            return
        if reply is not None:
            self._answer(client, *reply)

    def _answer(self, client: _Client, reply: bytes, page: bool) -> None:
        client.out, client.page = memoryview(reply), page
        client.deadline = time.monotonic() + _WRITE_DEADLINE  # the whole reply's
        self._sel.modify(client.sock, selectors.EVENT_WRITE, client)
        self._write(client)

    def _write(self, client: _Client) -> None:
        assert client.out is not None
        try:
            sent = client.sock.send(client.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            self._drop(client)
            return
        client.out = client.out[sent:]
        if client.out:
            return
        if client.page:
            self.served += 1
        else:
            self.refused += 1
        _discard_unread(client.sock)
        self._close(client)

    def _drop(self, client: _Client) -> None:
        self.refused += 1
        self._close(client)

    def _close(self, client: _Client) -> None:
        client.closed = True
        self._clients.pop(client, None)
        mine = self._by_peer.get(client.peer)
        if mine is not None:
            mine.pop(client, None)
            if not mine:  # a flood of addresses leaves nothing behind
                del self._by_peer[client.peer]
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(client.sock)
        client.sock.close()  # last: a client that sees its end sees the counts without it


def _discard_unread(sock: socket.socket) -> None:
    """Read away what the client sent beyond its head (a POST's body, the rest of one
    over 8 KiB): closed with bytes unread, the socket resets and the client may lose
    its reply."""
    with contextlib.suppress(OSError):
        for _ in range(4):
            if not sock.recv(1 << 16):
                return


def open_endpoint(cfg: Config, where: Listen, snapshot: Callable[[], Snapshot],
                  health: Callable[[], Health], node: str,
                  inherited: socket.socket | None = None) -> Endpoint | None:
    """The endpoint on ``where``, not started yet; None (and one line in the journal) when
    it cannot be: python3-prometheus-client missing, the address not bindable. The
    metrics are then missing, nothing else: gecod serves on.

    ``snapshot`` and ``health`` are :class:`geco.usage.exposition.Renderer`'s sources;
    call the endpoint's ``body.prepare`` after each sampler round.
    """
    try:
        from geco.usage import exposition
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
