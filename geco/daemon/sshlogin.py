"""gecod's side of an ssh login: ADOPT from sshd's PAM module (``pam_geco.so``).

The module runs inside sshd's root process for the connection and asks twice:
at PAM's account stage (may this user log in here?) and at its session stage
(and move me into the job). The decision and the move are
:func:`geco.ssh.serve_login`'s, the same the helper makes when gecod cannot be
reached; here they cost one round trip on the privileged socket instead of a
Python start per stage.

What is taken on trust: nothing the kernel does not vouch for. The request
must come on the root lane, MAC'd with the secret key, from a process running
as root, and the pid to move must be that sender's (``SO_PEERCRED``): a root
process can only hand itself to a job.
"""

from __future__ import annotations

import pwd

from geco import log
from geco.daemon.quarantine import Context, Peer
from geco.errors import GecoError
from geco.protocol import AckStatus, Adopt, AdoptReply, AdoptStage
from geco.ssh import Login, serve_login

__all__ = ["refusal", "serve"]

_log = log.get("gecod.ssh")


def refusal(msg: Adopt, peer: Peer | None, lane: str) -> str:
    """Why gecod will not serve this ADOPT ("" when it will)."""
    if lane != "root" or peer is None or peer.uid != 0:
        return "ADOPT is sshd's (root's) request, on gecod's privileged socket"
    if msg.pid != peer.pid:
        return f"ADOPT must name its sender (pid {peer.pid}), not pid {msg.pid}"
    if msg.job_id or msg.task_id:
        return "ADOPT naming a job is not served: gecod chooses the job (job_id 0)"
    return ""


def serve(msg: Adopt, nonce: bytes, ctx: Context) -> AdoptReply:
    """Worker: decide the login (and at the session stage, move the sender); the reply's
    text is the user's line, then the session's ``NAME=value`` lines."""
    try:
        user = pwd.getpwuid(msg.uid).pw_name
    except KeyError:
        return AdoptReply(0, 0, AckStatus.REFUSED, nonce,
                          f"geco: user id {msg.uid} is unknown on {ctx.hostname}")
    try:
        login = Login.of(user, msg.connection.partition(" ")[0], msg.connection)
    except GecoError as exc:
        return AdoptReply(0, 0, AckStatus.REFUSED, nonce, f"geco: {exc}")
    answer = serve_login(msg.stage is AdoptStage.SESSION, login, ctx.config, ctx.backend,
                         ctx.hostname.partition(".")[0], msg.pid, _log)
    key = answer.job.key if answer.job else None
    text = "\n".join([answer.message, *(f"{k}={v}" for k, v in answer.env)])
    return AdoptReply(key.job if key else 0, key.task if key else 0,
                      AckStatus.OK if answer.admit else AckStatus.REFUSED, nonce, text)
