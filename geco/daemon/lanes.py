"""gecod's lanes and connections: what each listening socket and each client holds.

A :class:`Lane` is one listening socket of gecod's server (root's, the public one,
the cluster channel) with its own :class:`Budget` of connections and requests, split
per peer; a :class:`Connection` is one client's request and reply, as far as they
came (:class:`Phase`). The server (:mod:`geco.daemon.server`) drives both.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from geco.daemon.context import Peer
from geco.daemon.fastlane import FastLane
from geco.daemon.runloop import Timer
from geco.pools import Keys, Pool
from geco.wire.address import Address
from geco.wire.frame import MAX_FRAME, Frame, Header
from geco.wire.messages import CLUSTER_MAX_PAYLOAD, MAX_PAYLOAD
from geco.wire.replay import Replay

__all__ = ["CLUSTER_BUDGET", "PUBLIC_BUDGET", "Budget", "Channel", "Connection", "Lane",
           "Phase", "Who", "discard_unread", "peer_of", "pid_of", "root_budget", "tcp_peer",
           "uncount"]

# SO_PEERCRED's struct ucred: pid, uid, gid (three C ints).
_UCRED = struct.Struct("3i")
# Requests waiting for or in a worker, per worker thread, before new ones get BUSY.
_QUEUE_PER_WORKER = 64
# At most this many reads of leftover client bytes before closing (see discard_unread).
_DISCARD_CHUNKS = 4


@dataclass(frozen=True, slots=True)
class Budget:
    """What the clients of one lane may hold at once.

    Open connections beyond ``connections`` are closed at once; each costs two
    fds (socket, pidfd) until its deadline (gecod.service sets LimitNOFILE well
    above twice the lanes' sum). Requests beyond ``working`` get BUSY. The
    per-peer limits (None: none) split the same way among the peers (a uid on a
    Unix socket, an address over TCP); a peer at its connection share has its
    oldest connection that has not sent a whole frame closed for the new one.
    """

    connections: int
    working: int
    per_peer_connections: int | None = None
    per_peer_working: int | None = None


def root_budget(workers: int) -> Budget:
    """The privileged lane's: only root gets here, so no per-peer split."""
    return Budget(connections=1024, working=workers * _QUEUE_PER_WORKER)


# The public lane's: a user's `geco status` and a few job starts through the starter's
# fallback at once fit easily; a flood fills only its sender's share.
PUBLIC_BUDGET = Budget(connections=1024, working=2 * _QUEUE_PER_WORKER,
                       per_peer_connections=64, per_peer_working=8)
# The cluster lane's: a host asks once per job start, end and login; a frame needs
# milliseconds, so a handful of connections per host is plenty, and the rest of the
# hosts' shares stay free whatever one host's users do with its address.
CLUSTER_BUDGET = Budget(connections=1024, working=256, per_peer_connections=16,
                        per_peer_working=16)


Who = int | str | None
"""A budget's peer: a uid on a Unix socket, an address over TCP (None: root's lane)."""


class Channel(Protocol):
    """The cluster channel's side of its lane (:class:`geco.daemon.clusterserve.ClusterChannel`)."""

    key: bytes

    @property
    def replay(self) -> Replay:
        """The channel's replay cache."""

    def admits(self, host: str) -> str:
        """"" when ``host`` (an address) may connect, else why not."""

    def accept(self, got: Frame, peer: str) -> tuple[Pool, Keys, Callable[[], object]]:
        """Where the verified frame ``got`` from ``peer`` runs, as which keys, and the work
        (returning the reply's document); raises ProtocolError when it is not a request of
        this channel for this host."""


class Phase(enum.Enum):
    """Where a connection is in its one request and reply (the server's docstring)."""

    READING = "reading"
    WORKING = "working"
    WRITING = "writing"
    CLOSED = "closed"


@dataclass(eq=False)
class Lane:
    """One listening socket with its own connections and budget.

    Parameters
    ----------
    name: ``root``, ``public`` or ``cluster`` (journaled as ``LANE``).
    listener: a listening stream socket (:func:`geco.wire.address.listen`).
    address: where it listens (for messages).
    budget: what its clients may hold at once.
    inline: JOB_STARTED for a job gecod has seen is served in the loop, not a worker
        (root's lane: its clients are trusted; the public lane's could queue the loop).
    fast: the C lane that accepts this socket (:mod:`geco.daemon.fastlane`): the loop then
        gets only the connections it hands back.
    channel: the cluster channel (its key, replay cache, allow-list and requests): this
        lane takes other hosts' frames, nothing else.
    """

    name: str
    listener: socket.socket | None
    address: Address | str
    budget: Budget
    inline: bool = False
    fast: FastLane | None = None
    channel: Channel | None = None
    connections: set[Connection] = field(default_factory=set)
    working: int = 0
    # each peer's open connections, oldest first (dicts keep insertion order)
    open_by_peer: dict[Who, dict[Connection, None]] = field(default_factory=dict)
    working_by_peer: Counter[Who] = field(default_factory=Counter)
    warned_full: bool = False

    @property
    def max_payload(self) -> int:
        return CLUSTER_MAX_PAYLOAD if self.channel is not None else MAX_PAYLOAD


@dataclass(eq=False, slots=True)
class Connection:
    """One client's connection: its one request, as far as it came, and its reply."""

    sock: socket.socket
    peer: Peer | None
    lane: Lane
    host: str | None = None  # over TCP: the peer's address (its budget) and port
    port: int = 0
    pidfd: int = -1
    phase: Phase = Phase.READING
    buf: bytearray = field(default_factory=bytearray)
    header: Header | None = None  # parsed once, when its 36 bytes are in
    out: bytes = b""
    deadline: Timer | None = None
    accepted: float = field(default_factory=time.monotonic)
    claimed: tuple[int | None, int | None, int | None] = (None, None, None)
    peercred: bool = False  # the header has the PEERCRED flag (answer in kind)
    # the frame passed its MAC with a secret key: the job it names is the sender's word,
    # not anyone's (a refusal before that is journaled with CLAIMED_JOB_ID, never JOB_ID)
    verified: bool = False
    recorded: bool = False  # the fast lane put the nonce in the replay cache already
    died: bool = False  # the fast lane moved the pid, then found the process gone
    watched: bool = False  # registered with the loop (it had to wait for bytes or room)

    @property
    def uid(self) -> int | None:
        """The sender's uid as the kernel names it (None over TCP)."""
        return self.peer.uid if self.peer else None

    @property
    def who(self) -> Who:
        """Whose budget this connection counts against."""
        return self.host if self.host is not None else self.uid

    def describe(self) -> str:
        if self.host is not None:
            return f"{self.host} port {self.port}"
        if self.peer is None:
            return "a TCP client"
        return f"pid {self.peer.pid} uid {self.peer.uid}"


def peer_of(sock: socket.socket) -> Peer | None:
    """The kernel's word on who connected (Unix sockets only; None over TCP)."""
    if sock.family != socket.AF_UNIX:
        return None
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _UCRED.size))
    return Peer(pid, uid, gid)



def tcp_peer(addr: object) -> tuple[str | None, int]:
    """A TCP peer's address and port as accept() gave them (an IPv4 peer of a dual-stack
    socket as its IPv4 address); (None, 0) for a Unix socket's."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return None, 0
    return str(addr[0]).removeprefix("::ffff:"), int(addr[1])


def discard_unread(sock: socket.socket) -> None:
    """Read away what the client sent beyond its frame (a refused oversized one, say).

    Closing a socket with unread data makes the kernel reset the connection
    (Unix sockets too: the peer's next recv fails with ECONNRESET), and the
    client could lose the ACK that says why it was refused.
    """
    with contextlib.suppress(OSError):
        for _ in range(_DISCARD_CHUNKS):
            if not sock.recv(MAX_FRAME):
                return


def pid_of(conn: Connection) -> int | None:
    return conn.peer.pid if conn.peer else None


def uncount(counter: Counter[Who], who: Who) -> None:
    """One less for ``who``; the entry goes at 0, so a flood of peers leaves nothing behind."""
    counter[who] -= 1
    if counter[who] <= 0:
        del counter[who]

