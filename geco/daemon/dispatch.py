"""Where each kind of verified request goes, and how its answer is sent back.

:func:`route` takes a frame that passed every check of :func:`geco.wire.frame.decode`
(its payload unpacked once there, :attr:`~geco.wire.frame.Frame.message`) and says what
to do with it: an :class:`~geco.daemon.context.Outcome` to answer at once (refused
before any work), or the :class:`Work` to run in the pool of its kind
(:mod:`geco.pools`):

=================  ============================  =========================================
request            work                          pool, keyed by
=================  ============================  =========================================
JOB_STARTED        the quarantine                starts (job); root's lane tries it in the
                   (:mod:`~geco.daemon.quarantine`)  loop first when gecod knows the job
QUARANTINE_SELF    the quarantine                users (uid)
STATUS             the STATUS document           users (uid)
ADOPT              an ssh login                  logins (uid)
                   (:mod:`~geco.daemon.sshlogin`)
STARTER            the starter's question        users (uid)
                   (:mod:`~geco.daemon.hookserve`)
HOOK               the prolog's or epilog's      starts, or ends for an epilog (job)
                   work (:mod:`~geco.daemon.hookserve`)
cluster requests   :mod:`~geco.daemon.clusterserve`  its own pools (peer, job)
=================  ============================  =========================================

:func:`reply` and :func:`answer` encode what comes back, in kind: a PEERCRED asker
gets a PEERCRED reply (it has no secret key to check any other MAC).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from geco.daemon import hookserve, sshlogin
from geco.daemon.context import GecodContext, Outcome
from geco.daemon.lanes import Connection
from geco.daemon.quarantine import Request, pid_reused, quarantine
from geco.pools import Keys, Pool, Pools
from geco.wire.frame import Frame, encode
from geco.wire.messages import (
    CLUSTER_MAX_PAYLOAD,
    Ack,
    AckStatus,
    Adopt,
    AdoptReply,
    Hook,
    HookName,
    JobStarted,
    MsgType,
    Starter,
    StarterReply,
    StatusReply,
)

__all__ = ["Work", "answer", "reply", "route"]


@dataclass(frozen=True, slots=True)
class Work:
    """A request's work: the pool it runs in, as which keys (its caps), and the work.

    ``inline``: the same work, tried in gecod's loop first; it raises
    :class:`~geco.daemon.context.WouldWait` when it needs a worker after all.
    """

    pool: Pool
    keys: Keys
    run: Callable[[], object]
    inline: Callable[[], Outcome] | None = None


def route(conn: Connection, got: Frame, ctx: GecodContext, pools: Pools,
          status: Callable[[], bytes]) -> Outcome | Work:
    """What to do with the verified frame ``got`` that came on ``conn``.

    Parameters
    ----------
    conn: the connection (its lane, the kernel's word on the sender, its pidfd).
    got: the frame, its payload unpacked (``got.message``).
    ctx: gecod's shared context.
    pools: where each kind of request runs.
    status: the STATUS document's work.

    Returns
    -------
    An :class:`Outcome` to answer now (a refusal), or the :class:`Work` to run.

    Raises
    ------
    ProtocolError
        on the cluster lane: the frame is not a request of the channel for this host.
    """
    lane, msg = conn.lane, got.message
    if lane.channel is not None:
        pool, keys, work = lane.channel.accept(got, f"{conn.host}:{conn.port}")
        return Work(pool, keys, work)
    if got.type is MsgType.STATUS:
        return Work(pools.users, {"uid": conn.uid}, status)
    if isinstance(msg, JobStarted):  # JOB_STARTED or QUARANTINE_SELF
        return _job_started(conn, got.type, msg, ctx, pools)
    if isinstance(msg, Adopt):
        why = sshlogin.refusal(msg, conn.peer, lane.name, got.peercred)
        if why:
            return Outcome(AckStatus.REFUSED, why)
        pidfd, accepted = conn.pidfd, conn.accepted
        return Work(pools.logins, {"uid": msg.uid},
                    lambda: sshlogin.serve(msg, got.nonce, ctx, pidfd, accepted))
    if isinstance(msg, Starter):
        peer = conn.peer
        why = hookserve.refusal(msg, peer, lane.name)
        if why or peer is None:
            return Outcome(AckStatus.REFUSED, why)
        return Work(pools.users, {"uid": peer.uid},
                    lambda: hookserve.serve_starter(msg, got.nonce, peer, ctx))
    if isinstance(msg, Hook):
        why = hookserve.refusal(msg, conn.peer, lane.name)
        if why:
            return Outcome(AckStatus.REFUSED, why)
        # an epilog's teardown may wait out kill_timeout: a job end, never a start's
        pool = pools.ends if msg.hook is HookName.EPILOG else pools.starts
        return Work(pool, {"job": _job_of(msg.job_id, msg.task_id)},
                    lambda: hookserve.serve(msg, ctx))
    return Outcome(AckStatus.BAD_REQUEST, f"{got.type.name} is not a request this socket "
                                          "takes")


def _job_started(conn: Connection, type_: MsgType, msg: JobStarted, ctx: GecodContext,
                 pools: Pools) -> Outcome | Work:
    """JOB_STARTED (sge_execd's child) or QUARANTINE_SELF (the starter's fallback)."""
    req = Request(type_, msg.job_id, msg.task_id, msg.pid, conn.peer, conn.pidfd)
    if conn.died:
        return pid_reused(req)
    if type_ is MsgType.QUARANTINE_SELF:  # a user's request: on the users' pool
        return Work(pools.users, {"uid": conn.uid}, lambda: quarantine(req, ctx))
    # a job's first process: one job's tasks wait for it in the queue, not on threads;
    # a later task of a job gecod has seen is a few /proc reads and cgroup writes: on
    # root's lane done in the loop, without the round trip through a worker thread
    return Work(pools.starts, {"job": _job_of(msg.job_id, msg.task_id)},
                lambda: quarantine(req, ctx),
                inline=(lambda: quarantine(req, ctx, wait=False)) if conn.lane.inline
                else None)


def reply(conn: Connection, got: Frame, result: object, secret: bytes) -> bytes | None:
    """The encoded reply of a request a worker answered; None for an :class:`Outcome`,
    which :func:`answer` acknowledges (after the server journaled it). Raises when it
    cannot be encoded."""
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


def answer(conn: Connection, got: Frame, outcome: Outcome, secret: bytes) -> bytes:
    """The encoded answer that carries ``outcome``'s status: an ADOPT_REPLY to an ADOPT, a
    STARTER_REPLY to a STARTER (refused before the decision, busy, or a bug), else an
    ACK."""
    job, task, _ = conn.claimed
    if got.type is MsgType.ADOPT:
        adopt = AdoptReply(0, 0, outcome.status, got.nonce)
        return encode(MsgType.ADOPT_REPLY, adopt, secret, flags=got.flags)
    if got.type is MsgType.STARTER:
        started = StarterReply(job or 0, task or 0, outcome.status, got.nonce)
        return encode(MsgType.STARTER_REPLY, started, secret, flags=got.flags)
    ack = Ack(job or 0, task or 0, outcome.status, got.nonce)
    return encode(MsgType.ACK, ack, secret, flags=got.flags)


def _job_of(job: int, task: int) -> str:
    """The pool key of a request's job, as the message claims it (not checked yet: any
    64-bit ids); equal to the job's :class:`JobKey` (a ``str``) when they are valid, so
    requests of one job share its caps whoever sends them (non-array jobs say task 0)."""
    return f"{job}.{task or 1}"
