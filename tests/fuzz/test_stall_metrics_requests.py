"""Request fuzzing of gecod's Prometheus endpoint (:mod:`geco.daemon.metrics`).

Whatever a client sends as its request head, the endpoint answers with one HTTP reply
(200 for ``GET``/``HEAD`` of ``/metrics`` and ``/``, else 400, 404, 405 or 431) or,
while the head is not whole, waits for more; it never raises, never hangs, and serves
the next client. Two levels:

* the parser, :func:`geco.daemon.metrics.reply_to`, on random bytes, mutations of real
  heads and heads made of HTTP's pieces;
* a real endpoint on a loopback port, in this process, sent the same heads in random
  pieces (each client half-closes: a head never whole ends with no reply), then asked
  for its metrics.

``GECO_FUZZ_EXAMPLES=<n>`` runs ``n`` examples per test (see ``fuzzkit``).
"""

from __future__ import annotations

import itertools
import re
import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from geco.daemon import metrics
from geco.daemon.metrics import Listen, reply_to
from tests.fuzz import fuzzkit
from tests.logkit import RecordingHandler, handler_on

WAIT = 10.0
GOOD = b"GET /metrics HTTP/1.1\r\nHost: node1:9477\r\nAccept: text/plain\r\n\r\n"
BODY = b"geco_node_jobs 1\n"
STATUS = re.compile(rb"HTTP/1\.1 (200|400|404|405|431) [A-Za-z ]+\r\n")
TRIED = {"inputs": 0}


class _Body:
    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def prepare(self) -> None:
        pass

    def render(self) -> bytes:
        return BODY


# heads made of what HTTP heads are made of, in any order and number
TOKENS = [b"GET", b"HEAD", b"POST", b"get", b" ", b"  ", b"/", b"/metrics", b"/metrics?x=1",
          b"?", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.", b"\r\n", b"\n", b"\r",
          b"\r\n\r\n", b"\n\n", b":", b"Host: x", b"\x00", b"\xff", b"\xc3\xa9", b"%00",
          b"/" * 300, b"a" * 4000, b"\t"]
heads = (st.binary(max_size=600)
         | st.lists(st.sampled_from(TOKENS), max_size=40).map(b"".join)
         | st.tuples(st.binary(max_size=60), st.integers(0, len(GOOD)),
                     st.integers(0, len(GOOD))).map(
             lambda t: GOOD[:t[1]] + t[0] + GOOD[t[2]:])
         | st.integers(8000, 9000).map(lambda n: b"GET /" + b"m" * n + b" HTTP/1.1\r\n\r\n"))


def _check(data: bytes) -> bytes | None:
    """reply_to's answer to ``data``, checked: None only for a head not whole within the
    limit, else one whole reply."""
    TRIED["inputs"] += 1
    answer = reply_to(data, _Body())
    whole = b"\r\n\r\n" in data or b"\n\n" in data
    if answer is None:
        assert not whole and len(data) <= metrics._MAX_REQUEST
        return None
    reply, page = answer
    head, _, body = reply.partition(b"\r\n\r\n")
    assert STATUS.match(reply), reply[:100]
    assert page == reply.startswith(b"HTTP/1.1 200 ")
    length = int(re.search(rb"\r\nContent-Length: (\d+)\r\n", head + b"\r\n")[1])  # type: ignore[index]
    assert length == len(body) or (body == b"" and data.startswith(b"HEAD "))
    assert b"\r\nConnection: close" in head
    return reply


@fuzzkit.fuzz_settings(3000)
@given(data=heads)
@example(data=GOOD)
@example(data=b"HEAD / HTTP/1.0\n\n")
@example(data=b"\r\n\r\n")
@example(data=b" " * 2 + b"\r\n\r\n")
@example(data=b"a" * 8192)
@example(data=b"a" * 8193)
def test_any_request_head_gets_one_reply_or_waits_for_more(data: bytes) -> None:
    _check(data)


@pytest.fixture(scope="module")
def logged() -> Iterator[RecordingHandler]:
    """Every record of geco's loggers (a module-long caplog: hypothesis runs many examples
    in one test)."""
    kept = RecordingHandler()
    with handler_on("geco", kept):
        yield kept


@pytest.fixture(scope="module")
def endpoint(logged: RecordingHandler) -> Iterator[metrics.Endpoint]:
    e = metrics.Endpoint(metrics.listener(Listen("127.0.0.1", 0)), _Body(), "fuzz")
    e.start()
    try:
        yield e
    finally:
        e.close()


def _exchange(e: metrics.Endpoint, pieces: list[bytes]) -> bytes:
    """Send ``pieces`` one by one, half-close, and read until the endpoint closes (a reset
    after a 431, closed with bytes of ours unread, may cost the reply)."""
    with socket.create_connection(e.listener.getsockname(), timeout=WAIT) as s:
        reply = b""
        try:
            for piece in pieces:
                s.sendall(piece)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                reply += chunk
        except OSError:
            pass  # closed by the endpoint already (reset, or gone before the half-close)
    return reply


@fuzzkit.fuzz_settings(400)
@given(data=heads, cuts=st.lists(st.integers(0, 700), max_size=4))
@example(data=GOOD, cuts=[1, 5, 20])
def test_the_endpoint_answers_any_head_in_any_pieces_and_serves_on(
        endpoint: metrics.Endpoint, logged: RecordingHandler, data: bytes, cuts: list[int]) -> None:
    """Given a head sent in pieces, then the reply is the parser's (the endpoint answers
    what it read: at most one byte over the limit), or none when the head is not whole,
    and the next client is served."""
    TRIED["inputs"] += 1
    at = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in itertools.pairwise(at)]
    started = time.monotonic()
    reply = _exchange(endpoint, pieces)
    expected = _check(data[:metrics._MAX_REQUEST + 1])
    if reply:  # none: the head never whole, or a reset after a reply (431 and unread)
        assert expected is not None and reply == expected, (reply[:200], data[:200])
    assert _exchange(endpoint, [GOOD]) == expected_good()
    assert time.monotonic() - started < WAIT, "the endpoint took its time over a head"
    assert not [r for r in logged.records if r.exc_info], logged.records[-1].getMessage()


def expected_good() -> bytes:
    answer = reply_to(GOOD, _Body())
    assert answer is not None
    return answer[0]


def test_figures(endpoint: metrics.Endpoint) -> None:
    """Runs last in the module: how many heads were tried, and that the endpoint lived."""
    fuzzkit.record("metrics request heads tried", TRIED["inputs"])
    assert _exchange(endpoint, [GOOD]) == expected_good()
    assert endpoint._thread.is_alive()
