"""gecod's server: non-blocking connections on the runloop, slow work in pools of its own.

gecod listens on two sockets (three with the cluster channel), each a
:class:`~geco.daemon.lanes.Lane` with its own connections and request budget, so that no user can
crowd root out; each kind of request then runs in a pool of its own
(:mod:`geco.pools`: job starts, job ends, a user's requests, ssh logins,
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
    :data:`~geco.daemon.lanes.PUBLIC_BUDGET` ``per_peer_connections`` open connections (a new one
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
    the frame is verified (MAC, clock, replay cache) and its payload unpacked,
    once; :func:`geco.daemon.dispatch.route` says where the request of its kind
    runs (the quarantine of a job start, a STATUS scan, an ssh login, a hook's
    work, another host's request), and its result comes back through
    ``call_soon_threadsafe``. The loop keeps
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

Every refusal and every success of the quarantine is journaled within a budget
(:mod:`geco.daemon.requestlog`).
Nothing a client sends can stop the server: a bad client costs one socket
until its deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import os
import selectors
import socket
import time
from collections.abc import Callable, Sequence

from geco import __version__, log
from geco.config import Config
from geco.daemon import dispatch, status
from geco.daemon.context import GecodContext, Outcome, Peer, Shepherd, WouldWait
from geco.daemon.dispatch import Work
from geco.daemon.fastlane import Handoff
from geco.daemon.lanes import (
    Connection,
    Lane,
    Phase,
    discard_unread,
    peer_of,
    tcp_peer,
    uncount,
)
from geco.daemon.requestlog import RequestLog
from geco.daemon.runloop import RunLoop
from geco.errors import ProtocolError
from geco.jobkey import JobKey
from geco.pools import Busy, Pools
from geco.wire.frame import (
    AFTER_MAC,
    HEADER_BYTES,
    Frame,
    Header,
    ack_for_error,
    claimed,
    claims_peercred,
    decode,
    expected_length,
)
from geco.wire.messages import AckStatus
from geco.wire.replay import Replay, ReplayCache

__all__ = ["Server", "python_replay"]

_log = log.get("daemon.server")

# Connections accepted per readiness event, so a connect flood cannot starve replies: on
# root's socket many (execd's children), on the others few, so that a flood of strangers'
# connections takes its turn with every other ready socket, not a whole loop turn each.
_ACCEPT_BATCH = {"root": 64}
_ACCEPT_BATCH_OTHERS = 8
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



class Server:
    """gecod's server on a runloop (see the module docstring).

    Parameters
    ----------
    loop: the runloop to serve on.
    lanes: the listening sockets, each with its budget.
    secret: the quarantine key's 32 bytes.
    ctx: gecod's shared context (settings, cgroup backend, topology).
    pools: where each kind of request runs.
    on_change: called in the loop after a request changed the node's jobs.
    on_contained: called in the loop with ``<job>.<task>`` once the first process of that
        job is in its cgroups, once per incarnation of them (gecod starts watching the
        job, e.g. for OOM kills).
    on_shepherd: called in the loop with a job's master shepherd, once it is in the
        job's cgroups, and a pidfd of it the callee owns (gecod ends the job when it
        exits: :mod:`geco.daemon.shepherdwatch`).
    """

    def __init__(self, loop: RunLoop, lanes: Sequence[Lane], secret: bytes, ctx: GecodContext,
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
        # the last handover that did not happen: {"at": time, "reason": text} (STATUS)
        self.handover_failed: dict[str, object] | None = None
        self._served = 0
        self.journal = RequestLog()
        self._on_idle: Callable[[], None] | None = None
        for lane in self.lanes:
            self.add_lane(lane, start=False)
        loop.add_timer(self.journal.window, lambda: self.journal.end_window(self.lanes),
                       repeat=self.journal.window)

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
    def connections(self) -> set[Connection]:
        """Every open connection, of every lane."""
        return set().union(*(lane.connections for lane in self.lanes))

    @property
    def served(self) -> int:
        """Requests answered, here and in the fast lane."""
        return self._served + sum(lane.fast.served for lane in self.lanes if lane.fast)

    @property
    def refused(self) -> int:
        """Requests refused (and clients dropped), journaled or held back."""
        return self.journal.refused

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
        host, port = tcp_peer(addr)
        if handoff is not None:
            peer: Peer | None = Peer(handoff.pid, handoff.uid, handoff.gid)
        else:
            try:
                peer = peer_of(sock)
            except OSError as exc:
                _log.debug("no peer credentials: %s", exc)
                sock.close()
                return
        conn = Connection(sock, peer, lane, host, port)
        if lane.channel is not None and host is not None:
            why = lane.channel.admits(host)
            if why:  # checked before anything is read: an outsider costs one accept
                sock.close()
                self.journal.refusal(conn, "not-allowed", why, None)
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
            if conn.phase is not Phase.READING:
                return
        # a client sends its frame right after connecting: mostly it is here already,
        # and is served without a deadline timer or a turn through epoll
        self._on_readable(conn)
        if conn.phase is Phase.READING:
            conn.deadline = self.loop.add_timer(self.ctx.config.gecod_connection_deadline,
                                                lambda: self._expired(conn))
            self.loop.add_source(sock, selectors.EVENT_READ,
                                 lambda s, ev: self._on_readable(conn))
            conn.watched = True

    def _room_for(self, conn: Connection) -> bool:
        """Whether the peer's share of connections has room for ``conn``: when it is full,
        its oldest connection still waiting for its frame is closed for the new one (an
        idle flood then costs its sender only, never its next real request); False (the
        new one goes) when all of them are being answered."""
        lane, share = conn.lane, conn.lane.budget.per_peer_connections
        mine = lane.open_by_peer.get(conn.who, {})
        if share is None or len(mine) < share:
            return True
        oldest = next((c for c in mine if c.phase is Phase.READING), None)
        if oldest is None:
            self.journal.refusal(conn, "over-budget", f"{share} connections of this peer "
                                                       "are being answered already; closed",
                                  None)
            return False
        oldest.claimed = claimed(oldest.buf)
        oldest.peercred = claims_peercred(oldest.buf)
        self.journal.refusal(oldest, "evicted", f"{share} connections of this peer were "
                                                 f"open; the oldest, {len(oldest.buf)} bytes "
                                                 "into its frame, was closed for a new one",
                              None)
        self._close(oldest)
        return True

    # -- reading --------------------------------------------------------------

    def _on_readable(self, conn: Connection) -> None:
        # the whole header first (every frame has one): a frame refused for its length
        # field is then answered with its own nonce, which binds the ACK to it
        while conn.phase is Phase.READING and self._read_some(conn):
            pass

    def _read_some(self, conn: Connection) -> bool:
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

    def _took(self, conn: Connection, *, more: bool) -> bool:
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

    def _check_transport(self, conn: Connection) -> None:
        """A PEERCRED frame is believed only where the kernel names its sender."""
        assert conn.header is not None
        conn.peercred = conn.header.peercred
        if conn.peercred and conn.peer is None:
            raise ProtocolError("the PEERCRED flag needs gecod's Unix socket: over TCP the "
                                "kernel cannot name the sender, so only frames MAC'd with the "
                                "secret key are accepted here", reason="flags")

    def _expired(self, conn: Connection) -> None:
        if conn.phase is Phase.READING:
            limit = self.ctx.config.gecod_connection_deadline
            self._refuse_unanswered(conn, "timeout", f"no whole request within {limit:g} s "
                                                     f"({len(conn.buf)} bytes received); dropped")
        elif conn.phase is Phase.WRITING:
            _log.warning("%s did not read its reply within %g s; dropped", conn.describe(),
                         self.ctx.config.gecod_connection_deadline)
            self._close(conn)

    # -- the request ----------------------------------------------------------

    def _received(self, conn: Connection) -> None:
        frame = bytes(conn.buf)
        conn.claimed = claimed(frame)
        self._unwatch(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
        conn.phase = Phase.WORKING
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

    def _dispatch(self, conn: Connection, got: Frame) -> None:
        """Answer a verified frame, or hand it to the pool of its kind."""
        try:
            routed = dispatch.route(conn, got, self.ctx, self.pools, self._status)
        except ProtocolError as exc:  # not a request of the cluster channel for this host
            self._reject(conn, exc)
            return
        if isinstance(routed, Outcome):
            self._answer(conn, got, routed)
            return
        if routed.inline is not None:
            try:
                outcome = routed.inline()
            except WouldWait:
                pass
            else:
                self._answer(conn, got, outcome)
                return
        self._submit(conn, got, routed)

    def _submit(self, conn: Connection, got: Frame, work: Work) -> None:
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
            future = work.pool.submit_for(work.keys, work.run)
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

    def _done(self, conn: Connection, got: Frame,
              future: concurrent.futures.Future[object]) -> None:
        lane = conn.lane
        lane.working -= 1
        uncount(lane.working_by_peer, conn.who)
        try:
            result = future.result()
            reply = dispatch.reply(conn, got, result, self._key(conn.lane))
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

    def _internal_error(self, conn: Connection, got: Frame, exc: Exception) -> Outcome:
        _log.error("internal error handling %s from %s: %s", got.type.name, conn.describe(),
                   exc, exc_info=exc)
        return Outcome(AckStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}")

    def _status(self) -> bytes:
        """Worker: the STATUS reply, read from the cgroup tree."""
        node = status.scan(self.ctx.backend)
        return status.status_document(node, gecod=__version__, pid=os.getpid(),
                                     host=self.ctx.hostname,
                                     uptime=round(time.time() - self.started, 3),
                                     served=self.served, refused=self.refused,
                                     **({"handover_failed": self.handover_failed}
                                        if self.handover_failed else {}))

    def _answer(self, conn: Connection, got: Frame, outcome: Outcome) -> None:
        """Journal the outcome of a verified request and send its answer."""
        job, task, _ = conn.claimed
        if outcome.ok:
            self._served += 1
            self.journal.success(conn, got, outcome)
            if self.on_contained is not None and outcome.first and job is not None \
                    and task is not None:
                self.on_contained(JobKey(job, task))
            if outcome.shepherd is not None and self.on_shepherd is not None \
                    and conn.pidfd >= 0:
                self.on_shepherd(outcome.shepherd, os.dup(conn.pidfd))
            if self.on_change is not None:
                self.on_change()
        else:
            self.journal.refusal(conn, outcome.status.name.lower(), outcome.reason,
                             outcome.status, got.type.name)
        self._send(conn, dispatch.answer(conn, got, outcome, self._key(conn.lane)))

    # -- refusals -------------------------------------------------------------

    def _reject(self, conn: Connection, exc: ProtocolError) -> None:
        """A frame failed a protocol check: journal it, answer why (no job), close."""
        data = bytes(conn.buf)
        if conn.claimed == (None, None, None):
            conn.claimed = claimed(data)
        conn.peercred = claims_peercred(data)
        reply = ack_for_error(data, exc, self._key(conn.lane))
        status = AckStatus.VERSION if exc.reason == "version" else AckStatus.BAD_REQUEST
        self.journal.refusal(conn, exc.reason, exc.msg, status)
        self._unwatch(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
        self._send(conn, reply)

    def _refuse_unanswered(self, conn: Connection, reason: str, text: str) -> None:
        """A client that never completed a frame: journal it and close without a reply."""
        conn.claimed = claimed(conn.buf)
        conn.peercred = claims_peercred(conn.buf)
        self.journal.refusal(conn, reason, text, None)
        self._close(conn)

    # -- writing --------------------------------------------------------------

    def _send(self, conn: Connection, data: bytes) -> None:
        if conn.phase is Phase.CLOSED:
            _log.debug("%s left before its reply was ready", conn.describe())
            return
        conn.phase = Phase.WRITING
        conn.out = data
        self._write(conn)
        if conn.phase is Phase.WRITING:  # the socket buffer was full: wait for room
            self.loop.add_source(conn.sock, selectors.EVENT_WRITE,
                                 lambda s, ev: self._write(conn))
            conn.watched = True
            conn.deadline = self.loop.add_timer(self.ctx.config.gecod_connection_deadline,
                                                lambda: self._expired(conn))

    def _write(self, conn: Connection) -> None:
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

    def _unwatch(self, conn: Connection) -> None:
        if conn.watched:
            self.loop.remove_source(conn.sock)
            conn.watched = False

    def _close(self, conn: Connection) -> None:
        # never called while WORKING: a worker still uses the pidfd; _done answers first
        if conn.phase is Phase.CLOSED:
            return
        conn.phase = Phase.CLOSED
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
        discard_unread(conn.sock)
        conn.sock.close()
        if conn.pidfd >= 0:
            os.close(conn.pidfd)
            conn.pidfd = -1
        self._maybe_idle()

    # -- lifecycle ------------------------------------------------------------

    def replace_secret(self, secret: bytes) -> None:
        """Use ``secret`` for requests from now on (after ``geco keygen --force`` and SIGHUP)."""
        self.secret = secret

    def shutdown(self, on_idle: Callable[[], None], *, finish_reading: bool = False) -> None:
        """Stop accepting; drop half-sent requests (unless ``finish_reading``: a handover
        reads them to the end, or to their deadline); call ``on_idle`` once every answer
        is out.

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
            if conn.phase is Phase.READING and not finish_reading:
                self._close(conn)
        self.journal.end_window(self.lanes)  # what the last window held back is not lost
        self._on_idle = on_idle
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self._on_idle is not None and self.working == 0 and not any(
                c.phase is not Phase.CLOSED for c in self.connections):
            callback, self._on_idle = self._on_idle, None
            callback()

