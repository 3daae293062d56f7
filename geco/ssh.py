"""Who may ssh into this node, and which of their jobs a session joins.

The rules are pam_slurm_adopt's, in Grid Engine's terms:

* root always gets in (a lock-out guard), and so do the configured admins
  (``[ssh] admins``, ``admin_groups``); their sessions join no job;
* while ``[ssh] bypass_file`` exists everyone gets in, uncontained (an
  emergency switch, journaled on every login);
* anyone else needs a job running on this node: a job whose cgroups exist and
  whose spooled config (``active_jobs/<job>.<task>/config``, written by
  sge_execd) names them as ``job_owner``;
* the session joins the job the connection comes from (an ssh started by a
  process of one of the user's jobs on this node, found from the connection's
  4-tuple as Slurm's callerid does), else the user's only job, else the newest
  one (``several_jobs = "newest"``) or none (``"refuse"``).

:func:`login_verdict` is the one decision; the PAM helper (:mod:`geco.hooks.pam`)
calls it at account time (to refuse before anything of the user's runs) and
again at session time (to pick the job it moves the connection into).
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
from collections.abc import Sequence

from geco import containment
from geco._tuple import NamedTuple
from geco.cgroup import Backend
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.sge import execd

__all__ = ["Login", "NodeJob", "Verdict", "caller_job", "login_verdict", "running_jobs"]


class Login(NamedTuple):
    """One ssh login, as PAM names it.

    Attributes
    ----------
    user: the account logging in (``PAM_USER``).
    uid: its uid, from the password database.
    groups: the names of its groups (primary and supplementary).
    rhost: where the connection comes from (``PAM_RHOST``).
    connection: ``SSH_CONNECTION`` (``<src> <sport> <dst> <dport>``), "" if unknown.
    """

    user: str
    uid: int
    groups: frozenset[str]
    rhost: str = ""
    connection: str = ""

    @classmethod
    def of(cls, user: str, rhost: str = "", connection: str = "") -> Login:
        """Look ``user`` up in the password and group databases.

        Raises
        ------
        GecoError: the user is unknown on this node.
        """
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise GecoError("unknown user", user=user) from None
        names = set()
        for gid in os.getgrouplist(pw.pw_name, pw.pw_gid):
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        return cls(pw.pw_name, pw.pw_uid, frozenset(names), rhost, connection)


class NodeJob(NamedTuple):
    """A job running on this node: its key, owner and when its cgroups were made."""

    key: JobKey
    owner: str
    started: float


class Verdict(NamedTuple):
    """What to do with a login.

    Attributes
    ----------
    admit: let the user in.
    why: the rule that decided, journaled as ``REASON``: ``root``, ``admin``,
        ``bypass``, ``caller``, ``only-job``, ``newest``, ``no-job``, ``several-jobs``.
    message: one line for the user when refused ("" when admitted).
    job: the job the session joins (None: it joins none).
    """

    admit: bool
    why: str
    message: str = ""
    job: NodeJob | None = None


def running_jobs(cfg: Config, backend: Backend, node: str) -> list[NodeJob]:
    """The jobs running on this node with cgroups of geco's, oldest first.

    A job counts while both its cgroups and sge_execd's spool dir for it exist:
    the owner comes from the spooled config, which only root and sge_execd write.
    """
    jobs = []
    for key in backend.job_keys():
        spool = execd.find_spool_dir(cfg.execd_spool_dir, key, node)
        if spool is None:
            continue
        try:
            owner = execd.read_config(spool).get("job_owner", "")
        except GecoError:
            continue
        started = containment.last_changed(key, backend)
        if owner and started is not None:
            jobs.append(NodeJob(key, owner, started))
    return sorted(jobs, key=lambda j: (j.started, j.key.order()))


def _from_this_node(connection: str) -> tuple[str, int, str, int] | None:
    """The 4-tuple of a connection made from this node to itself, else None."""
    try:
        src, sport, dst, dport = connection.split()
        source = ipaddress.ip_address(src)
        ends = (src, int(sport), dst, int(dport))
    except ValueError:
        return None
    return ends if source.is_loopback or src == dst else None


def caller_job(connection: str, uid: int, keys: Sequence[JobKey],
               backend: Backend) -> JobKey | None:
    """The job of the process that made this connection, when it is one of ``keys``.

    Only for a connection from this node to itself: its client socket is found
    by the 4-tuple (``psutil.net_connections``, the kernel's socket tables), and
    the process holding it must run as the user and sit in the job's cgroups.
    """
    ends = _from_this_node(connection)
    if ends is None or not keys:
        return None
    import psutil  # only here: a login from another host never needs it

    for conn in psutil.net_connections(kind="tcp"):
        if conn.pid is None or (*conn.laddr, *conn.raddr) != ends:
            continue
        try:
            if psutil.Process(conn.pid).uids().real != uid:
                continue
        except psutil.Error:
            continue
        for key in keys:
            if backend.contains(key, conn.pid):
                return key
    return None


def _is_admin(login: Login, cfg: Config) -> bool:
    return login.user in cfg.ssh_admins or not login.groups.isdisjoint(cfg.ssh_admin_groups)


def login_verdict(login: Login, cfg: Config, backend: Backend, node: str) -> Verdict:
    """Decide whether ``login`` gets in, and which job its session joins."""
    if login.uid == 0:
        return Verdict(True, "root")
    if _is_admin(login, cfg):
        return Verdict(True, "admin")
    if cfg.ssh_bypass_file.exists():
        return Verdict(True, "bypass")
    mine = [job for job in running_jobs(cfg, backend, node) if job.owner == login.user]
    if not mine:
        return Verdict(False, "no-job", f"geco: you have no job running on {node}; ssh to "
                                        "compute nodes is for your running jobs")
    caller = caller_job(login.connection, login.uid, [j.key for j in mine], backend)
    if caller is not None:
        return Verdict(True, "caller", job=next(j for j in mine if j.key == caller))
    if len(mine) == 1:
        return Verdict(True, "only-job", job=mine[0])
    if cfg.ssh_several_jobs == "newest":
        return Verdict(True, "newest", job=mine[-1])
    names = ", ".join(j.key for j in mine)
    return Verdict(False, "several-jobs",
                   f"geco: you have {len(mine)} jobs running on {node} ({names}); ssh from "
                   "inside the one your session should join")
