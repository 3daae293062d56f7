"""sshd's PAM helper: refuse logins without a job here, move sessions into their job.

Installed as ``/opt/geco/libexec/geco-pam`` and run by ``pam_exec`` in sshd's PAM
stack (``/etc/pam.d/sshd``; the README shows the whole stack)::

    account  required  pam_exec.so quiet stdout /opt/geco/libexec/geco-pam
    session  required  pam_exec.so quiet /opt/geco/libexec/geco-pam

``account`` decides (:func:`geco.ssh.login_verdict`) before anything of the
user's runs, public-key logins included (they skip the auth stack); a refusal
prints one line, which sshd shows the user, and exits 1. ``session`` runs in
sshd's root process for the connection (its ``[priv]`` monitor, this helper's
parent) before it forks the user's side, decides again and moves that process
into the job's cgroups, so the shell, ``~/.ssh/rc``, sftp, scp and forwarded
ports all start inside the job. Put the session line after ``pam_systemd``:
a later module that moves the process would undo the adoption.

Every decision is journaled (``SYSLOG_IDENTIFIER=geco-pam``, ``GECO_EVENT``
``ssh-admitted``, ``ssh-refused``, ``ssh-bypassed``, ``ssh-adopted``,
``ssh-not-adopted``; ``SSH_USER``, ``RHOST``, ``REASON``, ``JOB_ID``).
"""

from __future__ import annotations

import os
import sys

from geco import cgroup, config, log, procfs
from geco.errors import GecoError
from geco.ssh import Login, Verdict, login_verdict

__all__ = ["main"]

ADMIT, REFUSE = 0, 1  # pam_exec: 0 is success, anything else fails a required line


def _journal(logger: log.Logger, event: str, login: Login, verdict: Verdict, text: str,
             **more: object) -> None:
    job = verdict.job
    logger.info("%s", text, extra=log.job_fields(
        job.key.job if job else None, job.key.task if job else None, event,
        SSH_USER=login.user, RHOST=login.rhost or None, REASON=verdict.why, **more))


def _account(login: Login, verdict: Verdict, node: str, logger: log.Logger) -> int:
    if not verdict.admit:
        _journal(logger, "ssh-refused", login, verdict,
                 f"ssh login of {login.user} from {login.rhost or '?'} refused ({verdict.why})")
        print(verdict.message, flush=True)
        return REFUSE
    event = "ssh-bypassed" if verdict.why == "bypass" else "ssh-admitted"
    where = f", to job {verdict.job.key}" if verdict.job else ""
    _journal(logger, event, login, verdict,
             f"ssh login of {login.user} from {login.rhost or '?'} to {node} admitted "
             f"({verdict.why}{where})")
    return ADMIT


def _session(login: Login, verdict: Verdict, cfg: config.Config, backend: cgroup.Backend,
             node: str, logger: log.Logger) -> int:
    if not verdict.admit:
        return _account(login, verdict, node, logger)
    if verdict.job is None:
        return ADMIT
    key = verdict.job.key
    # our parent is sshd's root process for this connection; it forks the user's side
    monitor = os.getppid()
    try:
        if procfs.real_uid(monitor) != 0:
            raise GecoError("the helper's parent is not a root process", pid=monitor)
        backend.add_pid(key, monitor)
        if not backend.contains(key, monitor):
            raise GecoError("the session's process is still outside the job's cgroups",
                            pid=monitor)
    except GecoError as exc:
        allow = cfg.ssh_adopt_failure == "allow"
        _journal(logger, "ssh-not-adopted", login, verdict,
                 f"ssh session of {login.user} not moved into job {key}: {exc}"
                 f"{'; let in outside the job (adopt_failure = allow)' if allow else ''}",
                 PID=monitor)
        if allow:
            return ADMIT
        print(f"geco: your session cannot be put into job {key} on {node}; try again, or "
              "ask your admin", flush=True)
        return REFUSE
    _journal(logger, "ssh-adopted", login, verdict,
             f"ssh session of {login.user} from {login.rhost or '?'} joined job {key} "
             f"({verdict.why})", PID=monitor)
    return ADMIT


def _decide(stage: str, login: Login, node: str, logger: log.Logger) -> int:
    cfg = config.load(config.DEFAULT_PATH)  # never $GECO_CONFIG: the login's env is not ours
    backend = cgroup.for_config(cfg)
    verdict = login_verdict(login, cfg, backend, node)
    if stage == "account":
        return _account(login, verdict, node, logger)
    return _session(login, verdict, cfg, backend, node, logger)


def main() -> int:
    """Entry point of ``geco-pam`` (pam_exec sets ``PAM_TYPE``, ``PAM_USER``, ...)."""
    stage = os.environ.get("PAM_TYPE", "")
    if stage not in ("account", "open_session"):
        return ADMIT  # close_session, password, auth: nothing of ours
    if os.geteuid() != 0:
        print("geco-pam: run it from sshd's PAM stack (pam_exec), as root", file=sys.stderr)
        return REFUSE
    logger = log.setup_hook("quiet", identifier="geco-pam")
    node = os.uname().nodename.partition(".")[0]
    user = os.environ.get("PAM_USER", "")
    try:
        login = Login.of(user, os.environ.get("PAM_RHOST", ""),
                         os.environ.get("SSH_CONNECTION", ""))
        if login.uid == 0:  # before anything that could fail: root is never locked out
            return _account(login, Verdict(True, "root"), node, logger)
        return _decide(stage, login, node, logger)
    except Exception as exc:  # fail closed, with a reason, never a traceback
        logger.error("ssh login of %r refused: cannot decide: %s", user, exc,
                     extra=log.job_fields(None, None, "ssh-refused", SSH_USER=user,
                                          REASON="error"))
        print(f"geco: your login to {node} cannot be checked ({exc}); ask your admin",
              flush=True)
        return REFUSE
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
