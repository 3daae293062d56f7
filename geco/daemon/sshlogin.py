"""gecod's side of an ssh login: ADOPT from sshd's PAM module and from the preload in sshd.

``pam_geco.so`` runs inside sshd's root process for the connection and asks
twice: at PAM's account stage (may this user log in here?) and at its session
stage (and move me into the job). The decision and the move are
:func:`geco.ssh.serve_login`'s, the same the helper makes when gecod cannot be
reached; here they cost one round trip on the privileged socket instead of a
Python start per stage. Then the preload in sshd asks once more from the
session's own process, running as the user, before it runs anything (stage
EXEC, :func:`geco.ssh.serve_exec`): into the job its ``JOB_ID`` names, or
the one it is in, or as at login when PAM did not adopt it.

What is taken on trust: nothing the kernel does not vouch for. ACCOUNT and
SESSION must come on the root lane, MAC'd with the secret key, from a process
running as root; EXEC peer-credentialed from a process of the uid it names,
whose program is sshd with a root sshd above it. The pid to move is always the
sender's (``SO_PEERCRED``): a process can only hand itself to a job.
"""

from __future__ import annotations

import os
import pwd

from geco import log, procfs
from geco.daemon.quarantine import Context, Peer
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.protocol import AckStatus, Adopt, AdoptReply, AdoptStage
from geco.ssh import Login, serve_exec, serve_login

__all__ = ["refusal", "serve"]

_log = log.get("gecod.ssh")


# the programs an ssh session's processes run in before they exec the user's
_SSHD = ("sshd", "sshd-session")
# how far above a session's process sshd's root process for the connection is: the
# session child's parent is the user's sshd process, whose parent is the monitor
_ANCESTORS = 4


def _sshd_program(pid: int) -> bool:
    """The kernel names the process's program sshd (or sshd-session), owned by root."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        owner = os.stat(f"/proc/{pid}/exe").st_uid
    except OSError:
        return False
    return os.path.basename(exe) in _SSHD and owner == 0


def _under_root_sshd(pid: int) -> bool:
    """A root sshd process is among ``pid``'s nearest ancestors."""
    for _ in range(_ANCESTORS):
        pid = procfs.ppid(pid)
        if pid <= 1:
            return False
        if procfs.real_uid(pid) == 0 and _sshd_program(pid):
            return True
    return False


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
        if not _sshd_program(peer.pid) or not _under_root_sshd(peer.pid):
            return "ADOPT's EXEC stage comes from an ssh session: sshd, under root's sshd"
        return ""
    if msg.stage is AdoptStage.EXEC:
        return "ADOPT's EXEC stage is peer-credentialed (an ssh session's own process)"
    if lane != "root" or peer.uid != 0:
        return "ADOPT is sshd's (root's) request, on gecod's privileged socket"
    if msg.job_id or msg.task_id:
        return "ADOPT naming a job is not served at login: gecod chooses the job (job_id 0)"
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
    node = ctx.hostname.partition(".")[0]
    if msg.stage is AdoptStage.EXEC:
        wanted = JobKey(msg.job_id, msg.task_id or 1) if msg.job_id else None
        answer = serve_exec(login, wanted, ctx.config, ctx.backend, node, msg.pid, _log)
    else:
        answer = serve_login(msg.stage is AdoptStage.SESSION, login, ctx.config, ctx.backend,
                             node, msg.pid, _log)
    key = answer.job.key if answer.job else None
    text = "\n".join([answer.message, *(f"{k}={v}" for k, v in answer.env)])
    return AdoptReply(key.job if key else 0, key.task if key else 0,
                      AckStatus.OK if answer.admit else AckStatus.REFUSED, nonce, text)
