"""gecod's side of an ssh login: ADOPT from sshd's PAM module and from the preload in sshd.

``pam_geco.so`` runs inside sshd's root process for the connection and asks
twice: at PAM's account stage (may this user log in here?) and at its session
stage (and move me into the job). The decision and the move are
:func:`geco.ssh.policy.serve_login`'s, the same the helper makes when gecod cannot be
reached; here they cost one round trip on the privileged socket instead of a
Python start per stage. Then the preload in sshd asks once more from the
session's own process, running as the user, before it runs anything (stage
EXEC, :func:`geco.ssh.policy.serve_exec`): into the job its ``JOB_ID`` names, or
the one it is in, or as at login when PAM did not adopt it.

What is taken on trust: nothing the kernel does not vouch for. ACCOUNT and
SESSION must come on the root lane, MAC'd with the secret key, from a process
running as root; EXEC peer-credentialed from a process of the uid it names,
whose program is sshd with a root sshd above it. The pid to move is always the
sender's (``SO_PEERCRED``): a process can only hand itself to a job.
"""

from __future__ import annotations

import contextlib
import pwd
import signal
import time
from collections.abc import Iterator, Mapping

from geco import log
from geco.daemon.context import GecodContext, Peer, WouldWait
from geco.errors import GecoError
from geco.job import teardown
from geco.jobkey import JobKey
from geco.resourceset import short_hostname
from geco.ssh.policy import Login, Placement, serve_exec, serve_login, sshd_program, under_root_sshd
from geco.wire.messages import REPLY_MAX_TEXT, AckStatus, Adopt, AdoptReply, AdoptStage

__all__ = ["refusal", "serve"]

_log = log.get("daemon.sshlogin")

# How long a session's move waits for its job's lock: a start or a move holds it for
# milliseconds; an end holds it while it kills and removes the job, and then the session
# must not go in at all.
_LOCK_WAIT = 1.0


def refusal(msg: Adopt, peer: Peer | None, lane: str, peercred: bool) -> str:
    """Why gecod will not serve this ADOPT ("" when it will)."""
    if peer is None:
        return "ADOPT needs gecod's Unix socket, where the kernel names the sender"
    if msg.pid != peer.pid:
        return f"ADOPT must name its sender (pid {peer.pid}), not pid {msg.pid}"
    if peercred:
        if msg.stage is not AdoptStage.EXEC:
            return "only ADOPT's EXEC stage may be peer-credentialed"
        if msg.uid != peer.uid or peer.uid == 0:
            return f"an ssh session's process asks for its own uid ({peer.uid}), not {msg.uid}"
        if not sshd_program(peer.pid) or not under_root_sshd(peer.pid):
            return "ADOPT's EXEC stage comes from an ssh session: sshd, under root's sshd"
        return ""
    if msg.stage is AdoptStage.EXEC:
        return "ADOPT's EXEC stage is peer-credentialed (an ssh session's own process)"
    if lane != "root" or peer.uid != 0:
        return "ADOPT is sshd's (root's) request, on gecod's privileged socket"
    if msg.job_id or msg.task_id:
        return "ADOPT naming a job is not served at login: gecod chooses the job (job_id 0)"
    return ""


def _placement(ctx: GecodContext, pid: int, pidfd: int) -> Placement:
    """The sender's move: under its job's lock, never into a job whose end has begun, and
    pinned by the pidfd taken when it connected."""

    @contextlib.contextmanager
    def guard(key: JobKey) -> Iterator[None]:
        why = ""
        try:
            with ctx.job_lock(key, moves=True, timeout=_LOCK_WAIT):
                if key in ctx.ending or not ctx.backend.exists(key):
                    why = "its end has begun"
                elif teardown.found_stuck(ctx.config, key):
                    why = "its end found processes that would not die"
                else:
                    yield
                    return
        except WouldWait:
            why = f"it is being ended (its lock was held for {_LOCK_WAIT:g} s)"
        raise GecoError(f"job {key} takes no new session: {why}")

    def alive() -> bool:
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return pidfd >= 0  # EPERM: alive; EBADF: nothing pins it (refused before)
        return True

    return Placement(pid, guard, alive)


class _Timed:
    """The logger the login's records go through, each with ``ELAPSED_MS``: from the
    connection's accept (time in the queue included) to the record."""

    def __init__(self, since: float) -> None:
        self.since = since

    def info(self, msg: object, *args: object,
             extra: Mapping[str, object] | None = None) -> None:
        fields = dict(extra or {})
        journal = dict(fields.get(log.FIELDS_ATTR) or {})  # type: ignore[call-overload]
        journal["ELAPSED_MS"] = f"{(time.monotonic() - self.since) * 1000:.1f}"
        fields[log.FIELDS_ATTR] = journal
        _log.info(msg, *args, extra=fields)


def serve(msg: Adopt, nonce: bytes, ctx: GecodContext, pidfd: int,
          accepted: float | None = None) -> AdoptReply:
    """Worker: decide the login (and at the session stage, move the sender, pinned by
    ``pidfd``); the reply's text is the user's line, then the session's ``NAME=value``
    lines. Its records carry ``ELAPSED_MS`` since ``accepted`` (``time.monotonic()``)."""
    try:
        user = pwd.getpwuid(msg.uid).pw_name
    except KeyError:
        return AdoptReply(0, 0, AckStatus.REFUSED, nonce,
                          f"geco: user id {msg.uid} is unknown on {ctx.hostname}")
    try:
        login = Login.of(user, msg.connection.partition(" ")[0], msg.connection)
    except GecoError as exc:
        return AdoptReply(0, 0, AckStatus.REFUSED, nonce, _fit(f"geco: {exc}", REPLY_MAX_TEXT))
    if msg.stage is not AdoptStage.ACCOUNT and pidfd < 0:
        # fail closed: without a pidfd, "still alive after the move" proves nothing
        return AdoptReply(0, 0, AckStatus.REFUSED, nonce,
                          f"geco: your session cannot be placed on {ctx.hostname} now; try "
                          "again")
    node = short_hostname(ctx.hostname)
    placement = _placement(ctx, msg.pid, pidfd)
    logger = _Timed(time.monotonic() if accepted is None else accepted)
    if msg.stage is AdoptStage.EXEC:
        wanted = JobKey(msg.job_id, JobKey.task_of(msg.task_id)) if msg.job_id else None
        answer = serve_exec(login, wanted, ctx.config, ctx.backend, node, placement, logger)
    else:
        answer = serve_login(msg.stage is AdoptStage.SESSION, login, ctx.config, ctx.backend,
                             node, placement, logger)
    key = answer.job.key if answer.job else None
    lines = [f"{k}={v}" for k, v in answer.env]
    # the user's line gives way to the session's variables, never the reverse: a reply
    # that does not fit its frame would be no answer at all
    room = REPLY_MAX_TEXT - sum(len(line.encode()) + 1 for line in lines)
    text = "\n".join([_fit(answer.message, room), *lines])
    return AdoptReply(key.job if key else 0, key.task if key else 0,
                      AckStatus.OK if answer.admit else AckStatus.REFUSED, nonce, text)


def _fit(text: str, room: int) -> str:
    """``text`` cut to ``room`` bytes of UTF-8 (never a broken character)."""
    return text.encode()[:max(room, 0)].decode(errors="ignore")
