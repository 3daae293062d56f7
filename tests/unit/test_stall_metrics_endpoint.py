"""gecod's Prometheus endpoint (:mod:`geco.daemon.metrics`) under clients that hold it:
its clients are served together, each peer address within its share of connections and
all of them within the total, and a handover answers every client taken.

The endpoint is a real one on a loopback port, in this process; the clients are plain
sockets bound to addresses of 127.0.0.0/8, one peer each. The request deadline is set
far above the test's waits, so a connection closed here was closed for a share, never
at its deadline.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from geco.daemon import metrics
from geco.daemon.metrics import Listen

WAIT = 10.0
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
HALF = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"


class _Body:
    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def prepare(self) -> None:
        pass

    def render(self) -> bytes:
        return b"up 1\n"


class _Big(_Body):
    def render(self) -> bytes:
        return b"x" * (32 << 20)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[metrics.Endpoint]:
    monkeypatch.setattr(metrics, "_READ_DEADLINE", 3 * WAIT)
    e = metrics.Endpoint(metrics.listener(Listen("127.0.0.1", 0)), _Body(), "test")
    e.start()
    try:
        yield e
    finally:
        e.close()


def _until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
        time.sleep(0.01)


def _connect(e: metrics.Endpoint, source: str, stack: contextlib.ExitStack,
             send: bytes = b"") -> socket.socket:
    s = stack.enter_context(socket.socket())
    s.bind((source, 0))
    s.settimeout(WAIT)
    s.connect(e.listener.getsockname())
    s.sendall(send)
    return s


def _reply(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _ask(e: metrics.Endpoint, source: str) -> bytes:
    with contextlib.ExitStack() as stack:
        return _reply(_connect(e, source, stack, REQUEST))


def _closed_by_endpoint(s: socket.socket) -> bool:
    return bool(select.select([s], [], [], 0)[0]) and s.recv(1) == b""


def _held(e: metrics.Endpoint, peer: str) -> int:
    return len(e._by_peer.get(peer, {}))


def test_a_scrape_is_answered_while_silent_and_half_head_clients_hold_connections(
        endpoint: metrics.Endpoint) -> None:
    """Given 30 silent clients and 10 that sent half a head, all still within their
    deadline, when another asks, then it is answered at once (one client at a time, it
    waited for every deadline before its own)."""
    with contextlib.ExitStack() as stack:
        for i in range(40):
            _connect(endpoint, f"127.0.1.{i + 1}", stack, HALF if i % 4 == 0 else b"")
        _until(lambda: len(endpoint._clients) == 40, "the 40 clients taken")
        assert _ask(endpoint, "127.0.0.1") == b"HTTP/1.1 200 OK\r\nContent-Type: " \
            b"text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: 5\r\n" \
            b"Connection: close\r\n\r\nup 1\n"
        assert len(endpoint._clients) == 40  # nobody was dropped for it
    assert endpoint.served == 1


def test_a_peer_over_its_share_has_its_oldest_silent_connections_closed(
        endpoint: metrics.Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a share of 4 connections per peer, when one address opens 6 silent ones,
    then its 2 oldest are closed, its 4 newest held, and another address is served; a
    request head from the peer itself is still answered (its oldest silent one goes)."""
    monkeypatch.setattr(metrics, "PER_PEER_CONNECTIONS", 4)
    with contextlib.ExitStack() as stack:
        held = [_connect(endpoint, "127.0.0.9", stack) for _ in range(6)]
        for s in held[:2]:
            assert s.recv(1) == b"", "over the share, yet not closed"
        _until(lambda: _held(endpoint, "127.0.0.9") == 4, "the peer's 4 held")
        assert not any(_closed_by_endpoint(s) for s in held[2:])
        assert _ask(endpoint, "127.0.0.10").startswith(b"HTTP/1.1 200 OK")
        assert _ask(endpoint, "127.0.0.9").startswith(b"HTTP/1.1 200 OK")
        assert held[2].recv(1) == b"" and not _closed_by_endpoint(held[3])
        assert _held(endpoint, "127.0.0.9") == 3  # its answered scrape is closed
        assert endpoint.refused == 3 and endpoint.served == 2


def test_the_total_closes_the_oldest_silent_connection_of_any_peer(
        endpoint: metrics.Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a total of 4 connections, when 5 addresses each open a silent one, then the
    first address's is closed, the others held, and a sixth address is served."""
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 4)
    with contextlib.ExitStack() as stack:
        held = []
        for i in range(5):
            held.append(_connect(endpoint, f"127.0.2.{i + 1}", stack))
            taken = min(i + 1, 4)
            _until(lambda n=taken: len(endpoint._clients) == n, "the client taken")
        assert held[0].recv(1) == b""
        assert not any(_closed_by_endpoint(s) for s in held[1:])
        assert _ask(endpoint, "127.0.2.6").startswith(b"HTTP/1.1 200 OK")
        assert len(endpoint._clients) == 3 and "127.0.2.1" not in endpoint._by_peer


def test_a_connection_being_answered_is_closed_for_a_share_only_when_none_is_reading(
        endpoint: metrics.Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a share of 2, a client that never reads a big reply and a silent one from
    the same address, when a third connects, then the silent one goes, not the reply."""
    monkeypatch.setattr(metrics, "PER_PEER_CONNECTIONS", 2)
    endpoint.body = _Big()
    with contextlib.ExitStack() as stack:
        lazy = stack.enter_context(socket.socket())
        lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lazy.bind(("127.0.0.11", 0))
        lazy.connect(endpoint.listener.getsockname())
        lazy.sendall(REQUEST)
        _until(lambda: any(c.out for c in endpoint._clients), "the reply under way")
        silent = _connect(endpoint, "127.0.0.11", stack)
        _until(lambda: _held(endpoint, "127.0.0.11") == 2, "both held")
        _connect(endpoint, "127.0.0.11", stack)
        assert silent.recv(1) == b""
        assert not _closed_by_endpoint(lazy)


def test_a_handover_answers_every_client_taken_even_with_its_head_still_coming(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given 5 clients half way through their heads, when the endpoint closes for a
    handover (``finish``), then each gets its reply once its head is whole, and the
    close returns after the last."""
    monkeypatch.setattr(metrics, "_READ_DEADLINE", 3 * WAIT)
    endpoint = metrics.Endpoint(metrics.listener(Listen("127.0.0.1", 0)), _Body(), "test")
    endpoint.start()
    with contextlib.ExitStack() as stack:
        clients = [_connect(endpoint, f"127.0.3.{i + 1}", stack, HALF) for i in range(5)]
        _until(lambda: len(endpoint._clients) == 5, "the 5 clients taken")
        closer = threading.Thread(target=endpoint.close, kwargs={"finish": True})
        closer.start()
        _until(endpoint._closing.is_set, "the handover's close")
        for s in clients:
            s.sendall(b"\r\n")
        replies = [_reply(s) for s in clients]
        closer.join(timeout=WAIT)
    assert all(r.startswith(b"HTTP/1.1 200 OK\r\n") and r.endswith(b"up 1\n")
               for r in replies), replies
    assert not closer.is_alive() and endpoint.listener.fileno() == -1
