"""Reading one frame from a blocking socket: a client's reply, another host's answer.

gecod reads its requests without blocking, in its loop (:mod:`geco.daemon.server`).
"""

from __future__ import annotations

import socket
import time

from geco.errors import ProtocolError
from geco.wire.frame import LENGTH_PREFIX, expected_length
from geco.wire.messages import MAX_PAYLOAD

__all__ = ["read_frame"]


def read_frame(sock: socket.socket, deadline: float, max_payload: int = MAX_PAYLOAD) -> bytes:
    """Read exactly one frame from a blocking socket.

    Parameters
    ----------
    sock:
        A connected stream socket (its timeout is changed).
    deadline:
        ``time.monotonic()`` by which the whole frame must have arrived.
    max_payload:
        The channel's cap.

    Returns
    -------
    The frame's bytes, ready for :func:`geco.wire.frame.decode`; nothing past it is read.

    Raises
    ------
    ProtocolError
        ``timeout`` at the deadline, ``closed`` when the peer closed before a
        whole frame, or a shape reason from :func:`expected_length`.
    OSError
        for other socket errors.
    """
    buf = bytearray()
    want: int | None = None
    while want is None or len(buf) < want:
        # read no further than this frame: header first, then exactly the rest
        need = (LENGTH_PREFIX if want is None else want) - len(buf)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProtocolError(f"no whole frame before the deadline: got {len(buf)} bytes",
                                reason="timeout")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(need)
        except TimeoutError:
            raise ProtocolError(f"no whole frame before the deadline: got {len(buf)} bytes",
                                reason="timeout") from None
        if not chunk:
            raise ProtocolError(f"the peer closed the connection after {len(buf)} bytes of a "
                                f"frame", reason="closed")
        buf += chunk
        if want is None:
            want = expected_length(bytes(buf), max_payload)
    return bytes(buf)
