"""gecod's server: non-blocking connections on the runloop, slow work in pools of its own.

gecod listens on two sockets (three with the cluster channel), each a
:class:`Lane` with its own connections and request budget, so that no user can
crowd root out; each kind of request then runs in a pool of its own
(:mod:`geco.daemon.pools`: job starts, job ends, a user's requests, ssh logins,
other hosts' look-ups), bounded per uid, job or peer, so that nothing a user can
cause queues a job start or another user's login:

``root``
    the privileged socket (mode 0600): the preload's JOB_STARTED from sge_execd.
    Only root can connect (the kernel refuses everyone else), so nothing a user
    does fills its connection table, its queue or its workers.
``public``
    the 0666 socket: ``geco status`` (STATUS) and the starter's fallback
    (QUARANTINE_SELF), the starter (STARTER) and ssh sessions (ADOPT's EXEC
    stage), from any user. Each uid has a budget of its own: at most
    :data:`PUBLIC_BUDGET` ``per_peer_connections`` open connections (a new one
    closes the uid's oldest that has not sent a whole frame yet, so an idle
    flood costs only its sender, never its own next request) and
    ``per_peer_working`` requests waiting for or in a worker (more get BUSY).
``cluster``
    the TCP port other hosts' gecods ask (:mod:`geco.daemon.clusterserve`): the
    same budgets per peer address, after the allow-list (a host that is not an
    execution host is closed at accept). Its frames are MAC'd with the cluster key.

One connection carries one request and one reply (as the original). Each
connection is a small state machine driven by the runloop:

``READING``
    read the 36-byte header (magic, version, flags and length are checked as
    soon as their bytes arrive), then exactly the rest: payload and MAC.
    A client that has not sent a whole frame within
    ``[gecod] connection_deadline`` seconds is dropped (slowloris), one that
    closes early is dropped (truncated), one whose frame fails a check gets an
    ACK saying BAD_REQUEST (or VERSION) and is closed.
``WORKING``
    the frame is verified (MAC, clock, replay cache); the request runs in the
    pool of its kind (:func:`geco.daemon.quarantine.quarantine`, a STATUS scan, an ssh
    login, another host's request)
    and its result comes back through ``call_soon_threadsafe``. The loop keeps
    serving everyone else meanwhile.
``WRITING``
    the reply is sent without blocking (within another deadline), then the
    connection is closed.

Peer-credentialed frames (flag PEERCRED, MAC keyed with the public all-zero
key; ``docs/wire-format.md``) come from users without the key: the job
owner's starter (QUARANTINE_SELF) and ``geco status`` (STATUS). They are
accepted only on the Unix socket, where SO_PEERCRED names the sender (over
TCP they are refused as soon as their header arrives), and only for those two
types (the protocol layer refuses the flag on anything else, JOB_STARTED
included). Every other check applies as to any frame, and the reply is in
kind (PEERCRED, public-key MAC), since the asker could not check the secret
key's MAC. Their nonces go to a replay cache of their own, so a flood of
them (anyone can make them) can never fill the cache that guards JOB_STARTED.

Every refusal is journaled as ``GECO_EVENT=quarantine-refused`` (on the cluster
lane ``cluster-refused``; priority warning) with the peer's pid and uid as the
kernel gave them (its address over TCP), the claimed job, task and pid (as
``JOB_ID`` only when the frame passed its MAC with a secret key, else as
``CLAIMED_JOB_ID``: a stranger never writes into a job's story), and the reason;
every success as ``GECO_EVENT=quarantined`` (``ELAPSED_MS``: from the
connection's accept to the answer); both with
``LANE`` and with ``PEERCRED=1`` when the frame was peer-credentialed. A peer
gets a few refusal records per window, then one summary
(``GECO_EVENT=quarantine-refused-summary``), and a job a few hundred successes,
then one summary (``GECO_EVENT=quarantined-summary``; :mod:`geco.daemon.ratelimit`).
Nothing a client sends can stop the server: a bad client costs one socket
until its deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import errno
import functools
import os
import selectors
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from geco import __version__, log
from geco.config import Config
from geco.daemon import hookserve, sshlogin, status
from geco.daemon.fastlane import FastLane, Handoff
from geco.daemon.pools import Busy, Keys, Pool, Pools
from geco.daemon.quarantine import (
    Context,
    Outcome,
    Peer,
    Request,
    Shepherd,
    WouldWait,
    pid_reused,
    quarantine,
)
from geco.daemon.ratelimit import (
    REFUSAL_BURST,
    SUCCESS_BURST,
    JournalBudget,
    describe_refusals,
)
from geco.daemon.runloop import RunLoop, Timer
from geco.errors import ProtocolError
from geco.job.jobkey import JobKey
from geco.wire.address import Address
from geco.wire.protocol import (
    AFTER_MAC,
    CLUSTER_MAX_PAYLOAD,
    HEADER_BYTES,
    MAX_FRAME,
    MAX_PAYLOAD,
    Ack,
    AckStatus,
    Adopt,
    AdoptReply,
    Frame,
    Header,
    Hook,
    HookName,
    JobStarted,
    MsgType,
    Replay,
    ReplayCache,
    Starter,
    StarterReply,
    StatusReply,
    ack_for_error,
    claimed,
    claims_peercred,
    decode,
    encode,
    expected_length,
)

__all__ = ["CLUSTER_BUDGET", "PUBLIC_BUDGET", "Budget", "Channel", "Lane", "Server", "Who",
           "python_replay", "root_budget"]

_log = log.get("gecod")

# SO_PEERCRED's struct ucred: pid, uid, gid (three C ints).
_UCRED = struct.Struct("3i")
# Connections accepted per readiness event, so a connect flood cannot starve replies: on
# root's socket many (execd's children), on the others few, so that a flood of strangers'
# connections takes its turn with every other ready socket, not a whole loop turn each.
_ACCEPT_BATCH = {"root": 64}
_ACCEPT_BATCH_OTHERS = 8
# Requests waiting for or in a worker, per worker thread, before new ones get BUSY.
_QUEUE_PER_WORKER = 64
# At most this many reads of leftover client bytes before closing (see _discard_unread).
_DISCARD_CHUNKS = 4
# After EMFILE/ENFILE the listener stays readable; pause accepting instead of spinning.
_ACCEPT_PAUSE = 1.0
# Nonces of the replay cache without the fast lane (full of live ones, it refuses every
# request): Python alone answers up to about 5,000 JOB_STARTED a second on a small node
# (bench_gecod without the lane), and this holds 8,738 a second over the default 60 s
# window (2 x max_skew); 65,536 refused everything after 13 s at that rate. Memory grows
# with the rate: 170 bytes a nonce of the window (48 MiB at 4,700 a second).
_PYTHON_REPLAY_CAPACITY = 1 << 19


def python_replay(cfg: Config) -> ReplayCache:
    """The replay cache of the frames MAC'd with the secret key when the fast lane does
    not run (when it does, its own)."""
    return ReplayCache.for_skew(cfg.gecod_max_skew, capacity=_PYTHON_REPLAY_CAPACITY)


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


class _Phase(enum.Enum):
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
    connections: set[_Connection] = field(default_factory=set)
    working: int = 0
    # each peer's open connections, oldest first (dicts keep insertion order)
    open_by_peer: dict[Who, dict[_Connection, None]] = field(default_factory=dict)
    working_by_peer: Counter[Who] = field(default_factory=Counter)
    warned_full: bool = False

    @property
    def max_payload(self) -> int:
        return CLUSTER_MAX_PAYLOAD if self.channel is not None else MAX_PAYLOAD


@dataclass(eq=False, slots=True)
class _Connection:
    sock: socket.socket
    peer: Peer | None
    lane: Lane
    host: str | None = None  # over TCP: the peer's address (its budget) and port
    port: int = 0
    pidfd: int = -1
    phase: _Phase = _Phase.READING
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


def _peer_of(sock: socket.socket) -> Peer | None:
    """The kernel's word on who connected (Unix sockets only; None over TCP)."""
    if sock.family != socket.AF_UNIX:
        return None
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _UCRED.size))
    return Peer(pid, uid, gid)


class Server:
    """gecod's server on a runloop (see the module docstring).

    Parameters
    ----------
    loop: the runloop to serve on.
    lanes: the listening sockets, each with its budget.
    secret: the quarantine key's 32 bytes.
    ctx: the policy's context (settings, cgroup backend, topology).
    pools: where each kind of request runs.
    on_change: called in the loop after a request changed the node's jobs.
    on_contained: called in the loop with ``<job>.<task>`` once the first process of that
        job is in its cgroups, once per incarnation of them (gecod starts watching the
        job, e.g. for OOM kills).
    on_shepherd: called in the loop with a job's master shepherd, once it is in the
        job's cgroups, and a pidfd of it the callee owns (gecod ends the job when it
        exits: :mod:`geco.daemon.shepherdwatch`).
    """

    def __init__(self, loop: RunLoop, lanes: Sequence[Lane], secret: bytes, ctx: Context,
                 pools: Pools, *,
                 on_change: Callable[[], None] | None = None,
                 on_contained: Callable[[JobKey], None] | None = None,
                 on_shepherd: Callable[[Shepherd, int], None] | None = None) -> None:
        self.loop = loop
        self.lanes = list(lanes)
        self.secret = secret
        self.ctx = ctx
        self.pools = pools
        self.on_change = on_change
        self.on_contained = on_contained
        self.on_shepherd = on_shepherd
        fast = next((lane.fast for lane in self.lanes if lane.fast is not None), None)
        # one cache for every frame MAC'd with the secret key: the C lane's, when it runs
        self.replay: Replay = (
            fast.replay if fast is not None else python_replay(ctx.config))
        # PEERCRED frames can be minted by anyone: their own cache, which forgets when full
        self.replay_peercred = ReplayCache.for_skew(ctx.config.gecod_max_skew,
                                                    forget_when_full=True)
        self.started = time.time()
        self._served = 0
        self.refused = 0
        self.refusal_budget = JournalBudget[Who](REFUSAL_BURST, exempt=(0,))
        self.success_budget = JournalBudget[JobKey](SUCCESS_BURST)
        self._on_idle: Callable[[], None] | None = None
        for lane in self.lanes:
            self.add_lane(lane, start=False)
        loop.add_timer(self.refusal_budget.window, self._end_journal_window,
                       repeat=self.refusal_budget.window)

    def add_lane(self, lane: Lane, *, start: bool = True) -> None:
        """Serve ``lane`` too (the cluster channel, opened after the local sockets)."""
        assert lane.listener is not None
        if lane not in self.lanes:
            self.lanes.append(lane)
        lane.listener.setblocking(False)
        if lane.fast is not None:
            self.loop.add_source(lane.fast.notify_fd, selectors.EVENT_READ,
                                 functools.partial(self._on_handoff_event, lane))
        else:
            self._accept_on(lane)

    @property
    def connections(self) -> set[_Connection]:
        """Every open connection, of every lane."""
        return set().union(*(lane.connections for lane in self.lanes))

    @property
    def served(self) -> int:
        """Requests answered, here and in the fast lane."""
        return self._served + sum(lane.fast.served for lane in self.lanes if lane.fast)

    @property
    def working(self) -> int:
        """Requests waiting for or in a worker, in every lane."""
        return sum(lane.working for lane in self.lanes)

    def _key(self, lane: Lane) -> bytes:
        """The secret a lane's frames are MAC'd with."""
        return lane.channel.key if lane.channel is not None else self.secret

    # -- accepting ------------------------------------------------------------

    def _on_accept(self, lane: Lane) -> None:
        for _ in range(_ACCEPT_BATCH.get(lane.name, _ACCEPT_BATCH_OTHERS)):
            if lane.listener is None:
                return
            try:
                sock, addr = lane.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    _log.error("cannot accept connections on %s: %s; pausing for %g s",
                               lane.address, exc.strerror, _ACCEPT_PAUSE)
                    self.loop.remove_source(lane.listener)
                    self.loop.add_timer(_ACCEPT_PAUSE, lambda: self._accept_on(lane))
                    return
                # ECONNABORTED and friends: that client is gone, the next one may be fine
                _log.debug("accept failed: %s", exc)
                continue
            self._start(lane, sock, addr=addr)

    def _accept_on(self, lane: Lane) -> None:
        if lane.listener is not None and not self.loop.has_source(lane.listener):
            self.loop.add_source(lane.listener, selectors.EVENT_READ,
                                 lambda s, ev: self._on_accept(lane))

    def _on_handoff_event(self, lane: Lane, _fd: object, _events: int) -> None:
        self._on_handoff(lane)

    def _on_handoff(self, lane: Lane) -> None:
        """The fast lane left connections to the loop (or served requests meanwhile)."""
        assert lane.fast is not None
        for handoff in lane.fast.take():
            self._start(lane, handoff.sock, handoff)
        if lane.fast.changed() and self.on_change is not None:
            self.on_change()

    def _start(self, lane: Lane, sock: socket.socket, handoff: Handoff | None = None, *,
               addr: object = None) -> None:
        sock.setblocking(False)
        if len(lane.connections) >= lane.budget.connections:
            if not lane.warned_full:
                _log.warning("%d connections open on %s; closing new ones until some finish",
                             lane.budget.connections, lane.address)
                lane.warned_full = True
            sock.close()
            if handoff is not None and handoff.pidfd >= 0:
                os.close(handoff.pidfd)
            return
        lane.warned_full = False
        host, port = _tcp_peer(addr)
        if handoff is not None:
            peer: Peer | None = Peer(handoff.pid, handoff.uid, handoff.gid)
        else:
            try:
                peer = _peer_of(sock)
            except OSError as exc:
                _log.debug("no peer credentials: %s", exc)
                sock.close()
                return
        conn = _Connection(sock, peer, lane, host, port)
        if lane.channel is not None and host is not None:
            why = lane.channel.admits(host)
            if why:  # checked before anything is read: an outsider costs one accept
                sock.close()
                self._journal_refusal(conn, "not-allowed", why, None)
                return
        if not self._room_for(conn):
            sock.close()
            return
        if handoff is not None:
            conn.pidfd, conn.accepted = handoff.pidfd, handoff.accepted
            conn.recorded, conn.died = handoff.recorded, handoff.died
        elif peer is not None:
            # pins the peer's identity for the worker: a pidfd names this very process,
            # so "still alive" after the move means the pid was not reused meanwhile
            with contextlib.suppress(OSError):
                conn.pidfd = os.pidfd_open(peer.pid)
        lane.connections.add(conn)
        lane.open_by_peer.setdefault(conn.who, {})[conn] = None
        if handoff is not None and handoff.data:
            # what the lane read first: the loop goes on from there
            conn.buf += handoff.data
            self._took(conn, more=True)
            if conn.phase is not _Phase.READING:
                return
        # a client sends its frame right after connecting: mostly it is here already,
        # and is served without a deadline timer or a turn through epoll
        self._on_readable(conn)
        if conn.phase is _Phase.READING:
            conn.deadline = self.loop.add_timer(self.ctx.config.gecod_connection_deadline,
                                                lambda: self._expired(conn))
            self.loop.add_source(sock, selectors.EVENT_READ,
                                 lambda s, ev: self._on_readable(conn))
            conn.watched = True

    def _room_for(self, conn: _Connection) -> bool:
        """Whether the peer's share of connections has room for ``conn``: when it is full,
        its oldest connection still waiting for its frame is closed for the new one (an
        idle flood then costs its sender only, never its next real request); False (the
        new one goes) when all of them are being answered."""
        lane, share = conn.lane, conn.lane.budget.per_peer_connections
        mine = lane.open_by_peer.get(conn.who, {})
        if share is None or len(mine) < share:
            return True
        oldest = next((c for c in mine if c.phase is _Phase.READING), None)
        if oldest is None:
            self._journal_refusal(conn, "over-budget", f"{share} connections of this peer "
                                                       "are being answered already; closed",
                                  None)
            return False
        oldest.claimed = claimed(oldest.buf)
        oldest.peercred = claims_peercred(oldest.buf)
        self._journal_refusal(oldest, "evicted", f"{share} connections of this peer were "
                                                 f"open; the oldest, {len(oldest.buf)} bytes "
                                                 "into its frame, was closed for a new one",
                              None)
        self._close(oldest)
        return True

    # -- reading --------------------------------------------------------------

    def _on_readable(self, conn: _Connection) -> None:
        # the whole header first (every frame has one): a frame refused for its length
        # field is then answered with its own nonce, which binds the ACK to it
        while conn.phase is _Phase.READING and self._read_some(conn):
            pass

    def _read_some(self, conn: _Connection) -> bool:
        """One recv of what the frame still lacks, and what follows from it; False when
        nothing more can be read now."""
        want = HEADER_BYTES if conn.header is None else conn.header.frame_bytes
        need = want - len(conn.buf)
        try:
            chunk = conn.sock.recv(need)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._refuse_unanswered(conn, "closed", f"connection error after {len(conn.buf)} "
                                                    f"bytes: {exc.strerror}")
            return False
        if not chunk:
            if conn.buf:
                self._refuse_unanswered(conn, "closed", f"the client closed the connection "
                                                        f"after {len(conn.buf)} bytes of a "
                                                        f"frame (truncated)")
            else:
                _log.debug("%s connected and closed without a request", conn.describe())
                self._close(conn)
            return False
        conn.buf += chunk
        return self._took(conn, more=len(chunk) == need)  # short read: the rest is not here

    def _took(self, conn: _Connection, *, more: bool) -> bool:
        """What follows from the bytes in ``conn.buf``; False when nothing more can be read
        now (``more``: the last read filled what it asked for)."""
        if conn.header is None:
            limit = conn.lane.max_payload
            try:
                if len(conn.buf) < HEADER_BYTES:
                    expected_length(bytes(conn.buf), limit)  # garbage is answered at once
                    return False
                conn.header = Header.parse(bytes(conn.buf), limit)
                self._check_transport(conn)
            except ProtocolError as exc:
                self._reject(conn, exc)
                return False
        if len(conn.buf) >= conn.header.frame_bytes:
            self._received(conn)
            return False
        return more

    def _check_transport(self, conn: _Connection) -> None:
        """A PEERCRED frame is believed only where the kernel names its sender."""
        assert conn.header is not None
        conn.peercred = conn.header.peercred
        if conn.peercred and conn.peer is None:
            raise ProtocolError("the PEERCRED flag needs gecod's Unix socket: over TCP the "
                                "kernel cannot name the sender, so only frames MAC'd with the "
                                "secret key are accepted here", reason="flags")

    def _expired(self, conn: _Connection) -> None:
        if conn.phase is _Phase.READING:
            limit = self.ctx.config.gecod_connection_deadline
            self._refuse_unanswered(conn, "timeout", f"no whole request within {limit:g} s "
                                                     f"({len(conn.buf)} bytes received); dropped")
        elif conn.phase is _Phase.WRITING:
            _log.warning("%s did not read its reply within %g s; dropped", conn.describe(),
                         self.ctx.config.gecod_connection_deadline)
            self._close(conn)

    # -- the request ----------------------------------------------------------

    def _received(self, conn: _Connection) -> None:
        frame = bytes(conn.buf)
        conn.claimed = claimed(frame)
        self._unwatch(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
        conn.phase = _Phase.WORKING
        lane = conn.lane
        # a frame the fast lane began to serve is in the replay cache already
        replay = (lane.channel.replay if lane.channel is not None else None if conn.recorded
                  else self.replay_peercred if conn.peercred else self.replay)
        try:
            got = decode(frame, self._key(lane), max_skew=self.ctx.config.gecod_max_skew,
                         replay=replay, header=conn.header, max_payload=lane.max_payload)
        except ProtocolError as exc:
            conn.verified = not conn.peercred and exc.reason in AFTER_MAC
            self._reject(conn, exc)
            return
        conn.verified = not got.peercred
        try:
            self._dispatch(conn, got)
        except Exception as exc:  # a bug must not end the loop, nor leave the client waiting
            self._answer(conn, got, self._internal_error(conn, got, exc))

    def _dispatch(self, conn: _Connection, got: Frame) -> None:
        """Answer a verified frame, or hand it to the pool of its kind."""
        lane = conn.lane
        if lane.channel is not None:
            try:
                pool, keys, work = lane.channel.accept(got, f"{conn.host}:{conn.port}")
            except ProtocolError as exc:
                self._reject(conn, exc)
                return
            self._submit(conn, got, work, pool, keys)
            return
        if got.type is MsgType.STATUS:
            self._submit(conn, got, self._status, self.pools.users, {"uid": conn.uid})
        elif got.type in (MsgType.JOB_STARTED, MsgType.QUARANTINE_SELF):
            self._job_started(conn, got)
        elif got.type is MsgType.ADOPT:
            msg = got.message
            assert isinstance(msg, Adopt)
            why = sshlogin.refusal(msg, conn.peer, lane.name, got.peercred)
            if why:
                self._answer(conn, got, Outcome(AckStatus.REFUSED, why))
                return
            pidfd, accepted = conn.pidfd, conn.accepted
            self._submit(conn, got,
                         lambda: sshlogin.serve(msg, got.nonce, self.ctx, pidfd, accepted),
                         self.pools.logins, {"uid": msg.uid})
        elif got.type is MsgType.STARTER:
            ask = got.message
            assert isinstance(ask, Starter)
            peer = conn.peer
            why = hookserve.refusal(ask, peer, lane.name)
            if why or peer is None:
                self._answer(conn, got, Outcome(AckStatus.REFUSED, why))
                return
            self._submit(conn, got, lambda: hookserve.serve_starter(ask, got.nonce, peer,
                                                                    self.ctx),
                         self.pools.users, {"uid": peer.uid})
        elif got.type is MsgType.HOOK:
            hook = got.message
            assert isinstance(hook, Hook)
            why = hookserve.refusal(hook, conn.peer, lane.name)
            if why:
                self._answer(conn, got, Outcome(AckStatus.REFUSED, why))
                return
            # an epilog's teardown may wait out kill_timeout: a job end, never a start's
            pool = self.pools.ends if hook.hook is HookName.EPILOG else self.pools.starts
            self._submit(conn, got, lambda: hookserve.serve(hook, self.ctx), pool,
                         {"job": _job_of(hook.job_id, hook.task_id)})
        else:
            self._answer(conn, got, Outcome(AckStatus.BAD_REQUEST,
                                            f"{got.type.name} is not a request this "
                                            "socket takes"))

    def _job_started(self, conn: _Connection, got: Frame) -> None:
        """JOB_STARTED (sge_execd's child) or QUARANTINE_SELF (the starter's fallback)."""
        msg = got.message
        assert isinstance(msg, JobStarted)
        req = Request(got.type, msg.job_id, msg.task_id, msg.pid, conn.peer, conn.pidfd)
        if conn.died:
            self._answer(conn, got, pid_reused(req))
            return
        if got.type is MsgType.QUARANTINE_SELF:  # a user's request: on the users' pool
            self._submit(conn, got, lambda: quarantine(req, self.ctx), self.pools.users,
                         {"uid": conn.uid})
            return
        if conn.lane.inline:
            # a later task of a job gecod has seen is a few /proc reads and cgroup
            # writes: done here, without the round trip through a worker thread
            try:
                outcome = quarantine(req, self.ctx, wait=False)
            except WouldWait:
                pass
            except Exception as exc:  # a bug must not end the loop
                self._answer(conn, got, self._internal_error(conn, got, exc))
                return
            else:
                self._answer(conn, got, outcome)
                return
        # a job's first process: one job's tasks wait for it in the queue, not on threads
        self._submit(conn, got, lambda: quarantine(req, self.ctx), self.pools.starts,
                     {"job": _job_of(msg.job_id, msg.task_id)})

    def _submit(self, conn: _Connection, got: Frame, work: Callable[[], object], pool: Pool,
                keys: Keys) -> None:
        lane, who = conn.lane, conn.who
        share = lane.budget.per_peer_working
        if lane.working >= lane.budget.working:
            self._answer(conn, got, Outcome(AckStatus.BUSY, f"{lane.working} requests are "
                                                            "already waiting for a worker"))
            return
        if share is not None and lane.working_by_peer[who] >= share:
            self._answer(conn, got, Outcome(AckStatus.BUSY, f"{share} requests of this peer "
                                                            "are already waiting"))
            return
        try:
            future = pool.submit_for(keys, work)
        except Busy as exc:
            self._answer(conn, got, Outcome(AckStatus.BUSY, str(exc)))
            return
        except RuntimeError:  # gecod is stopping: the pool takes no more work
            self._answer(conn, got, Outcome(AckStatus.BUSY, "gecod is stopping"))
            return
        lane.working += 1
        lane.working_by_peer[who] += 1
        future.add_done_callback(
            lambda f: self.loop.call_soon_threadsafe(lambda: self._done(conn, got, f)))

    def _done(self, conn: _Connection, got: Frame,
              future: concurrent.futures.Future[object]) -> None:
        lane = conn.lane
        lane.working -= 1
        _uncount(lane.working_by_peer, conn.who)
        try:
            result = future.result()
            reply = self._reply(conn, got, result)
        except Exception as exc:  # a bug, or a reply that cannot be sent: never left open
            self._answer(conn, got, self._internal_error(conn, got, exc))
        else:
            if reply is None:
                assert isinstance(result, Outcome)
                self._answer(conn, got, result)
            else:
                self._served += 1
                self._send(conn, reply)
        self._maybe_idle()

    def _reply(self, conn: _Connection, got: Frame, result: object) -> bytes | None:
        """The encoded reply of a request a worker answered; None for an :class:`Outcome`,
        which :meth:`_answer` journals and acknowledges. Raises when it cannot be encoded."""
        secret = self._key(conn.lane)
        if isinstance(result, dict):  # another host's request: its document, bound to it
            result["request"] = got.nonce.hex()
            return encode(MsgType.NODE_REPLY, StatusReply(result), secret,
                          max_payload=CLUSTER_MAX_PAYLOAD)
        if isinstance(result, bytes):
            return encode(MsgType.STATUS_REPLY, result, secret, flags=got.flags)
        if isinstance(result, AdoptReply):  # journaled by the worker (ssh-* events)
            return encode(MsgType.ADOPT_REPLY, result, secret, flags=got.flags)
        if isinstance(result, StarterReply):  # journaled by the worker, as the starter
            return encode(MsgType.STARTER_REPLY, result, secret, flags=got.flags)
        if isinstance(result, tuple):  # a HOOK: journaled by the worker, as the hook
            job, task, _ = conn.claimed
            ack = Ack(job or 0, task or 0, result[0], got.nonce)
            return encode(MsgType.ACK, ack, secret, flags=got.flags)
        return None

    def _internal_error(self, conn: _Connection, got: Frame, exc: Exception) -> Outcome:
        _log.error("internal error handling %s from %s: %s", got.type.name, conn.describe(),
                   exc, exc_info=exc)
        return Outcome(AckStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}")

    def _status(self) -> bytes:
        """Worker: the STATUS reply, read from the cgroup tree."""
        node = status.scan(self.ctx.backend)
        return status.status_document(node, gecod=__version__, pid=os.getpid(),
                                     host=self.ctx.hostname,
                                     uptime=round(time.time() - self.started, 3),
                                     served=self.served, refused=self.refused)

    def _answer(self, conn: _Connection, got: Frame, outcome: Outcome) -> None:
        """Journal the outcome of a verified request and send its ACK."""
        job, task, _ = conn.claimed
        if outcome.ok:
            self._served += 1
            if job is None or task is None \
                    or self.success_budget.allow(JobKey(job, task), "python"):
                self._journal_success(conn, got, outcome)
            if self.on_contained is not None and outcome.first and job is not None \
                    and task is not None:
                self.on_contained(JobKey(job, task))
            if outcome.shepherd is not None and self.on_shepherd is not None \
                    and conn.pidfd >= 0:
                self.on_shepherd(outcome.shepherd, os.dup(conn.pidfd))
            if self.on_change is not None:
                self.on_change()
        else:
            self._journal_refusal(conn, outcome.status.name.lower(), outcome.reason,
                                  outcome.status, got.type.name)
        secret = self._key(conn.lane)
        if got.type is MsgType.ADOPT:  # refused before the decision, busy, or a bug
            reply = AdoptReply(0, 0, outcome.status, got.nonce)
            self._send(conn, encode(MsgType.ADOPT_REPLY, reply, secret, flags=got.flags))
            return
        if got.type is MsgType.STARTER:  # the same, answered in kind
            started = StarterReply(job or 0, task or 0, outcome.status, got.nonce)
            self._send(conn, encode(MsgType.STARTER_REPLY, started, secret, flags=got.flags))
            return
        ack = Ack(job or 0, task or 0, outcome.status, got.nonce)
        # in kind: a PEERCRED asker has no secret key to check any other MAC
        self._send(conn, encode(MsgType.ACK, ack, secret, flags=got.flags))

    def _journal_success(self, conn: _Connection, got: Frame, outcome: Outcome) -> None:
        job, task, pid = conn.claimed
        limits = outcome.limits
        _log.info("quarantined process %s into job %s.%s (%s)%s", pid, job, task,
                  conn.describe(), "; created its cgroups" if outcome.created else "",
                  extra=log.job_fields(
                      job, task, "quarantined", PID=pid, PEER_PID=_pid(conn),
                      PEER_UID=conn.uid, REQUEST=got.type.name, LANE=conn.lane.name,
                      ELAPSED_MS=round((time.monotonic() - conn.accepted) * 1000, 1),
                      PEERCRED=1 if got.peercred else None,
                      CGROUP_CREATED=int(outcome.created),
                      CPUS=limits.cpus if limits else None,
                      MEMS=limits.mems if limits else None,
                      MEMORY_LIMIT=limits.memory if limits else None,
                      MEMSW_LIMIT=limits.memory_swap if limits else None))

    # -- refusals -------------------------------------------------------------

    def _journal_refusal(self, conn: _Connection, reason: str, text: str,
                         status: AckStatus | None, request: str | None = None) -> None:
        self.refused += 1
        if not self.refusal_budget.allow(conn.who, reason):
            return  # counted into the peer's summary at the end of the window
        job, task, pid = conn.claimed
        # the job a frame names is journaled as its JOB_ID only when the frame was MAC'd with
        # a secret key: otherwise anyone could put records into another user's job's story
        # (geco journal, its trace file) and choose which job they seem to be about
        ids = (log.job_fields(job, task) if conn.verified
               else log.job_fields(None, None, CLAIMED_JOB_ID=job, CLAIMED_TASK_ID=task))
        claim = f"job {job}.{task} pid {pid}" if job is not None else "no readable claim"
        if not conn.verified and job is not None:
            claim = f"claims {claim}"
        cluster = conn.lane.channel is not None
        fields = log.job_fields(
            None, None, "cluster-refused" if cluster else "quarantine-refused", PID=pid,
            PEER_PID=_pid(conn), PEER_UID=conn.uid,
            PEER=f"{conn.host}:{conn.port}" if conn.host is not None else None,
            REASON=reason, REQUEST=request, LANE=conn.lane.name,
            PEERCRED=1 if conn.peercred else None,
            ACK_STATUS=status.name if status else "none")
        fields[log.FIELDS_ATTR].update(ids[log.FIELDS_ATTR])
        _log.warning("refused %s from %s (%s): %s",
                     request or ("a cluster request" if cluster else "a request"),
                     conn.describe(), claim, text, extra=fields)

    def _reject(self, conn: _Connection, exc: ProtocolError) -> None:
        """A frame failed a protocol check: journal it, answer why (no job), close."""
        data = bytes(conn.buf)
        if conn.claimed == (None, None, None):
            conn.claimed = claimed(data)
        conn.peercred = claims_peercred(data)
        reply = ack_for_error(data, exc, self._key(conn.lane))
        status = AckStatus.VERSION if exc.reason == "version" else AckStatus.BAD_REQUEST
        self._journal_refusal(conn, exc.reason, exc.msg, status)
        self._unwatch(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
        self._send(conn, reply)

    def _end_journal_window(self) -> None:
        """Journal what the window's budgets held back: one summary per peer and per job."""
        window = self.refusal_budget.window
        for held in self.refusal_budget.end_window():
            event = ("cluster-refused-summary" if isinstance(held.key, str)
                     else "quarantine-refused-summary")
            _log.warning("%s", describe_refusals(held, window),
                         extra=log.job_fields(None, None, event,
                                              PEER_UID=held.key if isinstance(held.key, int)
                                              else None,
                                              PEER=held.key if isinstance(held.key, str)
                                              else None,
                                              REFUSED=held.count, WINDOW_S=window,
                                              REASONS=",".join(f"{r}:{n}" for r, n in
                                                               held.reasons.items())))
        for lane in self.lanes:
            if lane.fast is not None:
                for key, count in lane.fast.held().items():
                    self.success_budget.hold(key, "lane", count)
        for job in self.success_budget.end_window():
            key = job.key
            _log.info("job %s: %s more processes quarantined in %g s (a job's first %d a "
                      "window are journaled one by one)", key, f"{job.count:,}", window,
                      self.success_budget.burst,
                      extra=log.job_fields(key.job, key.task, "quarantined-summary",
                                           QUARANTINED=job.count, WINDOW_S=window))

    def _refuse_unanswered(self, conn: _Connection, reason: str, text: str) -> None:
        """A client that never completed a frame: journal it and close without a reply."""
        conn.claimed = claimed(conn.buf)
        conn.peercred = claims_peercred(conn.buf)
        self._journal_refusal(conn, reason, text, None)
        self._close(conn)

    # -- writing --------------------------------------------------------------

    def _send(self, conn: _Connection, data: bytes) -> None:
        if conn.phase is _Phase.CLOSED:
            _log.debug("%s left before its reply was ready", conn.describe())
            return
        conn.phase = _Phase.WRITING
        conn.out = data
        self._write(conn)
        if conn.phase is _Phase.WRITING:  # the socket buffer was full: wait for room
            self.loop.add_source(conn.sock, selectors.EVENT_WRITE,
                                 lambda s, ev: self._write(conn))
            conn.watched = True
            conn.deadline = self.loop.add_timer(self.ctx.config.gecod_connection_deadline,
                                                lambda: self._expired(conn))

    def _write(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            _log.debug("cannot send the reply to %s: %s", conn.describe(), exc)
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._close(conn)

    def _unwatch(self, conn: _Connection) -> None:
        if conn.watched:
            self.loop.remove_source(conn.sock)
            conn.watched = False

    def _close(self, conn: _Connection) -> None:
        # never called while WORKING: a worker still uses the pidfd; _done answers first
        if conn.phase is _Phase.CLOSED:
            return
        conn.phase = _Phase.CLOSED
        lane = conn.lane
        if conn in lane.connections:
            lane.connections.discard(conn)
            mine = lane.open_by_peer.get(conn.who)
            if mine is not None:
                mine.pop(conn, None)
                if not mine:  # a flood of peers leaves nothing behind
                    del lane.open_by_peer[conn.who]
        self._unwatch(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
        _discard_unread(conn.sock)
        conn.sock.close()
        if conn.pidfd >= 0:
            os.close(conn.pidfd)
            conn.pidfd = -1
        self._maybe_idle()

    # -- lifecycle ------------------------------------------------------------

    def replace_secret(self, secret: bytes) -> None:
        """Use ``secret`` for requests from now on (after ``geco keygen --force`` and SIGHUP)."""
        self.secret = secret

    def shutdown(self, on_idle: Callable[[], None]) -> None:
        """Stop accepting; drop half-sent requests; call ``on_idle`` once every answer is out.

        Job cgroups are not touched: running jobs stay contained, and the next
        gecod rebuilds everything from the cgroup tree.
        """
        for lane in self.lanes:
            if lane.fast is not None:
                lane.fast.stop()
                self._on_handoff(lane)  # what it accepted last is answered too
                self.loop.remove_source(lane.fast.notify_fd)
            elif lane.listener is not None:
                self.loop.remove_source(lane.listener)
            if lane.listener is not None:
                lane.listener.close()
                lane.listener = None
        for conn in list(self.connections):
            if conn.phase is _Phase.READING:
                self._close(conn)
        self._end_journal_window()  # what the last window held back is not lost
        self._on_idle = on_idle
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self._on_idle is not None and self.working == 0 and not any(
                c.phase is not _Phase.CLOSED for c in self.connections):
            callback, self._on_idle = self._on_idle, None
            callback()


def _job_of(job: int, task: int) -> str:
    """The pool key of a request's job, as the message claims it (not checked yet: any
    64-bit ids); equal to the job's :class:`JobKey` (a ``str``) when they are valid, so
    requests of one job share its caps whoever sends them (non-array jobs say task 0)."""
    return f"{job}.{task or 1}"


def _tcp_peer(addr: object) -> tuple[str | None, int]:
    """A TCP peer's address and port as accept() gave them (an IPv4 peer of a dual-stack
    socket as its IPv4 address); (None, 0) for a Unix socket's."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return None, 0
    return str(addr[0]).removeprefix("::ffff:"), int(addr[1])


def _discard_unread(sock: socket.socket) -> None:
    """Read away what the client sent beyond its frame (a refused oversized one, say).

    Closing a socket with unread data makes the kernel reset the connection
    (Unix sockets too: the peer's next recv fails with ECONNRESET), and the
    client could lose the ACK that says why it was refused.
    """
    with contextlib.suppress(OSError):
        for _ in range(_DISCARD_CHUNKS):
            if not sock.recv(MAX_FRAME):
                return


def _pid(conn: _Connection) -> int | None:
    return conn.peer.pid if conn.peer else None


def _uncount(counter: Counter[Who], who: Who) -> None:
    """One less for ``who``; the entry goes at 0, so a flood of peers leaves nothing behind."""
    counter[who] -= 1
    if counter[who] <= 0:
        del counter[who]
