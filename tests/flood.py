"""A hostile local user against gecod's public socket: held connections, STATUS and garbage floods.

:func:`flooding` forks a process that drops to ``uid`` (65534 by default, a user
with no business with gecod) and, until the with-block ends:

* ``hold``: keeps that many connections open (reopening every one gecod closes,
  so it is a connect flood as well);
* ``status``: that many threads send STATUS requests back to back (no key needed:
  PEERCRED frames), each waiting for its answer;
* ``garbage``: that many connections (in total, as fast as it can) each sending
  64 random bytes and closing.

The with-block gets a :class:`Flood` whose ``stats`` (after the block) count what
the flooder did and what it got back. Used by the integration tests and
``bench/bench_flood.py``.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import multiprocessing.connection
import os
import resource
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from geco.errors import ProtocolError
from geco.wire.frame import PEERCRED, PUBLIC_KEY, encode
from geco.wire.messages import Ack, MsgType
from geco.wire.reader import read_frame

NOBODY = 65534
# the flooder's fd limit: the held connections plus the threads' own
_NOFILE = 8192


@dataclass
class Flood:
    """What the flooder did; ``stats`` is filled when the with-block ends."""

    stats: Counter[str] = field(default_factory=Counter)


def _connect(path: str, stats: Counter[str], lock: threading.Lock) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except OSError as exc:
        s.close()
        with lock:
            stats[f"connect {errno.errorcode.get(exc.errno or 0, exc.errno)}"] += 1
        return None
    with lock:
        stats["connected"] += 1
    return s


def _hold(path: str, count: int, stop: threading.Event, stats: Counter[str],
          lock: threading.Lock) -> None:
    held: list[socket.socket] = []
    while not stop.is_set():
        while len(held) < count and not stop.is_set():
            s = _connect(path, stats, lock)
            if s is None:
                time.sleep(0.01)
                break
            held.append(s)
        with lock:
            stats["held max"] = max(stats["held max"], len(held))
        # a connection gecod closed reads as EOF: drop it (the loop above reopens it)
        for chunk in range(0, len(held), 512):
            ready, _, _ = select.select(held[chunk:chunk + 512], [], [], 0)
            for s in ready:
                with contextlib.suppress(OSError):
                    s.recv(4096)
                s.close()
                with lock:
                    stats["held closed by gecod"] += 1
        held = [s for s in held if s.fileno() >= 0]
        time.sleep(0.05)
    for s in held:
        s.close()


def _status(path: str, stop: threading.Event, stats: Counter[str],
            lock: threading.Lock) -> None:
    while not stop.is_set():
        frame = encode(MsgType.STATUS, b"", PUBLIC_KEY,
                       flags=PEERCRED)
        outcome = "status answered"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(path)
                s.sendall(frame)
                reply = read_frame(s, time.monotonic() + 5)
            if reply[5] == MsgType.ACK:
                outcome = f"status {Ack.unpack(reply[36:-32]).status.name}"
        except (OSError, ProtocolError) as exc:
            outcome = f"status failed: {type(exc).__name__}"
        with lock:
            stats[outcome] += 1


def _garbage(path: str, count: int, stop: threading.Event, stats: Counter[str],
             lock: threading.Lock) -> None:
    sent = 0
    while sent < count and not stop.is_set():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
                s.send(os.urandom(64))
        except OSError as exc:
            with lock:
                stats[f"garbage {errno.errorcode.get(exc.errno or 0, exc.errno)}"] += 1
            time.sleep(0.001)
            continue
        sent += 1
    with lock:
        stats["garbage sent"] = sent


def _flooder(path: str, uid: int, hold: int, status: int, garbage: int,
             conn: multiprocessing.connection.Connection) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_NOFILE, _NOFILE))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    stats: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    threads = [threading.Thread(target=_status, args=(path, stop, stats, lock))
               for _ in range(status)]
    if hold:
        threads.append(threading.Thread(target=_hold, args=(path, hold, stop, stats, lock)))
    if garbage:
        threads.append(threading.Thread(target=_garbage,
                                        args=(path, garbage, stop, stats, lock)))
    started = time.monotonic()
    for t in threads:
        t.start()
    conn.send("started")
    if garbage and not (hold or status):
        threads[-1].join()  # garbage alone: done when all are sent
    else:
        conn.recv()  # the with-block ended
    stop.set()
    for t in threads:
        t.join()
    stats["seconds"] = round(time.monotonic() - started)
    conn.send(dict(stats))


@contextlib.contextmanager
def flooding(path: str, *, uid: int = NOBODY, hold: int = 0, status: int = 0,
             garbage: int = 0) -> Iterator[Flood]:
    """Flood gecod's public socket at ``path`` as ``uid`` for the with-block (see above)."""
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_flooder, args=(path, uid, hold, status, garbage, theirs))
    proc.start()
    flood = Flood()
    try:
        if not ours.poll(30):
            raise RuntimeError("the flooder did not start")
        ours.recv()
        yield flood
    finally:
        if hold or status or not garbage:
            with contextlib.suppress(OSError):
                ours.send("stop")
        if ours.poll(600):
            flood.stats.update(ours.recv())
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()


def send_garbage(path: str, count: int, *, uid: int = NOBODY) -> Counter[str]:
    """Send ``count`` garbage connections to ``path`` as ``uid``; return the stats once
    all are sent."""
    with flooding(path, uid=uid, garbage=count) as flood:
        pass
    return flood.stats
