"""sshd's PAM helper: the login decision when gecod cannot make it.

``pam_geco.so`` (sshd's account and session module) asks gecod, which decides
(:func:`geco.ssh.policy.serve_login`). When gecod cannot be reached, the module runs
this helper, installed as ``/usr/libexec/geco/geco-pam``, the way ``pam_exec``
would (``PAM_TYPE``, ``PAM_USER``, ``PAM_RHOST``, ``SSH_CONNECTION``; its
first line of output reaches the user; exit 0 lets the stage pass), and it
does what ``[ssh] gecod_unreachable`` says:

* ``decide-here``: the same decision, made here (config, cgroups and spool
  read by this process), the session stage moving its parent (sshd's root
  process for the connection, checked to be one: a helper whose parent is gone
  was re-parented, and moves nothing) into the job;
* ``refuse``: only root and the admins (and everyone while the bypass file
  exists) get in;
* ``allow``: everyone gets in, uncontained.

Every decision is journaled under ``SYSLOG_IDENTIFIER=geco-pam`` with the
events of :func:`geco.ssh.policy.serve_login`; the other two add ``REASON``
``gecod-unreachable``.
"""

from __future__ import annotations

import os
import signal
import sys

from geco import cgroup, config, log, procfs
from geco.errors import GecoError
from geco.resourceset import short_hostname
from geco.ssh.policy import Answer, Login, Placement, is_admin, serve_login, sshd_program

__all__ = ["main"]

ADMIT, REFUSE = 0, 1  # pam_exec's convention: 0 is success, anything else fails the stage


def _without_gecod(session: bool, login: Login, cfg: config.Config, node: str,
                   logger: log.Logger) -> Answer:
    action = cfg.ssh_gecod_unreachable
    if action == "decide-here":
        # only the session stage moves anything: its parent must be sshd's
        placement = _parent() if session else Placement(os.getppid())
        return serve_login(session, login, cfg, cgroup.for_config(cfg), node, placement,
                           logger)
    admit = action == "allow" or is_admin(login, cfg) or cfg.ssh_bypass_file.exists()
    if not session:
        logger.info("ssh login of %s from %s %s: gecod cannot be reached "
                    "(gecod_unreachable = %s)", login.user, login.rhost or "?",
                    "admitted, in no job" if admit else "refused", action,
                    extra=log.job_fields(None, None, "ssh-admitted" if admit else "ssh-refused",
                                         SSH_USER=login.user, RHOST=login.rhost or None,
                                         REASON="gecod-unreachable"))
    if admit:
        return Answer(True)
    return Answer(False, f"geco: logins to {node} are closed while its geco daemon is down; "
                         "ask your admin")


def _parent() -> Placement:
    """sshd's root process for the connection (pam_geco runs us in it), pinned by a pidfd.

    Raises
    ------
    GecoError
        when the parent is not a root sshd (we were re-parented: sshd is gone).
    """
    ppid = os.getppid()
    pidfd = os.pidfd_open(ppid)  # first: what is checked next is this very process
    if procfs.real_uid(ppid) != 0 or not sshd_program(ppid) or os.getppid() != ppid:
        os.close(pidfd)
        raise GecoError(f"the helper's parent (pid {ppid}) is not sshd's root process for "
                        "the login")

    def alive() -> bool:
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except ProcessLookupError:
            return False
        return True

    return Placement(ppid, alive=alive)


def main() -> int:
    """Entry point of ``geco-pam`` (``PAM_TYPE``, ``PAM_USER``, ... in the environment)."""
    stage = os.environ.get("PAM_TYPE", "")
    if stage not in ("account", "open_session"):
        return ADMIT  # close_session, password, auth: nothing of ours
    if os.geteuid() != 0:
        print("geco-pam: sshd's PAM module (pam_geco.so) runs it, as root", file=sys.stderr)
        return REFUSE
    logger = log.setup_hook("quiet", identifier="geco-pam")
    node = short_hostname()
    user = os.environ.get("PAM_USER", "")
    try:
        login = Login.of(user, os.environ.get("PAM_RHOST", ""),
                         os.environ.get("SSH_CONNECTION", ""))
        if login.uid == 0:  # before anything that could fail: root is never locked out
            return ADMIT
        cfg = config.load(config.DEFAULT_PATH)  # never $GECO_CONFIG: the login's env is not ours
        answer = _without_gecod(stage == "open_session", login, cfg, node, logger)
    except Exception as exc:  # fail closed, with a reason, never a traceback
        logger.error("ssh login of %r refused: cannot decide: %s", user, exc,
                     extra=log.job_fields(None, None, "ssh-refused", SSH_USER=user,
                                          REASON="error"))
        print(f"geco: your login to {node} cannot be checked ({exc}); ask your admin",
              flush=True)
        return REFUSE
    finally:
        log.close()
    if answer.message or answer.env:
        # as gecod's reply: the user's line, then the session's variables (pam_geco.so
        # puts those into the session's environment)
        print("\n".join((answer.message, *(f"{k}={v}" for k, v in answer.env))), flush=True)
    return ADMIT if answer.admit else REFUSE


if __name__ == "__main__":
    sys.exit(main())
