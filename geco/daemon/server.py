"""gecod's quarantine server: non-blocking connections on the runloop, slow work in threads.

gecod listens on two sockets, each a :class:`Lane` with its own connections,
request budget and worker threads, so that no user can crowd root out:

``root``
    the privileged socket (mode 0600): the preload's JOB_STARTED from sge_execd.
    Only root can connect (the kernel refuses everyone else), so nothing a user
    does fills its connection table, its queue or its workers.
``public``
    the 0666 socket: ``geco status`` (STATUS) and the starter's fallback
    (QUARANTINE_SELF), from any user. Each uid has a budget of its own: at most
    :data:`PUBLIC_BUDGET` ``per_uid_connections`` open connections (more are
    closed at once) and ``per_uid_working`` requests waiting for or in a worker
    (more get BUSY), so a flood costs only its sender.

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
    worker pool (:func:`geco.daemon.quarantine.quarantine`, or a STATUS scan)
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

Every refusal is journaled as ``GECO_EVENT=quarantine-refused`` (priority
warning) with the peer's pid and uid as the kernel gave them, the claimed
job, task and pid, and the reason; every success as ``GECO_EVENT=quarantined``
(``ELAPSED_MS``: from the connection's accept to the answer); both with
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

from geco import __version__, log
from geco.address import Address
from geco.config import Config
from geco.daemon import hookserve, sshlogin, status
from geco.daemon.fastlane import FastLane, Handoff
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
from geco.jobkey import JobKey
from geco.protocol import (
    HEADER_BYTES,
    MAX_FRAME,
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
    ack_for_error,
    claimed,
    claims_peercred,
    decode,
    encode,
    expected_length,
)

__all__ = ["PUBLIC_BUDGET", "Budget", "Lane", "Server", "python_replay", "root_budget"]

_log = log.get("gecod")

# SO_PEERCRED's struct ucred: pid, uid, gid (three C ints).
_UCRED = struct.Struct("3i")
# Connections accepted per readiness event, so a connect flood cannot starve replies.
_ACCEPT_BATCH = 64
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
    per-uid limits (None: none) split the same way among the peers' uids.
    """

    connections: int
    working: int
    per_uid_connections: int | None = None
    per_uid_working: int | None = None


def root_budget(workers: int) -> Budget:
    """The privileged lane's: only root gets here, so no per-uid split."""
    return Budget(connections=1024, working=workers * _QUEUE_PER_WORKER)


# The public lane's: a user's `geco status` and a few job starts through the starter's
# fallback at once fit easily; a flood fills only its sender's share.
PUBLIC_BUDGET = Budget(connections=1024, working=2 * _QUEUE_PER_WORKER,
                       per_uid_connections=64, per_uid_working=8)


class _Phase(enum.Enum):
    READING = "reading"
    WORKING = "working"
    WRITING = "writing"
    CLOSED = "closed"


@dataclass(eq=False)
class Lane:
    """One listening socket with its own connections, budget and worker threads.

    Parameters
    ----------
    name: ``root`` or ``public`` (journaled as ``LANE``).
    listener: a listening stream socket (:func:`geco.address.listen`).
    address: where it listens (for messages).
    executor: this lane's worker threads.
    budget: what its clients may hold at once.
    inline: JOB_STARTED for a job gecod has seen is served in the loop, not a worker
        (root's lane: its clients are trusted; the public lane's could queue the loop).
    fast: the C lane that accepts this socket (:mod:`geco.daemon.fastlane`): the loop then
        gets only the connections it hands back.
    """

    name: str
    listener: socket.socket | None
    address: Address
    executor: concurrent.futures.ThreadPoolExecutor
    budget: Budget
    inline: bool = False
    fast: FastLane | None = None
    connections: set[_Connection] = field(default_factory=set)
    working: int = 0
    open_by_uid: Counter[int | None] = field(default_factory=Counter)
    working_by_uid: Counter[int | None] = field(default_factory=Counter)
    warned_full: bool = False


@dataclass(eq=False, slots=True)
class _Connection:
    sock: socket.socket
    peer: Peer | None
    lane: Lane
    pidfd: int = -1
    phase: _Phase = _Phase.READING
    buf: bytearray = field(default_factory=bytearray)
    header: Header | None = None  # parsed once, when its 36 bytes are in
    out: bytes = b""
    deadline: Timer | None = None
    accepted: float = field(default_factory=time.monotonic)
    claimed: tuple[int | None, int | None, int | None] = (None, None, None)
    peercred: bool = False  # the header has the PEERCRED flag (answer in kind)
    recorded: bool = False  # the fast lane put the nonce in the replay cache already
    died: bool = False  # the fast lane moved the pid, then found the process gone
    watched: bool = False  # registered with the loop (it had to wait for bytes or room)

    @property
    def uid(self) -> int | None:
        """Whose budget this connection counts against (None: every TCP client)."""
        return self.peer.uid if self.peer else None

    def describe(self) -> str:
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
    """The quarantine server on a runloop (see the module docstring).

    Parameters
    ----------
    loop: the runloop to serve on.
    lanes: the listening sockets, each with its workers and budget.
    secret: the quarantine key's 32 bytes.
    ctx: the policy's context (settings, cgroup backend, topology).
    on_change: called in the loop after a request changed the node's jobs.
    on_contained: called in the loop with ``<job>.<task>`` once the first process of that
        job is in its cgroups, once per incarnation of them (gecod starts watching the
        job, e.g. for OOM kills).
    on_shepherd: called in the loop with a job's master shepherd, once it is in the
        job's cgroups, and a pidfd of it the callee owns (gecod ends the job when it
        exits: :mod:`geco.daemon.jobend`).
    teardowns: where an epilog's HOOK runs (its teardown may wait out ``kill_timeout``);
        default the lane's workers.
    """

    def __init__(self, loop: RunLoop, lanes: Sequence[Lane], secret: bytes, ctx: Context, *,
                 on_change: Callable[[], None] | None = None,
                 on_contained: Callable[[JobKey], None] | None = None,
                 on_shepherd: Callable[[Shepherd, int], None] | None = None,
                 teardowns: concurrent.futures.Executor | None = None) -> None:
        self.loop = loop
        self.teardowns = teardowns
        self.lanes = list(lanes)
        self.secret = secret
        self.ctx = ctx
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
        self.refusal_budget = JournalBudget[int | None](REFUSAL_BURST, exempt=(0,))
        self.success_budget = JournalBudget[JobKey](SUCCESS_BURST)
        self._on_idle: Callable[[], None] | None = None
        for lane in self.lanes:
            assert lane.listener is not None
            lane.listener.setblocking(False)
            if lane.fast is not None:
                loop.add_source(lane.fast.notify_fd, selectors.EVENT_READ,
                                functools.partial(self._on_handoff_event, lane))
            else:
                self._accept_on(lane)
        loop.add_timer(self.refusal_budget.window, self._end_journal_window,
                       repeat=self.refusal_budget.window)

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

    # -- accepting ------------------------------------------------------------

    def _on_accept(self, lane: Lane) -> None:
        for _ in range(_ACCEPT_BATCH):
            if lane.listener is None:
                return
            try:
                sock, _addr = lane.listener.accept()
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
            self._start(lane, sock)

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

    def _start(self, lane: Lane, sock: socket.socket, handoff: Handoff | None = None) -> None:
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
        if handoff is not None:
            peer: Peer | None = Peer(handoff.pid, handoff.uid, handoff.gid)
        else:
            try:
                peer = _peer_of(sock)
            except OSError as exc:
                _log.debug("no peer credentials: %s", exc)
                sock.close()
                return
        conn = _Connection(sock, peer, lane)
        share = lane.budget.per_uid_connections
        if share is not None and lane.open_by_uid[conn.uid] >= share:
            # checked before anything costly: a flood's extra connections cost one accept
            sock.close()
            self._journal_refusal(conn, "over-budget", f"{share} connections of this uid are "
                                                       f"open already; closed", None)
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
        lane.open_by_uid[conn.uid] += 1
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
            try:
                if len(conn.buf) < HEADER_BYTES:
                    expected_length(bytes(conn.buf))  # garbage is answered at once
                    return False
                conn.header = Header.parse(bytes(conn.buf))
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
        # a frame the fast lane began to serve is in the replay cache already
        replay = None if conn.recorded else \
            self.replay_peercred if conn.peercred else self.replay
        try:
            got = decode(frame, self.secret, max_skew=self.ctx.config.gecod_max_skew,
                         replay=replay, header=conn.header)
        except ProtocolError as exc:
            self._reject(conn, exc)
            return
        if got.type is MsgType.STATUS:
            self._submit(conn, got, self._status)
        elif got.type in (MsgType.JOB_STARTED, MsgType.QUARANTINE_SELF):
            msg = got.message
            assert isinstance(msg, JobStarted)
            req = Request(got.type, msg.job_id, msg.task_id, msg.pid, conn.peer, conn.pidfd)
            if conn.died:
                self._answer(conn, got, pid_reused(req))
                return
            if conn.lane.inline and got.type is MsgType.JOB_STARTED:
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
            self._submit(conn, got, lambda: quarantine(req, self.ctx))
        elif got.type is MsgType.ADOPT:
            msg = got.message
            assert isinstance(msg, Adopt)
            why = sshlogin.refusal(msg, conn.peer, conn.lane.name, got.peercred)
            if why:
                self._answer(conn, got, Outcome(AckStatus.REFUSED, why))
                return
            self._submit(conn, got, lambda: sshlogin.serve(msg, got.nonce, self.ctx))
        elif got.type is MsgType.STARTER:
            ask = got.message
            assert isinstance(ask, Starter)
            peer = conn.peer
            why = hookserve.refusal(ask, peer, conn.lane.name)
            if why or peer is None:
                self._answer(conn, got, Outcome(AckStatus.REFUSED, why))
                return
            self._submit(conn, got, lambda: hookserve.serve_starter(ask, got.nonce, peer,
                                                                    self.ctx))
        elif got.type is MsgType.HOOK:
            hook = got.message
            assert isinstance(hook, Hook)
            why = hookserve.refusal(hook, conn.peer, conn.lane.name)
            if why:
                self._answer(conn, got, Outcome(AckStatus.REFUSED, why))
                return
            # an epilog's teardown may wait out kill_timeout: never in a quarantine's worker
            slow = self.teardowns if hook.hook is HookName.EPILOG else None
            self._submit(conn, got, lambda: hookserve.serve(hook, self.ctx), executor=slow)
        else:
            self._answer(conn, got, Outcome(AckStatus.BAD_REQUEST,
                                            f"{got.type.name} is not a request this "
                                            "socket takes"))

    def _submit(self, conn: _Connection, got: Frame, work: Callable[[], object], *,
                executor: concurrent.futures.Executor | None = None) -> None:
        lane, uid = conn.lane, conn.uid
        share = lane.budget.per_uid_working
        if lane.working >= lane.budget.working:
            self._answer(conn, got, Outcome(AckStatus.BUSY, f"{lane.working} requests are "
                                                            "already waiting for a worker"))
            return
        if share is not None and lane.working_by_uid[uid] >= share:
            self._answer(conn, got, Outcome(AckStatus.BUSY, f"{share} requests of this uid "
                                                            "are already waiting"))
            return
        lane.working += 1
        lane.working_by_uid[uid] += 1
        future = (executor or lane.executor).submit(work)
        future.add_done_callback(
            lambda f: self.loop.call_soon_threadsafe(lambda: self._done(conn, got, f)))

    def _done(self, conn: _Connection, got: Frame,
              future: concurrent.futures.Future[object]) -> None:
        lane = conn.lane
        lane.working -= 1
        _uncount(lane.working_by_uid, conn.uid)
        try:
            result = future.result()
        except Exception as exc:
            result = self._internal_error(conn, got, exc)
        if isinstance(result, bytes):
            self._served += 1
            self._send(conn, encode(MsgType.STATUS_REPLY, result, self.secret, flags=got.flags))
        elif isinstance(result, AdoptReply):  # journaled by the worker (ssh-* events)
            self._served += 1
            self._send(conn, encode(MsgType.ADOPT_REPLY, result, self.secret, flags=got.flags))
        elif isinstance(result, StarterReply):  # journaled by the worker, as the starter
            self._served += 1
            self._send(conn, encode(MsgType.STARTER_REPLY, result, self.secret, flags=got.flags))
        elif isinstance(result, tuple):  # a HOOK: journaled by the worker, as the hook
            self._served += 1
            job, task, _ = conn.claimed
            ack = Ack(job or 0, task or 0, result[0], got.nonce)
            self._send(conn, encode(MsgType.ACK, ack, self.secret, flags=got.flags))
        else:
            assert isinstance(result, Outcome)
            self._answer(conn, got, result)
        self._maybe_idle()

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
        if got.type is MsgType.ADOPT:  # refused before the decision, busy, or a bug
            reply = AdoptReply(0, 0, outcome.status, got.nonce)
            self._send(conn, encode(MsgType.ADOPT_REPLY, reply, self.secret, flags=got.flags))
            return
        if got.type is MsgType.STARTER:  # the same, answered in kind
            started = StarterReply(job or 0, task or 0, outcome.status, got.nonce)
            self._send(conn, encode(MsgType.STARTER_REPLY, started, self.secret,
                                    flags=got.flags))
            return
        ack = Ack(job or 0, task or 0, outcome.status, got.nonce)
        # in kind: a PEERCRED asker has no secret key to check any other MAC
        self._send(conn, encode(MsgType.ACK, ack, self.secret, flags=got.flags))

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
        if not self.refusal_budget.allow(conn.uid, reason):
            return  # counted into the peer's summary at the end of the window
        job, task, pid = conn.claimed
        claim = f"job {job}.{task} pid {pid}" if job is not None else "no readable claim"
        _log.warning("refused %s from %s (%s): %s", request or "a request", conn.describe(),
                     claim, text,
                     extra=log.job_fields(job, task, "quarantine-refused", PID=pid,
                                          PEER_PID=_pid(conn), PEER_UID=conn.uid,
                                          REASON=reason, REQUEST=request, LANE=conn.lane.name,
                                          PEERCRED=1 if conn.peercred else None,
                                          ACK_STATUS=status.name if status else "none"))

    def _reject(self, conn: _Connection, exc: ProtocolError) -> None:
        """A frame failed a protocol check: journal it, answer why (no job), close."""
        data = bytes(conn.buf)
        if conn.claimed == (None, None, None):
            conn.claimed = claimed(data)
        conn.peercred = claims_peercred(data)
        reply = ack_for_error(data, exc, self.secret)
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
            _log.warning("%s", describe_refusals(held, window),
                         extra=log.job_fields(None, None, "quarantine-refused-summary",
                                              PEER_UID=held.key, REFUSED=held.count,
                                              WINDOW_S=window,
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
            _uncount(lane.open_by_uid, conn.uid)
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


def _uncount(counter: Counter[int | None], uid: int | None) -> None:
    """One less for ``uid``; the entry goes at 0, so a flood of uids leaves nothing behind."""
    counter[uid] -= 1
    if counter[uid] <= 0:
        del counter[uid]
